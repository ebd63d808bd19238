"""One HTTP client layer for every OpenAI-compatible server the package talks to.

``prepare`` and ``validate`` ask an LLM API for rewrites and judgements; a served model (``--endpoint``) is an
inference server asked for log-probabilities. Both go through :class:`ApiClient`, so both follow the same rules: the
key (:func:`find_key`) is sent in the ``Authorization`` header only and scrubbed from every message, log line and
error (:func:`scrub`, :func:`known_secrets`); a request that may succeed later (a dropped connection, a timeout, 408,
409, 429, 5xx) is sent again with a jittered, capped exponential backoff, each retry logged and counted, the waits
spent on the client's ``cancel`` event (Ctrl-C ends them at once); a failure is one line (:class:`ApiError`). The
``openai`` package is the ``[api]`` extra; its own retry loop is off (``max_retries=0``): this one is the only one.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

from .errors import TinymcfError
from .extras import available, require

logger = logging.getLogger("tinymcf_callback")

# The key variables of each use, in the order they are read. A served model's key is never an LLM provider's
# (OPENROUTER_API_KEY is not sent to a local inference server), and prepare never sends TINYMCF_API_KEY.
PREPARE_KEYS = ("OPENROUTER_API_KEY", "OPENAI_API_KEY")
SERVED_KEYS = ("TINYMCF_API_KEY", "OPENAI_API_KEY")
ALL_KEYS = tuple(dict.fromkeys((*PREPARE_KEYS, *SERVED_KEYS)))
NO_KEY = "EMPTY"  # what vLLM's docs send to a server started without --api-key
RETRY_STATUSES = (408, 409, 429)  # and every 5xx
MESSAGE_CHARS = 300

T = TypeVar("T")


# ---- the key ----------------------------------------------------------------------------------------------------
def read_dotenv(path: str | os.PathLike) -> dict[str, str]:
    """``KEY=VALUE`` pairs of a ``.env`` file, parsed by python-dotenv (no change to ``os.environ``); ``{}`` when there
    is no file (python-dotenv not needed then)."""
    if not Path(path).is_file():
        return {}
    dotenv_values = require("dotenv").dotenv_values
    try:
        return {k: v for k, v in dotenv_values(path).items() if v is not None}
    except (OSError, UnicodeDecodeError):
        return {}


def find_key(variables: tuple[str, ...], environ=None, dotenv: str | os.PathLike | None = None
             ) -> tuple[str | None, str | None]:
    """``(key, where)``: the first of ``variables`` set in the environment (``where`` is ``$NAME``), else in the
    ``.env`` file of folder ``dotenv`` (``NAME in <file>``); ``(None, None)`` when none is."""
    environ = os.environ if environ is None else environ
    found = next(((environ[v].strip(), f"${v}") for v in variables if (environ.get(v) or "").strip()), None)
    if found is None and dotenv is not None:  # the file is read only when the environment has no key
        path = Path(dotenv) / ".env"
        values = read_dotenv(path)
        found = next(((values[v].strip(), f"{v} in {path}") for v in variables if (values.get(v) or "").strip()), None)
    return found or (None, None)


def known_secrets(environ=None, cwd: str | os.PathLike | None = None) -> list[str]:
    """Every key value this process could send (any use's variables, in the environment or ``./.env``), so that no
    message can show one. The ``.env`` file is read only where python-dotenv is installed: without it no key can
    come from there."""
    environ = os.environ if environ is None else environ
    values = [environ.get(v) for v in ALL_KEYS]
    if available("dotenv"):
        dot = read_dotenv(Path(cwd if cwd is not None else Path.cwd()) / ".env")
        values += [dot.get(v) for v in ALL_KEYS]
    return [v.strip() for v in values if v and v.strip()]


def scrub(text, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret (of 4 characters or more) replaced by ``***``."""
    text = str(text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def split_url(url: str, option: str = "--endpoint") -> tuple[str, str]:
    """``(root, shown)``: a server's root (``http://host:port``, a trailing ``/v1`` dropped) and it without any
    ``user:password``; a bad URL is a :class:`ApiError` naming ``option``."""
    if not isinstance(url, str) or not url.strip():
        raise ApiError(f"{option} must be the server's URL (http://host:port), got {url!r}", kind="url")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ApiError(f"{option} {url!r} is not an http(s) URL: give the server's address, e.g. "
                       "http://127.0.0.1:8000", kind="url")
    root = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/").removesuffix("/v1"), "", "")).rstrip("/")
    return root, _without_password(root)


# ---- what went wrong ---------------------------------------------------------------------------------------------
class ApiError(TinymcfError):
    """A request that did not succeed: ``kind`` is ``connection``, ``timeout``, ``status`` (the server answered
    ``status``), ``cancelled`` or ``url``; ``detail`` is the server's own words (scrubbed, one line), ``tries`` how
    many times it was sent, ``route`` where. The message says all of it in one line."""

    def __init__(self, message: str, *, kind: str, status: int | None = None, detail: str = "", tries: int = 0,
                 route: str = "", retry_after: float | None = None):
        super().__init__(message)
        self.kind, self.status, self.detail, self.tries, self.route = kind, status, detail, tries, route
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """Whether sending it again may succeed (the server is away for a moment, busy or overloaded)."""
        return self.kind in ("connection", "timeout") or (self.kind == "status" and self.status is not None and (
            self.status >= 500 or self.status in RETRY_STATUSES))

    @property
    def reason(self) -> str:
        """The failure in a few words: ``timed out``, ``rate limited (429)``, ``server error (503)``, ..."""
        if self.kind == "timeout":
            return "timed out"
        if self.kind == "connection":
            return f"connection failed ({self.detail})" if self.detail else "connection failed"
        if self.kind == "cancelled":
            return "cancelled"
        if self.status == 429:
            return "rate limited (429)"
        if self.retryable:
            return f"server error ({self.status})"
        return f"refused ({self.status}: {self.detail})"


class Cancelled(Exception):
    """The client's ``cancel`` event was set (Ctrl-C, or the run stopping): pending work stops quietly."""


# ---- the client ------------------------------------------------------------------------------------------------
class ApiClient:
    """Requests to one OpenAI-compatible server through the real ``openai`` client, with this module's rules.

    Args:
        base_url: the server's OpenAI base (``https://openrouter.ai/api/v1``, ``http://127.0.0.1:8000/v1``).
        key: the API key (``None``: the server needs none; ``EMPTY`` is sent).
        timeout: seconds per request; retries: how many times a retryable failure is sent again;
        backoff, max_backoff: the first wait (doubling) and the longest one, in seconds;
        cancel: an event that ends the waits (and the client's work) when set; it is also the client's clock.
        name: how messages and log lines name the server (default: the base URL without any password).
        retry_timeouts: send a request that timed out again (an inference server that is slow only gets slower
            with the same request sent twice: a served model's client does not).
    """

    def __init__(self, base_url: str, key: str | None, *, timeout: float = 60.0, retries: int = 4,
                 backoff: float = 0.5, max_backoff: float = 8.0, cancel: threading.Event | None = None,
                 name: str | None = None, secrets: Iterable[str] = (), retry_timeouts: bool = True):
        openai = require("openai")
        self._openai = openai
        self.base_url = base_url.rstrip("/")
        self.root = self.base_url.removesuffix("/v1")
        self.name = name or _without_password(self.base_url)
        self._key = key or NO_KEY
        self._secrets = [s for s in (key, *secrets) if s]
        self.timeout, self.retries = float(timeout), max(0, int(retries))
        self.backoff, self.max_backoff = max(0.0, float(backoff)), float(max_backoff)
        self.retry_timeouts = retry_timeouts
        self.cancel = cancel or threading.Event()
        self._client = openai.OpenAI(base_url=self.base_url, api_key=self._key, max_retries=0, timeout=self.timeout)
        self._lock = threading.Lock()
        self.requests = 0  # requests answered
        self.retried = 0  # requests sent again after a retryable failure

    # ---- scrubbing --------------------------------------------------------------------------------------------
    def scrub(self, text) -> str:
        """``text`` on one line, without the key, cut to a readable length."""
        text = scrub(" ".join(str(text).split()), self._secrets)
        return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 3] + "..."

    # ---- sending ----------------------------------------------------------------------------------------------
    def call(self, route: str, send: Callable[[object], T], *, retries: int | None = None) -> T:
        """``send(openai_client)`` with this client's retries; its result, or :class:`ApiError` (:class:`Cancelled`
        when the cancel event is set). ``route`` names the request in messages; ``retries`` overrides the
        client's for this request (0: the first answer is final)."""
        retries = self.retries if retries is None else max(0, int(retries))
        tries = 0
        while True:
            if self.cancel.is_set():
                raise Cancelled()
            tries += 1
            try:
                out = send(self._client)
            except Exception as e:  # noqa: BLE001 - classified below; anything else is re-raised
                error = self._classify(e, route, tries)
                if error is None:
                    raise
                if not error.retryable or tries > retries or (error.kind == "timeout" and not self.retry_timeouts):
                    raise error from None
                wait = self._wait(tries - 1, error)
                with self._lock:
                    self.retried += 1
                logger.info("%s %s: %s; trying again in %.1f s (try %d of %d)", self.name, route, error.reason, wait,
                            tries + 1, retries + 1)
                if self.cancel.wait(wait):
                    raise Cancelled() from None
                continue
            with self._lock:
                self.requests += 1
            return out

    def post(self, route: str, body: dict, *, retries: int | None = None):
        """POST ``body`` to the server's ``route`` (``/v1/completions``, ``/generate``, ...): the parsed JSON."""
        url = f"{self.root}/{route.lstrip('/')}"
        return self.call(route, lambda c: c.post(url, cast_to=object, body=body), retries=retries)

    def get(self, route: str, *, retries: int | None = None):
        """GET the server's ``route``: the parsed JSON."""
        url = f"{self.root}/{route.lstrip('/')}"
        return self.call(route, lambda c: c.get(url, cast_to=object), retries=retries)

    def close(self) -> None:
        """Close the connections (requests in flight on other threads fail at once)."""
        self._client.close()

    # ---- what went wrong, and how long to wait ----------------------------------------------------------------
    def _classify(self, e: Exception, route: str, tries: int) -> ApiError | None:
        o = self._openai
        where = f"{self.name} {route}"
        if isinstance(e, o.APITimeoutError):
            return ApiError(f"{where} timed out after {self.timeout:g} s ({tries} tries)", kind="timeout",
                            tries=tries, route=route)
        if isinstance(e, o.APIConnectionError):
            detail = self.scrub(getattr(e, "__cause__", None) or e)
            return ApiError(f"{where}: connection failed after {tries} tries ({detail})", kind="connection",
                            detail=detail, tries=tries, route=route)
        if isinstance(e, o.APIStatusError):
            detail = self.scrub(getattr(e, "message", None) or e)
            return ApiError(f"{where} answered {e.status_code} after {tries} tries: {detail}", kind="status",
                            status=e.status_code, detail=detail, tries=tries, route=route,
                            retry_after=_retry_after(e))
        return None

    def _wait(self, n: int, error: ApiError) -> float:
        delay = min(self.max_backoff, self.backoff * (2 ** n)) * random.uniform(0.75, 1.0)
        if error.retry_after is not None and 0 <= error.retry_after <= self.max_backoff:
            delay = max(delay, error.retry_after)
        return delay


def _retry_after(e) -> float | None:
    headers = getattr(getattr(e, "response", None), "headers", None) or {}
    try:
        return float(headers.get("retry-after"))
    except (TypeError, ValueError):
        return None


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if not parts.hostname:
        return url
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")
