#!/usr/bin/env python
"""What a probe with a precision target costs to build and to run, here and at another commit, on the same machine.

A probe with a precision target (``until``) asks its vignettes look by look. Issue 50 made its looks slices of one
encoding: the candidates' prompts formatted and tokenised once, each look scoring a subset of their indices. This
script times, for the tiny random Qwen3 and SmolLM2-135M-Instruct (float32, the scifi set):

- ``build``: the probe made from its settings (the prompts formatted and tokenised);
- ``first run``: its first stopped probe (anything built on the way included);
- ``next run``: a second stopped probe of the same probe (the callback's every later checkpoint).

With ``--ref REF`` the package of that commit is timed too (``git archive``, in a subprocess, one process after the
other on the same machine), the ratios printed, and the reports' per-prompt P(Yes) compared: float32 gives the same
numbers to float32's spread.

    python -m benchmarks.adaptive_cost --ref main          # this tree against main
    python -m benchmarks.adaptive_cost --models tiny --runs 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# (label, settings, with a baseline): a level target asking every look (too narrow a width: used up), a change
# target's baseline (every look, none looked at), and a change target measured from a baseline of the same model (its
# change is 0: it stops at its first look)
CASES = [("until=level used up", {"until": "level", "width": 1e-6}, False),
         ("until=change baseline", {"until": "change", "width": 0.05}, False),
         ("until=change width=0.05", {"until": "change", "width": 0.05}, True)]


def factory():
    """The one call that builds a probe from its settings: ``make_probe`` where it exists, else ``Probe`` (before
    issue 50, ``Probe(tok, name, until=...)`` returned the adaptive probe)."""
    try:
        from tinymcf_callback.probe import make_probe
    except ImportError:
        from tinymcf_callback.probe import Probe as make_probe
    return make_probe


def model_and_tok(which: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinymcf_callback import testing

    if which == "tiny":
        return testing.tiny_qwen3(seed=0).eval(), AutoTokenizer.from_pretrained(testing.qwen3_tokenizer_dir())
    folder = testing.smollm2_dir()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def once(make, tok, model, settings: dict, baseline: dict | None):
    """A fresh probe: its build, its first run and its next run (seconds), and the first run's report."""
    build_s, probe = timed(lambda: make(tok, "scifi", **settings))
    first_s, report = timed(lambda: probe.run(model, baseline=baseline))
    next_s, _ = timed(lambda: probe.run(model, baseline=baseline))
    return build_s, first_s, next_s, report


def measure(models: list[str], runs: int) -> list[dict]:
    """Each case's build, first-run and next-run seconds (the best of ``runs`` fresh probes) and its report's rows."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    make = factory()
    out = []
    for which in models:
        model, tok = model_and_tok(which)
        make(tok, "scifi").run(model)  # warm: the model's first forward calls, the tokenizer's caches
        for label, settings, with_baseline in CASES:
            builds, firsts, nexts, report = [], [], [], None
            baseline = make(tok, "scifi", **settings).run(model) if with_baseline else None
            for _ in range(runs):
                build_s, first_s, next_s, report = once(make, tok, model, settings, baseline)
                builds.append(build_s)
                firsts.append(first_s)
                nexts.append(next_s)
            a = report["info"]["adaptive"]
            out.append({"model": which, "case": label, "build_s": min(builds), "first_run_s": min(firsts),
                        "next_run_s": min(nexts), "spread": statistics.pstdev(firsts) if runs > 1 else None,
                        "stopped": a["stopped"], "vignettes": a["vignettes"], "looks": len(a["looks"]),
                        "prompt_digest": report["prompt_digest"], "p_yes": list(map(float, report["raw"]["p_yes"])),
                        "score": report["score"]})
            print(f"[adaptive_cost] {which} {label}: build {min(builds):.3f} s, first run {min(firsts):.3f} s, "
                  f"next run {min(nexts):.3f} s ({a['stopped']} at {a['vignettes']} vignettes)", flush=True)
    return out


def at_ref(ref: str, models: list[str], runs: int) -> list[dict]:
    """:func:`measure` with the package of commit ``ref`` (exported with ``git archive``), in a subprocess."""
    with tempfile.TemporaryDirectory(prefix="tinymcf-adaptive-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "tinymcf_callback",
                                  "configs", "cache"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = Path(tmp) / "out.json"
        # that package (the working folder, first on the path), these benchmarks (the root, after it)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(ROOT)])}
        subprocess.run([sys.executable, "-m", "benchmarks.adaptive_cost", "--models", ",".join(models), "--runs",
                        str(runs), "--out", str(out), "--_here"], env=env, check=True, cwd=tmp)
        return json.loads(out.read_text())["rows"]


def compared(now: list[dict], then: list[dict], ref: str) -> None:
    """Ratios (this tree over ``ref``) and the largest per-prompt P(Yes) difference of each case's report."""
    import numpy as np

    print(f"\n{'model':<8} {'case':<26} {'build':>14} {'first run':>16} {'next run':>16}  same prompts, max |dP(Yes)|")
    for a, b in zip(now, then, strict=True):
        same = a["prompt_digest"] == b["prompt_digest"]
        diff = float(np.max(np.abs(np.array(a["p_yes"]) - np.array(b["p_yes"])))) if same else float("nan")
        cells = [f"{a[k]:.3f}/{b[k]:.3f} {a[k] / b[k]:.2f}x" for k in ("build_s", "first_run_s", "next_run_s")]
        print(f"{a['model']:<8} {a['case']:<26} {cells[0]:>14} {cells[1]:>16} {cells[2]:>16}  {same}, {diff:.1e}")
    print(f"(seconds: this tree / {ref}, then their ratio; the best of each side's runs)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    ap.add_argument("--runs", type=int, default=3, help="fresh probes per case (the best is kept)")
    ap.add_argument("--ref", default="", help="also time the package of this git commit, and compare")
    ap.add_argument("--out", default="", help="a JSON file for the rows")
    ap.add_argument("--_here", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._here:
        import tinymcf_callback

        print(f"[adaptive_cost] the package of {tinymcf_callback.__file__}", flush=True)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    rows = measure(models, args.runs)
    if args.ref:
        compared(rows, at_ref(args.ref, models, args.runs), args.ref)
    if args.out:
        Path(args.out).write_text(json.dumps({"ref": args.ref or None, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
