"""An OpenAI-compatible inference server around a Hugging Face model, written for the tests (stdlib HTTP).

``FakeServed(model, tok)`` listens on 127.0.0.1 (a free port) in a thread and answers as the real server
``kind`` does, with the model's own float32 forward pass (one prompt per request, no padding), so its
numbers are exact and a served report can be held to a local one at 1e-5:

``vllm``       ``/version``, ``/v1/models``, ``/tokenize`` (prompt or messages), ``/v1/completions`` with
               ``logprob_token_ids``, ``echo``, ``logprobs`` and ``return_tokens_as_token_ids``, one prompt or a list
``sglang``     ``/get_server_info``, ``/version``, ``/v1/models``, ``/generate`` (``token_ids_logprob``, one prompt
               or a list) and ``/v1/completions``
``llama.cpp``  ``/props``, ``/v1/models``, ``/tokenize``, ``/apply-template``, ``/completion``
               (``n_probs``) and ``/v1/completions`` (which ignores ``echo``, as llama.cpp's does)
``plain``      ``/v1/models`` and ``/v1/completions`` only, one prompt per request, ignoring ``logprob_token_ids``
               (an older server)
``llama-cpp-python``  its FastAPI ``/openapi.json`` title, and a 500 carrying a validation error for a token-id
               prompt (it takes text only)

What can be made wrong, to test the refusals: ``template`` (another chat template for ``/tokenize`` and
``/apply-template``), ``forced_temperature`` (a proxy or server default that sets every request's temperature:
with ``processed``, the sampled position's log-probabilities are those of this temperature whatever the request
asks), ``processed`` (the sampled position's log-probabilities after the request's temperature and
top-k, as vLLM's ``processed_logprobs``; prompt log-probabilities stay raw, as vLLM's do; ``"ignores pins"``: also
after a top-k of 20 whatever the request says, as a server whose generation defaults win would), ``drift`` (each
request's logits shifted by up to this: an order dependence), ``api_key`` (a 401 echoing the key it got, unless it
is this one), and ``faults`` (``"429"``, ``"500"``, ``"slow"`` (no answer until the fake closes: longer than any
client's timeout, however fast the machine), ``"die"``: the server goes away at that request;
consumed one per request). ``requests`` records each request's route and body.
``POST /admin/load {"path": folder}`` makes it serve a saved checkpoint (what a ``--reload`` script asks).
In dev mode (``dev``) a vLLM fake says its ``device`` and ``dtype`` at ``/server_info`` (default a float32 GPU
server); ``stale_head``: its in-place reload keeps the output layer it had (what vLLM on the CPU does to a tied one).
With ``lora``, an echo request batched with any other sequence (in it, or in flight beside it) kills the fake, as
it kills vLLM-CPU's engine (``died`` says so).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque

import torch

from helpers.fake_http import FakeHTTP

KINDS = ("vllm", "sglang", "llama.cpp", "plain", "llama-cpp-python")


class FakeServed(FakeHTTP):
    def __init__(self, model, tok, *, kind: str = "vllm", name: str = "served-model", template: str | None = None,
                 processed: bool = False, drift: float = 0.0, api_key: str | None = None, delay: float = 0.0,
                 vocab: int | None = None, dev: bool = False, lora: str | None = None, stuck: bool = False,
                 device: str = "cuda", dtype: str = "float32", stale_head: bool = False,
                 forced_temperature: float | None = None):
        assert kind in KINDS
        self.model, self.tok, self.kind, self.name = model.eval().float(), tok, kind, name
        # vLLM's dev-mode routes (its in-place reload and weight versions) and SGLang's weight-update routes; with
        # ``lora`` (a name) the served model is an adapter of that name on the base ``name``; ``stuck``: a reload
        # is acknowledged but the weights never change (a server whose update did not take)
        self.dev, self.lora, self.stuck = dev, lora, stuck
        self.device, self.dtype, self.stale_head = device, dtype, stale_head
        self.forced_temperature = forced_temperature
        self.base = self.model
        self.version = "initial"
        self.adapter_root: str | None = None
        self.template, self.processed, self.drift, self.api_key, self.delay = template, processed, drift, api_key, delay
        self.vocab = vocab or len(tok)  # a smaller one: a server whose model has fewer tokens than the tokenizer
        self.faults: deque = deque()
        self.completion_faults: deque = deque()  # the same, consumed by /v1/completions requests only
        self.died: str | None = None  # why the fake's engine died, if it did
        self.failing: dict[str, int] = {}  # a route that always answers this status (a weight update that fails)
        self.requests: list[tuple[str, dict]] = []
        self.closing = threading.Event()  # a "slow" request answers only once it is set
        self.loaded: list[str] = []  # what /admin/load was given, in order
        self.count = 0
        self._noise = __import__("random").Random(0)
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()  # one forward pass at a time
        self._count_lock = threading.Lock()
        super().__init__()

    def close(self):
        self.closing.set()
        super().close()

    # ------------------------------------------------------------------ plumbing
    def answer(self, method, path, h, raw):
        body = json.loads(raw or b"{}") if method == "POST" else {}
        with self._count_lock:
            self.requests.append((path, body))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            fault = self.faults.popleft() if self.faults else None
            if fault is None and path == "/v1/completions" and self.completion_faults:
                fault = self.completion_faults.popleft()
        try:
            return self._answer(h, method, path, body, fault)
        finally:
            with self._count_lock:  # counted out before the answer leaves: the client may send again at once
                self.in_flight -= 1

    def _answer(self, h, method, path, body, fault):
        if self.delay:
            time.sleep(self.delay)
        if self.api_key is not None:
            got = (h.headers.get("Authorization") or "").removeprefix("Bearer ")
            if got != self.api_key:
                return 401, {"error": {"message": f"invalid key {got!r}"}}
        if fault == "429":
            return 429, {"error": {"message": "rate limited"}}, {"Retry-After": "0"}
        if fault == "500":
            return 500, {"error": {"message": "boom"}}
        if fault == "slow":
            self.closing.wait(120)
        if fault == "die":  # the server process is gone: this connection and every later one
            threading.Thread(target=self.close, daemon=True).start()
            raise ConnectionAbortedError("the fake server died")
        if path in self.failing:
            return self.failing[path], {"error": {"message": f"{path} failed"}}
        route = self._routes().get((method, path))
        if route is None:
            return 404, {"detail": "Not Found"}
        return route(body)

    def _models(self, _):
        rows = [{"id": self.name, "object": "model", "root": self.name, "parent": None}]
        if self.lora:
            rows.append({"id": self.lora, "object": "model", "root": self.adapter_root, "parent": self.name})
        return 200, {"object": "list", "data": rows}

    def _routes(self):
        models = self._models
        r = {("GET", "/v1/models"): models, ("POST", "/v1/completions"): self.completions,
             ("GET", "/health"): lambda _: (200, {}), ("POST", "/admin/load"): self.load}
        if self.kind == "vllm":
            r |= {("GET", "/version"): lambda _: (200, {"version": "0.0-fake"}), ("POST", "/tokenize"): self.tokenize}
            if self.dev:
                r |= {("POST", "/collective_rpc"): self.collective_rpc, ("POST", "/reset_prefix_cache"):
                      lambda _: (200, {}), ("POST", "/update_weight_version"): self.update_version,
                      ("GET", "/weight_info"): lambda _: (200, {"weight_version": self.version}),
                      ("GET", "/server_info"): lambda _: (200, {"vllm_config": {
                          "device_config": {"device": self.device}, "model_config": {"dtype": f"torch.{self.dtype}"}}})}
            if self.lora:
                r |= {("POST", "/v1/load_lora_adapter"): self.load_lora}
        if self.kind == "sglang":
            r |= {("POST", "/update_weights_from_disk"): self.update_from_disk,
                  ("GET", "/get_weight_version"): lambda _: (200, {"weight_version": self.version})}
            r |= {("GET", "/get_server_info"): lambda _: (200, {"tp_size": 1, "disable_radix_cache": False}),
                  ("GET", "/version"): lambda _: (200, {"version": "0.0-fake"}), ("POST", "/generate"): self.generate}
        if self.kind == "llama-cpp-python":
            r |= {("GET", "/openapi.json"): lambda _: (200, {"info": {"title": "🦙 llama.cpp Python API"}}),
                  ("POST", "/v1/completions"): lambda b: (500, {"error": {"message": (
                      "1 validation error for CreateCompletionRequest\nprompt\n  Input should be a valid string "
                      f"[type=string_type, input_value={b.get('prompt')!r}, input_type=list]")}})}
        if self.kind == "llama.cpp":
            r |= {("GET", "/props"): lambda _: (200, {"build_info": "b0-fake", "default_generation_settings": {}}),
                  ("POST", "/tokenize"): self.tokenize, ("POST", "/apply-template"): self.apply_template,
                  ("POST", "/completion"): self.completion}
        return r

    # ------------------------------------------------------------------ the model
    def logprobs(self, ids: list[int], temperature: float = 1.0, every: bool = False,
                 top_k: int | None = None) -> torch.Tensor:
        """``[n, vocab]`` log-probabilities of the next token after each prefix (what the server computes): after the
        whole prompt (``n`` = 1), or after every prefix (``every``: echo's prompt log-probabilities)."""
        with self._lock:
            self.count += 1
            shift = self.drift * float(self._noise.random())
            with torch.inference_mode():
                if hasattr(self.model, "lm_head") and hasattr(self.model, "model"):  # the last position's logits only
                    hidden = self.model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
                    logits = self.model.lm_head(hidden if every else hidden[-1:]).float()
                else:  # a wrapper (a test's model that changes the logits)
                    logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()
                    logits = logits if every else logits[-1:]
        if shift:
            logits = logits.clone()
            logits[:, :: 7] += shift
        if self.processed and not every:  # the sampled position only: prompt log-probabilities are raw
            temperature = self.forced_temperature or temperature
            logits = logits / temperature if temperature > 0 else logits
            k = 20 if self.processed == "ignores pins" else (top_k if top_k and top_k > 0 else None)
            if k:
                cut = torch.topk(logits, k, dim=-1).values[..., -1:]
                logits = logits.masked_fill(logits < cut, float("-inf"))
        return torch.log_softmax(logits, dim=-1)

    def load(self, body):
        """What a user's reload script would ask of its server: serve the weights saved in ``path`` from now on."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(body["path"], torch_dtype=torch.float32).eval()
        with self._lock:
            self.model = model
            self.loaded.append(body["path"])
        return 200, {"loaded": body["path"]}

    def _reload(self, path: str) -> None:
        if self.stuck:
            return
        head = self.model.lm_head.weight.detach().clone()
        self.load({"path": path})
        if self.stale_head:  # the output layer as it was: new embeddings under the old head
            with self._lock:
                self.model.lm_head.weight = torch.nn.Parameter(head)

    def collective_rpc(self, body):
        if body.get("method") != "reload_weights":
            return 400, {"error": {"message": f"this fake knows reload_weights only, not {body.get('method')!r}"}}
        self._reload(body["kwargs"]["weights_path"])
        return 200, [None]

    def update_version(self, body):
        if not self.stuck:
            self.version = body["new_version"]
        return 200, {"success": True, "new_version": body["new_version"]}

    def update_from_disk(self, body):
        self._reload(body["model_path"])
        if not self.stuck:
            self.version = body.get("weight_version") or self.version
        return 200, {"success": True, "message": "Succeeded to update model weights."}

    def load_lora(self, body):
        """vLLM's /v1/load_lora_adapter: the adapter in ``lora_path`` applied to the base (merged, as it computes)."""
        import copy

        from peft import PeftModel

        if body.get("lora_name") != self.lora:
            return 400, {"error": {"message": f"no adapter {body.get('lora_name')!r} is served"}}
        if not self.stuck:
            merged = PeftModel.from_pretrained(copy.deepcopy(self.base), body["lora_path"]).merge_and_unload()
            with self._lock:
                self.model, self.adapter_root = merged.eval(), body["lora_path"]
                self.loaded.append(body["lora_path"])
        return 200, f"Success: LoRA adapter '{self.lora}' added successfully."

    def _key(self, token: int, as_ids: bool) -> str:
        return f"token_id:{token}" if as_ids else self.tok.decode([token])

    def _render(self, messages) -> str:
        kwargs = {"chat_template": self.template} if self.template else {}
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                            enable_thinking=False, **kwargs)

    def tokenize(self, body):
        if "messages" in body:
            text = self._render(body["messages"])
        else:
            text = body.get("prompt", body.get("content", ""))
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if self.template and "messages" not in body:  # another template's special tokens: another tokenization
            ids = self.tok(text.replace("<|im_start|>", "<|begin|>"), add_special_tokens=False)["input_ids"]
        return 200, {"tokens": ids, "count": len(ids)}

    def apply_template(self, body):
        return 200, {"prompt": self._render(body["messages"])}

    def completions(self, body):
        if body.get("model") not in (self.name, self.lora) and self.kind != "llama.cpp":
            return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                   "code": "model_not_found"}}
        prompt = body["prompt"]
        many = isinstance(prompt, list) and bool(prompt) and all(isinstance(p, list) for p in prompt)
        if many and self.kind in ("llama.cpp", "plain"):
            return 400, {"error": {"message": "this server takes one prompt per request"}}
        prompts = prompt if many else [prompt]
        if self.lora and body.get("echo") and (len(prompts) > 1 or self.in_flight > 1):
            # vLLM-CPU with LoRA adapters: prompt log-probabilities batched with any other sequence kill the engine
            self.died = "prompt log-probabilities batched beside another sequence on a LoRA server"
            threading.Thread(target=self.close, daemon=True).start()
            raise ConnectionAbortedError(self.died)
        for ids in prompts:
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                return 400, {"error": {"message": "this fake takes token-id prompts only"}}
            if any(t >= self.vocab or t < 0 for t in [*ids, *(body.get("logprob_token_ids") or [])]):
                return 400, {"error": {"message": f"Token id out of vocabulary: {max(ids)}"}}
        choices = [self._choice(n, ids, body) for n, ids in enumerate(prompts)]
        return 200, {"id": f"cmpl-{self.count}", "object": "text_completion", "model": self.name, "choices": choices}

    def _choice(self, index: int, ids: list[int], body: dict) -> dict:
        as_ids = bool(body.get("return_tokens_as_token_ids")) and self.kind == "vllm"
        k = body.get("logprobs")
        echo = bool(body.get("echo")) and self.kind != "llama.cpp"
        lp = self.logprobs(ids, body.get("temperature", 1.0), every=echo, top_k=body.get("top_k"))
        nxt = int(lp[-1].argmax())
        wanted = body.get("logprob_token_ids") if self.kind == "vllm" else None

        def step(row, token):
            if k is None:
                return None
            if wanted:
                return {self._key(t, as_ids): float(row[t]) for t in [token, *wanted]}
            top = torch.topk(row, max(int(k), 1))
            pairs = zip(top.values.tolist(), top.indices.tolist(), strict=True)
            out = {self._key(int(t), as_ids): float(v) for v, t in pairs}
            out[self._key(token, as_ids)] = float(row[token])
            return out

        tokens, token_lp, tops = [], [], []
        if echo:
            for pos, t in enumerate(ids):
                tokens.append(self._key(t, as_ids))
                token_lp.append(None if pos == 0 else float(lp[pos - 1, t]))
                tops.append(None if pos == 0 else step(lp[pos - 1], t))
        if body.get("max_tokens", 16) > 0:
            tokens.append(self._key(nxt, as_ids))
            token_lp.append(float(lp[-1, nxt]))
            tops.append(step(lp[-1], nxt))
        logprobs = None if k is None else {"tokens": tokens, "token_logprobs": token_lp, "top_logprobs": tops,
                                           "text_offset": [0] * len(tokens)}
        return {"index": index, "text": self.tok.decode([nxt]), "logprobs": logprobs, "finish_reason": "length"}

    def generate(self, body):
        many = isinstance(body["input_ids"][0], list)
        answers = [self._generated(ids, body) for ids in (body["input_ids"] if many else [body["input_ids"]])]
        return 200, answers if many else answers[0]

    def _generated(self, ids: list[int], body: dict) -> dict:
        lp = self.logprobs(ids, (body.get("sampling_params") or {}).get("temperature", 1.0))[-1]
        top = torch.topk(lp, int(body.get("top_logprobs_num") or 1))
        wanted = body.get("token_ids_logprob") or []
        meta = {"prompt_tokens": len(ids), "completion_tokens": 1,
                "output_top_logprobs": [[[float(v), int(t), None]
                                         for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True)]],
                "output_token_ids_logprobs": [[[float(lp[t]), int(t), None] for t in wanted]]}
        return {"text": "", "output_ids": [int(lp.argmax())], "meta_info": meta}

    def completion(self, body):
        ids = body["prompt"]
        lp = self.logprobs(ids, 1.0)[-1]  # llama.cpp's n_probs come before any sampler: raw
        n = int(body.get("n_probs") or 0)
        top = torch.topk(lp, min(max(n, 1), lp.numel()))
        nxt = int(top.indices[0])
        rows = [{"id": int(t), "token": self.tok.decode([int(t)]), "logprob": float(v), "bytes": []}
                for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True)]
        probs = [{"id": nxt, "token": self.tok.decode([nxt]), "logprob": float(lp[nxt]), "bytes": [],
                  "top_logprobs": rows}] if n else []
        return 200, {"content": self.tok.decode([nxt]), "tokens_evaluated": len(ids), "completion_probabilities": probs}
