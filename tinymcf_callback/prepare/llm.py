"""A small wrapper around the ``openai`` client for ``prepare`` and ``validate``.

Any OpenAI-compatible endpoint works (OpenRouter by default). This module owns the
parts that are the same for rewriting and judging: finding the API key (environment or
``./.env``), keeping it out of every message, one chat request with retries and short
exponential backoff on rate limits, server errors and timeouts, strict parsing of the
JSON answer, re-asking when an answer breaks the rules, falling back to a second model
on refusals and unparseable answers, and a bounded thread pool with a progress bar.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from ..errors import PrepareError
from ..extras import require

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
DEFAULT_MODEL = "openai/gpt-4o-mini"
KEY_VARS = ("OPENROUTER_API_KEY", "OPENAI_API_KEY")

_REFUSAL_RE = re.compile(
    r"\b(i\s*(?:can(?:'|’)?t|cannot|can not|won(?:'|’)?t|will not|am unable|'m unable|’m unable|am not able)"
    r"|i(?:'|’)m sorry|sorry,|as an ai|i must decline|unable to (?:help|assist|comply))",
    re.IGNORECASE,
)
_FENCE_RE = re.compile(r"^```(?:json|JSON)?[ \t]*\n(.*)\n```$", re.DOTALL)
_MODEL_MISSING_RE = re.compile(r"model.*(not found|does not exist|not a valid|invalid|unknown)|no such model", re.I)


class FatalLLMError(PrepareError):
    """The endpoint cannot serve this run at all (rejected key, unknown model): stop everything."""


class ItemFailed(Exception):
    """One request gave no usable answer; ``reason`` says why. Never cached."""


class Cancelled(Exception):
    """The run was interrupted; pending work stops quietly."""


# --------------------------------------------------------------------------- the key


def read_dotenv(path: str | os.PathLike) -> dict[str, str]:
    """``KEY=VALUE`` pairs of a ``.env`` file, parsed by python-dotenv (no change to ``os.environ``).

    No file, no dotenv needed: ``{}``. A file without python-dotenv (the ``[prepare]`` extra) is
    :class:`~tinymcf_callback.errors.MissingExtraError`.
    """
    if not Path(path).is_file():
        return {}
    dotenv_values = require("dotenv").dotenv_values
    try:
        return {k: v for k, v in dotenv_values(path).items() if v is not None}
    except (OSError, UnicodeDecodeError):
        return {}


def find_api_key(environ: dict | None = None, cwd: str | os.PathLike | None = None) -> tuple[str | None, str | None]:
    """``(key, where)``: the first of ``KEY_VARS`` set in the environment, else in ``./.env``."""
    environ = os.environ if environ is None else environ
    for var in KEY_VARS:
        if environ.get(var, "").strip():
            return environ[var].strip(), f"${var}"
    dotenv = Path(cwd if cwd is not None else Path.cwd()) / ".env"
    values = read_dotenv(dotenv)
    for var in KEY_VARS:
        if values.get(var, "").strip():
            return values[var].strip(), f"{var} in {dotenv}"
    return None, None


def no_key_message(what: str) -> str:
    return (
        f"no API key: {what}. Set {' or '.join(KEY_VARS)} in the environment or in a .env file in the "
        f"current directory (KEY=VALUE lines). The shipped cache already covers the built-in sets "
        f"(scifi, clifford), which need no key; use --dry-run to see what would be requested."
    )


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret replaced by ``***``."""
    text = str(text)
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "***")
    return text


# --------------------------------------------------------------------------- one request


@dataclass
class Answer:
    model: str
    content: str | None
    refusal: str | None = None
    finish_reason: str | None = None


class ChatClient:
    """The real ``openai.OpenAI`` client, with our own retry loop (its built-in one is off).

    Rate limits (429), server errors (5xx), timeouts and dropped connections are retried
    ``retries`` times with backoff ``backoff * 2**n`` seconds (jittered, at most
    ``max_backoff``; a ``Retry-After`` header wins when shorter than ``max_backoff``).
    A rejected key or an unknown model raises :class:`FatalLLMError`.
    """

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0, retries: int = 5,
                 backoff: float = 1.0, max_backoff: float = 30.0, json_mode: bool = True,
                 temperature: float | None = 0.7, cancel: threading.Event | None = None):
        self._openai = require("openai")
        self.base_url = base_url
        self._secret = api_key
        self.retries = max(0, int(retries))
        self.backoff = max(0.0, float(backoff))
        self.max_backoff = max_backoff
        self.json_mode = json_mode
        self.temperature = temperature
        self.cancel = cancel or threading.Event()
        self._client = self._openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout)

    def _msg(self, e: Exception) -> str:
        text = getattr(e, "message", None) or str(e) or type(e).__name__
        return scrub(" ".join(str(text).split())[:300], [self._secret])

    def _delay(self, n: int, e: Exception) -> float:
        delay = min(self.max_backoff, self.backoff * (2 ** n)) * random.uniform(0.75, 1.0)
        response = getattr(e, "response", None)
        headers = getattr(response, "headers", None) or {}
        try:
            after = float(headers.get("retry-after"))
        except (TypeError, ValueError):
            after = None
        if after is not None and 0 <= after <= self.max_backoff:
            delay = max(delay, after)
        return delay

    def chat(self, model: str, messages: list[dict]) -> Answer:
        o = self._openai
        last = "no answer"
        err: Exception | None = None
        n = 0
        while True:
            if self.cancel.is_set():
                raise Cancelled()
            kwargs: dict = {"model": model, "messages": messages}
            if self.temperature is not None:
                kwargs["temperature"] = self.temperature
            if self.json_mode:
                kwargs["response_format"] = {"type": "json_object"}
            try:
                resp = self._client.chat.completions.create(**kwargs)
            except o.NotFoundError as e:
                raise FatalLLMError(
                    f"the endpoint {self.base_url} does not know the model {model!r} (404: {self._msg(e)}). "
                    f"Check --model / --fallback-model / --judge-model and --base-url."
                ) from None
            except (o.AuthenticationError, o.PermissionDeniedError) as e:
                raise FatalLLMError(
                    f"the endpoint {self.base_url} rejected the API key ({e.status_code}: {self._msg(e)})"
                ) from None
            except o.BadRequestError as e:
                text = self._msg(e)
                if self.json_mode and "response_format" in text.lower():
                    self.json_mode = False  # the endpoint has no JSON mode: ask in the prompt only
                    continue
                if _MODEL_MISSING_RE.search(text):
                    raise FatalLLMError(
                        f"the endpoint {self.base_url} does not know the model {model!r} (400: {text}). "
                        f"Check --model / --fallback-model / --judge-model and --base-url."
                    ) from None
                raise ItemFailed(f"{model}: request rejected (400: {text})") from None
            except (o.RateLimitError, o.InternalServerError, o.APITimeoutError, o.APIConnectionError) as e:
                kind = {o.RateLimitError: "rate limited (429)", o.APITimeoutError: "timed out"}.get(type(e))
                if kind is None:
                    status = getattr(e, "status_code", None)
                    kind = f"server error ({status})" if status else f"connection failed ({self._msg(e)})"
                last, err = kind, e
            except o.APIStatusError as e:
                if e.status_code >= 500 or e.status_code in (408, 409):
                    last, err = f"server error ({e.status_code})", e
                else:
                    raise ItemFailed(f"{model}: request failed ({e.status_code}: {self._msg(e)})") from None
            else:
                choices = getattr(resp, "choices", None) or []
                if not choices:
                    return Answer(model, None, None, None)
                msg = choices[0].message
                return Answer(model, getattr(msg, "content", None), getattr(msg, "refusal", None),
                              getattr(choices[0], "finish_reason", None))
            if n >= self.retries:
                raise ItemFailed(f"{model}: {last}, gave up after {n + 1} tries")
            if self.cancel.wait(self._delay(n, err)):
                raise Cancelled()
            n += 1


def parse_json_answer(answer: Answer) -> tuple[dict | None, str | None]:
    """``(object, None)`` for a JSON object answer, else ``(None, reason)``; no guessing inside prose."""
    if answer.refusal:
        return None, f"refused ({_short(answer.refusal)})"
    content = (answer.content or "").strip()
    if not content:
        why = f" (finish_reason {answer.finish_reason})" if answer.finish_reason not in (None, "stop") else ""
        return None, f"empty answer{why}"
    m = _FENCE_RE.match(content)
    if m:
        content = m.group(1).strip()
    try:
        obj = json.loads(content)
    except json.JSONDecodeError:
        if _REFUSAL_RE.search(content) and not content.lstrip().startswith("{"):
            return None, f"refused ({_short(content)})"
        return None, f"unparseable answer, not JSON ({_short(content)})"
    if not isinstance(obj, dict):
        return None, f"unparseable answer, JSON {type(obj).__name__} instead of an object"
    return obj, None


def _short(text: str, n: int = 80) -> str:
    text = " ".join(str(text).split())
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def ask_json(client: ChatClient, models: list[str], build: Callable[[list | None], list[dict]],
             check: Callable[[dict], tuple[object, list[str]]], attempts: int = 3) -> tuple[object, str]:
    """Ask ``models`` in turn until an answer passes ``check``; ``(value, model)``.

    ``build(feedback)`` makes the messages; ``feedback`` is ``None`` or the list of
    ``(previous answer, problems)`` of this model so far. ``check(obj)`` returns
    ``(value, problems)``. An answer that breaks the rules is re-asked up to ``attempts``
    times per model; a refusal, an unparseable answer or exhausted retries go straight
    to the next model. Raises :class:`ItemFailed` with every model's last reason.
    """
    reasons = []
    for model in models:
        feedback: list = []
        last = None
        for _ in range(max(1, attempts)):
            try:
                answer = client.chat(model, build(feedback or None))
            except ItemFailed as e:
                last = str(e)
                break
            obj, why = parse_json_answer(answer)
            if obj is None:
                last = f"{model}: {why}"
                break
            value, problems = check(obj)
            if not problems:
                return value, model
            last = f"{model}: breaks the rules after {len(feedback) + 1} attempt(s): {'; '.join(problems)}"
            feedback.append((answer.content, problems))
        reasons.append(last)
    raise ItemFailed(" | ".join(r for r in reasons if r))


# --------------------------------------------------------------------------- the pool


def run_pool(items: list, work: Callable, *, concurrency: int, cancel: threading.Event,
             on_result: Callable, desc: str = "", progress: bool | None = None) -> None:
    """Run ``work(item)`` for every item on at most ``concurrency`` threads.

    ``on_result(item, result_or_exception)`` runs in the worker, under a lock, the moment
    ``work`` returns, so every finished result is handled (written) at once, even one that
    completes while an interrupted run shuts down. A :class:`FatalLLMError`, an error in
    ``on_result`` or ``Ctrl-C`` sets ``cancel``, drops what has not started, and is re-raised.
    """
    from tqdm.auto import tqdm

    lock = threading.Lock()

    def task(item):
        try:
            res = work(item)
        except (ItemFailed, Cancelled) as e:
            res = e
        with lock:
            on_result(item, res)

    bar = tqdm(total=len(items), desc=desc, unit="req", disable=(None if progress is None else not progress),
               dynamic_ncols=True, leave=False)
    pool = ThreadPoolExecutor(max_workers=max(1, int(concurrency)), thread_name_prefix="tinymcf-llm")
    try:
        pending = {pool.submit(task, it) for it in items}
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                fut.result()  # re-raises a fatal error
                bar.update(1)
    except BaseException:
        cancel.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)
