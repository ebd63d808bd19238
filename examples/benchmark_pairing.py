#!/usr/bin/env python
"""The demo's fine-tune with the slow benchmark beside the probe: the figure of docs/benchmark.md.

The demo's recipe (``examples/demo.py``: SmolLM2-135M-Instruct, fp32 on the CPU, everyday moral judgements), the
probe at step 0 and every ``--eval-every`` steps (``--per-foundation 2`` by default), and the preference pairs
(``--prefs``, default the project's 36 ETHICS-style test pairs) at the run's start, middle and end
(``MoralProbeCallback(prefs=...)``). Then ``tinymcf compare RUN --steps 0 END`` and the paper figure, the score with
the pairs' accuracy over it:

    python examples/benchmark_pairing.py                          # 50 steps (~5 min on 2 idle cores)
    python examples/benchmark_pairing.py --quick                  # 2 steps: the mechanics

Writes under ``--output-dir`` (default ``runs/benchmark``) the probe's history, the benchmark's
``moral_bench_scifi.jsonl`` beside it, and ``headline.png`` (``tinymcf plot RUN --panels headline``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import demo  # noqa: E402 - the demo's data, recipe and offline set-up

PAIRS = ROOT / "tests" / "data" / "prefs" / "ethics_like.jsonl"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default=str(ROOT / "runs" / "benchmark"))
    p.add_argument("--prefs", default=str(PAIRS), help="the preference pairs (default: the project's test pairs)")
    demo.add_recipe_args(p)
    args = demo.finish_args(p, p.parse_args(argv))
    if not args.quick and not args.limit and not args.per_foundation:
        args.per_foundation = 2
    demo.offline_environment()
    out = Path(args.output_dir).resolve()
    demo.prepare_output_dir(out, also=("moral_bench_scifi.jsonl", "headline.png"))
    run = demo.prepare_run(args, out, tag="benchmark")
    from tinymcf_callback import MoralProbeCallback, compare_steps
    from tinymcf_callback.benchmark.steps import format_steps
    from tinymcf_callback.cli.main import main as tinymcf

    run.trainer.remove_callback(run.probe)  # the demo's probe, again with the benchmark beside it
    run.trainer.add_callback(MoralProbeCallback(name="scifi", limit=args.limit or None,
                                                per_foundation=args.per_foundation or None, trainer=run.trainer,
                                                prefs=args.prefs))
    result = demo.train(run)
    demo.print_summary(run, result)
    end = max(line["step"] for line in result.history)
    print(format_steps(compare_steps(out, 0, end)))
    return tinymcf(["plot", str(out), "--panels", "headline", "--out", str(out / "headline.png")])


if __name__ == "__main__":
    sys.exit(main())
