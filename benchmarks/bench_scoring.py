#!/usr/bin/env python
"""Speed and memory of the tinymcf scoring engine against two common peers, measured in one run.

Every method scores the same prompts (the ``scifi`` set: 51 vignettes x 4 conditions x
2 frames = 408 prompts) on the same model and turns the answer position into
P(Yes vs No) with the same tokenizer's Yes/No ids (``prompts.answer_token_ids``):

- ``tinymcf``: ``Probe(tok, "scifi").score(model)``: length-sorted, left-padded batches
  under a token budget, ``logits_to_keep=1`` (only the last position's logits), and the
  self-check (two prompts scored alone and compared); the time the check took is recorded;
- ``tinymcf-unchecked``: the same with ``self_check=False``: what the check costs, and the
  engine to set beside ``--baseline-ref`` (an older engine had no check);
- ``tinymcf-no-prefix-share``: the same engine with ``share_prefix=False`` (an ablation:
  every prompt scored in full, no key/value cache of the shared chat header and scenario);
- ``lm-eval-harness``: the real lm-evaluation-harness (``lm_eval``, the ``[bench]`` extra):
  ``HFLM(pretrained=model, tokenizer=tok, batch_size=64)`` scoring the log-likelihood of each
  prompt with each Yes and No token as the continuation (10 requests a prompt on SmolLM2; the
  harness groups a prompt's one-token continuations into one row), through
  ``_loglikelihood_tokens``, the harness's scoring step after its tokenisation;
- ``naive-full-logits``: the project's own loop in lm-evaluation-harness's style: batches of
  16 in the original order, right padding, a full forward returning ``[batch, seq, vocab]``
  logits, ``log_softmax`` over the whole tensor, then a gather at each row's last real token;
- ``one-at-a-time``: each prompt alone, ``model(ids).logits[0, -1]``, no batching
  (timed on an evenly spaced subset and extrapolated to the whole set).

Each (model, method) pair runs in its own subprocess: load the model and the prompts,
reset the process's peak-RSS mark, one warm-up batch, then one timed run. The methods run in
interleaved rounds (every method once, then every method again, ``--runs`` rounds) and each
keeps its best round, so a slow minute of the machine falls on all of them alike.
Memory is ``ru_maxrss`` at the end minus ``ru_maxrss`` after the load, and
a forward hook records the largest logits tensor the model hands back. Only ratios
between methods of the same run are meant to be compared; nothing is hard-coded.

    python -m benchmarks.bench_scoring                  # every model, ~15 min on 2 idle cores
    python -m benchmarks.bench_scoring --quick          # smoke run, fewer prompts
    python -m benchmarks.bench_scoring --models tiny-qwen3 --out /tmp/bench.json
    python -m benchmarks.bench_scoring --baseline-ref 8f888ee   # also time the engine of an older commit

``--baseline-ref REF`` exports that commit of this repository (``git archive``) to a
temporary folder and runs *its* ``tinymcf`` worker beside today's, in the same run, as
method ``tinymcf@REF``: a before/after check of the engine's speed under the same load.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct, fp32 (real model)",
    "tiny-qwen3": "tiny random Qwen3, ~10M params, 151,936-token vocab, fp32 (vocabulary-dominated)",
    "tiny-qwen3-bf16": "the same tiny Qwen3 in bf16: what the self-check's float32 replay costs",
}
METHODS = ("tinymcf", "tinymcf-unchecked", "tinymcf-no-prefix-share", "lm-eval-harness", "naive-full-logits",
           "one-at-a-time")
MODEL_METHODS = {"tiny-qwen3-bf16": ("tinymcf", "tinymcf-unchecked")}  # the check's cost only (bf16 is slow on CPUs)
LM_EVAL_BATCH = 64
NAIVE_BATCH = 16
TOLERANCE = 1e-4
REDUCED_TOLERANCE = 5e-2  # bf16: a prompt's P(Yes) differs by this much between two batchings (engine docs)
QUICK_VIGNETTES = 6  # 6 x 4 x 2 = 48 prompts
QUICK_SINGLE = 16
FOREIGN_LOAD_WARN = 0.2  # CPUs kept busy by other processes during the timed runs


# --------------------------------------------------------------------------- worker side

def load_model(key: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from tinymcf_callback import testing as offline_assets

    hf_logging.disable_progress_bar()
    if key == "smollm2":
        path = offline_assets.smollm2_dir()
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    elif key in ("tiny-qwen3", "tiny-qwen3-bf16"):
        tok = AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
        model = offline_assets.tiny_qwen3(seed=0)
    else:
        raise ValueError(f"unknown model {key!r}; choose from {', '.join(MODELS)}")
    return tok, model.to(torch.bfloat16 if key.endswith("-bf16") else torch.float32).eval()


def _pad_id(tok) -> int:
    if tok.pad_token_id is not None:
        return tok.pad_token_id
    return tok.eos_token_id if tok.eos_token_id is not None else 0


def _p_yes_from_logp(logp, yes: list[int], no: list[int]):
    """P(Yes vs No) from rows of log-probabilities ``[n, vocab]``."""
    import torch

    lyes = torch.logsumexp(logp[:, yes], dim=-1)
    lno = torch.logsumexp(logp[:, no], dim=-1)
    return torch.sigmoid(lyes - lno).double().cpu().numpy()


def naive_full_logits(model, tok, encoded, idx, yes, no):
    """lm-evaluation-harness style: fixed batches in the given order, right padding, full logits (on the model's
    device)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    pad, out = _pad_id(tok), np.empty(len(idx))
    device = next(model.parameters()).device
    with torch.no_grad():
        for start in range(0, len(idx), NAIVE_BATCH):
            seqs = [encoded[i] for i in idx[start:start + NAIVE_BATCH]]
            width = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for row, seq in enumerate(seqs):
                ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[row, :len(seq)] = 1
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                           use_cache=False).logits  # [b, seq, vocab]
            logp = F.log_softmax(logits.float(), dim=-1)  # over the whole tensor, as the harness does
            last = (mask.sum(dim=1) - 1).to(device)
            out[start:start + len(seqs)] = _p_yes_from_logp(logp[torch.arange(len(seqs), device=device), last],
                                                            yes, no)
    return out


def lm_eval_harness(lm, encoded, idx, yes, no):
    """The real lm-evaluation-harness scoring the prompts' tokens: each prompt with each answer token as continuation.

    The requests go to ``HFLM._loglikelihood_tokens``, what ``HFLM.loglikelihood`` calls once it has tokenised
    ``(context, continuation)`` strings: the harness's own ordering, grouping and batching, on the engine's token
    ids (pre-tokenised, as every method here is timed; and the string route cannot ask for an answer token that
    merges with the prompt's last character, as 3 of the Qwen3 tokenizer's 13 do).
    """
    import torch

    answers = yes + no
    requests = [((str(i), str(t)), list(encoded[i]), [t]) for i in idx for t in answers]
    logp = torch.tensor([ll for ll, _ in lm._loglikelihood_tokens(requests, disable_tqdm=True)]).reshape(len(idx), -1)
    return torch.sigmoid(torch.logsumexp(logp[:, :len(yes)], -1) - torch.logsumexp(logp[:, len(yes):], -1)).double(
    ).numpy()


def harness_for(model, tok):
    """lm-evaluation-harness's ``HFLM`` around the loaded model (``pip install -e '.[bench]'``)."""
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        raise SystemExit("the lm-eval-harness peer needs lm_eval: pip install -e '.[bench]' (make bench does)"
                         ) from None
    return HFLM(pretrained=model, tokenizer=tok, batch_size=LM_EVAL_BATCH)


def one_at_a_time(model, tok, encoded, idx, yes, no):
    """Each prompt alone, full logits, no padding and no batching."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    out = np.empty(len(idx))
    with torch.no_grad():
        for k, i in enumerate(idx):
            logits = model(torch.tensor([encoded[i]], dtype=torch.long)).logits[0, -1]
            out[k] = _p_yes_from_logp(F.log_softmax(logits.float(), dim=-1)[None], yes, no)[0]
    return out


class LogitsMeter:
    """Forward hook on the whole model: the largest ``logits`` tensor it returned."""

    def __init__(self, model):
        self.bytes, self.shape = 0, None
        self.handle = model.register_forward_hook(self)

    def __call__(self, module, args, output):
        t = output.logits
        size = t.numel() * t.element_size()
        if size > self.bytes:
            self.bytes, self.shape = size, list(t.shape)


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (what ``ru_maxrss`` reports) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20  # macOS reports bytes


def _cpu_snapshot() -> tuple[float, float]:
    """(seconds of CPU the whole machine spent busy, seconds this process used) since boot/start."""
    hz = os.sysconf("SC_CLK_TCK")
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / hz  # all but idle and iowait (guest is in user)
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    own = resource.getrusage(resource.RUSAGE_SELF)
    return busy, own.ru_utime + own.ru_stime


def worker(model_key: str, method: str, limit: int | None, n_single: int, runs: int, out_path: str) -> None:
    import numpy as np
    import torch

    from tinymcf_callback.probe import Probe
    from tinymcf_callback.scoring.prompts import answer_token_ids

    tok, model = load_model(model_key)
    probe = Probe(tok, "scifi", limit)  # prompt texts, token ids and batch plan: built once, not timed
    yes, no = answer_token_ids(tok)
    encoded, n = probe.encoded, len(probe)
    if method == "one-at-a-time" and n_single < n:
        idx = sorted(set(np.linspace(0, n - 1, n_single).round().astype(int).tolist()))
    else:
        idx = list(range(n))

    check_s = []  # the self-check's own seconds, per timed run (tinymcf only)
    if method == "tinymcf":
        def run():
            res = probe.score(model)
            if getattr(res, "check", None):  # an older engine (--baseline-ref) has no self-check
                check_s.append(res.check["seconds"])
            return res.p_yes

        def warm():
            probe.score(model, batches=[list(range(min(NAIVE_BATCH, n)))])
    elif method == "tinymcf-unchecked":  # the same engine without its self-check
        unchecked = Probe(tok, "scifi", limit, self_check=False)

        def run():
            return unchecked.score(model).p_yes

        def warm():
            unchecked.score(model, batches=[list(range(min(NAIVE_BATCH, n)))])
    elif method == "tinymcf-no-prefix-share":  # ablation: the same engine scoring every prompt in full
        flat = Probe(tok, "scifi", limit, share_prefix=False)

        def run():
            return flat.score(model).p_yes

        def warm():
            flat.score(model, batches=[list(range(min(NAIVE_BATCH, n)))])
    elif method == "naive-full-logits":
        def run():
            return naive_full_logits(model, tok, encoded, idx, yes, no)

        def warm():
            naive_full_logits(model, tok, encoded, idx[:NAIVE_BATCH], yes, no)
    elif method == "lm-eval-harness":
        lm = harness_for(model, tok)

        def run():
            return lm_eval_harness(lm, encoded, idx, yes, no)

        def warm():
            lm_eval_harness(lm, encoded, idx[:1], yes, no)
    elif method == "one-at-a-time":
        def run():
            return one_at_a_time(model, tok, encoded, idx, yes, no)

        def warm():
            one_at_a_time(model, tok, encoded, idx[:1], yes, no)
    else:
        raise ValueError(f"unknown method {method!r}")

    gc.collect()
    reset = _reset_peak_rss()
    base_mb = _maxrss_mb()
    meter = LogitsMeter(model)
    warm()
    calls = []
    counter = model.register_forward_pre_hook(lambda *_: calls.append(1))
    times, p_yes = [], None
    busy0, own0 = _cpu_snapshot()
    t0 = time.perf_counter()
    for _ in range(runs):
        start = time.perf_counter()
        p_yes = run()
        times.append(time.perf_counter() - start)
    busy1, own1 = _cpu_snapshot()
    foreign = max(0.0, ((busy1 - busy0) - (own1 - own0)) / (time.perf_counter() - t0))
    peak_mb = _maxrss_mb()
    meter.handle.remove()
    counter.remove()

    result = {
        "model": model_key, "method": method, "n_prompts": n, "n_timed": len(idx), "indices": idx,
        "p_yes": [float(x) for x in p_yes], "times_s": times, "best_s": min(times),
        "peak_rss_mb": peak_mb, "baseline_rss_mb": base_mb, "peak_delta_mb": peak_mb - base_mb,
        "peak_mark_reset": reset, "logits_mb": meter.bytes / 2**20, "logits_shape": meter.shape,
        "n_params": sum(p.numel() for p in model.parameters()), "vocab": int(model.config.vocab_size),
        "torch_threads": torch.get_num_threads(), "foreign_cpu_cores": foreign,
        "prompt_tokens": sum(len(encoded[i]) for i in idx),
        "check_s": check_s[times.index(min(times))] if check_s else None,  # in the best run
        "forward_calls": len(calls) // runs,  # per timed run (a probe's self-check included)
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
    }
    Path(out_path).write_text(json.dumps(result))


# --------------------------------------------------------------------------- driver side

def other_load(sample_s: float = 1.0) -> float:
    """CPUs kept busy by other processes over ``sample_s`` seconds (the driver itself sleeps)."""
    busy0, own0 = _cpu_snapshot()
    time.sleep(sample_s)
    busy1, own1 = _cpu_snapshot()
    return max(0.0, ((busy1 - busy0) - (own1 - own0)) / sample_s)


def wait_for_quiet(max_wait_s: float) -> tuple[float, float]:
    """Wait up to ``max_wait_s`` for other processes to leave the CPUs; (seconds waited, last load)."""
    load = other_load()
    start = time.perf_counter()  # the first 1 s sample is not waiting
    while load > FOREIGN_LOAD_WARN and time.perf_counter() - start < max_wait_s:
        time.sleep(4.0)
        load = other_load()
    return time.perf_counter() - start, load


def run_worker(model_key: str, method: str, args, tmp: Path, script: Path | None = None) -> dict:
    """Run one (model, method) pair in a subprocess; ``script``: another checkout's bench script."""
    out = tmp / f"{model_key}-{method.replace('@', '_at_')}.json"
    limit = QUICK_VIGNETTES if args.quick else (args.vignettes or None)
    n_single = QUICK_SINGLE if args.quick else args.single_prompts
    worker_method = method.split("@", 1)[0]
    cmd = [sys.executable, "-m", "benchmarks.bench_scoring", "--_worker", model_key, worker_method,
           "--_limit", str(limit or 0), "--_single", str(n_single), "--runs", "1", "--_result", str(out)]
    start = time.perf_counter()
    root = (script or Path(__file__).resolve()).parents[1]  # its checkout: the package it imports
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"worker {model_key}/{method} failed (exit {proc.returncode})")
    res = json.loads(out.read_text())
    res["method"] = method
    res["process_wall_s"] = time.perf_counter() - start
    return res


def merge_round(kept: dict | None, new: dict) -> dict:
    """One method's rounds so far: every round's time, the best round's figures (the peak memory: the largest)."""
    if kept is None:
        return new
    times = kept["times_s"] + new["times_s"]
    best = new if new["best_s"] < kept["best_s"] else kept
    return {**best, "times_s": times, "best_s": min(times), "peak_delta_mb": max(kept["peak_delta_mb"],
                                                                                  new["peak_delta_mb"]),
            "foreign_cpu_cores": max(kept["foreign_cpu_cores"], new["foreign_cpu_cores"])}


def summarise(model_key: str, results: dict) -> list[dict]:
    import numpy as np

    ref = results["tinymcf"]
    ref_p = np.asarray(ref["p_yes"])
    ref_s = ref["best_s"]
    rows = []
    for method, r in results.items():
        full_s = r["best_s"] * r["n_prompts"] / r["n_timed"]  # extrapolated when a subset was timed
        diff = float(np.max(np.abs(np.asarray(r["p_yes"]) - ref_p[r["indices"]])))
        agree = diff <= (TOLERANCE if r.get("dtype", "float32") == "float32" else REDUCED_TOLERANCE)
        rows.append({
            "model": model_key, "method": method, "n_prompts": r["n_prompts"], "n_timed": r["n_timed"],
            "extrapolated": r["n_timed"] < r["n_prompts"], "wall_s": full_s, "timed_s": r["best_s"],
            "runs_s": r["times_s"], "prompts_per_s": r["n_prompts"] / full_s,
            "tinymcf_speedup": full_s / ref_s, "peak_delta_mb": r["peak_delta_mb"],
            "mem_ratio_vs_tinymcf": r["peak_delta_mb"] / ref["peak_delta_mb"] if ref["peak_delta_mb"] > 0 else None,
            "logits_mb": r["logits_mb"], "logits_shape": r["logits_shape"],
            "logits_ratio_vs_tinymcf": r["logits_mb"] / ref["logits_mb"] if ref["logits_mb"] > 0 else None,
            "max_abs_dp_yes": diff, "agree": agree, "peak_mark_reset": r["peak_mark_reset"],
            "n_params": r["n_params"], "vocab": r["vocab"], "torch_threads": r["torch_threads"],
            "foreign_cpu_cores": r["foreign_cpu_cores"], "check_s": r.get("check_s"),
            "forward_calls": r.get("forward_calls"), "dtype": r.get("dtype", "float32"),
        })
    return rows


def format_table(rows: list[dict]) -> str:
    head = ("model", "method", "wall s", "prompts/s", "tinymcf x", "calls", "peak +MB", "mem x", "logits MB", "max|dp|",
            "check", "busy")
    lines = []
    for r in rows:
        star = "*" if r["extrapolated"] else ""
        tiny = r["method"] == "tinymcf"
        lines.append((
            r["model"], r["method"], f"{r['wall_s']:.2f}{star}", f"{r['prompts_per_s']:.1f}",
            "1.00" if tiny else f"{r['tinymcf_speedup']:.2f}", str(r.get("forward_calls", "")),
            f"{r['peak_delta_mb']:.0f}",
            "1.00" if tiny else ("n/a" if r["mem_ratio_vs_tinymcf"] is None else f"{r['mem_ratio_vs_tinymcf']:.1f}"),
            f"{r['logits_mb']:.1f}", "-" if tiny else f"{r['max_abs_dp_yes']:.1e}",
            "ref" if tiny else ("PASS" if r["agree"] else "FAIL"), f"{r['foreign_cpu_cores']:.2f}",
        ))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=True)]
    fmt = lambda row: "  ".join(str(x).ljust(w) if i < 2 else str(x).rjust(w)  # noqa: E731
                                for i, (x, w) in enumerate(zip(row, widths, strict=True)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines])


def machine_info() -> dict:
    import torch
    import transformers

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def export_ref(ref: str, dest: Path) -> Path:
    """The bench script of commit ``ref`` of this repository, exported (``git archive``) under ``dest``."""
    folder = dest / "ref"
    folder.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        why = detail.decode(errors="replace").strip() or e
        raise SystemExit(f"--baseline-ref {ref}: cannot export that commit ({why})") from None
    script = folder / "benchmarks" / "bench_scoring.py"
    if not script.is_file():
        raise SystemExit(f"--baseline-ref {ref}: that commit has no benchmarks/bench_scoring.py")
    return script


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: {QUICK_VIGNETTES} vignettes ({QUICK_VIGNETTES * 8} prompts), "
                         f"one-at-a-time on {QUICK_SINGLE}")
    ap.add_argument("--runs", type=int, default=3,
                    help="interleaved rounds: each method timed once per round, its best round kept (default 3)")
    ap.add_argument("--single-prompts", type=int, default=96,
                    help="prompts the one-at-a-time peer is timed on, extrapolated to the set (default 96)")
    ap.add_argument("--vignettes", type=int, default=0,
                    help="score only the first N of the 51 vignettes (8 prompts each); default all")
    ap.add_argument("--wait-idle", type=float, default=60.0,
                    help="before each method, wait up to this many seconds for other processes to leave the "
                         "CPUs (default 60; 0: do not wait)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results.json"), help="JSON results file")
    ap.add_argument("--methods", default="",
                    help="comma-separated methods to time (default: every one); with --baseline-ref, tinymcf "
                         "alone gives a quick before/after check of the engine's numbers")
    ap.add_argument("--baseline-ref", default="",
                    help="also time the tinymcf engine of this git commit (e.g. the one before a refactor), "
                         "side by side in the same run")
    ap.add_argument("--_worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--_limit", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--_single", type=int, default=96, help=argparse.SUPPRESS)
    ap.add_argument("--_result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.vignettes < 0 or args.single_prompts < 1:
        ap.error("--vignettes must be >= 0 and --single-prompts >= 1")

    if args._worker:
        worker(*args._worker, limit=args._limit or None, n_single=args._single, runs=args.runs,
               out_path=args._result)
        return 0

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")

    started = time.perf_counter()
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    machine = machine_info()
    print(f"[bench] {date}  {machine['cpu']} ({machine['cpu_count']} CPUs), torch {machine['torch']}, "
          f"transformers {machine['transformers']}")
    print(f"[bench] each method in its own subprocess: 1 warm-up batch, 1 timed run; {args.runs} interleaved "
          f"round(s), the best kept"
          + (" [--quick]" if args.quick else ""))
    rows, per_model, waited_total = [], {}, 0.0
    with tempfile.TemporaryDirectory(prefix="tinymcf-bench-") as tmp:
        ref_script = export_ref(args.baseline_ref, Path(tmp)) if args.baseline_ref else None
        methods = [(m, None) for m in METHODS]
        if ref_script is not None:
            methods.insert(1, (f"tinymcf@{args.baseline_ref}", ref_script))
        for key in models:
            results: dict[str, dict] = {}
            wanted = {m.strip() for m in args.methods.split(",") if m.strip()} or set(METHODS)
            chosen = [(m, sc) for m, sc in methods if m.split("@", 1)[0] in MODEL_METHODS.get(key, METHODS)
                      and m.split("@", 1)[0] in wanted]
            for round_ in range(1, args.runs + 1):  # interleaved: every method once, then every method again
                for method, script in chosen:
                    if args.wait_idle > 0:
                        waited, load = wait_for_quiet(args.wait_idle)
                        waited_total += waited
                        if waited >= 2:
                            print(f"[bench] waited {waited:.0f}s for other processes to leave the CPUs "
                                  f"({load:.2f} CPUs busy now)", flush=True)
                    print(f"[bench] {key} / {method} (round {round_} of {args.runs}) ...", end=" ", flush=True)
                    r = run_worker(key, method, args, Path(tmp), script)
                    results[method] = merge_round(results.get(method), r)
                    sub = f" on {r['n_timed']} of {r['n_prompts']} prompts" if r["n_timed"] < r["n_prompts"] else ""
                    print(f"{r['best_s']:.2f}s{sub}, {r['forward_calls']} forward calls, peak "
                          f"+{r['peak_delta_mb']:.0f} MB, other processes {r['foreign_cpu_cores']:.2f} CPUs busy "
                          f"(process {r['process_wall_s']:.0f}s)", flush=True)
            model_rows = summarise(key, results)
            rows += model_rows
            first = results["tinymcf"]
            per_model[key] = {"label": MODELS[key], "n_prompts": first["n_prompts"], "n_params": first["n_params"],
                              "vocab": first["vocab"], "prompt_tokens": first["prompt_tokens"]}
    total = time.perf_counter() - started

    print()
    for key, info in per_model.items():
        print(f"{key}: {info['label']}; {info['n_params'] / 1e6:.1f}M params; {info['n_prompts']} prompts, "
              f"{info['prompt_tokens']} tokens")
    print(format_table(rows))
    single = [r for r in rows if r["extrapolated"]]
    if single:
        r = single[0]
        print(f"* timed on {r['n_timed']} of {r['n_prompts']} evenly spaced prompts and extrapolated to all "
              f"{r['n_prompts']}; its max|dp| is over those {r['n_timed']}.")
    print(f"wall s: best of {args.runs}, scoring only (prompts pre-tokenised, model loaded); "
          "tinymcf x: peer wall / tinymcf wall; peak +MB: ru_maxrss after the runs minus after the load "
          "(own subprocess); mem x: peer / tinymcf; logits MB: largest logits tensor the model returned "
          "(the naive peer's log_softmax makes a second one of the same size); max|dp|: max |p_yes - "
          f"tinymcf p_yes|, PASS if <= {TOLERANCE:g}; busy: CPUs other processes kept busy while it was timed.")
    busy = max(r["foreign_cpu_cores"] for r in rows)
    if busy > FOREIGN_LOAD_WARN:
        print(f"WARNING: other processes kept up to {busy:.2f} CPUs busy while methods were timed; the speed "
              "figures are disturbed (small ops stall when torch's threads are descheduled). Rerun on an idle machine.")
    if not all(r["peak_mark_reset"] for r in rows):
        print("note: /proc/self/clear_refs was not writable, so the peak may include the model load's own peak.")
    print(f"[bench] total run time {total:.0f}s" + (f" ({waited_total:.0f}s of it waiting for a quiet machine)"
                                                     if waited_total >= 1 else ""))

    for r in rows:
        if r["method"] == "lm-eval-harness":
            print(f"{r['model']}: the real lm-evaluation-harness (HFLM, batch {LM_EVAL_BATCH}) takes "
                  f"{r['tinymcf_speedup']:.2f}x the time of tinymcf's checked probe ({r['wall_s']:.2f} s against "
                  f"{r['wall_s'] / r['tinymcf_speedup']:.2f} s, best of {args.runs} interleaved rounds), "
                  f"{r['forward_calls']} forward calls; the same P(Yes) within {r['max_abs_dp_yes']:.1e}")
        if r["method"] == "tinymcf" and r.get("check_s") is not None:
            unchecked = next((u for u in rows if u["model"] == r["model"] and u["method"] == "tinymcf-unchecked"), None)
            whole = f"; checked / unchecked probe {1 / unchecked['tinymcf_speedup']:.3f}x" if unchecked else ""
            print(f"{r['model']}: the self-check took {r['check_s']:.2f} s of the {r['wall_s']:.2f} s probe "
                  f"({r['check_s'] / r['wall_s']:.1%}){whole}")
        if "@" in r["method"]:
            unchecked = next((u for u in rows if u["model"] == r["model"] and u["method"] == "tinymcf-unchecked"), None)
            against = (f"; {r['wall_s'] / unchecked['wall_s']:.2f}x today's without its self-check"
                       if unchecked else "")
            print(f"{r['model']}: the engine of {r['method'].split('@', 1)[1]} takes {r['tinymcf_speedup']:.2f}x "
                  f"the time of today's{against} (above 1: today's is faster)")
    payload = {"date": date, "baseline_ref": args.baseline_ref or None, "machine": machine, "quick": args.quick,
               "runs": args.runs,
               "naive_batch_size": NAIVE_BATCH, "tolerance": TOLERANCE, "models": per_model, "rows": rows,
               "all_agree": all(r["agree"] for r in rows), "max_foreign_cpu_cores": busy, "total_wall_s": total,
               "waited_for_quiet_s": waited_total}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"[bench] wrote {out}")
    return 0 if payload["all_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
