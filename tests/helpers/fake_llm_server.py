"""A real OpenAI-compatible HTTP server for the prepare/validate tests (stdlib only).

``FakeLLM`` listens on 127.0.0.1 (random port) in a thread and serves
``POST /v1/chat/completions`` and ``GET /v1/models``. What it answers depends on the
requested model and on a queue of one-shot faults:

models
    ``good-model``       a valid rewrite built from the request (or a judgement)
    ``refuse-model``     "I'm sorry, but I can't help with that." (plain text)
    ``refusal-field``    content null, ``message.refusal`` set (the OpenAI refusal field)
    ``malformed-model``  a truncated JSON object
    ``rulebreak-model``  two sentences with an editorial word (breaks rules.rewrite_problems)
    ``fixes-on-retry``   breaks the rules first, answers correctly once told what was wrong
    ``cue-until-told``   an uphold that adds a negative word ("refusing to betray"), breaking the lexical-cue
                         rule, until told what was wrong; its other answers are good-model's
    anything else        404 model_not_found
faults (``server.faults``, consumed one per request, before the model's answer)
    ``"429"`` rate limit (with ``Retry-After: <retry_after>``), ``"500"`` server error,
    ``"slow"`` sleeps ``slow_seconds`` first.

``delay`` slows every request. A wrong ``Authorization`` header gets a 401 that echoes the
key it received (as some servers do), to check that clients scrub it.

Like a strict real endpoint, it refuses with HTTP 400 (which the client sees as an error):
a rewrite request that lacks the original text, its foundation label or the rewrite rules,
a judge request without its scenario (:func:`request_problems`), and, when
``json_mode_supported`` is False, any request that sends ``response_format``. Every request
is recorded in ``requests`` as ``{"model", "kind", "condition", "text", "label", "json_mode",
"status"}``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import deque

from helpers.fake_http import FakeHTTP
from tinymcf_callback.prepare import rules

FOUNDATIONS = ("Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty", "Social Norms")
MODELS = ("good-model", "refuse-model", "refusal-field", "malformed-model", "rulebreak-model", "fixes-on-retry",
          "cue-until-told")


def _field(messages, name):
    for m in messages:
        if m.get("role") == "user":
            hit = re.search(rf"^{re.escape(name)}: (.*)$", m.get("content") or "", re.M)
            if hit:
                return hit.group(1)
    return None


def _coarse(label):
    for f in FOUNDATIONS:
        if (label or "").startswith(f):
            return f
    return "Care"


def good_rewrite(condition, original, label):
    """A rewrite that passes the rules, deterministic in its inputs."""
    tag = hashlib.md5(f"{original}|{condition}".encode()).hexdigest()[:8]
    f = _coarse(label)
    if condition == "other_uphold":
        return f"You see the same person keeping to the {f} rule instead, case {tag}."
    if condition == "self_violate":
        return f"You break the {f} rule yourself, case {tag}."
    return f"You keep to the {f} rule yourself, case {tag}."


def cue_rewrite(condition, original, label):
    """An uphold written as a refused violation: passes every rule but the lexical-cue one."""
    tag = hashlib.md5(f"{original}|{condition}".encode()).hexdigest()[:8]
    if condition == "other_uphold":
        return f"You see the same person refusing to betray the {_coarse(label)} rule, case {tag}."
    return f"You refuse to betray the {_coarse(label)} rule yourself, case {tag}."


def rewrite_request_problems(messages) -> list[str]:
    """What a rewrite request lacks: the original text, its foundation label, its condition, or the rules.

    The rules are :mod:`tinymcf_callback.prepare.rules`' own: the word limit, the "You see" start and
    every deny-listed phrase must be written out in the request (system or user message).
    """
    problems = []
    if not (_field(messages, "Original (other_violate)") or "").strip():
        problems.append("the original text (an 'Original (other_violate): ...' line)")
    label = (_field(messages, "Foundation") or "").strip()
    if not any(label.startswith(f) for f in FOUNDATIONS):
        problems.append(f"its foundation label (a 'Foundation: ...' line naming one of {', '.join(FOUNDATIONS)})")
    if _field(messages, "Condition") not in ("other_uphold", "self_violate", "self_uphold"):
        problems.append("the condition to write (a 'Condition: ...' line)")
    asked = "\n".join(m.get("content") or "" for m in messages[:2])
    missing = [p for p in (f"at most {rules.MAX_WORDS} words", '"You see "', *rules.DENY_LIST) if p not in asked]
    if missing:
        problems.append(f"the rules (not stated: {', '.join(missing)})")
    return problems


def request_problems(body: dict, kind: str, json_mode_supported: bool) -> str | None:
    """Why a strict endpoint refuses this chat request with a 400, or ``None``."""
    messages = body.get("messages") or []
    if "response_format" in body and not json_mode_supported:
        return "response_format is not supported by this endpoint"
    if kind == "rewrite":
        lacks = rewrite_request_problems(messages)
        return "rewrite request lacks " + "; ".join(lacks) if lacks else None
    if not (_field(messages, "Scenario") or "").strip():
        return "classify request lacks the scenario (a 'Scenario: ...' line)"
    return None


def good_judgement(text):
    low = text.lower()
    f = next((x for x in FOUNDATIONS if x.lower() in low), "Care")
    return {"foundation": f, "valence": "uphold" if "keep" in low else "violate"}


class FakeLLM(FakeHTTP):
    protocol = "HTTP/1.1"

    def __init__(self, key: str = "sk-test-SECRET-123"):
        self.key = key
        self.faults: deque[str] = deque()
        self.delay = 0.0
        self.slow_seconds = 3.0
        self.retry_after = "0"  # the Retry-After header of a "429" fault (seconds)
        self.json_mode_supported = True  # False: an endpoint without response_format (refused with a 400)
        self.judge_overrides: dict[str, dict] = {}
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        super().__init__()
        self.base_url = f"{self.url}/v1"

    def count(self, **match) -> int:
        with self.lock:
            return sum(all(r.get(k) == v for k, v in match.items()) for r in self.requests)

    # ------------------------------------------------------------------ answers

    def chat(self, body: dict) -> tuple[int, dict, dict]:
        """``(status, json body, extra headers)`` for one chat request."""
        model = body.get("model")
        messages = body.get("messages") or []
        kind = "judge" if _field(messages, "Task") == "classify" else "rewrite"
        cond = _field(messages, "Condition")
        original = _field(messages, "Original (other_violate)")
        label = _field(messages, "Foundation")
        scenario = _field(messages, "Scenario")
        rec = {"model": model, "kind": kind, "condition": cond, "text": original or scenario, "label": label,
               "json_mode": "response_format" in body}
        with self.lock:
            fault = self.faults.popleft() if self.faults else None
            self.requests.append(rec)
        if self.delay:
            time.sleep(self.delay)
        if fault == "429":
            rec["status"] = 429
            return 429, _error("Rate limit exceeded, slow down", "rate_limit_exceeded"), {
                "retry-after": self.retry_after}
        if fault == "500":
            rec["status"] = 500
            return 500, _error("Internal server error", "server_error"), {}
        if fault == "slow":
            time.sleep(self.slow_seconds)
        if model not in MODELS:
            rec["status"] = 404
            return 404, _error(f"The model `{model}` does not exist or you do not have access to it.",
                               "model_not_found"), {}
        refused = request_problems(body, kind, self.json_mode_supported)
        if refused:
            rec["status"] = 400
            return 400, _error(refused, "invalid_request"), {}
        rec["status"] = 200
        if model in ("refuse-model",):
            return 200, _completion(model, "I'm sorry, but I can't help with that."), {}
        if model == "refusal-field":
            return 200, _completion(model, None, refusal="I can't assist with this request."), {}
        if model == "malformed-model":
            return 200, _completion(model, '{"rewrite": "You see a man'), {}
        if kind == "judge":
            verdict = self.judge_overrides.get(scenario) or good_judgement(scenario or "")
            return 200, _completion(model, json.dumps(verdict)), {}
        text = good_rewrite(cond, original, label)
        told = len(messages) > 2  # feedback about an earlier answer is present
        if model == "rulebreak-model" or (model == "fixes-on-retry" and not told):
            text = text[:-1] + ", thus showing who they are. It was a big day."
        if model == "cue-until-told":
            rec["feedback"] = messages[-1]["content"] if told else None
            if not told and cond in ("other_uphold", "self_uphold"):
                text = cue_rewrite(cond, original, label)
        return 200, _completion(model, json.dumps({"rewrite": text})), {}

    # ------------------------------------------------------------------ the routes
    def answer(self, method, path, handler, raw):
        """GET /v1/models and POST /v1/chat/completions, each with the key (else the 401 OpenAI answers)."""
        route = path.rstrip("/")
        if route != ("/v1/models" if method == "GET" else "/v1/chat/completions"):
            return 404, _error("not found", "not_found")
        got = handler.headers.get("Authorization", "")
        if got != f"Bearer {self.key}":
            return 401, _error(f"Incorrect API key provided: {got.removeprefix('Bearer ')}", "invalid_api_key")
        if method == "GET":
            return 200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in MODELS]}
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            return 400, _error("request body is not JSON", "invalid_json")
        return self.chat(body)


def _error(message, code):
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "param": None}}


def _completion(model, content, refusal=None):
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content, "refusal": refusal}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }


if __name__ == "__main__":  # a manual check: python tests/fake_llm_server.py
    with FakeLLM() as s:
        print(s.base_url, "key", s.key)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
