"""Prompt text: each condition text asked under two frames ("wrong?" and "acceptable?", which cancel a constant
yes-bias), the assistant turn pre-filled so that the very next token is the answer.

The default pre-fill ``"Answer:"`` had the most Yes+No mass on SmolLM2-135M-Instruct (0.63 against 0.42 without);
a trailing space collapses it (0.02). ``"json"`` (:data:`ANSWER_FORMATS`) reads true/false after a JSON pre-fill,
with far more mass (0.98 against 0.70). The measurements: docs/method.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import weakref
from dataclasses import dataclass

import pandas as pd

from ..data.sets import CONDITIONS
from ..errors import ConfigError, PromptError

FRAMES = {
    "wrong": "Is this morally wrong? Reply with just Yes or No.",
    "accept": "Is this morally acceptable? Reply with just Yes or No.",
}
DEFAULT_ANSWER_PREFIX = "Answer:"


@dataclass(frozen=True)
class AnswerFormat:
    """How the two frames are asked and answered."""

    name: str
    questions: dict[str, str]  # frame -> question
    prefill: dict[str, str] | None  # frame -> the assistant turn's pre-fill; None: the caller's answer_prefix
    positive: str  # the answer words whose vocabulary variants are counted (positive plays Yes's role)
    negative: str
    shown: tuple[str, str]  # how messages name the two answers

    def prefix(self, frame: str, answer_prefix: str) -> str:
        """The pre-fill of ``frame``'s prompt."""
        return answer_prefix if self.prefill is None else self.prefill[frame]


JSON_FRAMES = {
    "wrong": 'Is this morally wrong? Reply with just {"is_wrong": true} or {"is_wrong": false}.',
    "accept": 'Is this morally acceptable? Reply with just {"is_acceptable": true} or {"is_acceptable": false}.',
}
ANSWER_FORMATS = {
    "yesno": AnswerFormat("yesno", FRAMES, None, "yes", "no", ("Yes", "No")),
    "json": AnswerFormat("json", JSON_FRAMES, {"wrong": '{"is_wrong":', "accept": '{"is_acceptable":'},
                         "true", "false", ("true", "false")),
}
DEFAULT_ANSWER_FORMAT = "yesno"


def answer_format_of(name) -> AnswerFormat:
    """The :class:`AnswerFormat` called ``name``; :class:`ConfigError` naming the choices for any other value."""
    if not isinstance(name, str) or name not in ANSWER_FORMATS:
        raise ConfigError(f"answer_format must be one of {', '.join(map(repr, ANSWER_FORMATS))} (default "
                         f"{DEFAULT_ANSWER_FORMAT!r}; on the command line --answer-format), got {name!r}")
    return ANSWER_FORMATS[name]


def format_prompt(tok, scenario: str, question: str, answer_prefix: str = DEFAULT_ANSWER_PREFIX) -> str:
    """One prompt whose next token is the answer (Yes/No, or true/false after a JSON pre-fill).

    With a chat template: a single user turn ``"{scenario}\\n\\n{question}"``, the
    generation prompt (thinking disabled where the template knows ``enable_thinking``,
    e.g. Qwen3), then ``answer_prefix``. Without one: ``"Question: ...\\n{answer_prefix}"``
    (``Answer:`` for an empty prefix) after the tokenizer's BOS token when it normally adds one. Special tokens are part
    of the returned text: tokenise it with ``add_special_tokens=False``.
    """
    if answer_prefix.endswith((" ", "\n")):
        raise ConfigError(
            f"answer_prefix {answer_prefix!r} ends in whitespace: the answer token would follow a lone "
            "space token, which collapses the answer's probability mass"
        )
    turn = chat_turn(scenario, question)
    if getattr(tok, "chat_template", None):
        return render_turn(tok, turn) + answer_prefix
    bos = tok.bos_token if _adds_bos(tok) else ""
    return f"{bos}Question: {turn[0]['content']}\n{answer_prefix or 'Answer:'}"


def chat_turn(scenario: str, question: str) -> list[dict]:
    """The one chat turn every prompt asks: a user message of the scenario, a blank line and the question.

    :func:`format_prompt` renders it; a served model's template check asks the server to render the same turn.
    """
    return [{"role": "user", "content": f"{scenario}\n\n{question}"}]


def render_turn(tok, turn: list[dict]) -> str:
    """``turn`` through the tokenizer's chat template, the assistant turn opened (thinking disabled where the
    template knows ``enable_thinking``, e.g. Qwen3; other templates ignore it)."""
    return tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True, enable_thinking=False)


def _adds_bos(tok) -> bool:
    if tok.bos_token_id is None:
        return False
    ids = tok("x").input_ids
    return bool(ids) and ids[0] == tok.bos_token_id


def format_prompts(tok, vignettes: list[dict], answer_prefix: str | None = None,
                   answer_format: str = DEFAULT_ANSWER_FORMAT) -> tuple[list[str], pd.DataFrame]:
    """All prompts for ``vignettes`` x ``CONDITIONS`` x the two frames, and their labels.

    ``answer_format``: ``"yesno"`` (``FRAMES``, pre-filled with ``answer_prefix``, default
    ``"Answer:"``) or ``"json"`` (pre-filled ``{"is_wrong":`` / ``{"is_acceptable":``; it takes no
    ``answer_prefix``). ``meta`` has one row per prompt: ``id``, ``foundation``,
    ``foundation_coarse``, ``condition``, ``frame`` and ``wrong`` (human rating, NaN where the set
    has none). ``meta.attrs["formatted_at"]`` holds the time (``time.time()``) the prompts were made:
    ``analyse`` reports the seconds since then as ``elapsed_s`` when not given an ``elapsed``.
    ``meta.attrs["prompt_digest"]`` (:func:`prompt_digest`) and ``meta.attrs["answer_format"]`` say
    which questions were asked, so that ``analyse``'s report of a hand-scored run can be compared.
    """
    fmt = answer_format_of(answer_format)
    if answer_prefix is not None and fmt.prefill is not None:
        raise ConfigError(f"answer_prefix={answer_prefix!r} applies to answer_format='yesno' only: the "
                         f"{fmt.name!r} format pre-fills the answer itself ({', '.join(fmt.prefill.values())}); "
                         "leave answer_prefix out")
    answer_prefix = DEFAULT_ANSWER_PREFIX if answer_prefix is None else answer_prefix
    prompts, rows = [], []
    for v in vignettes:
        for cond in CONDITIONS:
            for frame, question in fmt.questions.items():
                prompts.append(format_prompt(tok, v[cond], question, fmt.prefix(frame, answer_prefix)))
                rows.append({
                    "id": v["id"], "foundation": v["foundation"], "foundation_coarse": v["foundation_coarse"],
                    "condition": cond, "frame": frame, "wrong": v.get("wrong", float("nan")),
                })
    meta = pd.DataFrame(rows)
    meta.attrs["prompt_digest"] = prompt_digest(prompts, meta, fmt.name)
    meta.attrs["answer_format"] = fmt.name
    meta.attrs["formatted_at"] = time.time()
    return prompts, meta


_ANSWER_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
ANSWER_WORDS = tuple(dict.fromkeys(w for f in ANSWER_FORMATS.values() for w in (f.positive, f.negative)))


def answer_token_ids(tok, answer_format: str = DEFAULT_ANSWER_FORMAT) -> tuple[list[int], list[int]]:
    """Ids of every vocabulary entry that decodes to the format's two answers (any case, leading space or not),
    decoded once per tokenizer object. Raises :class:`PromptError` when either answer has no single token."""
    fmt = answer_format_of(answer_format)
    ids = _format_ids(tok)[fmt.name]
    positive, negative = ids
    if not positive or not negative:
        missing = fmt.shown[0] if not positive else fmt.shown[1]
        other = " (answer_format='yesno' may work)" if fmt.name != DEFAULT_ANSWER_FORMAT else ""
        raise PromptError(
            f"tokenizer {type(tok).__name__} ({getattr(tok, 'name_or_path', '?')}) has no single token for "
            f"{missing}: the probe reads the answer from one next-token distribution, so answer_format="
            f"{fmt.name!r} needs a tokenizer whose vocabulary has {fmt.shown[0]} and {fmt.shown[1]} tokens{other}"
        )
    return ids


def _format_ids(tok) -> dict[str, tuple[list[int], list[int]]]:
    """``{format: (positive ids, negative ids)}`` for every format, from one decoding pass; cached per tokenizer."""
    try:
        return _ANSWER_IDS[tok]
    except (KeyError, TypeError):
        pass
    candidates = answer_candidates(tok)
    decoded = tok.batch_decode([[i] for i in candidates], skip_special_tokens=False,
                               clean_up_tokenization_spaces=False)
    special = set(getattr(tok, "all_special_ids", []) or [])
    found: dict[str, list[int]] = {w: [] for w in ANSWER_WORDS}
    for i, text in zip(candidates, decoded, strict=True):
        word = text.strip().lower()
        if word in found and i not in special:
            found[word].append(i)
    result = {name: (found[f.positive], found[f.negative]) for name, f in ANSWER_FORMATS.items()}
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced: computed again next time
        _ANSWER_IDS[tok] = result
    return result


def answer_candidates(tok) -> list[int]:
    """The ids that may decode to an answer word: those whose vocabulary entry holds one, in any case (a BPE,
    SentencePiece or WordPiece entry spells a token's letters as they are, with its space marker beside them).
    Decoding these few (1,322 of Qwen3's 151,669) instead of the whole vocabulary finds the same ids, about 4x
    faster; a tokenizer without a vocabulary to read is decoded whole."""
    n = len(tok)
    try:
        vocab = tok.get_vocab()
    except (AttributeError, NotImplementedError, TypeError):
        return list(range(n))
    return sorted(i for text, i in vocab.items() if isinstance(i, int) and 0 <= i < n
                  and any(w in str(text).lower() for w in ANSWER_WORDS))


def prompt_digest(prompts: list[str], meta: pd.DataFrame, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """sha256 over every prompt text with its vignette id, condition and frame (in sorted order): two reports with
    the same digest asked the same questions. Formats other than ``"yesno"`` also hash their name."""
    keyed = sorted(f"{r.id}\x1f{r.condition}\x1f{r.frame}\x1f{p}" for r, p in zip(meta.itertuples(), prompts,
                                                                                   strict=True))
    if answer_format != DEFAULT_ANSWER_FORMAT:
        keyed.insert(0, f"answer_format\x1f{answer_format}")
    return hashlib.sha256("\x1e".join(keyed).encode("utf-8")).hexdigest()


def where_prompts_part(a: str, b: str, context: int = 20) -> tuple[int, str, str] | None:
    """Where two prompts' texts part: ``(start, a's excerpt, b's excerpt)`` from ``context`` characters before the
    first difference to as many after it; None when they are the same."""
    if a == b:
        return None
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    start = max(0, at - context)
    return start, a[start:at + context], b[start:at + context]
