"""How each server is asked for the answer position's log-probabilities: one request form per server.

Every form sends the prompt as the token ids of the local tokenizer's chat template (the server
never re-tokenizes) and returns a :class:`Reading` of the next position: the log-probability of
each answer token it read, the top tokens when the form gives them, and, for a top-k form, the
``floor`` (the k-th token's log-probability, the most any token it did not list can have).

``logprob_token_ids``  vLLM ``/v1/completions``: the answer ids' log-probabilities, read straight
                       off the full softmax (exact; one request per prompt).
``token_ids_logprob``  SGLang ``/generate``: the same, with the top tokens beside them (exact).
``n_probs``            llama.cpp ``/completion``: the top ``n_probs`` (1000) tokens of the full-vocabulary
                       softmax, before any sampler; a prompt with an answer token below them is asked
                       again for the whole vocabulary (exact).
``echo``               ``/v1/completions`` with ``echo`` and ``logprobs``: the prompt plus one answer
                       token, read back as a prompt log-probability (lm-evaluation-harness's
                       ``local-completions`` form); exact, one request per answer token.
``top_logprobs``       ``/v1/completions`` with ``logprobs=k`` only: a bound (what hosted APIs allow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ServedError

FORMS = ("logprob_token_ids", "token_ids_logprob", "n_probs", "echo", "top_logprobs")
EXACT = {"logprob_token_ids": True, "token_ids_logprob": True, "n_probs": True, "echo": True, "top_logprobs": False}
FLOOR_CAP = -9999.0  # vLLM writes -inf as -9999.0


@dataclass
class Reading:
    """The next position of one prompt as one form read it."""

    logp: dict[int, float]  # answer token id -> log-probability, for the answer tokens read
    # (token id, log-probability), likeliest first; the id is the token's text where the server gave only that
    top: list[tuple[int | str, float]] = field(default_factory=list)
    floor: float | None = None  # top-k forms: the k-th log-probability (an unread token has at most this)
    requests: int = 1


def sampling(temperature: float = 1.0) -> dict:
    """Neutral sampling settings, so a server that returns processed log-probabilities changes none."""
    return {"temperature": temperature, "top_p": 1.0}


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


def _choice_logprobs(data, route: str, shown: str) -> dict:
    try:
        logprobs = data["choices"][0]["logprobs"]
    except (KeyError, IndexError, TypeError):
        logprobs = None
    if not isinstance(logprobs, dict):
        raise ServedError(f"the server at {shown} gave no logprobs on {route}: it does not return log-probabilities "
                          "(or ignored the request's logprobs)")
    return logprobs


class Form:
    """One request form: :meth:`read` sends what it needs for one prompt and returns its :class:`Reading`."""

    name = ""
    route = ""

    def __init__(self, client, model: str, sides: tuple[list[int], list[int]], *, top: int = 10,
                 vocab: dict[str, int] | None = None, vocab_size: int | None = None, extra: dict | None = None):
        self.client, self.model, self.top, self.vocab, self.extra = client, model, top, vocab, dict(extra or {})
        self.sides, self.answers, self.vocab_size = sides, [*sides[0], *sides[1]], vocab_size

    def read(self, ids: list[int], *, temperature: float = 1.0, top: bool = False,
             only: list[int] | None = None) -> Reading:
        """The next position after ``ids``; ``only``: the answer tokens to read, where a form reads them one by one."""
        raise NotImplementedError

    @property
    def exact(self) -> bool:
        return EXACT[self.name]


class LogprobTokenIds(Form):
    """vLLM: ``logprob_token_ids`` on ``/v1/completions`` (the top tokens need a second request: ``top=True``)."""

    name, route = "logprob_token_ids", "/v1/completions"

    def read(self, ids, *, temperature=1.0, top=False, only=None):
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "logprobs": 1, "logprob_token_ids": self.answers,
                "return_tokens_as_token_ids": True, **sampling(temperature), **self.extra}
        data = self.client.post(self.route, body)
        got = _choice_logprobs(data, self.route, self.client.shown).get("top_logprobs") or [None]
        found = {_token_id(k, self.vocab): _finite(v) for k, v in (got[0] or {}).items()}
        missing = [a for a in self.answers if a not in found]
        if missing:
            raise ServedError(f"the server at {self.client.shown} did not return logprob_token_ids {missing}: it "
                              "does not support logprob_token_ids (vLLM 0.2x before 2026-05); use --form echo")
        reading = Reading({a: found[a] for a in self.answers})
        if top:
            body = {"model": self.model, "prompt": ids, "max_tokens": 1, "logprobs": self.top,
                    "return_tokens_as_token_ids": True, **sampling(temperature), **self.extra}
            got = _choice_logprobs(self.client.post(self.route, body), self.route, self.client.shown)
            reading.top = _ranked(got.get("top_logprobs") or [None], self.vocab)
            reading.requests += 1
        return reading


class TokenIdsLogprob(Form):
    """SGLang: ``token_ids_logprob`` and ``top_logprobs_num`` on ``/generate``."""

    name, route = "token_ids_logprob", "/generate"

    def read(self, ids, *, temperature=1.0, top=False, only=None):
        body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": -1, "top_logprobs_num": self.top,
                "token_ids_logprob": self.answers,
                "sampling_params": {"max_new_tokens": 1, **sampling(temperature), "top_k": -1}}
        data = self.client.post(self.route, body)
        if isinstance(data, list):
            data = data[0] if data else {}
        meta = (data or {}).get("meta_info") or {}
        try:
            chosen = meta["output_token_ids_logprobs"][0]
            ranked = meta.get("output_top_logprobs", [[]])[0] or []
        except (KeyError, IndexError, TypeError):
            raise ServedError(f"the server at {self.client.shown} gave no output_token_ids_logprobs on /generate: "
                              "not an SGLang server that supports token_ids_logprob; use --form echo") from None
        found = {int(row[1]): _finite(row[0]) for row in chosen}
        return Reading({a: found[a] for a in self.answers if a in found},
                       top=[(int(row[1]), _finite(row[0])) for row in ranked])


class NProbs(Form):
    """llama.cpp: ``n_probs`` on ``/completion``: the top tokens of the full softmax, before any sampler."""

    name, route = "n_probs", "/completion"

    def read(self, ids, *, temperature=1.0, top=False, only=None):
        reading = self._read(ids, temperature, self.top)
        if self.vocab_size and reading.floor is not None and any(a not in reading.logp for a in self.answers):
            # an answer token below the top n_probs: ask for the whole vocabulary (exact, for this prompt only;
            # SmolLM2: 4.7 MB and 0.6 s, against 91 kB and 0.02 s for the top 1000)
            reading = self._read(ids, temperature, self.vocab_size)
            reading.requests = 2
        return reading

    def _read(self, ids, temperature, n_probs):
        body = {"prompt": ids, "n_predict": 1, "n_probs": n_probs, "post_sampling_probs": False,
                "temperature": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0, **self.extra}
        data = self.client.post(self.route, body)
        try:
            step = data["completion_probabilities"][0]
        except (KeyError, IndexError, TypeError):
            raise ServedError(f"the server at {self.client.shown} gave no completion_probabilities on /completion: "
                              "not a llama.cpp server with n_probs; use --form echo") from None
        rows = step.get("top_logprobs")
        if rows is not None:
            ranked = [(int(r["id"]), _finite(r["logprob"])) for r in rows]
        else:  # older servers: probabilities, not logs
            ranked = [(int(r["id"]), math.log(r["prob"]) if r["prob"] > 0 else -math.inf) for r in step["probs"]]
        ranked.sort(key=lambda t: -t[1])
        found = dict(ranked)
        # fewer than asked, or all of it: the whole vocabulary was listed, every unlisted token has probability 0
        whole = len(ranked) < n_probs or (self.vocab_size is not None and len(ranked) >= self.vocab_size)
        floor = None if whole else ranked[-1][1]
        return Reading({a: found[a] for a in self.answers if a in found}, top=ranked[: max(self.top, 10)], floor=floor)


class Echo(Form):
    """``echo`` on ``/v1/completions``: the prompt plus each answer token, its log-probability read back."""

    name, route = "echo", "/v1/completions"

    def read(self, ids, *, temperature=1.0, top=False, only=None):
        logp, ranked = {}, []
        for n, answer in enumerate(self.answers if only is None else only):
            want_top = top and n == 0
            body = {"model": self.model, "prompt": [*ids, answer], "max_tokens": 1, "echo": True,
                    "logprobs": self.top if want_top else 1, "return_tokens_as_token_ids": True,
                    **sampling(temperature), **self.extra}
            got = _choice_logprobs(self.client.post(self.route, body), self.route, self.client.shown)
            values = got.get("token_logprobs") or []
            if len(values) <= len(ids) or values[len(ids)] is None:
                raise ServedError(f"the server at {self.client.shown} did not echo the prompt's log-probabilities "
                                  f"on {self.route} (llama.cpp ignores echo: use --form n_probs)")
            tokens = got.get("tokens") or []
            if len(tokens) > len(ids) and _token_id(tokens[len(ids)], None) not in (None, answer):
                raise ServedError(f"the server at {self.client.shown} echoed token {tokens[len(ids)]!r} where the "
                                  f"answer token {answer} was sent: it re-tokenized the prompt")
            logp[answer] = _finite(values[len(ids)])
            if want_top:
                ranked = _ranked([(got.get("top_logprobs") or [None] * (len(ids) + 1))[len(ids)]], self.vocab)
        return Reading(logp, top=ranked, requests=len(logp))


class TopLogprobs(Form):
    """``logprobs=k`` on ``/v1/completions``: the top k only, so an unlisted answer token is a bound."""

    name, route = "top_logprobs", "/v1/completions"

    def read(self, ids, *, temperature=1.0, top=False, only=None):
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "logprobs": self.top,
                "return_tokens_as_token_ids": True, **sampling(temperature), **self.extra}
        got = _choice_logprobs(self.client.post(self.route, body), self.route, self.client.shown)
        ranked = _ranked(got.get("top_logprobs") or [None], self.vocab)
        found = {k: v for k, v in ranked if isinstance(k, int)}
        floor = ranked[-1][1] if ranked else -math.inf
        return Reading({a: found[a] for a in self.answers if a in found}, top=ranked, floor=floor)


def _ranked(rows, vocab) -> list[tuple[int | str, float]]:
    pairs = [(_token_id(k, vocab), k, _finite(v)) for k, v in (rows[0] or {}).items()]
    return sorted([(k if i is None else i, v) for i, k, v in pairs], key=lambda t: -t[1])


FORM_CLASSES = {cls.name: cls for cls in (LogprobTokenIds, TokenIdsLogprob, NProbs, Echo, TopLogprobs)}
