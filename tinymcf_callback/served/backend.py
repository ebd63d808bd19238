"""A model behind an OpenAI-compatible server, scored like a local one: :class:`ServedModel`.

``Probe.run(ServedModel("http://127.0.0.1:8000", "my-model"))`` gives the same report as a local
probe, with ``info["backend"]`` saying what answered: the server's kind and version, the request form,
whether the numbers are exact or a bound, and what its self-check found. Each probe:

1. **finds the server** (``/version`` for vLLM, ``/props`` for llama.cpp, ``/get_server_info`` for
   SGLang) and checks the model name against ``/v1/models``;
2. **checks the template**: the server's own tokenization of the first prompt and its own rendering
   of that chat turn must be the local tokenizer's (``/tokenize``, and llama.cpp's ``/apply-template``);
   another tokenizer or template is refused, naming the first token that differs;
3. **checks the log-probabilities are raw**: the first prompt asked at temperature 1 and 0.5 must give
   the same numbers; a server returning processed log-probabilities (vLLM's ``--logprobs-mode
   processed_logprobs``, which TRL's ``vllm-serve`` sets) is refused;
4. **scores every prompt** through a bounded pool of concurrent requests, as the server is really
   run (prefix caching, continuous batching), with a progress bar;
5. **self-checks**: a few prompts, rotating over a run's probes, are asked again in the same form at
   another point of the queue (an order or batching dependence shows there) and in a second form
   (``echo``, or top-k on llama.cpp); their largest difference is the resolution reached, held to the
   tolerance. Given ``reference`` (the same weights loaded locally), those prompts are also scored by
   the local forward pass and the difference recorded (``scored_diff``): what bf16 or quantisation
   changes, stated, not hidden.

Nothing is cached between probes: a model reloaded into the server is read afresh.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np

from ..errors import ServedError
from ..scoring.engine import ScoreResult, empty_result
from ..scoring.prompts import answer_format_of, answer_token_ids
from ..scoring.selfcheck import SelfCheck
from .forms import FORM_CLASSES, FORMS, Reading
from .http import ServerClient

AUTO_FORM = {"vllm": "logprob_token_ids", "sglang": "token_ids_logprob", "llama.cpp": "n_probs"}
SECOND_FORM = {"logprob_token_ids": "echo", "token_ids_logprob": "echo", "n_probs": "top_logprobs",
               "echo": "echo", "top_logprobs": "top_logprobs"}
DEFAULT_TOP = {"n_probs": 1000, "top_logprobs": 20}
DEFAULT_TOLERANCE = 1e-3  # two requests for the same prompt to one server: what they may differ by
# log-probability change between temperature 1 and 0.5 that reveals processing: temperature 0.5 doubles every logit
# gap, which moves an answer token's log-probability by tenths (random tiny models: ~0.1; SmolLM2: ~1), far above a
# server's repeat noise, which it must also be 10 times above
PROCESSED_TOLERANCE = 0.02
N_CHECKED = 4
# What each server needs so that a prompt's numbers are its own. llama.cpp reuses a slot's cached prefix
# (computed in another batch) and decodes parallel slots in one batch, and both move its numbers: measured on
# SmolLM2 Q4_1, a prompt's log P(answer) moved by up to 0.07 with the prompt cache and 0.13-0.17 with 8
# requests in flight, and by 0 asked alone without the cache. So it gets one request at a time, uncached.
REQUEST_EXTRA = {"llama.cpp": {"cache_prompt": False}}
DEFAULT_CONCURRENCY = {"llama.cpp": 1}


@dataclass
class Server:
    """What answered: ``kind`` (vllm, sglang, llama.cpp, or openai-compatible), its version, what it serves."""

    kind: str
    version: str | None = None
    models: list[str] = field(default_factory=list)


class ServedModel:
    """A model served by vLLM, SGLang, llama.cpp or any OpenAI-compatible completions server.

    Args:
        endpoint: the server's URL (``http://host:port``; a trailing ``/v1`` is fine).
        model: the name the server serves it under (``GET /v1/models``).
        form: the request form (:data:`~tinymcf_callback.served.forms.FORMS`), default the exact one of the
            server found: ``logprob_token_ids`` on vLLM, ``token_ids_logprob`` on SGLang, ``n_probs`` on
            llama.cpp, ``echo`` elsewhere.
        concurrency: requests in flight at once (a bounded pool); default 8, and 1 on llama.cpp, whose
            batched decoding changes a prompt's numbers.
        timeout, retries: per request; 408/409/429/5xx and timeouts are retried with backoff.
        top: how many top tokens a top-k form asks for (llama.cpp ``n_probs`` 1000, ``top_logprobs`` 20).
        reference: the same weights as a local model, to score the checked prompts with the forward pass too.
        check_prompts: prompts the self-check asks again per probe (0: no self-check).
        tolerance: what the self-check holds the server's two readings of a prompt to (default: the probe's
            ``self_check_tolerance`` when set, else 1e-3).
        reference_tolerance: what it holds the local forward pass's difference to (default: recorded only).
        name: what the report calls the model (default ``model``).

    The API key, when the server wants one, is read from ``TINYMCF_API_KEY`` or ``OPENAI_API_KEY``.
    """

    def __init__(self, endpoint: str, model: str, *, form: str = "auto", concurrency: int | None = None,
                 timeout: float = 60.0, retries: int = 4, top: int | None = None, reference=None,
                 check_prompts: int = N_CHECKED, tolerance: float | None = None,
                 reference_tolerance: float | None = None, name: str | None = None, seed: int = 0, environ=None):
        if form != "auto" and form not in FORMS:
            raise ServedError(f"--form must be auto or one of {', '.join(FORMS)}, got {form!r}")
        if not isinstance(model, str) or not model:
            raise ServedError(f"--model must name the served model (GET <endpoint>/v1/models lists them), got "
                              f"{model!r}")
        if concurrency is not None and int(concurrency) < 1:
            raise ServedError(f"--concurrency must be at least 1, got {concurrency!r}")
        self.client = ServerClient(endpoint, timeout=timeout, retries=retries, environ=environ)
        self.model, self.form_name = model, form
        self.asked_concurrency = None if concurrency is None else int(concurrency)
        self.concurrency = self.asked_concurrency or 8
        self.top, self.reference, self.check_prompts = top, reference, max(0, int(check_prompts))
        self.asked_tolerance = None if tolerance is None else float(tolerance)
        self.tolerance = DEFAULT_TOLERANCE if tolerance is None else float(tolerance)
        self.reference_tolerance = reference_tolerance
        self.name, self.seed, self.probes = name or model, seed, 0
        self.server: Server | None = None
        self.notes: list[str] = []

    def __repr__(self) -> str:
        return f"ServedModel({self.client.shown!r}, {self.model!r})"

    # ------------------------------------------------------------------ the server
    def find_server(self) -> Server:
        """Which server this is, asked afresh (a reload may have changed it), and that it serves ``model``."""
        c = self.client
        listed = c.get("/v1/models", quiet=True)  # a server that is down raises here, in one line
        models = [m.get("id") for m in (listed or {}).get("data", []) if isinstance(m, dict)]
        props = c.get("/props", quiet=True)
        if isinstance(props, dict) and ("default_generation_settings" in props or "build_info" in props):
            server = Server("llama.cpp", str(props.get("build_info") or "") or None, models)
        else:
            info = c.get("/get_server_info", quiet=True) or c.get("/server_info", quiet=True)
            version = c.get("/version", quiet=True)
            if isinstance(info, dict) and ("tp_size" in info or "disable_radix_cache" in info):
                server = Server("sglang", (version or {}).get("version") if isinstance(version, dict) else None, models)
            elif isinstance(version, dict) and "version" in version:
                server = Server("vllm", str(version["version"]), models)
            else:
                server = Server("openai-compatible", None, models)
        if server.kind != "llama.cpp" and models and self.model not in models:
            raise ServedError(f"the server at {c.shown} serves {', '.join(map(repr, models))}, not {self.model!r}: "
                              f"pass one of those with --model")
        if listed is None and server.kind == "openai-compatible":
            raise ServedError(f"the server at {c.shown} answers but has no /v1/models: not an OpenAI-compatible "
                              "server, or --endpoint is not its root (give http://host:port)")
        self.server = server
        return server

    def form(self, name: str | None, tok, sides: tuple[list[int], list[int]]):
        name = name or (AUTO_FORM.get(self.server.kind, "echo") if self.form_name == "auto" else self.form_name)
        top = self.top or DEFAULT_TOP.get(name, 10)
        vocab = {tok.decode([a]): a for a in [*sides[0], *sides[1]]}
        return FORM_CLASSES[name](self.client, self.model, sides, top=top, vocab=vocab, vocab_size=len(tok),
                                  extra=REQUEST_EXTRA.get(self.server.kind))

    # ------------------------------------------------------------------ checks before scoring
    def check_template(self, probe) -> str:
        """The server's tokenizer and chat template against the local ones, on the first prompt; refuse a mismatch."""
        tok, c = probe.tok, self.client
        i = probe.sample_index
        ids, text = list(probe.encoded[i]), probe.prompts[i]
        row = probe.meta.iloc[i]
        fmt = answer_format_of(probe.answer_format)
        user = f"{probe.vignettes[0][row['condition']]}\n\n{fmt.questions[row['frame']]}"
        kind = self.server.kind
        if kind == "llama.cpp":
            got = c.post("/tokenize", {"content": text, "add_special": False, "parse_special": True}, quiet=True)
            rendered = c.post("/apply-template", {"messages": [{"role": "user", "content": user}]}, quiet=True)
            rendered = rendered.get("prompt") if isinstance(rendered, dict) else None
        else:
            got = c.post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}, quiet=True)
            chat = c.post("/tokenize", {"model": self.model, "messages": [{"role": "user", "content": user}],
                                        "add_generation_prompt": True, "add_special_tokens": False,
                                        "chat_template_kwargs": {"enable_thinking": False}}, quiet=True)
            rendered = tok.decode(chat["tokens"]) if isinstance(chat, dict) and "tokens" in chat else None
        server_ids = got.get("tokens") if isinstance(got, dict) else None
        if server_ids is None and rendered is None:
            return "not checked: the server has no /tokenize"
        if server_ids is not None:
            server_ids = [t["id"] if isinstance(t, dict) else int(t) for t in server_ids]
            if server_ids != ids:
                pairs = enumerate(zip(ids, server_ids, strict=False))
                n = next((k for k, (a, b) in pairs if a != b), min(len(ids), len(server_ids)))
                ours = tok.decode(ids[n:n + 3]) if n < len(ids) else "(end)"
                theirs = repr(server_ids[n:n + 3]) if n < len(server_ids) else "(end)"
                raise ServedError(f"the server at {c.shown} tokenizes the prompts differently from the local tokenizer "
                                  f"{getattr(tok, 'name_or_path', '')!r}: first difference at token {n} (local "
                                  f"{ids[n:n + 3]} = {ours!r}, server {theirs}); load the served model's own "
                                  "tokenizer with --tokenizer")
        if rendered is not None:
            local = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                            add_generation_prompt=True, enable_thinking=False)
            if rendered != local:
                pairs = enumerate(zip(local, rendered, strict=False))
                n = next((k for k, (a, b) in pairs if a != b), min(len(local), len(rendered)))
                raise ServedError(f"the server at {c.shown} renders the chat turn with another template: they differ "
                                  f"at character {n} (local {local[n:n + 30]!r}, server {rendered[n:n + 30]!r}); "
                                  "give the server the model's own chat template (vLLM --chat-template, llama.cpp "
                                  "--chat-template-file), or load its tokenizer with --tokenizer")
        return "checked: " + " and ".join(w for w, ok in (("tokenizer", server_ids is not None),
                                                          ("chat template", rendered is not None)) if ok)

    def check_raw(self, form, ids: list[int]) -> Reading:
        """Refuse a server whose log-probabilities change with the sampling temperature (processed, not raw)."""
        one, half, again = (form.read(ids, temperature=t) for t in (1.0, 0.5, 1.0))

        def change(a: Reading, b: Reading) -> float:
            common = [t for t in a.logp if t in b.logp and math.isfinite(a.logp[t])]
            return max((abs(a.logp[t] - b.logp[t]) for t in common), default=0.0)

        # a server that is merely not repeatable (the self-check's to find) is not taken for a processing one
        if change(one, half) > max(PROCESSED_TOLERANCE, 10 * change(one, again)):
            moved = change(one, half)
            raise ServedError(f"the server at {self.client.shown} returns processed log-probabilities: the same prompt "
                              f"read at temperature 1 and 0.5 differs by {moved:.3g} in log P(answer). The probe needs "
                              "the model's own distribution: start vLLM with --logprobs-mode raw_logprobs (TRL's "
                              "vllm-serve passes processed_logprobs; a second vLLM with raw logprobs can serve the "
                              "probe), or SGLang/llama.cpp without sampling on the returned probabilities")
        return one

    # ------------------------------------------------------------------ scoring
    def score(self, probe, *, progress: bool = False) -> ScoreResult:
        """Every prompt of ``probe`` through the server; the self-check on a few; ``res.backend`` says how."""
        tok = probe.tok
        yes, no = answer_token_ids(tok, probe.answer_format)
        self.check_vocabulary(probe, [*yes, *no])
        server = self.find_server()
        self.concurrency = self.asked_concurrency or DEFAULT_CONCURRENCY.get(server.kind, 8)
        form = self.form(None, tok, (yes, no))
        template = self.check_template(probe)
        n = len(probe.encoded)
        first = self.check_raw(form, probe.encoded[probe.sample_index])  # refuses processed log-probabilities
        config = probe.config
        self.tolerance = next(t for t in (self.asked_tolerance, config.self_check_tolerance, DEFAULT_TOLERANCE)
                              if t is not None)
        checked = self.pick_checked(n) if config.self_check else []
        second = self.form(SECOND_FORM[form.name], tok, (yes, no)) if checked else None
        # the second form reads the likeliest Yes and No tokens (of the first prompt): one request each for echo
        self.pair = [max(side, key=lambda a: first.logp.get(a, -math.inf)) for side in (yes, no)]
        jobs = [("main", i, form) for i in range(n)]
        # the check's requests go in among the others, the repeat far from the prompt's first reading
        extra = [("repeat", i, form) for i in checked] + [("second", i, second) for i in checked]
        order = jobs[: n // 2] + extra + jobs[n // 2:]
        readings = self.run_pool(order, probe, progress)
        res = self.result(probe, readings, yes, no, n)
        check_started = time.perf_counter()
        res.check = self.self_check(probe, readings, checked, form, second, yes, no, check_started)
        main_requests = sum(r.requests for (what, _), r in readings.items() if what == "main")
        res.n_forward = main_requests
        bound = self.bounds(readings, yes, no, n)
        res.backend = {"kind": server.kind, "version": server.version, "url": self.client.shown,
                       "served_model": self.model, "form": form.name, "exact": bound is None,
                       "logprobs_mode": "raw", "template": template,
                       "requests": self.client.count, "concurrency": self.concurrency,
                       "p_yes_bound": None if bound is None else bound[0],
                       "mass_bound": None if bound is None else bound[1]}
        res.strategy = form.name
        res.precision = {"dtype": "served", "autocast": None, "device": f"{server.kind} server", "compute": "served"}
        res.model = self.name
        self.probes += 1
        return res

    def check_vocabulary(self, probe, answers: list[int]) -> None:
        top_id = max(max((max(e) for e in probe.encoded if e), default=0), max(answers))
        size = len(probe.tok)
        if top_id >= size:
            raise ServedError(f"token id {top_id} is out of range for the tokenizer ({size} tokens): the prompts were "
                              "tokenized by another tokenizer")

    def pick_checked(self, n: int) -> list[int]:
        if not self.check_prompts or n == 0:
            return []
        order = np.random.default_rng(self.seed).permutation(n)
        k = min(self.check_prompts, n)
        start = (self.probes * k) % n
        return sorted({int(order[(start + j) % n]) for j in range(k)})

    def run_pool(self, jobs, probe, progress: bool) -> dict:
        from tqdm.auto import tqdm

        readings, lock = {}, threading.Lock()
        sample = probe.sample_index

        def work(job):
            what, i, form = job
            top = (what == "main" and i == sample) or form.name in ("token_ids_logprob", "n_probs", "top_logprobs")
            return job, form.read(list(probe.encoded[i]), top=top, only=self.pair if what == "second" else None)

        bar = tqdm(total=len(jobs), desc=f"moral probe [{probe.name}] @ {self.client.shown}", unit="req",
                   disable=not progress, dynamic_ncols=True, leave=False)
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="tinymcf-served")
        try:
            futures = [pool.submit(work, job) for job in jobs]
            for fut in as_completed(futures):
                (what, i, _), reading = fut.result()
                with lock:
                    readings[(what, i)] = reading
                bar.update(1)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            bar.close()
        pool.shutdown(wait=True)
        return readings

    @staticmethod
    def answer(reading: Reading, yes: list[int], no: list[int]) -> tuple[float, float]:
        """``(p_yes, yn_mass)`` from the answer tokens read (an unread one counts as 0)."""
        def total(ids):
            vals = [reading.logp[a] for a in ids if a in reading.logp and math.isfinite(reading.logp[a])]
            return float(np.exp(np.logaddexp.reduce(vals))) if vals else 0.0
        py, pn = total(yes), total(no)
        return (py / (py + pn) if py + pn > 0 else float("nan")), py + pn

    def result(self, probe, readings: dict, yes, no, n: int) -> ScoreResult:
        res = empty_result(n)
        tops = []
        answers = {*yes, *no} | {probe.tok.decode([a]) for a in (*yes, *no)}
        for i in range(n):
            reading = readings[("main", i)]
            res.p_yes[i], res.yn_mass[i] = self.answer(reading, yes, no)
            if len(reading.top) >= 3:
                tops.append(any(t in answers for t, _ in reading.top[:3]))
        res.yn_top3 = np.array(tops, dtype=bool) if len(tops) == n else np.zeros(0, dtype=bool)
        sample = readings[("main", probe.sample_index)]
        res.top_tokens = [(t if isinstance(t, str) else probe.tok.decode([t]), float(math.exp(v)))
                          for t, v in sample.top[:10]]
        return res

    def bounds(self, readings: dict, yes, no, n: int) -> tuple[float, float] | None:
        """For a top-k form: the widest P(Yes) interval and the most answer mass the unread tokens can hide."""
        widest = hidden = 0.0
        inexact = False
        for i in range(n):
            r = readings[("main", i)]
            if r.floor is None:
                continue
            cap = math.exp(r.floor)
            miss_y, miss_n = sum(a not in r.logp for a in yes), sum(a not in r.logp for a in no)
            if not miss_y and not miss_n:
                continue
            inexact = True
            py = sum(math.exp(r.logp[a]) for a in yes if a in r.logp)
            pn = sum(math.exp(r.logp[a]) for a in no if a in r.logp)
            lo = py / (py + pn + miss_n * cap) if py + pn + miss_n * cap > 0 else 0.0
            hi = (py + miss_y * cap) / (py + miss_y * cap + pn) if py + miss_y * cap + pn > 0 else 1.0
            widest, hidden = max(widest, hi - lo), max(hidden, (miss_y + miss_n) * cap)
        return (widest, hidden) if inexact else None

    def self_check(self, probe, readings, checked, form, second, yes, no, check_started) -> dict | None:
        if not checked:
            return None
        diffs, mass_diffs = [], []
        for i in checked:
            main = readings[("main", i)]
            for what in ("repeat", "second"):
                other = readings[(what, i)]
                # the second form may read fewer answer tokens: compare on the ones both read
                common = [a for a in [*yes, *no] if a in main.logp and a in other.logp]
                y, n_ = [a for a in yes if a in common], [a for a in no if a in common]
                p0, m0 = self.answer(main, y, n_)
                p1, m1 = self.answer(other, y, n_)
                diffs.append(abs(p0 - p1) if y and n_ else 0.0)
                mass_diffs.append(abs(math.log(m0) - math.log(m1)) if m0 > 0 and m1 > 0 else 0.0)
        max_diff, max_mass = float(max(diffs)), float(max(mass_diffs))
        requests = sum(readings[(w, i)].requests for w in ("repeat", "second") for i in checked)
        check = SelfCheck(strategy=form.name, checked=list(checked), max_diff=max_diff, max_mass_diff=max_mass,
                          tolerance=self.tolerance, precision="served",
                          reference=f"{second.name} form, and {form.name} again later in the queue",
                          resolution=max(max_diff, 1e-7))
        if self.reference is not None:
            check.scored_diff, check.scored_mass_diff = self.compare_local(probe, readings, checked, yes, no)
            check.scored_tolerance = self.reference_tolerance
            check.replay_note = f"the checked prompts also scored by the local forward pass of {_name(self.reference)}"
        check.coverage = {"checked_this_cycle": min(len(probe.encoded), (self.probes + 1) * len(checked)),
                          "prompts": len(probe.encoded), "probes": self.probes + 1,
                          "cycles_completed": ((self.probes + 1) * len(checked)) // max(1, len(probe.encoded))}
        check.n_forward = requests
        check.seconds = float(time.perf_counter() - check_started)
        if max_diff > self.tolerance or max_mass > self.tolerance:
            worst = checked[int(np.argmax(np.array(diffs).reshape(len(checked), 2).max(axis=1)))]
            raise ServedError(f"the served self-check failed: the server at {self.client.shown} gave one prompt "
                              f"({probe.labels[worst]}) two answers {max_diff:.3g} apart in P(Yes) (log mass "
                              f"{max_mass:.3g}) when asked again later or in the {second.name} form, above the "
                              f"tolerance {self.tolerance:g} with {self.concurrency} request(s) in flight: its numbers "
                              "depend on request order, batching or prompt caching (llama.cpp: --concurrency 1; vLLM: "
                              "--no-enable-prefix-caching) or on the request form; raise --self-check-tolerance to "
                              "accept that resolution")
        if (check.scored_diff is not None and self.reference_tolerance is not None
                and max(check.scored_diff, check.scored_mass_diff) > self.reference_tolerance):
            raise ServedError(f"the served model differs from the local forward pass of {_name(self.reference)} by "
                              f"{check.scored_diff:.3g} in P(Yes) (log mass {check.scored_mass_diff:.3g}), above "
                              f"--reference-tolerance {self.reference_tolerance:g}: not the same weights, or another "
                              "precision or quantisation")
        return check.as_dict()

    def compare_local(self, probe, readings, checked, yes, no) -> tuple[float, float]:
        import torch

        from ..scoring.engine import score_alone
        from ..scoring.mode import probe_mode

        with probe_mode(self.reference), torch.inference_mode():
            scored, _ = score_alone(self.reference, probe.encoded, checked, probe.tok, probe.answer_format)
        diffs, mass = [], []
        for k, i in enumerate(checked):
            p, m = self.answer(readings[("main", i)], yes, no)
            diffs.append(abs(p - float(scored.p_yes[k])))
            mass.append(abs(math.log(m) - math.log(float(scored.yn_mass[k]))) if m > 0 else math.inf)
        return float(max(diffs)), float(max(mass))

    def close(self) -> None:
        self.client.close()


def _name(model) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "name_or_path", None) or type(model).__name__

