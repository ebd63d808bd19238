#!/usr/bin/env python
"""Does training one foundation move that foundation's score more than the others'? Selectivity, measured.

Runs the demo's recipe (``examples/demo.py``: SmolLM2-135M-Instruct, fp32 on the CPU, 50 steps,
``MoralProbeCallback(name="scifi")`` at step 0 and every 10 steps) once per target foundation,
each time training on **that foundation's contrast pairs only** (4 pairs, 16 examples; the other
foundations' pairs are left out), from the same starting weights, with the same seed, learning
rate and number of steps. The held-out evaluation keeps all six foundations' held-out pairs, so
``answer_accuracy`` shows how far the taught answers carry to the untrained foundations.

For each run and each target the script reports, from the step-0 and final probe reports (the
same 51 ``scifi`` vignettes):

- the change of the target's ``align_other`` since step 0 (``on_target``), the mean change of the
  other five real foundations' (``off_target``), and **selectivity** = on-target minus off-target,
  each with its 95% interval and p-value (``tinymcf_callback.stats.bootstrap.selectivity``: the paired
  bootstrap over vignettes of ``compare``);
- every foundation's change (``stats.paired_change``), so a reader sees where the training went.

With ``--reference DIR`` (default ``runs/validity/aligned`` when it exists: the demo's run on all
six foundations, trained by ``examples/validity.py``) the same figures are computed for that run,
as the yardstick: training on everything should not be selective.

    python examples/selectivity.py                           # Care-only and Authority-only (~6 min each, 2 cores)
    python examples/selectivity.py --targets Care --quick    # smoke run of the mechanics
    python examples/selectivity.py --from-runs               # recompute the tables from finished runs

Writes, under ``--output-dir`` (default ``runs/selectivity``): one folder per target
(``care-only/``, ...: a demo run folder with its history, last checkpoint and every probe's
report in ``reports/``), ``selectivity.json`` and ``selectivity.md`` (the tables, also printed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import demo  # noqa: E402  the recipe
import validity  # noqa: E402  labelling, report keeping and the table helpers

DEFAULT_TARGETS = ("Care", "Authority")


def folder_name(target: str) -> str:
    return f"{target.lower()}-only"


def only(pairs, target: str):
    """The contrast pairs of one foundation, labelled as the demo labels them (the truth)."""
    kept = [pair for pair in pairs if pair[0]["foundation"] == target]
    return validity.relabel(kept, [False] * len(kept))


def run_target(args, target: str, out: Path) -> dict:
    train_pairs, held_pairs = demo.contrast_sets(demo.load_situations(), args.seed)
    train = only(train_pairs, target)
    if not train:
        raise SystemExit(f"selectivity: the demo data hold no {target} pairs")
    held = validity.relabel(held_pairs, [False] * len(held_pairs))
    return validity.train_pairs_into(args, folder_name(target), out, train, held, {"target": target})


def reports(out: Path) -> tuple[dict, dict, int]:
    """The step-0 and the last probed step's full reports of a run folder (kept by validity's report keeper)."""
    history = demo.read_history(out / demo.HISTORY)
    if not history:
        raise SystemExit(f"selectivity: {out} holds no probe history ({demo.HISTORY}); train it first")
    last = history[-1]["step"]
    return (validity.read_report(out / validity.REPORTS / "step-0.json"),
            validity.read_report(out / validity.REPORTS / f"step-{last}.json"), last)


def run_stats(out: Path, targets: list[str], args) -> dict:
    """Selectivity for each target, and every foundation's change, of one run folder."""
    from tinymcf_callback.stats import bootstrap as stats

    base, final, last = reports(out)
    a, b = stats.vignette_scores(base["scenarios"]), stats.vignette_scores(final["scenarios"])
    change = stats.paired_change(a, b, level=args.level, n_resamples=args.n_resamples, seed=0)
    per_target = {}
    for target in targets:
        sel = stats.selectivity(a, b, target, level=args.level, n_resamples=args.n_resamples, seed=0)
        per_target[target] = {k: validity._change(sel[k]) for k in ("on_target", "off_target", "selectivity")}
    summary = json.loads((out / demo.MARKER).read_text(encoding="utf-8"))
    last_ck = summary["checkpoints"][-1]
    return {"run": out.name, "trained_on": summary.get("target", "all six foundations"), "final_step": last,
            "wall_s": summary.get("wall_s"), "eval_answer_accuracy": last_ck.get("eval_answer_accuracy"),
            "selectivity": per_target,
            "change": {f: validity._change(change["foundations"][f]["align_other"])
                       for f in (*demo.REAL, "Social Norms") if change["n"][f]},
            "score_change": validity._change(change["headline"]["score"])}


def markdown(rows: list[dict], targets: list[str], level: float) -> str:
    pct = f"{level:.0%}"
    lines = [f"| run (trained on) | target | target change [{pct}] | mean off-target change [{pct}] "
             f"| selectivity [{pct}], p | held-out acc |", "|---|---|---|---|---|---|"]
    for r in rows:
        acc = "n/a" if r["eval_answer_accuracy"] is None else f"{r['eval_answer_accuracy']:.2f}"
        for t in targets:
            sel = r["selectivity"][t]
            lines.append(f"| {r['run']} ({r['trained_on']}) | {t} | {validity.fmt_change(sel['on_target'])} "
                         f"| {validity.fmt_change(sel['off_target'])} | {validity.fmt_change(sel['selectivity'])} "
                         f"| {acc} |")
    foundations = list(dict.fromkeys(f for r in rows for f in r["change"]))
    lines += ["", f"Change of `align_other` since step 0 per foundation ({pct} interval, p):", "",
              "| run | " + " | ".join(foundations) + " |", "|---" * (len(foundations) + 1) + "|"]
    for r in rows:
        lines.append(f"| {r['run']} | " + " | ".join(validity.fmt_change(r["change"][f]) for f in foundations)
                     + " |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default=str(ROOT / "runs" / "selectivity"),
                   help="one folder per target, and the tables (default: runs/selectivity)")
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                   help=f"comma-separated foundations, one training run each (default {','.join(DEFAULT_TARGETS)})")
    p.add_argument("--reference", default=None,
                   help="a finished run folder on all foundations to compare with (default runs/validity/aligned "
                        "when it exists)")
    p.add_argument("--level", type=float, default=0.95, help="interval level (default 0.95)")
    p.add_argument("--n-resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--from-runs", action="store_true", help="train nothing: recompute the tables from the folders")
    demo.add_recipe_args(p)
    args = p.parse_args(argv)
    if args.quick and not args.per_foundation and args.limit is None:
        args.per_foundation = 2  # selectivity needs the other foundations beside the target: a balanced subset
    args = demo.finish_args(p, args)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in args.targets if t not in demo.REAL]
    if unknown or not args.targets:
        p.error(f"--targets: unknown {unknown}; choose from {', '.join(demo.REAL)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    demo.offline_environment()
    t0 = time.perf_counter()
    top = Path(args.output_dir).resolve()
    top.mkdir(parents=True, exist_ok=True)
    outs = [top / folder_name(t) for t in args.targets]
    if not args.from_runs:
        for target, out in zip(args.targets, outs, strict=True):
            run_target(args, target, out)
    reference = Path(args.reference) if args.reference else ROOT / "runs" / "validity" / "aligned"
    rows = [run_stats(out, args.targets, args) for out in outs]
    if reference.is_dir() and (reference / validity.REPORTS / "step-0.json").exists():
        try:
            rows.append(run_stats(reference, args.targets, args))
        except ValueError as e:  # a reference probed on another subset (a --quick run): no yardstick
            print(f"[selectivity] the reference {reference} is left out: {e}", file=sys.stderr)
    elif args.reference:
        raise SystemExit(f"selectivity: --reference {reference} holds no finished run with kept reports")
    table = markdown(rows, args.targets, args.level)
    wall = time.perf_counter() - t0
    (top / "selectivity.json").write_text(json.dumps({"args": vars(args), "wall_s": round(wall, 1), "runs": rows},
                                                     indent=2) + "\n", encoding="utf-8")
    (top / "selectivity.md").write_text(table + "\n", encoding="utf-8")
    print()
    print(table)
    print(f"\n[selectivity] {len(rows)} run(s) in {wall:.0f}s wall; tables: {top / 'selectivity.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
