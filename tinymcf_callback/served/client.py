"""The HTTP side of a served model: the package's one client (:mod:`tinymcf_callback.apiclient`, its retries logged
and counted), each failure as one line naming what fixes it. The server's own routes outside ``/v1`` (llama.cpp's
``/completion``, SGLang's ``/generate``, vLLM's ``/tokenize``) are sent the same way. Nothing is cached: a reloaded
model is read afresh at every request. The API key (``TINYMCF_API_KEY``, else ``OPENAI_API_KEY``; a local server
needs none) goes into the ``Authorization`` header only and is taken out of every message.
"""

from __future__ import annotations

from ..apiclient import SERVED_KEYS, ApiClient, ApiError, find_key, split_url
from ..errors import ServedError

KEY_VARS = SERVED_KEYS
QUIET = (400, 404, 405, 422, 501)  # a route the server lacks (a probe of what it is)


class ServerGone(ServedError):
    """The server stopped answering (its connection refused or lost): down, or crashed."""


class ServerClient:
    """Requests to one server: ``post(route, body)`` and ``get(route)`` return the parsed JSON; a request that cannot
    succeed raises :class:`ServedError` with one line (the server, the route, what went wrong and what to do)."""

    def __init__(self, url: str, *, timeout: float = 60.0, retries: int = 4):
        try:
            self.root, self.shown = split_url(url)
        except ApiError as e:
            raise ServedError(str(e)) from None
        key, self.key_source = find_key(KEY_VARS)
        # a request that timed out is not sent again: the server is slow, and a second copy only adds to its queue
        self.api = ApiClient(f"{self.root}/v1", key, timeout=timeout, retries=retries, name=self.shown,
                             retry_timeouts=False)
        self.timeout = self.api.timeout

    def post(self, route: str, body: dict, *, quiet: bool = False, retries: int | None = None):
        """POST ``body`` to ``route`` (``/v1/completions``, ``/completion``, ...); the parsed JSON answer. With
        ``quiet`` a route the server lacks gives ``None``."""
        return self._send(lambda: self.api.post(route, body, retries=retries), route, quiet)

    def get(self, route: str, *, quiet: bool = False):
        """GET ``route``; with ``quiet`` a route the server lacks (400/404/405/422/501) gives ``None``."""
        return self._send(lambda: self.api.get(route), route, quiet)

    def _send(self, send, route: str, quiet: bool):
        try:
            return send()
        except ApiError as e:
            if quiet and e.kind == "status" and e.status in QUIET:
                return None
            error = self._failure(e, route)
            error.status = e.status  # the HTTP status the server answered, None when it did not answer
            raise error from None

    def _failure(self, e: ApiError, route: str) -> ServedError:
        """One line for a request that did not succeed: what happened, and what to do."""
        where = f"the server at {self.shown}"
        if e.kind == "connection":
            return ServerGone(f"{where} is not answering on {route} (connection refused or lost, {e.tries} tries); "
                              f"start it or check --endpoint ({e.detail})")
        if e.kind == "timeout":
            return ServedError(f"{where} did not answer {route} within {self.timeout:g} s: raise --request-timeout "
                               "if it is busy or slow (or lower --concurrency / --batch-prompts), or check that it is "
                               "not stuck")
        status, text = e.status, e.detail
        if status in (401, 403):
            hint = (f"the key from {self.key_source} was refused" if self.key_source else
                    f"set {' or '.join(KEY_VARS)} to the server's key")
            return ServedError(f"{where} refused the request to {route} ({status}): {hint}")
        if status == 404 and "model" in text.lower():
            return ServedError(f"{where} does not serve that model ({text}); pass the name it serves with --model "
                               f"(GET {self.shown}/v1/models lists them)")
        if e.retryable:
            return ServedError(f"{where} kept failing on {route} ({status}) after {e.tries} tries: {text}")
        return ServedError(f"{where} refused the request to {route} ({status}): {text}")

    def close(self) -> None:
        self.api.close()
