"""The plumbing every fake HTTP server of the tests shares (the strict LLM endpoint of ``prepare``, the inference
servers of a served model): a real ``ThreadingHTTPServer`` on a free port of 127.0.0.1, served from a thread as soon
as it is made, JSON answers, quiet logs, closed by ``with`` or :meth:`FakeHTTP.close`.

A subclass answers each request in :meth:`FakeHTTP.answer`: ``(method, path, the request handler, the raw body)``
-> ``(status, a JSON-ready object)`` or ``(status, object, extra headers)``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHTTP:
    protocol = "HTTP/1.0"  # HTTP/1.1: connections kept open between requests, as a real server keeps them

    def __init__(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = self.protocol

            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                server._serve(self, "GET")

            def do_POST(self):
                server._serve(self, "POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, handler: BaseHTTPRequestHandler, raw: bytes) -> tuple:
        raise NotImplementedError

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if method == "POST" else b""
        send(handler, *self.answer(method, handler.path.split("?")[0], handler, raw))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def send(handler: BaseHTTPRequestHandler, status: int, obj, headers: dict | None = None) -> None:
    """``obj`` as a JSON answer with ``status`` (and ``headers``); a client that gave up already is no error."""
    data = json.dumps(obj).encode()
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the client timed out (a timeout test)
