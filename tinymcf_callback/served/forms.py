"""How each server is asked for the answer position's log-probabilities: one request form per server, as a pure
payload/parse pair (no HTTP here: :mod:`~tinymcf_callback.served.transport` sends what :meth:`Form.payload` builds
and hands the answer to :meth:`Form.parse`).

Every form sends the prompts as the token ids of the local tokenizer's chat template (the server never
re-tokenizes) and returns one :class:`Reading` per prompt. The forms, one class each (:data:`FORMS`), and which server
takes which: docs/served.md ("How it asks").

The sampling settings each request pins (:data:`PINS`) are the ones that processed log-probabilities depend on,
set to what leaves the model's own distribution unchanged (temperature 1, no top-k/top-p/min-p cut, no penalties),
so a server that returns processed log-probabilities (vLLM's ``--logprobs-mode processed_logprobs``, which TRL's
``vllm-serve`` sets) returns the raw ones, and the defaults a server takes from the model's
``generation_config.json`` (vLLM's ``--generation-config auto``) never apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ServedError

FORMS = ("logprob_token_ids", "token_ids_logprob", "n_probs", "echo", "top_logprobs")
FLOOR_CAP = -9999.0  # vLLM writes -inf as -9999.0

# What each server kind is sent so that its log-probabilities are the model's own (the temperature is the raw
# check's to vary). A plain OpenAI-compatible server gets the OpenAI API's own parameters only (a strict one
# refuses others).
_NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
PINS = {
    "vllm": {**_NEUTRAL, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
    "sglang": {**_NEUTRAL, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
    "llama.cpp": {**_NEUTRAL, "top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
                  "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0},
    "openai-compatible": dict(_NEUTRAL),
}


@dataclass
class Reading:
    """The next position of one prompt as one form read it."""

    logp: dict[int, float]  # answer token id -> log-probability, for the answer tokens read
    # (token id, log-probability), likeliest first; the id is the token's text where the server gave only that
    top: list[tuple[int | str, float]] = field(default_factory=list)
    floor: float | None = None  # top-k forms: the k-th log-probability (an unread token has at most this)


def _token_id(key, vocab: dict[str, int] | None) -> int | None:
    """A ``top_logprobs`` key as a token id: ``token_id:123`` (vLLM's ``return_tokens_as_token_ids``) or the text."""
    if isinstance(key, str) and key.startswith("token_id:"):
        try:
            return int(key.split(":", 1)[1])
        except ValueError:
            return None
    return (vocab or {}).get(key)


def _finite(value) -> float:
    value = float(value)
    return -math.inf if value <= FLOOR_CAP else value


def _one_or_list(prompts: list[list[int]]):
    """A request's prompts: one as a flat list of token ids (what every server takes), several as a list of them."""
    return prompts[0] if len(prompts) == 1 else prompts


def _ranked(row, vocab) -> list[tuple[int | str, float]]:
    pairs = [(_token_id(k, vocab), k, _finite(v)) for k, v in (row or {}).items()]
    return sorted([(k if i is None else i, v) for i, k, v in pairs], key=lambda t: -t[1])


class Form:
    """One request form. ``payload(prompts)`` is the body of one request for those prompts; ``parse(data,
    prompts)`` is their readings from the server's answer. ``batched``: the server takes several prompts in one
    request. ``pins``: the sampling settings every request carries (:data:`PINS` of the server's kind)."""

    name = ""
    route = ""
    batched = True

    def __init__(self, model: str, sides: tuple[list[int], list[int]], *, top: int = 10,
                 vocab: dict[str, int] | None = None, vocab_size: int | None = None, pins: dict | None = None,
                 extra: dict | None = None):
        self.model, self.top, self.vocab, self.vocab_size = model, top, vocab, vocab_size
        self.sides, self.answers = sides, [*sides[0], *sides[1]]
        self.pins = dict(_NEUTRAL if pins is None else pins)
        self.extra = dict(extra or {})

    def sampling(self, temperature: float | None) -> dict:
        return {**self.pins, **({} if temperature is None else {"temperature": float(temperature)})}

    def payload(self, prompts: list[list[int]], *, temperature: float | None = None, top: bool = False,
                only: list[int] | None = None, whole: bool = False) -> dict:
        """The request body for ``prompts``. ``top``: also the top tokens (the sample prompt); ``only``: the answer
        tokens to read where a form reads them one by one (the self-check's second form); ``whole``: every token
        of the vocabulary (a top-k form asked again)."""
        raise NotImplementedError

    def parse(self, data, prompts: list[list[int]], *, top: bool = False, only: list[int] | None = None,
              whole: bool = False, shown: str = "the endpoint") -> list[Reading]:
        """One :class:`Reading` per prompt of ``data``, the server's answer to :meth:`payload`; ``shown`` names the
        server in a refusal (an answer without what was asked for)."""
        raise NotImplementedError

    def incomplete(self, reading: Reading) -> bool:
        """Whether ``reading`` lacks an answer token it should have read (then asked again with ``whole``)."""
        return False

    def choices(self, data, n: int, shown: str) -> list[dict]:
        """The ``n`` choices of a ``/v1/completions`` answer in prompt order, each with its ``logprobs``."""
        try:
            choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        except (KeyError, TypeError, AttributeError):
            choices = None
        usable = [c for c in choices if isinstance(c, dict) and isinstance(c.get("logprobs"), dict)] if isinstance(
            choices, list) else []
        if len(usable) != n or len(choices) != n:
            got = len(usable)
            raise ServedError(f"the server at {shown} gave {got} choice(s) with logprobs on {self.route} for {n} "
                              "prompt(s): it does not return log-probabilities for a list of token-id prompts (or "
                              "ignored the request's logprobs); use --form echo, or another server")
        return choices


class LogprobTokenIds(Form):
    """vLLM: ``logprob_token_ids`` on ``/v1/completions`` (the top tokens are a :class:`TopLogprobs` request)."""

    name, route = "logprob_token_ids", "/v1/completions"

    def payload(self, prompts, *, temperature=None, top=False, only=None, whole=False):
        return {"model": self.model, "prompt": _one_or_list(prompts), "max_tokens": 1, "logprobs": 1,
                "logprob_token_ids": self.answers, "return_tokens_as_token_ids": True,
                **self.sampling(temperature), **self.extra}

    def parse(self, data, prompts, *, top=False, only=None, whole=False, shown="the endpoint"):
        out = []
        for choice in self.choices(data, len(prompts), shown):
            got = choice["logprobs"].get("top_logprobs") or [None]
            found = {_token_id(k, self.vocab): _finite(v) for k, v in (got[0] or {}).items()}
            missing = [a for a in self.answers if a not in found]
            if missing:
                raise ServedError(f"the server at {shown} did not return logprob_token_ids {missing}: it does not "
                                  "support logprob_token_ids (vLLM 0.2x before 2026-05); use --form echo")
            out.append(Reading({a: found[a] for a in self.answers}))
        return out


class TokenIdsLogprob(Form):
    """SGLang: ``token_ids_logprob`` and ``top_logprobs_num`` on ``/generate`` (a list of prompts per request)."""

    name, route = "token_ids_logprob", "/generate"

    def payload(self, prompts, *, temperature=None, top=False, only=None, whole=False):
        return {"input_ids": _one_or_list(prompts), "return_logprob": True, "logprob_start_len": -1,
                "top_logprobs_num": self.top, "token_ids_logprob": self.answers,
                "sampling_params": {"max_new_tokens": 1, **self.sampling(temperature)}, **self.extra}

    def parse(self, data, prompts, *, top=False, only=None, whole=False, shown="the endpoint"):
        answers = data if isinstance(data, list) else [data]
        if len(answers) != len(prompts):
            raise ServedError(f"the server at {shown} gave {len(answers)} answer(s) on /generate for {len(prompts)} "
                              "prompt(s): not an SGLang server that takes a batch of input_ids; use --form echo")
        out = []
        for one in answers:
            meta = (one or {}).get("meta_info") or {}
            try:
                chosen = meta["output_token_ids_logprobs"][0]
                ranked = meta.get("output_top_logprobs", [[]])[0] or []
            except (KeyError, IndexError, TypeError):
                raise ServedError(f"the server at {shown} gave no output_token_ids_logprobs on /generate: not an "
                                  "SGLang server that supports token_ids_logprob; use --form echo") from None
            found = {int(row[1]): _finite(row[0]) for row in chosen}
            out.append(Reading({a: found[a] for a in self.answers if a in found},
                               top=[(int(row[1]), _finite(row[0])) for row in ranked]))
        return out


class NProbs(Form):
    """llama.cpp: ``n_probs`` on ``/completion``: the top tokens of the full softmax, before any sampler."""

    name, route = "n_probs", "/completion"
    batched = False  # its parallel slots are decoded in one batch, which moves a prompt's numbers

    def payload(self, prompts, *, temperature=None, top=False, only=None, whole=False):
        [ids] = prompts
        n_probs = self.vocab_size if whole and self.vocab_size else self.top
        return {"prompt": ids, "n_predict": 1, "n_probs": n_probs, "post_sampling_probs": False,
                **self.sampling(temperature), **self.extra}

    def parse(self, data, prompts, *, top=False, only=None, whole=False, shown="the endpoint"):
        n_probs = self.vocab_size if whole and self.vocab_size else self.top
        try:
            step = data["completion_probabilities"][0]
        except (KeyError, IndexError, TypeError):
            raise ServedError(f"the server at {shown} gave no completion_probabilities on /completion: not a "
                              "llama.cpp server with n_probs; use --form echo") from None
        rows = step.get("top_logprobs")
        if rows is not None:
            ranked = [(int(r["id"]), _finite(r["logprob"])) for r in rows]
        else:  # older servers: probabilities, not logs
            ranked = [(int(r["id"]), math.log(r["prob"]) if r["prob"] > 0 else -math.inf) for r in step["probs"]]
        ranked.sort(key=lambda t: -t[1])
        found = dict(ranked)
        # fewer than asked, or all of it: the whole vocabulary was listed, every unlisted token has probability 0
        listed_all = len(ranked) < n_probs or (self.vocab_size is not None and len(ranked) >= self.vocab_size)
        floor = None if listed_all else ranked[-1][1]
        return [Reading({a: found[a] for a in self.answers if a in found}, top=ranked[: max(self.top, 10)],
                        floor=floor)]

    def incomplete(self, reading):
        # an answer token below the top n_probs: ask for the whole vocabulary (exact, for this prompt only;
        # SmolLM2: 4.7 MB and 0.6 s, against 91 kB and 0.02 s for the top 1000)
        return bool(self.vocab_size) and reading.floor is not None and any(a not in reading.logp
                                                                           for a in self.answers)


class Echo(Form):
    """``echo`` on ``/v1/completions``: each prompt plus each answer token, its log-probability read back as a prompt
    log-probability. Every (prompt, answer token) pair is one sequence of the request's ``prompt`` list."""

    name, route = "echo", "/v1/completions"

    def sequences(self, prompts, only) -> list[tuple[int, int]]:
        """``(prompt index, answer token)`` of each sequence the request carries, in order."""
        answers = self.answers if only is None else list(only)
        return [(i, a) for i in range(len(prompts)) for a in answers]

    def payload(self, prompts, *, temperature=None, top=False, only=None, whole=False):
        seqs = self.sequences(prompts, only)
        return {"model": self.model, "prompt": _one_or_list([[*prompts[i], a] for i, a in seqs]), "max_tokens": 1,
                "echo": True, "logprobs": self.top if top else 1, "return_tokens_as_token_ids": True,
                **self.sampling(temperature), **self.extra}

    def parse(self, data, prompts, *, top=False, only=None, whole=False, shown="the endpoint"):
        seqs = self.sequences(prompts, only)
        readings = [Reading({}) for _ in prompts]
        for (i, answer), choice in zip(seqs, self.choices(data, len(seqs), shown), strict=True):
            got, n = choice["logprobs"], len(prompts[i])
            values = got.get("token_logprobs") or []
            if len(values) <= n or values[n] is None:
                raise ServedError(f"the server at {shown} did not echo the prompt's log-probabilities on "
                                  f"{self.route} (llama.cpp ignores echo: use --form n_probs)")
            tokens = got.get("tokens") or []
            if len(tokens) > n and _token_id(tokens[n], None) not in (None, answer):
                raise ServedError(f"the server at {shown} echoed token {tokens[n]!r} where the answer token {answer} "
                                  "was sent: it re-tokenized the prompt")
            readings[i].logp[answer] = _finite(values[n])
            if top and not readings[i].top:
                readings[i].top = _ranked((got.get("top_logprobs") or [None] * (n + 1))[n], self.vocab)
        return readings


class TopLogprobs(Form):
    """``logprobs=k`` on ``/v1/completions``: the top k only, so an unlisted answer token is a bound."""

    name, route = "top_logprobs", "/v1/completions"

    def payload(self, prompts, *, temperature=None, top=False, only=None, whole=False):
        return {"model": self.model, "prompt": _one_or_list(prompts), "max_tokens": 1, "logprobs": self.top,
                "return_tokens_as_token_ids": True, **self.sampling(temperature), **self.extra}

    def parse(self, data, prompts, *, top=False, only=None, whole=False, shown="the endpoint"):
        out = []
        for choice in self.choices(data, len(prompts), shown):
            ranked = _ranked((choice["logprobs"].get("top_logprobs") or [None])[0], self.vocab)
            found = {k: v for k, v in ranked if isinstance(k, int)}
            floor = ranked[-1][1] if ranked else -math.inf
            out.append(Reading({a: found[a] for a in self.answers if a in found}, top=ranked, floor=floor))
        return out


FORM_CLASSES = {cls.name: cls for cls in (LogprobTokenIds, TokenIdsLogprob, NProbs, Echo, TopLogprobs)}
