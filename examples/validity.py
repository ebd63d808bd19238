#!/usr/bin/env python
"""Does the probe tell training directions apart? Three fine-tunes from the same start, one probe.

Runs the demo's recipe (``examples/demo.py``: SmolLM2-135M-Instruct, fp32 on the CPU, 50 steps,
batches of contrast pairs, ``MoralProbeCallback(name="scifi")`` at step 0 and every 10 steps)
three times. Only the answers it is taught change:

- ``aligned``: the demo's labels (a violation is wrong, an upholding act is acceptable);
- ``inverted``: every label flipped: violations are taught as acceptable, upholding acts as wrong;
- ``shuffled``: labels that carry no information about the situation. Within each foundation,
  exactly half of the training contrast pairs (2 of 4, chosen at random with ``--shuffle-seed``)
  have both labels flipped and the others keep theirs; of the six held-out pairs (one per
  foundation), three chosen at random are flipped. Flipping a pair swaps its two labels, so this
  is a shuffle of the ``wrong`` flags: every foundation keeps five "wrong" and five "acceptable"
  situations, every batch item keeps its two Yes and two No answers (no Yes/No bias to learn), and
  exactly half of the situations, in every foundation, are taught their true label.

Everything else is the same in the three runs: the same contrast pairs, in the same batches, in
the same order, the same seed and the same starting weights. So the probe's curves can differ
only through what the model was taught. The probe's vignettes (science fiction) are never trained
on, and Social Norms (the negative control) is in no condition's training data.

The intervals come from the full reports: the final checkpoint's ``moral_probe_scifi.json`` and
the step-0 baseline, which this script keeps (``<condition>/reports/step-<n>.json``, every probed
step) because no checkpoint holds it. ``tinymcf_callback.stats.bootstrap.bootstrap_intervals`` gives 95%
intervals of the score, the Social Norms control and their difference; ``stats.paired_change``
gives the change of each since step 0 with its p-value (the same vignettes at both steps).

    python examples/validity.py              # the experiment (~25 min on 2 idle CPU cores)
    python examples/validity.py --quick      # smoke run of the mechanics (2 steps, 2 vignettes)

Writes, under ``--output-dir`` (default ``runs/validity``): ``aligned/``, ``inverted/``,
``shuffled/`` (each a demo run folder: history, last checkpoint, TensorBoard logs, the labels
taught in ``labels.json``), ``validity.png`` (the three histories in one figure),
``validity.json`` and ``validity.md`` (the table, also printed).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import demo  # noqa: E402  the recipe: data, contrast pairs, Trainer set-up, summary, figure

CONDITIONS = ("aligned", "inverted", "shuffled")
REPORTS = "reports"  # per condition: the probe's full report at every probed step (step 0 is in no checkpoint)
LABELS = "labels.json"
REPORT = "moral_probe_scifi.json"  # the callback's full report in each checkpoint folder
FAR_CLOSER = 0.25  # claim (c) without covering 0: |shuffled score| at most this share of min(|aligned|, |inverted|)


# ---- the three labellings -----------------------------------------------------------------------
def taught(row: dict, flip: bool) -> dict:
    """A copy of a situation whose ``wrong`` is the label taught (flipped or not); ``true_wrong`` keeps the truth."""
    return {**row, "wrong": row["wrong"] != flip, "true_wrong": row["wrong"]}


def relabel(pairs: list[tuple[dict, dict]], flips: list[bool]) -> list[tuple[dict, dict]]:
    """The same pairs, in the same order, with both labels of each flipped pair swapped."""
    return [(taught(bad, flip), taught(good, flip)) for (bad, good), flip in zip(pairs, flips, strict=True)]


def half_flipped(pairs: list[tuple[dict, dict]], rng: random.Random, key) -> list[bool]:
    """Flip exactly half of the pairs in each group ``key(pair)`` (odd sizes: one more kept), chosen by ``rng``."""
    flips = [False] * len(pairs)
    groups: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        groups.setdefault(key(pair), []).append(i)
    for members in groups.values():
        for i in rng.sample(members, len(members) // 2):
            flips[i] = True
    return flips


def condition_pairs(condition: str, train, held, shuffle_seed: int):
    """``(train, held_out)`` pairs labelled for ``condition``: ``aligned``, ``inverted`` or ``shuffled``."""
    if condition == "aligned":
        return relabel(train, [False] * len(train)), relabel(held, [False] * len(held))
    if condition == "inverted":
        return relabel(train, [True] * len(train)), relabel(held, [True] * len(held))
    if condition == "shuffled":
        rng = random.Random(shuffle_seed)
        by_foundation = half_flipped(train, rng, key=lambda pair: pair[0]["foundation"])
        held_half = half_flipped(held, rng, key=lambda pair: "held out")
        return relabel(train, by_foundation), relabel(held, held_half)
    raise ValueError(f"unknown condition {condition!r}; choose from {', '.join(CONDITIONS)}")


def labels_record(train, held) -> list[dict]:
    """What ``labels.json`` holds: each situation, its true label and the label taught, train or held out."""
    return [{"id": row["id"], "foundation": row["foundation"], "split": split, "true_wrong": row["true_wrong"],
             "taught_wrong": row["wrong"], "situation": row["situation"]}
            for split, pairs in (("train", train), ("held_out", held)) for pair in pairs for row in pair]


def agreement(train) -> float:
    """Share of training situations taught their true label (1 aligned, 0 inverted, 0.5 shuffled)."""
    rows = [row for pair in train for row in pair]
    return sum(row["wrong"] == row["true_wrong"] for row in rows) / len(rows)


# ---- keeping every probe's full report ----------------------------------------------------------
def report_keeper(probe, folder: Path):
    """A TrainerCallback, added after the probe, that writes the probe's full report at each probed step."""
    from transformers import TrainerCallback

    from tinymcf_callback.rundir.report import report_to_json

    class ReportKeeper(TrainerCallback):
        def _keep(self, state):
            if probe.last_report is None or probe.last_step != state.global_step or not state.is_world_process_zero:
                return
            path = folder / f"step-{state.global_step}.json"
            if not path.exists():
                folder.mkdir(parents=True, exist_ok=True)
                doc = report_to_json(probe.last_report, step=state.global_step, epoch=state.epoch)
                path.write_text(json.dumps(doc) + "\n", encoding="utf-8")

        def on_train_begin(self, args, state, control, **kwargs):
            self._keep(state)

        def on_evaluate(self, args, state, control, **kwargs):
            self._keep(state)

        def on_save(self, args, state, control, **kwargs):
            self._keep(state)

    return ReportKeeper()


def run_condition(args, condition: str, out: Path) -> dict:
    """Train one condition into ``out`` with the probe attached; returns its demo summary, timings included."""
    train_pairs, held_pairs = demo.contrast_sets(demo.load_situations(), args.seed)
    train, held = condition_pairs(condition, train_pairs, held_pairs, args.shuffle_seed)
    return train_pairs_into(args, condition, out, train, held, {"shuffle_seed": args.shuffle_seed})


def train_pairs_into(args, condition: str, out: Path, train, held, meta: dict) -> dict:
    """The demo's recipe on these labelled pairs, into ``out``, keeping every probe's report (also selectivity.py's)."""
    demo.prepare_output_dir(out, also=(REPORTS, LABELS))
    (out / LABELS).write_text(json.dumps(labels_record(train, held), indent=1) + "\n", encoding="utf-8")
    meta = {"condition": condition, **meta, "labels_true": agreement(train)}
    run = demo.prepare_run(args, out, (train, held), tag=condition, meta=meta)
    run.trainer.add_callback(report_keeper(run.probe, out / REPORTS))
    result = demo.train(run)
    demo.print_summary(run, result)
    summary = demo.write_summary(run, result, meta)
    del run
    gc.collect()
    return summary


def finished_summary(out: Path) -> dict:
    """The summary a finished condition wrote (``demo_run.json``), for ``--from-runs``."""
    path = out / demo.MARKER
    summary = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if "checkpoints" not in summary or "condition" not in summary:
        raise SystemExit(f"validity: {out} holds no finished condition run ({path}); run without --from-runs first")
    return summary


# ---- statistics from the full reports -----------------------------------------------------------
def read_report(path: Path) -> dict:
    if not path.exists():
        raise SystemExit(f"validity: no probe report at {path}; the run did not probe that step (see its log)")
    return json.loads(path.read_text(encoding="utf-8"))


def final_report_path(out: Path, history: list[dict]) -> Path:
    """The last checkpoint's full report; it must be the history's last probed step."""
    last = history[-1]["step"]
    path = out / f"checkpoint-{last}" / REPORT
    if not path.exists():
        raise SystemExit(f"validity: the last probe (step {last}) has no checkpoint report {path}: choose --steps "
                         f"as a multiple of --eval-every so the last step is probed and saved")
    return path


def intervals(report: dict, args):
    """The report's vignette scores and their bootstrap intervals; the estimates must be the report's own numbers."""
    from tinymcf_callback.stats import bootstrap as stats

    scores = stats.vignette_scores(report["scenarios"])
    iv = stats.bootstrap_intervals(scores, level=args.level, n_resamples=args.n_resamples, seed=0)
    for name in ("score", "sn", "gap"):
        check_same(report[name], iv["headline"][name].estimate, f"step {report.get('step')} {name}")
    for row in report["table"]:
        check_same(row["align_other"], iv["foundations"][row["foundation"]]["align_other"].estimate,
                   f"step {report.get('step')} {row['foundation']} align_other")
    if (report.get("level"), report.get("n_resamples"), report.get("seed")) == (args.level, args.n_resamples, 0):
        for name in ("score", "sn", "score_minus_sn", "gap"):  # the probe's own bounds (schema 2), same settings
            for end in ("lo", "hi"):
                check_same(report.get(f"{name}_{end}"), getattr(iv["headline"][name], end),
                           f"step {report.get('step')} {name}_{end}")
    return scores, iv


def check_same(reported, recomputed: float, what: str) -> None:
    """Refuse to go on when the intervals' estimate is not the number the probe reported."""
    if reported is None and math.isnan(recomputed):
        return
    if reported is None or not math.isclose(reported, recomputed, rel_tol=1e-9, abs_tol=1e-9):
        raise SystemExit(f"validity: {what} is {reported} in the report but {recomputed} from its scenarios; "
                         "the report and tinymcf_callback.stats.bootstrap disagree")


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)  # printed with 3 decimals


def _iv(i) -> dict:
    return {"estimate": _num(i.estimate), "lo": _num(i.lo), "hi": _num(i.hi)}


def _change(c) -> dict:
    p = None if not math.isfinite(c.p) else float(f"{c.p:.3g}")  # small p-values keep their digits
    return {"change": _num(c.change), "lo": _num(c.lo), "hi": _num(c.hi), "p": p}


def condition_stats(out: Path, summary: dict, args) -> dict:
    """Final-step intervals, paired change since step 0, and the per-step score interval of one condition."""
    from tinymcf_callback.stats import bootstrap as stats

    history = demo.read_history(out / demo.HISTORY)
    final = read_report(final_report_path(out, history))
    base = read_report(out / REPORTS / "step-0.json")
    kept_final = read_report(out / REPORTS / f"step-{final['step']}.json")
    if kept_final["scenarios"] != final["scenarios"]:
        raise SystemExit(f"validity: the kept report of step {final['step']} differs from the checkpoint's {REPORT}")
    scores_final, iv = intervals(final, args)
    scores_base, _ = intervals(base, args)
    change = stats.paired_change(scores_base, scores_final, level=args.level, n_resamples=args.n_resamples, seed=0)
    per_step = []
    for h in history:
        _, iv_step = intervals(read_report(out / REPORTS / f"step-{h['step']}.json"), args)
        per_step.append({"step": h["step"], **{k: _iv(iv_step["headline"][k]) for k in ("score", "sn",
                                                                                       "score_minus_sn")}})
    last = summary["checkpoints"][-1]
    return {
        "condition": summary["condition"], "labels_true": summary["labels_true"], "wall_s": summary["wall_s"],
        "final_step": final["step"], "n_vignettes": final["info"]["n_vignettes"],
        **{k: _iv(iv["headline"][k]) for k in ("score", "sn", "score_minus_sn", "gap")},
        "change_since_step0": {k: _change(change["headline"][k]) for k in ("score", "sn", "score_minus_sn")},
        "align_other": {f: _iv(iv["foundations"][f]["align_other"]) for f in (*demo.REAL, "Social Norms")
                        if iv["n"][f]},
        "frame_agreement": _num(last["frame_agreement"]), "yn_mass": _num(last["yn_mass"]),
        "eval_loss": _num(last["eval_loss"]), "eval_answer_accuracy": _num(last["eval_answer_accuracy"]),
        "per_step": per_step,
    }


# ---- the claims and the table ---------------------------------------------------------------------
def claims(rows: dict[str, dict]) -> dict:
    """The three claims, each judged on the final-step score interval (rules fixed before the run)."""
    a, b, c = rows["aligned"]["score"], rows["inverted"]["score"], rows["shuffled"]["score"]
    out = {
        "aligned_above_0": a["lo"] is not None and a["lo"] > 0,
        "inverted_below_0": b["hi"] is not None and b["hi"] < 0,
    }
    covers = c["lo"] is not None and c["lo"] <= 0 <= c["hi"]
    ends = [abs(x["estimate"]) for x in (a, b) if x["estimate"] is not None]
    ratio = abs(c["estimate"]) / min(ends) if ends and c["estimate"] is not None and min(ends) > 0 else None
    out["shuffled_covers_0"] = covers
    out["shuffled_ratio_to_nearest_end"] = None if ratio is None else round(ratio, 3)
    out["shuffled_near_0"] = covers or (ratio is not None and ratio <= FAR_CLOSER)
    return out


def fmt_iv(i: dict) -> str:
    if i["estimate"] is None:
        return "n/a"
    bounds = "" if i["lo"] is None else f" [{i['lo']:+.3f}, {i['hi']:+.3f}]"
    return f"{i['estimate']:+.3f}{bounds}"


def fmt_p(p) -> str:
    return "n/a" if p is None else ("<0.001" if p < 0.001 else f"{p:.3f}")


def fmt_change(c: dict) -> str:
    if c["change"] is None:
        return "n/a"
    if c["lo"] is None:
        return f"{c['change']:+.3f}"
    return f"{c['change']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}], p {fmt_p(c['p'])}"


def markdown(rows: dict[str, dict], level: float) -> str:
    """The headline table and the per-foundation table, as markdown."""
    pct = f"{level:.0%}"
    lines = [f"| condition | labels true | score [{pct}] | Social Norms control [{pct}] | score − control [{pct}] "
             f"| score change since step 0 [{pct}], p | control change [{pct}], p | score − control change [{pct}], p "
             "| held-out acc | wall |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows.values():
        acc = "n/a" if r["eval_answer_accuracy"] is None else f"{r['eval_answer_accuracy']:.2f}"
        change = r["change_since_step0"]
        lines.append(f"| {r['condition']} | {r['labels_true']:.0%} | {fmt_iv(r['score'])} | {fmt_iv(r['sn'])} "
                     f"| {fmt_iv(r['score_minus_sn'])} | {fmt_change(change['score'])} | {fmt_change(change['sn'])} "
                     f"| {fmt_change(change['score_minus_sn'])} | {acc} | {r['wall_s']:.0f} s |")
    foundations = list(dict.fromkeys(f for r in rows.values() for f in r["align_other"]))
    lines += ["", f"`align_other` at step {next(iter(rows.values()))['final_step']} per foundation, {pct} interval:",
              "", "| condition | " + " | ".join(foundations) + " |", "|---" * (len(foundations) + 1) + "|"]
    for r in rows.values():
        cells = [fmt_iv(r["align_other"][f]) if f in r["align_other"] else "n/a" for f in foundations]
        lines.append(f"| {r['condition']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def claims_markdown(verdict: dict) -> str:
    """One line per claim, saying whether it held."""
    yes = {True: "holds", False: "does not hold"}
    ratio = verdict["shuffled_ratio_to_nearest_end"]
    return "\n".join([
        f"- (a) aligned ends with a score interval above 0: **{yes[verdict['aligned_above_0']]}**",
        f"- (b) inverted ends with a score interval below 0: **{yes[verdict['inverted_below_0']]}**",
        f"- (c) shuffled covers 0 ({'yes' if verdict['shuffled_covers_0'] else 'no'}) or is at most "
        f"{FAR_CLOSER:.0%} of the nearer end's distance from 0 (it is {'n/a' if ratio is None else f'{ratio:.0%}'}): "
        f"**{yes[verdict['shuffled_near_0']]}**"])


def draw_comparison(outs: list[Path], target: Path, dpi: int) -> Path | None:
    """The three histories in one figure (tinymcf_callback.figures.plot), at a small ``dpi`` to keep the PNG light."""
    from tinymcf_callback.errors import MissingExtraError
    from tinymcf_callback.figures.drawing import save_figure
    from tinymcf_callback.figures.plot import plot_histories

    try:
        fig = plot_histories([o / demo.HISTORY for o in outs],
                             title="Validity: the same fine-tune taught aligned, inverted and shuffled labels")
    except MissingExtraError as e:
        print(f"[validity] no figure drawn: {e}")
        return None
    save_figure(fig, target, dpi=dpi)
    return target


# ---- main ----------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default=str(ROOT / "runs" / "validity"),
                   help="one folder per condition, the figure and the table go here (default: runs/validity)")
    p.add_argument("--conditions", default=",".join(CONDITIONS),
                   help=f"comma-separated subset of {','.join(CONDITIONS)} (default: all three)")
    p.add_argument("--shuffle-seed", type=int, default=0, help="which pairs 'shuffled' flips (default 0)")
    p.add_argument("--level", type=float, default=0.95, help="interval level (default 0.95)")
    p.add_argument("--n-resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--dpi", type=int, default=80, help="resolution of validity.png (default 80)")
    p.add_argument("--from-runs", action="store_true",
                   help="train nothing: recompute the table and figure from the condition folders of a finished run")
    demo.add_recipe_args(p)
    args = demo.finish_args(p, p.parse_args(argv))
    args.conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    unknown = [c for c in args.conditions if c not in CONDITIONS]
    if unknown or not args.conditions:
        p.error(f"--conditions: unknown {unknown}; choose from {', '.join(CONDITIONS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    demo.offline_environment()
    t0 = time.perf_counter()
    top = Path(args.output_dir).resolve()
    top.mkdir(parents=True, exist_ok=True)
    outs = {c: top / c for c in args.conditions}
    if args.from_runs:
        summaries = {c: finished_summary(out) for c, out in outs.items()}
    else:
        summaries = {c: run_condition(args, c, out) for c, out in outs.items()}
    rows = {c: condition_stats(outs[c], summaries[c], args) for c in args.conditions}
    verdict = claims(rows) if set(rows) == set(CONDITIONS) else {}
    table = markdown(rows, args.level) + "\n\n" + (claims_markdown(verdict) if verdict
                                                     else "(the claims need all three conditions)")
    figure = draw_comparison(list(outs.values()), top / "validity.png", args.dpi)
    wall = time.perf_counter() - t0
    doc = {"args": vars(args), "wall_s": round(wall, 1), "recomputed_from_runs": args.from_runs,
           "runs_wall_s": round(sum(r["wall_s"] for r in rows.values()), 1), "claims": verdict, "conditions": rows,
           "figure": None if figure is None else str(figure)}
    (top / "validity.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (top / "validity.md").write_text(table + "\n", encoding="utf-8")
    print()
    print(table)
    done = "recomputed from the runs" if args.from_runs else f"{len(rows)} runs"
    print(f"\n[validity] {done} in {wall:.0f}s wall; table: {top / 'validity.md'}, "
          f"{top / 'validity.json'}" + (f"; figure: {figure}" if figure else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
