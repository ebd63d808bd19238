#!/usr/bin/env python
"""What a cheap probe costs and what it gives up: per_foundation subsets against the whole set and ``limit``.

One model (SmolLM2-135M-Instruct, fp32, CPU), one process, scored in turn: ``scifi`` whole (51
vignettes), ``per_foundation`` 1 to 4 (7 to 28 vignettes, every foundation and the Social Norms
control), and ``limit=14`` (the first 14 in stored order: Care and Fairness only). For each: the
wall time of a probe (best of ``--runs``, after a warm-up), and the widths of the 95% bootstrap
intervals of the score, the control and score - control, which say how large a change the probe
can see. Ratios are against the whole set in the same run.

    python -m benchmarks.subset_intervals            # ~3 min on 2 idle cores
    python -m benchmarks.subset_intervals --quick    # the tiny random Qwen3: mechanics only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SUBSETS = [("whole set", {}), *((f"per_foundation={n}", {"per_foundation": n}) for n in (1, 2, 3, 4)),
           ("limit=14", {"limit": 14})]


def width(report: dict, key: str) -> float | None:
    lo, hi = report.get(f"{key}_lo"), report.get(f"{key}_hi")
    return None if lo is None or hi is None else hi - lo


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="timed probes per subset (the best is kept)")
    p.add_argument("--quick", action="store_true", help="the tiny random Qwen3 instead of SmolLM2")
    p.add_argument("--out", default=str(Path(__file__).with_name("subset_intervals.json")))
    args = p.parse_args(argv)

    import logging

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinymcf_callback import Probe
    from tinymcf_callback import testing as offline_assets

    logging.getLogger("tinymcf_callback").setLevel(logging.ERROR)  # the limit's note is the point here, not news
    if args.quick:
        tok = AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
        model, label = offline_assets.tiny_qwen3(seed=0), "tiny random Qwen3"
    else:
        tok = AutoTokenizer.from_pretrained(offline_assets.smollm2_dir())
        model = AutoModelForCausalLM.from_pretrained(offline_assets.smollm2_dir(), dtype=torch.float32).eval()
        label = "SmolLM2-135M-Instruct fp32"
    rows = []
    for name, settings in SUBSETS:
        probe = Probe(tok, "scifi", **settings)
        probe.run(model)  # warm-up
        best, report = None, None
        for _ in range(args.runs):
            start = time.perf_counter()
            report = probe.run(model)
            took = time.perf_counter() - start
            best = took if best is None else min(best, took)
        kept = list(report["table"].index)
        rows.append({"subset": name, "vignettes": len(probe.vignettes), "prompts": len(probe.prompts),
                     "foundations": len(kept), "control": "Social Norms" in kept, "seconds": best,
                     "score": report["score"], "score_width": width(report, "score"), "sn_width": width(report, "sn"),
                     "score_minus_sn_width": width(report, "score_minus_sn")})
    whole = rows[0]
    fmt = lambda x, spec: "n/a" if x is None else format(x, spec)  # noqa: E731
    print(f"{label}, scifi, 95% intervals, best of {args.runs} probes; ratios against the whole set")
    print(f"{'subset':<18} {'vign':>4} {'found':>5} {'ctrl':>4} {'seconds':>8} {'time x':>6} {'score':>7} "
          f"{'score width':>11} {'width x':>7} {'sn width':>8} {'score-sn width':>14}")
    for r in rows:
        ratio = None if r["score_width"] is None or whole["score_width"] is None else (
            r["score_width"] / whole["score_width"])
        print(f"{r['subset']:<18} {r['vignettes']:>4} {r['foundations']:>5} {'yes' if r['control'] else 'no':>4} "
              f"{r['seconds']:>8.2f} {r['seconds'] / whole['seconds']:>6.2f} {fmt(r['score'], '+.3f'):>7} "
              f"{fmt(r['score_width'], '.3f'):>11} {fmt(ratio, '.2f'):>7} {fmt(r['sn_width'], '.3f'):>8} "
              f"{fmt(r['score_minus_sn_width'], '.3f'):>14}")
    Path(args.out).write_text(json.dumps({"model": label, "runs": args.runs, "rows": rows,
                                          "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__},
                                         indent=2) + "\n", encoding="utf-8")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
