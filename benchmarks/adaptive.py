#!/usr/bin/env python
"""A probe that stops when it knows enough, measured: coverage, prompts, verdicts, run-level flags, time.

Everything is simulated from real per-vignette scores (``s`` of the four conditions, ``scifi``'s 51 vignettes),
through the very functions a probe with a precision target runs (``results.sequential``: the order, the looks,
the moments, the interval, the stop), so what is measured is what a probe would have done on those models:

- **rows**: SmolLM2-135M-Instruct (fp32) at the validity experiment's step 0 and at steps 10-50 of its three
  fine-tunes (aligned, inverted, shuffled; ``examples/validity.py``, its reports under ``runs/validity``), and
  the tiny random Qwen3 (seeds 0 and 1; seed 0 against itself with every weight moved by 1% noise, a change).
  Written to ``benchmarks/adaptive_rows.json`` (the project's own vignettes' scores; no text) so that
  ``--from-rows`` reruns the simulations without a model.
- **coverage**: at nominal 95%, how often the interval at the stop covers the *whole set's value* (the score,
  or its change since step 0, over all 51 vignettes), over ``--orders`` seeded orders (each order seed is a
  probe of its own: another balanced order of the same vignettes), for widths 0.02, 0.05 and 0.1 and
  ``until`` level and change; beside a *naive* sequential probe (the same looks and stop, each look's interval
  at a plain 95%) and a fixed ``per_foundation=k`` probe (one 95% interval, no looking) at the ``k`` whose
  interval reaches the width on average. And the *superpopulation* coverage: sets of the same size drawn with
  replacement from the real vignettes (new vignettes like them), the truth their population's value.
- **prompts**: mean, spread (sd, 10th and 90th percentile) of prompts asked at the stop, against that fixed
  ``per_foundation=k`` (8 prompts a vignette).
- **verdicts**: on the validity runs, at each probed step, whether the change since step 0 (up, down, none: its
  interval excludes 0 or not) is decided like the whole set's fixed 95% interval decides it, with what share of
  the whole set's prompts; the goal is at least 95% of steps with at most 40% of the prompts.
- **run-level flags**: null runs (no true change at any step) built from the validity runs' real change rows,
  centred per foundation and sign-flipped per vignette, 50 steps each, independent steps and a random walk; the
  share of runs with any step flagged by the per-step p (< 0.05) against the run-level p
  (``metrics.run_level_p``); and on the real runs, the first step each rule flags (their histories' own
  ``score_change_p`` and ``score_change_p_run``).
- **time**: real probes of SmolLM2 (fp32, CPU): the whole set against ``until="level"`` and ``until="change"``
  (with step 0's report as the baseline, on the aligned run's last checkpoint) at each width, ratios against the
  whole set in the same run.

    python examples/validity.py                      # once: the runs (~30 min on 2 idle cores)
    python benchmarks/adaptive.py                    # rows + simulations + timings (~8 min on 2 idle cores)
    python benchmarks/adaptive.py --from-rows        # the simulations only, from adaptive_rows.json (~3 min)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tinymcf_callback.data.sets import FOUNDATIONS  # noqa: E402
from tinymcf_callback.results import sequential as sq  # noqa: E402
from tinymcf_callback.results.metrics import run_level_p  # noqa: E402
from tinymcf_callback.results.stats import VignetteScores  # noqa: E402

WIDTHS = (0.02, 0.05, 0.1)
VERDICT_WIDTHS = (0.01, *WIDTHS)  # and one narrower than the shuffled run's drift, for the verdicts
LEVEL = 0.95
CONDITIONS = ("aligned", "inverted", "shuffled")
STEPS = (10, 20, 30, 40, 50)
ROWS = HERE / "adaptive_rows.json"
PROMPTS_PER_VIGNETTE = 8


# ---- the rows ---------------------------------------------------------------------------------------------------
def rows_record(report: dict) -> dict:
    from tinymcf_callback.results.stats import vignette_scores

    vs = vignette_scores(report["scenarios"])
    return {"id": [str(i) for i in vs.id], "foundation": [str(f) for f in vs.foundation_coarse],
            "s": [[None if not math.isfinite(x) else round(float(x), 7) for x in row] for row in vs.s]}


def as_scores(record: dict) -> VignetteScores:
    s = [[math.nan if x is None else x for x in row] for row in record["s"]]
    return VignetteScores(record["id"], record["foundation"], s)


def gather_rows(validity: Path) -> dict:
    """Per-vignette rows of every model the benchmark simulates from (the validity reports, the tiny models)."""
    import torch

    from tinymcf_callback import Probe
    from tinymcf_callback import testing as offline_assets

    out: dict[str, dict] = {}
    missing = [c for c in CONDITIONS if not (validity / c / "reports" / "step-50.json").exists()]
    if missing:
        raise SystemExit(f"error: {validity} lacks the validity runs' reports ({', '.join(missing)}): run "
                         "`python examples/validity.py` first, or pass --from-rows to simulate from "
                         f"{ROWS.name}")
    out["smollm2/step-0"] = rows_record(json.loads((validity / "aligned" / "reports" / "step-0.json").read_text()))
    for c in CONDITIONS:
        for step in STEPS:
            out[f"{c}/step-{step}"] = rows_record(json.loads((validity / c / "reports" / f"step-{step}.json")
                                                             .read_text()))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
    probe = Probe(tok, "scifi", n_resamples=0, self_check=False)
    for seed in (0, 1):
        out[f"tiny/seed-{seed}"] = rows_record(probe.run(offline_assets.tiny_qwen3(seed=seed), progress=False))
    moved = offline_assets.tiny_qwen3(seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.01 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    out["tiny/seed-0-moved"] = rows_record(probe.run(moved, progress=False))
    return out


# ---- one order's looks ------------------------------------------------------------------------------------------
def _take(scores: VignetteScores, rows) -> VignetteScores:
    rows = np.asarray(rows)
    return VignetteScores(scores.id[rows], scores.foundation_coarse[rows], scores.s[rows])


def look_moments(seq: sq.Sequential, now: VignetteScores, before: VignetteScores | None):
    """Each look's moments of one order (the score, or its change since ``before``)."""
    return [sq.moments(_take(now, seq.prefix(k)), None if before is None else _take(before, seq.prefix(k)))
            for k in range(len(seq.schedule.looks))]


def stop_at(seq: sq.Sequential, moments, until: str, width: float, per_look: float):
    """The look a probe stops at and its interval, by the probe's own rule."""
    bound = sq._RANGE[until]
    for k, m in enumerate(moments):
        lo, hi = sq.interval(m, per_look, bound)
        look = sq.Look(seq.schedule.looks[k], seq.schedule.vignettes(k), m.estimate, lo, hi)
        if sq.stop_reason(until, width, look) is not None:
            return k, look
    return len(moments) - 1, look


def whole_value(now: VignetteScores, before: VignetteScores | None) -> float:
    return sq.moments(now, before).estimate


def fixed_k(widths_by_k: dict[int, float], width: float, looks) -> int:
    """The fixed per_foundation whose 95% interval reaches ``width`` on average (the whole set if none does)."""
    for k, w in sorted(widths_by_k.items()):
        if w < width:
            return k
    return len(looks) - 1


def resampled(foundations: np.ndarray, rng) -> np.ndarray:
    """Rows of a new set of the same size per foundation, drawn with replacement from the real one."""
    rows = []
    for f in FOUNDATIONS:
        have = np.flatnonzero(foundations == f)
        rows += list(rng.choice(have, size=len(have), replace=True))
    return np.array(rows)


def simulate(now: VignetteScores, before: VignetteScores | None, until: str, orders: int, *,
             superpopulation: bool) -> dict:
    """Coverage and prompts at each width, for the sequence, the naive sequential probe and fixed per_foundation."""
    rng = np.random.default_rng(1234)
    ids, fnds = list(now.id), list(now.foundation_coarse)
    truth = whole_value(now, before)
    sims = []  # (seq, moments, truth) per simulated probe
    for i in range(orders):
        if superpopulation:
            rows = resampled(now.foundation_coarse, rng)
            new_ids = np.array([f"{now.id[r]}#{j}" for j, r in enumerate(rows)], dtype=object)
            a = VignetteScores(new_ids, now.foundation_coarse[rows], now.s[rows])
            b = None if before is None else VignetteScores(new_ids, before.foundation_coarse[rows], before.s[rows])
            seq = sq.Sequential.of(list(a.id), list(a.foundation_coarse), until=until, width=0.05, level=LEVEL,
                                   seed=i)
            sims.append((seq, look_moments(seq, a, b), truth))
        else:
            seq = sq.Sequential.of(ids, fnds, until=until, width=0.05, level=LEVEL, seed=i)
            sims.append((seq, look_moments(seq, now, before), truth))
    seq0 = sims[0][0]
    looks = seq0.schedule.looks
    per_look = seq0.per_look
    fixed_widths = {}
    for k in range(len(looks)):
        ws = [np.subtract(*reversed(sq.interval(m[k], LEVEL, sq._RANGE[until]))) for _, m, _ in sims]
        fixed_widths[k] = float(np.nanmean(ws))
    out = {"truth": truth, "per_look_level": per_look, "orders": orders, "widths": {}}
    for width in WIDTHS:
        row = {}
        for method, level in (("sequence", per_look), ("naive", LEVEL)):
            cover, prompts = [], []
            for seq, m, t in sims:
                k, look = stop_at(seq, m, until, width, level)
                cover.append(look.lo <= t <= look.hi)
                prompts.append(look.vignettes * PROMPTS_PER_VIGNETTE)
            row[method] = {"coverage": float(np.mean(cover)), **spread(prompts)}
        k = fixed_k(fixed_widths, width, looks)
        cover = []
        for _, m, t in sims:
            lo, hi = sq.interval(m[k], LEVEL, sq._RANGE[until])
            cover.append(lo <= t <= hi)
        row["fixed"] = {"coverage": float(np.mean(cover)), "per_foundation": looks[k],
                        "reaches": fixed_widths[k] < width, "mean_width": fixed_widths[k],
                        **spread([seq0.schedule.vignettes(k) * PROMPTS_PER_VIGNETTE])}
        out["widths"][str(width)] = row
    out["whole_prompts"] = len(ids) * PROMPTS_PER_VIGNETTE
    return out


def spread(prompts) -> dict:
    x = np.asarray(prompts, dtype=float)
    return {"prompts_mean": float(x.mean()), "prompts_sd": float(x.std()),
            "prompts_p10": float(np.percentile(x, 10)), "prompts_p90": float(np.percentile(x, 90))}


# ---- verdicts on the validity runs ------------------------------------------------------------------------------
def verdict(lo: float, hi: float) -> str:
    return "up" if lo > 0 else "down" if hi < 0 else "none"


def verdicts(rows: dict, orders: int) -> dict:
    """Per validity step: the whole set's verdict and how often a change target (and a fixed per_foundation=2)
    decides it alike, with the share of the whole set's prompts."""
    base = as_scores(rows["smollm2/step-0"])
    tally = {w: {"steps": [], "agree": [], "share": [], "fixed": [], "consistent": []} for w in VERDICT_WIDTHS}
    for c in CONDITIONS:
        for step in STEPS:
            now = as_scores(rows[f"{c}/step-{step}"])
            whole = sq.moments(now, base)
            truth = verdict(*sq.interval(whole, LEVEL, 4.0))
            seqs = [sq.Sequential.of(list(now.id), list(now.foundation_coarse), until="change", width=0.05,
                                     level=LEVEL, seed=i) for i in range(orders)]
            looks = [look_moments(seq, now, base) for seq in seqs]  # the same for every width
            for width in VERDICT_WIDTHS:
                agree, share, fixed, consistent = [], [], [], []
                for seq, m in zip(seqs, looks, strict=True):
                    k, look = stop_at(seq, m, "change", width, seq.per_look)
                    said = verdict(look.lo, look.hi)
                    agree.append(said == truth)
                    # "no change beyond its interval", an interval holding the whole set's change: not contradicted
                    consistent.append(said == truth or (said == "none" and look.lo <= whole.estimate <= look.hi))
                    share.append(look.vignettes / len(now.id))
                    fixed.append(verdict(*sq.interval(m[0], LEVEL, 4.0)) == truth)
                t = tally[width]
                t["steps"].append({"run": c, "step": step, "whole": truth, "change": whole.estimate,
                                   "agree": float(np.mean(agree)), "share": float(np.mean(share)),
                                   "consistent": float(np.mean(consistent)), "fixed_pf2_agree": float(np.mean(fixed))})
                for key, values in (("agree", agree), ("share", share), ("fixed", fixed), ("consistent", consistent)):
                    t[key] += values
    return {str(w): {"agree": float(np.mean(t["agree"])), "share": float(np.mean(t["share"])),
                     "consistent": float(np.mean(t["consistent"])), "fixed_pf2_agree": float(np.mean(t["fixed"])),
                     "steps": t["steps"]} for w, t in tally.items()}


# ---- run-level flags --------------------------------------------------------------------------------------------
def null_runs(rows: dict, runs: int, steps: int = 50) -> dict:
    """Runs whose score never moves: real change rows, centred per foundation and condition (their whole-set
    change 0), each vignette's sign flipped at random: independent steps, or a random walk of such increments."""
    base = as_scores(rows["smollm2/step-0"])
    pools = []
    for c in CONDITIONS:
        d = as_scores(rows[f"{c}/step-10"]).s - base.s
        for f in FOUNDATIONS:
            r = base.foundation_coarse == f
            d[r] -= np.nanmean(d[r], axis=0)
        pools.append(d)
    rng = np.random.default_rng(7)
    zero = VignetteScores(base.id, base.foundation_coarse, np.zeros_like(base.s))
    out = {}
    for kind in ("independent", "random walk"):
        per_step_any, run_any, per_step_rate = 0, 0, []
        for r in range(runs):
            d = pools[r % len(pools)]
            walk = np.zeros_like(d)
            flags_step, flags_run = [], []
            for j in range(1, steps + 1):
                step = d * rng.choice([-1.0, 1.0], size=(len(d), 1))
                if kind == "random walk":
                    walk = walk + step
                    step = walk / math.sqrt(j)
                m = sq.moments(VignetteScores(base.id, base.foundation_coarse, step), zero)
                p = sq.p_look(m)
                flags_step.append(p < 0.05)
                flags_run.append(run_level_p(p, j) < 0.05)
            per_step_any += any(flags_step)
            run_any += any(flags_run)
            per_step_rate.append(np.mean(flags_step))
        out[kind] = {"runs": runs, "steps": steps, "any_step_flag_per_step": per_step_any / runs,
                     "any_step_flag_run_level": run_any / runs, "step_flag_rate": float(np.mean(per_step_rate))}
    return out


def real_flags(validity: Path) -> dict:
    """The first step each rule flags on the validity runs, from their histories' own p-values."""
    out = {}
    for c in CONDITIONS:
        history = validity / c / "moral_probe_scifi.jsonl"
        if not history.exists():
            continue
        lines = [json.loads(x) for x in history.read_text().splitlines() if x.strip()]
        first_step = first_run = None
        ps = []
        for line in lines:
            m = line.get("metrics") or {}
            p = m.get("eval_moral_scifi/score_change_p")
            p_run = m.get("eval_moral_scifi/score_change_p_run")
            if p is None or p_run is None:
                continue
            ps.append({"step": line["step"], "p": p, "p_run": p_run})
            if first_step is None and p < 0.05:
                first_step = line["step"]
            if first_run is None and p_run < 0.05:
                first_run = line["step"]
        out[c] = {"first_flag_per_step": first_step, "first_flag_run_level": first_run, "tests": ps}
    return out


# ---- time -------------------------------------------------------------------------------------------------------
def timings(validity: Path, runs: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinymcf_callback import Probe
    from tinymcf_callback import testing as offline_assets

    tok = AutoTokenizer.from_pretrained(offline_assets.smollm2_dir())
    ckpts = sorted((validity / "aligned").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    path = ckpts[-1] if ckpts else offline_assets.smollm2_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    baseline_report = json.loads((validity / "aligned" / "reports" / "step-0.json").read_text())
    from tinymcf_callback.results.metrics import baseline_record

    baseline = baseline_record(baseline_report, 0)

    def best(probe, **kw):
        probe.run(model, progress=False, **kw)  # warm-up
        times, report = [], None
        for _ in range(runs):
            t = time.perf_counter()
            report = probe.run(model, progress=False, **kw)
            times.append(time.perf_counter() - t)
        return min(times), report

    out = {"model": f"SmolLM2-135M-Instruct fp32, {path.name}", "rows": []}
    whole_s, whole = best(Probe(tok, "scifi"))
    out["rows"].append({"probe": "whole set", "seconds": whole_s, "prompts": whole["info"]["n_prompts"],
                        "ratio": 1.0})
    for k in (2, 4):
        s, report = best(Probe(tok, "scifi", per_foundation=k))
        out["rows"].append({"probe": f"per_foundation={k}", "seconds": s, "prompts": report["info"]["n_prompts"],
                            "ratio": s / whole_s})
    for until in ("level", "change"):
        for width in WIDTHS:
            kw = {"baseline": baseline} if until == "change" else {}
            s, report = best(Probe(tok, "scifi", until=until, width=width), **kw)
            adaptive = report["info"]["adaptive"]
            out["rows"].append({"probe": f"until={until} width={width}", "seconds": s, "prompts": adaptive["prompts"],
                                "stopped": adaptive["stopped"], "reached": adaptive["reached"],
                                "ratio": s / whole_s})
    return out


# ---- the printout -----------------------------------------------------------------------------------------------
SETTINGS = [  # (name, until, now, before)
    ("SmolLM2 step 0", "level", "smollm2/step-0", None),
    ("SmolLM2 aligned step 50", "level", "aligned/step-50", None),
    ("tiny Qwen3 seed 0", "level", "tiny/seed-0", None),
    ("tiny Qwen3 seed 1", "level", "tiny/seed-1", None),
    ("aligned 0->10", "change", "aligned/step-10", "smollm2/step-0"),
    ("aligned 0->50", "change", "aligned/step-50", "smollm2/step-0"),
    ("inverted 0->50", "change", "inverted/step-50", "smollm2/step-0"),
    ("shuffled 0->50", "change", "shuffled/step-50", "smollm2/step-0"),
    ("tiny Qwen3 moved 1%", "change", "tiny/seed-0-moved", "tiny/seed-0"),
]


def print_coverage(results: dict, key: str, title: str) -> None:
    print(f"\n{title}")
    print(f"{'setting':<24} {'until':<6} {'width':>5}  {'sequence':>8} {'naive':>6} {'fixed':>6} (pf)  "
          f"{'prompts seq mean±sd [p10,p90]':<32} {'naive':>5} {'fixed':>5} {'whole':>5}")
    for name, until, *_ in SETTINGS:
        r = results[name][key]
        for w, row in r["widths"].items():
            s, n, f = row["sequence"], row["naive"], row["fixed"]
            fixed = f"{f['per_foundation']}{'' if f['reaches'] else '*'}"
            print(f"{name:<24} {until:<6} {w:>5}  {s['coverage']:>8.3f} {n['coverage']:>6.3f} {f['coverage']:>6.3f} "
                  f"({fixed:>2})  {s['prompts_mean']:>5.0f} ± {s['prompts_sd']:>4.0f} [{s['prompts_p10']:>3.0f}, "
                  f"{s['prompts_p90']:>3.0f}]{'':<12} {n['prompts_mean']:>5.0f} {f['prompts_mean']:>5.0f} "
                  f"{r['whole_prompts']:>5}")


def print_timing(timing: dict, runs: int) -> None:
    print(f"\nTime, {timing['model']} (best of {runs}, ratio against the whole set in this run)")
    for r in timing["rows"]:
        extra = f" stopped: {r['stopped']}, reached {r['reached']:.3f}" if "stopped" in r and r["reached"] else ""
        print(f"  {r['probe']:<26} {r['seconds']:6.1f} s  {r['prompts']:>3} prompts  x{r['ratio']:.2f}{extra}")


def tested(t: dict) -> str:
    return f"{t['step']}: p {t['p']:.2g} / run {t['p_run']:.2g}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from-rows", action="store_true", help="simulate from --rows (no model, no runs)")
    p.add_argument("--rows", default=str(ROWS), help=f"the rows file (default {ROWS.name} beside this script)")
    p.add_argument("--validity", default=str(ROOT / "runs" / "validity"), help="the validity runs' folder")
    p.add_argument("--orders", type=int, default=2000, help="simulated probes per setting (default 2000)")
    p.add_argument("--verdict-orders", type=int, default=400, help="orders per validity step (default 400)")
    p.add_argument("--null-runs", type=int, default=2000, help="simulated null runs (default 2000)")
    p.add_argument("--runs", type=int, default=2, help="timed probes each (the best is kept)")
    p.add_argument("--no-time", action="store_true", help="skip the real probes' timings")
    p.add_argument("--time-only", action="store_true", help="only the real probes' timings (adaptive.json kept)")
    p.add_argument("--out", default=str(HERE / "adaptive.json"))
    args = p.parse_args(argv)
    validity = Path(args.validity)

    import logging

    logging.getLogger("tinymcf_callback").setLevel(logging.ERROR)
    if args.time_only:
        timing = timings(validity, args.runs)
        print_timing(timing, args.runs)
        kept = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        Path(args.out).write_text(json.dumps({**kept, "time": timing}, indent=1) + "\n")
        return 0
    if args.from_rows:
        rows = json.loads(Path(args.rows).read_text())["rows"]
    else:
        rows = gather_rows(validity)
        about = ("per-vignette s of scifi (other_violate, other_uphold, self_violate, self_uphold), written by "
                 "benchmarks/adaptive.py")
        Path(args.rows).write_text(json.dumps({"about": about, "rows": rows}) + "\n")
    t0 = time.perf_counter()
    results = {}
    for name, until, now, before in SETTINGS:
        a, b = as_scores(rows[now]), None if before is None else as_scores(rows[before])
        results[name] = {sup: simulate(a, b, until, args.orders, superpopulation=sup == "superpopulation")
                         for sup in ("orders", "superpopulation")}
        results[name]["until"] = until
    sim_s = time.perf_counter() - t0
    print(f"per-look level of scifi's 8 looks at 95% over the sequence: "
          f"{results[SETTINGS[0][0]]['orders']['per_look_level']:.4f}; {args.orders} simulated probes a setting "
          f"({sim_s:.0f} s of simulation)")
    print_coverage(results, "orders", "Coverage of the whole set's value at nominal 95% (random orders of the real "
                   "vignettes); prompts at the stop (pf: the fixed per_foundation reaching the width on average, * "
                   "none does)")
    print_coverage(results, "superpopulation", "Coverage of the population's value (sets drawn with replacement "
                   "from the real vignettes)")
    verdict = verdicts(rows, args.verdict_orders)
    print(f"\nVerdicts on the validity runs (change since step 0: up/down/none, against the whole set's fixed 95%), "
          f"{args.verdict_orders} orders a step")
    for w, v in verdict.items():
        print(f"  width {w}: agree {v['agree']:.1%} with {v['share']:.1%} of the prompts on average; "
              f"not contradicting it {v['consistent']:.1%} (fixed per_foundation=2, 27% of them: agree "
              f"{v['fixed_pf2_agree']:.1%})")
        for s in v["steps"]:
            if s["agree"] < 0.95:
                print(f"    {s['run']} step {s['step']}: whole set {s['whole']} ({s['change']:+.4f}), agree "
                      f"{s['agree']:.1%} with {s['share']:.0%} of the prompts, not contradicting "
                      f"{s['consistent']:.1%}")
    nulls = null_runs(rows, args.null_runs)
    print("\nRun-level flags on null runs (real change rows, centred, sign-flipped; 50 steps)")
    for kind, n in nulls.items():
        print(f"  {kind}: runs with any step flagged: per-step p<0.05 {n['any_step_flag_per_step']:.1%}, run-level "
              f"{n['any_step_flag_run_level']:.1%} (a step's own false-flag rate {n['step_flag_rate']:.1%})")
    real = real_flags(validity)
    for c, r in real.items():
        print(f"  {c}: first flagged step per-step {r['first_flag_per_step']}, run-level {r['first_flag_run_level']}"
              f" ({', '.join(tested(t) for t in r['tests'])})")
    timing = None
    if not args.no_time and not args.from_rows:
        timing = timings(validity, args.runs)
        print_timing(timing, args.runs)
    import torch

    Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                                          "coverage": results, "verdicts": verdict, "null_runs": nulls,
                                          "real_flags": real, "time": timing}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
