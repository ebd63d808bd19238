"""The HTTP side of a served model: one ``openai`` client, its retries, and one clear line per failure.

Every request goes through the real ``openai`` client (``OpenAI.post`` for the servers' own routes,
``/completion`` of llama.cpp and ``/generate`` of SGLang, which lie outside ``/v1``). Its retry loop is
the library's: 408/409/429/5xx, timeouts and dropped connections are retried ``retries`` times with
exponential backoff and jitter (0.5 s doubling to 8 s, or the server's ``Retry-After``). Nothing is
cached: a reloaded model is read afresh at every request.

The API key comes from the environment (``TINYMCF_API_KEY``, else ``OPENAI_API_KEY``); a local server
needs none. It is sent in the ``Authorization`` header only: :meth:`ServerClient.scrub` takes it out
of every message, and it is never part of a report, a log line or a history line.
"""

from __future__ import annotations

import os
import threading
from urllib.parse import urlsplit, urlunsplit

from ..errors import MissingExtraError, ServedError

KEY_VARS = ("TINYMCF_API_KEY", "OPENAI_API_KEY")
NO_KEY = "EMPTY"  # what vLLM's docs send to a server started without --api-key


def api_key(environ=None) -> tuple[str, str | None]:
    """``(key, variable)``: the first of :data:`KEY_VARS` set, else ``("EMPTY", None)`` (a local server needs none)."""
    environ = os.environ if environ is None else environ
    for var in KEY_VARS:
        value = (environ.get(var) or "").strip()
        if value:
            return value, var
    return NO_KEY, None


def split_url(url: str) -> tuple[str, str]:
    """``(root, shown)``: the server's root (``http://host:port``, any ``/v1`` dropped), and it without user:pass."""
    if not isinstance(url, str) or not url.strip():
        raise ServedError(f"--endpoint must be the server's URL (http://host:port), got {url!r}")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServedError(f"--endpoint {url!r} is not an http(s) URL: give the server's address, e.g. "
                          "http://127.0.0.1:8000")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    root = urlunsplit((parts.scheme, parts.netloc, path, "", "")).rstrip("/")
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    shown = urlunsplit((parts.scheme, netloc, path, "", "")).rstrip("/")
    return root, shown


class ServerClient:
    """Requests to one server: ``post(route, body)`` and ``get(route)`` return the parsed JSON.

    ``retries``: how many times the ``openai`` client retries a request that may succeed later;
    ``timeout``: seconds per request. A request that cannot succeed raises :class:`ServedError`
    with one line (the server, the route, what went wrong and what to do), never the key.
    ``count`` holds the requests answered and ``retried`` the ones that needed a retry.
    """

    def __init__(self, url: str, *, timeout: float = 60.0, retries: int = 4, environ=None):
        try:
            import openai
        except ImportError:
            raise MissingExtraError("scoring a served model (--endpoint) needs the openai package, part of the "
                                    "[served] extra: pip install 'tinymcf_callback[served]'") from None
        self.root, self.shown = split_url(url)
        self._key, self.key_source = api_key(environ)
        self.timeout, self.retries = float(timeout), int(retries)
        self._openai = openai
        # base_url is /v1 (where the OpenAI routes live); the servers' own routes are passed as full URLs
        self._client = openai.OpenAI(base_url=f"{self.root}/v1", api_key=self._key, max_retries=self.retries,
                                     timeout=self.timeout)
        self._lock = threading.Lock()
        self.count = 0

    def scrub(self, text) -> str:
        text = " ".join(str(text).split())
        if self._key and self._key != NO_KEY and len(self._key) >= 4:
            text = text.replace(self._key, "***")
        return text[:300]

    def _url(self, route: str) -> str:
        return f"{self.root}/{route.lstrip('/')}"

    def post(self, route: str, body: dict, *, quiet: bool = False):
        """POST ``body`` to ``route`` (``/v1/completions``, ``/completion``, ...); the parsed JSON answer."""
        return self._send("post", route, body, quiet)

    def get(self, route: str, *, quiet: bool = False):
        """GET ``route``; with ``quiet`` a route the server lacks (400/404/405/422/501) gives ``None``, not an error."""
        return self._send("get", route, None, quiet)

    def _send(self, method: str, route: str, body, quiet: bool):
        o = self._openai
        try:
            if method == "post":
                out = self._client.post(self._url(route), cast_to=object, body=body)
            else:
                out = self._client.get(self._url(route), cast_to=object)
        except o.APIConnectionError as e:  # a server that is down is an error even where a route may be missing
            what = "timed out" if isinstance(e, o.APITimeoutError) else "is not answering (connection refused or lost)"
            raise ServedError(f"the server at {self.shown} {what} on {route} after {self.retries + 1} tries; start it "
                              f"or check --endpoint ({self.scrub(e)})") from None
        except o.APIStatusError as e:
            status = e.status_code
            if quiet and status in (400, 404, 405, 422, 501):
                return None
            text = self.scrub(getattr(e, "message", None) or e)
            if status in (401, 403):
                hint = (f"the key from ${self.key_source} was refused" if self.key_source else
                        f"set {' or '.join(KEY_VARS)} to the server's key")
                raise ServedError(f"the server at {self.shown} refused the request to {route} ({status}): "
                                  f"{hint}") from None
            if status == 404 and "model" in text.lower():
                raise ServedError(f"the server at {self.shown} does not serve that model ({text}); pass the name "
                                  f"it serves with --model (GET {self.shown}/v1/models lists them)") from None
            if status >= 500 or status in (408, 409, 429):
                raise ServedError(f"the server at {self.shown} kept failing on {route} ({status}) after "
                                  f"{self.retries + 1} tries: {text}") from None
            raise ServedError(f"the server at {self.shown} refused the request to {route} ({status}): {text}") from None
        with self._lock:
            self.count += 1
        return out

    def close(self) -> None:
        self._client.close()
