"""The LLM side of ``prepare`` and ``validate``: chat requests for rewrites and judgements, on the shared client.

The key, its scrubbing, the retries and the one-line failures are :mod:`tinymcf_callback.apiclient`'s. This module owns
what is particular to asking an LLM for JSON: one chat request (JSON mode, dropped for an endpoint that has none),
strict parsing of the answer, re-asking and falling back to a second model (:func:`ask_json`), and a bounded thread
pool with a progress bar (:func:`run_pool`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

from ..apiclient import PREPARE_KEYS, ApiClient, ApiError, Cancelled, find_key
from ..errors import PrepareError

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
DEFAULT_MODEL = "openai/gpt-4o-mini"
KEY_VARS = PREPARE_KEYS

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


# --------------------------------------------------------------------------- the key


def find_api_key(environ: dict | None = None, cwd: str | os.PathLike | None = None) -> tuple[str | None, str | None]:
    """``(key, where)``: the first of ``KEY_VARS`` set in the environment, else in ``./.env``."""
    return find_key(KEY_VARS, environ, dotenv=cwd if cwd is not None else os.getcwd())


def no_key_message(what: str) -> str:
    return (
        f"no API key: {what}. Set {' or '.join(KEY_VARS)} in the environment or in a .env file in the "
        f"current directory (KEY=VALUE lines). The shipped cache already covers the built-in sets "
        f"(scifi, clifford), which need no key; use --dry-run to see what would be requested."
    )


# --------------------------------------------------------------------------- one request


@dataclass
class Answer:
    model: str
    content: str | None
    refusal: str | None = None
    finish_reason: str | None = None


class ChatClient:
    """Chat requests to one endpoint, through :class:`~tinymcf_callback.apiclient.ApiClient` (its retries of rate
    limits, server errors, timeouts and dropped connections); a rejected key or an unknown model raises
    :class:`FatalLLMError`."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0, retries: int = 5,
                 backoff: float = 1.0, max_backoff: float = 30.0, json_mode: bool = True,
                 temperature: float | None = 0.7, cancel: threading.Event | None = None):
        self.api = ApiClient(base_url, api_key, timeout=timeout, retries=retries, backoff=backoff,
                             max_backoff=max_backoff, cancel=cancel)
        self.base_url = base_url
        self.json_mode = json_mode
        self.temperature = temperature

    @property
    def cancel(self) -> threading.Event:
        """The event that stops the work (and its waits) when set: Ctrl-C, or a fatal answer."""
        return self.api.cancel

    def chat(self, model: str, messages: list[dict]) -> Answer:
        while True:
            kwargs: dict = {"model": model, "messages": messages}
            if self.temperature is not None:
                kwargs["temperature"] = self.temperature
            if self.json_mode:
                kwargs["response_format"] = {"type": "json_object"}
            try:
                resp = self.api.call("/chat/completions", lambda c, kw=kwargs: c.chat.completions.create(**kw))
            except ApiError as e:
                if e.kind == "status" and e.status == 400 and self.json_mode and "response_format" in e.detail.lower():
                    self.json_mode = False  # the endpoint has no JSON mode: ask in the prompt only
                    continue
                raise self._failure(e, model) from None
            choices = getattr(resp, "choices", None) or []
            if not choices:
                return Answer(model, None, None, None)
            msg = choices[0].message
            return Answer(model, getattr(msg, "content", None), getattr(msg, "refusal", None),
                          getattr(choices[0], "finish_reason", None))

    def _failure(self, e: ApiError, model: str) -> Exception:
        """The error for the caller: a :class:`FatalLLMError` for what no retry or other item can fix, else one
        :class:`ItemFailed`."""
        unknown = (f"the endpoint {self.base_url} does not know the model {model!r} ({e.status}: {e.detail}). "
                   f"Check --model / --fallback-model / --judge-model and --base-url.")
        if e.kind == "status" and (e.status == 404 or (e.status == 400 and _MODEL_MISSING_RE.search(e.detail))):
            return FatalLLMError(unknown)
        if e.kind == "status" and e.status in (401, 403):
            return FatalLLMError(f"the endpoint {self.base_url} rejected the API key ({e.status}: {e.detail})")
        if e.kind == "status" and e.status == 400:
            return ItemFailed(f"{model}: request rejected (400: {e.detail})")
        if e.retryable:
            return ItemFailed(f"{model}: {e.reason}, gave up after {e.tries} tries")
        return ItemFailed(f"{model}: request failed ({e.status}: {e.detail})")


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
    """Ask ``models`` in turn until an answer passes ``check`` (``obj -> (value, problems)``); ``(value, model)``.

    ``build(feedback)`` makes the messages, ``feedback`` being None or this model's ``(previous answer, problems)`` so
    far. An answer that breaks the rules is re-asked up to ``attempts`` times per model; a refusal or an unparseable
    answer goes straight to the next model. :class:`ItemFailed` names each model's last reason."""
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
