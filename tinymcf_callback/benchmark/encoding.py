"""Pairs to token ids: the prompt and each continuation tokenised apart, then joined, as TRL's DPO tokenisation does.

Why apart: a continuation's tokens then do not depend on its prompt (tokenising ``prompt + continuation`` as one text
can merge the prompt's last characters with the continuation's first), so the chosen and the rejected continuation
are scored after exactly the same prompt tokens, and a margin compares the continuations only.

- **Plain text** is tokenised as it stands, with no special token added inside it; the prompt starts with the
  tokens the tokenizer itself puts before a text (a Llama tokenizer's BOS, none for SmolLM2 or Qwen3).
- **Conversational** pairs go through the tokenizer's chat template the way TRL's ``maybe_apply_chat_template``
  renders a preference example (:func:`chat_texts`): the prompt with the generation prompt (or continuing its last
  message when that is the assistant's), each continuation as the rest of the prompt-plus-continuation rendering
  after their common start. The rendered texts carry the template's special tokens, so nothing is added to them.

:attr:`EncodedPairs.digest` is a sha256 of the token ids: two scorings whose digests agree asked the same
questions, so their margins pair pair by pair (another tokenizer or chat template changes it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import takewhile

from ..errors import ProbeDataError
from .pairs import Pairs


@dataclass(frozen=True)
class EncodedPairs:
    """Each pair's prompt, chosen and rejected token ids (the continuations' own: joined after the prompt's)."""

    prompt: list[list[int]]
    chosen: list[list[int]]
    rejected: list[list[int]]
    template: str  # "chat" (through the tokenizer's chat template) or "plain"
    digest: str  # sha256 of every pair's ids

    def __len__(self) -> int:
        return len(self.prompt)


def chat_texts(tok, prompt: list[dict], chosen: list[dict], rejected: list[dict]) -> tuple[str, str, str]:
    """A conversational pair as the texts TRL's ``maybe_apply_chat_template`` renders: ``(prompt, chosen, rejected)``.

    The prompt ends with the generation prompt when its last message is a user's (or a tool's), and continues the
    last message when it is the assistant's; each continuation is ``render(prompt + continuation)`` after the
    longest start it shares with the prompt's rendering (a template that renders the prompt alone differently, such
    as one adding a token with the generation prompt, keeps only the common part).
    """
    last = prompt[-1]["role"]
    head = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=last in ("user", "tool"),
                                   continue_final_message=last == "assistant")
    with_chosen = tok.apply_chat_template(prompt + chosen, tokenize=False)
    with_rejected = tok.apply_chat_template(prompt + rejected, tokenize=False)
    for whole in (with_chosen, with_rejected):
        head = "".join(a for a, _ in takewhile(lambda ab: ab[0] == ab[1], zip(head, whole, strict=False)))
    return head, with_chosen[len(head):], with_rejected[len(head):]


def leading_special_ids(tok) -> list[int]:
    """The token ids the tokenizer puts before a text of its own accord (a BOS), none when it puts none."""
    probe = "moral"
    with_specials = tok(probe)["input_ids"]
    plain = tok(probe, add_special_tokens=False)["input_ids"]
    for start in range(len(with_specials) - len(plain) + 1):
        if with_specials[start:start + len(plain)] == plain:
            return list(with_specials[:start])
    return []


def encode_pairs(tok, pairs: Pairs) -> EncodedPairs:
    """The token ids of every pair (see the module); :class:`~tinymcf_callback.errors.ProbeDataError` for a
    conversational set with a tokenizer that has no chat template, or a part that gives no token."""
    if pairs.conversational:
        if not getattr(tok, "chat_template", None):
            raise ProbeDataError("the pairs are conversational (lists of messages), but the tokenizer has no chat "
                                 "template to render them with: load the chat model's tokenizer, or use plain-text "
                                 "pairs")
        texts = [chat_texts(tok, p, c, r) for p, c, r in zip(pairs.prompt, pairs.chosen, pairs.rejected, strict=True)]
        prefix = []
    else:
        texts = list(zip(pairs.prompt, pairs.chosen, pairs.rejected, strict=True))
        prefix = leading_special_ids(tok)
    prompts = _ids(tok, [t[0] for t in texts])
    chosen = _ids(tok, [t[1] for t in texts])
    rejected = _ids(tok, [t[2] for t in texts])
    prompts = [prefix + p for p in prompts]
    for column, ids in (("prompt", prompts), ("chosen", chosen), ("rejected", rejected)):
        empty = next((i for i, x in enumerate(ids) if not x), None)
        if empty is not None:
            raise ProbeDataError(f"{pairs.where(empty)}: its {column} gives no token with this tokenizer "
                                 f"({texts[empty][PART[column]]!r}): every part of a pair must say something")
    return EncodedPairs(prompts, chosen, rejected, "chat" if pairs.conversational else "plain",
                        ids_digest(prompts, chosen, rejected))


PART = {"prompt": 0, "chosen": 1, "rejected": 2}


def _ids(tok, texts: list[str]) -> list[list[int]]:
    return [list(x) for x in tok(list(texts), add_special_tokens=False)["input_ids"]]


def ids_digest(prompts, chosen, rejected) -> str:
    """sha256 over every pair's token ids."""
    h = hashlib.sha256()
    for triple in zip(prompts, chosen, rejected, strict=True):
        h.update(json.dumps(triple).encode("ascii"))
        h.update(b"\n")
    return h.hexdigest()
