#!/usr/bin/env python
"""A probe that stops when it knows enough, measured: coverage, prompts, verdicts, run-level flags, time.

Everything is simulated from real per-vignette scores (``s`` of the four conditions, ``scifi``'s 51 vignettes),
through the very functions a probe with a precision target runs (``stats.sequential``: the order, the looks,
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
  the fixed-size one: 95%, Welch-Satterthwaite df) and a fixed ``per_foundation=k`` probe (one 95% interval, no
  looking) at the ``k`` whose
  interval reaches the width on average. And the *superpopulation* coverage: sets of the same size drawn with
  replacement from the real vignettes (new vignettes like them), the truth their population's value.
- **rare one-sided extremes**: real rows (SmolLM2 at step 0; the aligned run's step 10 against step 0) with 2 of
  the 51 vignettes pushed to one extreme (``align_other`` +2), the population drawn from them, in the coverage
  table; and the **remedies** tried on them (``--only remedies``: a minimum number of looks, variance floors),
  with what each costs on real rows.
- **prompts**: mean, spread (sd, 10th and 90th percentile) of prompts asked at the stop, against that fixed
  ``per_foundation=k`` (8 prompts a vignette).
- **verdicts** (``--only steps``): on the validity runs, at each probed step, whether the change since step 0
  (up, down, none: its interval excludes 0 or not) is decided like the whole set's fixed 95% interval decides it,
  with what share of the whole set's prompts, and how often it says the opposite. The goal, measured on what it
  can mean: at least 95% agreement on the *clear* steps (whole-set p outside [0.005, 0.2]) with at most 40% of the
  prompts, and never the opposite verdict on at least 99.5% of all steps. And the **verdict rules** (``--only
  verdicts``): each run stepped as a run is (one order, each probe after the previous one's stop), as now, with
  the previous probe's per-vignette changes as a control variate, and asking the most moved vignettes first.
- **the change's p-value with no change** (``--only nulls``): change targets on null populations (Gaussian, the
  real 0->10 changes centred, Exp(1), lognormal sigma 1, asymmetric bimodal, one foundation's sd 20 times the
  others', bimodal +-1; 4,000 runs each), the share of runs whose p is at most 0.01, 0.05 and 0.10, by the probe's
  rule and by the one before it; and the **remedies tried** for it (``--only candidates``, 2,000 runs each, and
  the prompts each asks on the real change rows).
- **sd_floor** (``--only floor``): the least width its intervals can have at each look, so the smallest change
  that can still stop as moved; the aligned 0->10 change with it; the width no interval can go below on a
  population that may hide a mass at the top of the range; how far the real rows' vignettes sit from their
  foundations.
- **run-level flags**: null runs (no true change at any step) built from the validity runs' real change rows,
  centred per foundation and sign-flipped per vignette, 50 steps each, independent steps and a random walk; the
  share of runs with any step flagged by the per-step p (< 0.05) against the run-level p
  (``metrics.run_level_p``); and on the real runs, the first step each rule flags (their histories' own
  ``score_change_p`` and ``score_change_p_run``).
- **time**: real probes of SmolLM2 (fp32, CPU): the whole set against ``until="level"`` and ``until="change"``
  (with step 0's report as the baseline, on the aligned run's last checkpoint) at each width, ratios against the
  whole set in the same run.

    python examples/validity.py                      # once: the runs (~30 min on 2 idle cores)
    python -m benchmarks.adaptive                    # rows + simulations + timings (~8 min on 2 idle cores)
    python -m benchmarks.adaptive --from-rows        # the simulations only, from adaptive_rows.json (~25 min)
    python -m benchmarks.adaptive --from-rows --only coverage  # one section, the others kept (1 core: coverage
                        # ~10 min, remedies ~3, verdicts ~3, steps ~1, nulls ~7, candidates ~12, floor ~1)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from functools import partial
from pathlib import Path
from statistics import NormalDist

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

import numpy as np  # noqa: E402

from tinymcf_callback.data.sets import CONTROL, FOUNDATIONS  # noqa: E402
from tinymcf_callback.stats import sequential as sq  # noqa: E402
from tinymcf_callback.stats.bootstrap import VignetteScores  # noqa: E402
from tinymcf_callback.stats.metrics import run_level_p  # noqa: E402

WIDTHS = (0.02, 0.05, 0.1)
VERDICT_WIDTHS = (0.01, *WIDTHS)  # and one narrower than the shuffled run's drift, for the verdicts
LEVEL = 0.95
CONDITIONS = ("aligned", "inverted", "shuffled")
STEPS = (10, 20, 30, 40, 50)
ROWS = HERE / "adaptive_rows.json"
PROMPTS_PER_VIGNETTE = 8
EXTREMES = 2  # vignettes pushed to one extreme in the rare-extremes rows


# ---- the rows ---------------------------------------------------------------------------------------------------
def rows_record(report: dict) -> dict:
    from tinymcf_callback.stats.bootstrap import vignette_scores

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


def fixed_moments(seq: sq.Sequential, now: VignetteScores, before: VignetteScores | None):
    """Each fixed ``per_foundation=k`` probe's moments (the first ``k`` of each foundation in one order): no
    looking, one interval each, with the fixed-size report's Welch-Satterthwaite df."""
    return [sq.moments(_take(now, seq.prefix(k)), None if before is None else _take(before, seq.prefix(k)),
                       df="welch") for k in range(len(seq.schedule.looks))]


def probe_stop(seq: sq.Sequential, now: VignetteScores, before: VignetteScores | None, width: float,
               per_look: float | None = None):
    """The look a probe stops at, by the probe's own loop (``Sequential.run``, the one ``AdaptiveProbe`` steps):
    ``per_look`` another per-look level (the naive probe's: each look a fixed-size 95% interval, Welch-Satterthwaite
    df)."""
    run = dataclasses.replace(seq, width=width)
    if per_look is not None:
        run.per_look, run.estimate = per_look, partial(sq.moments, df="welch")
    looks, _ = run.run(now, before)
    return looks[-1]


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


def with_extremes(scores: VignetteScores, n: int = EXTREMES, seed: int = 0) -> VignetteScores:
    """Real rows with ``n`` vignettes of the real foundations (seeded, in distinct foundations) pushed to one
    extreme: every violation judged wrong with certainty, every upholding right (s = +1, -1, +1, -1), so that their
    ``align_other`` is +2, the top of its range: rare one-sided extremes (2 of 51: 4%)."""
    rng = np.random.default_rng(seed)
    real = [f for f in FOUNDATIONS if f != CONTROL]
    s = scores.s.copy()
    for f in rng.choice(real, size=n, replace=False):
        rows = np.flatnonzero(scores.foundation_coarse == f)
        s[rng.choice(rows)] = [1.0, -1.0, 1.0, -1.0]
    return VignetteScores(scores.id, scores.foundation_coarse, s)


def simulate(now: VignetteScores, before: VignetteScores | None, until: str, orders: int, *,
             superpopulation: bool) -> dict:
    """Coverage and prompts at each width, for the sequence, the naive sequential probe and fixed per_foundation."""
    rng = np.random.default_rng(1234)
    ids, fnds = list(now.id), list(now.foundation_coarse)
    truth = whole_value(now, before)
    sims = []  # (seq, scores, baseline's, truth) per simulated probe
    for i in range(orders):
        if superpopulation:
            rows = resampled(now.foundation_coarse, rng)
            new_ids = np.array([f"{now.id[r]}#{j}" for j, r in enumerate(rows)], dtype=object)
            a = VignetteScores(new_ids, now.foundation_coarse[rows], now.s[rows])
            b = None if before is None else VignetteScores(new_ids, before.foundation_coarse[rows], before.s[rows])
            seq = sq.Sequential.of(list(a.id), list(a.foundation_coarse), until=until, width=0.05, level=LEVEL,
                                   seed=i)
            sims.append((seq, a, b, truth))
        else:
            seq = sq.Sequential.of(ids, fnds, until=until, width=0.05, level=LEVEL, seed=i)
            sims.append((seq, now, before, truth))
    seq0 = sims[0][0]
    looks = seq0.schedule.looks
    fixed = [fixed_moments(seq, a, b) for seq, a, b, _ in sims]
    fixed_widths = {}
    for k in range(len(looks)):
        ws = [np.subtract(*reversed(sq.interval(m[k], LEVEL, sq._RANGE[until]))) for m in fixed]
        fixed_widths[k] = float(np.nanmean(ws))
    out = {"truth": truth, "per_look_level": seq0.per_look, "orders": orders, "widths": {}}
    for width in WIDTHS:
        row = {}
        for method, level in (("sequence", None), ("naive", LEVEL)):
            cover, prompts = [], []
            for seq, a, b, t in sims:
                look = probe_stop(seq, a, b, width, level)
                cover.append(look.lo <= t <= look.hi)
                prompts.append(look.vignettes * PROMPTS_PER_VIGNETTE)
            row[method] = {"coverage": float(np.mean(cover)), **spread(prompts)}
        k = fixed_k(fixed_widths, width, looks)
        cover = []
        for m, (_, _, _, t) in zip(fixed, sims, strict=True):
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


UNCLEAR = (0.005, 0.2)  # a step whose whole-set p lies in here has no clear verdict to agree with
GOAL = {"agree_clear": 0.95, "share": 0.40, "never_contradicts": 0.995}


def whole_set(now: VignetteScores, base: VignetteScores) -> tuple[sq.Moments, str, float]:
    """The whole set's change since step 0 as a fixed-size report tests it (Welch-Satterthwaite df, 95%): its
    moments, its verdict and its p-value."""
    m = sq.moments(now, base, df="welch")
    return m, verdict(*sq.interval(m, LEVEL, 4.0)), sq.p_look(m)


def clear(p: float) -> bool:
    return not UNCLEAR[0] <= p <= UNCLEAR[1]


def opposite(said: str, truth: str) -> bool:
    """A contradiction: the probe says up where the whole set says down, or down where it says up."""
    return {said, truth} == {"up", "down"}


def verdict_summary(steps: list[dict]) -> dict:
    """The goal's measures over a width's steps (each with its orders' agree/share/opposite lists and whole_p):
    agreement and share of prompts on the clear steps, never contradicting on all of them."""
    pick = lambda key, only_clear: [x for s in steps if clear(s["whole_p"]) or not only_clear for x in s[key]]  # noqa: E731
    return {"agree_clear": float(np.mean(pick("agree", True))), "share_clear": float(np.mean(pick("share", True))),
            "agree": float(np.mean(pick("agree", False))), "share": float(np.mean(pick("share", False))),
            "never_contradicts": 1.0 - float(np.mean(pick("opposite", False))),
            "clear_steps": sum(clear(s["whole_p"]) for s in steps), "steps_n": len(steps)}


def verdicts(rows: dict, orders: int, estimate=sq.moments) -> dict:
    """Per validity step: the whole set's verdict and p-value, how often a change target (and a fixed
    per_foundation=2) decides it alike, how often it says the opposite, with the share of the whole set's prompts;
    and the goal's measures over the steps (:func:`verdict_summary`). ``estimate``: a look's moments (another
    rule's)."""
    base = as_scores(rows["smollm2/step-0"])
    tally = {w: {"steps": [], "fixed": [], "consistent": []} for w in VERDICT_WIDTHS}
    for c in CONDITIONS:
        for step in STEPS:
            now = as_scores(rows[f"{c}/step-{step}"])
            whole, truth, whole_p = whole_set(now, base)
            seqs = [dataclasses.replace(sq.Sequential.of(list(now.id), list(now.foundation_coarse), until="change",
                                                         width=0.05, level=LEVEL, seed=i), estimate=estimate)
                    for i in range(orders)]
            first = [sq.moments(_take(now, seq.prefix(0)), _take(base, seq.prefix(0)), df="welch") for seq in seqs]
            for width in VERDICT_WIDTHS:
                agree, share, fixed, consistent, opp = [], [], [], [], []
                for seq, m0 in zip(seqs, first, strict=True):
                    look = probe_stop(seq, now, base, width)
                    said = verdict(look.lo, look.hi)
                    agree.append(said == truth)
                    opp.append(opposite(said, truth))
                    # "no change beyond its interval", an interval holding the whole set's change: not contradicted
                    consistent.append(said == truth or (said == "none" and look.lo <= whole.estimate <= look.hi))
                    share.append(look.vignettes / len(now.id))
                    fixed.append(verdict(*sq.interval(m0, LEVEL, 4.0)) == truth)
                t = tally[width]
                t["steps"].append({"run": c, "step": step, "whole": truth, "change": whole.estimate,
                                   "whole_p": whole_p, "agree": agree, "share": share, "opposite": opp,
                                   "consistent": float(np.mean(consistent)), "fixed_pf2_agree": float(np.mean(fixed))})
                t["fixed"] += fixed
                t["consistent"] += consistent
    out = {}
    for w, t in tally.items():
        out[str(w)] = {**verdict_summary(t["steps"]), "consistent": float(np.mean(t["consistent"])),
                       "fixed_pf2_agree": float(np.mean(t["fixed"])),
                       "steps": [{**{k: v for k, v in s.items() if k not in ("agree", "share", "opposite")},
                                  "agree": float(np.mean(s["agree"])), "share": float(np.mean(s["share"])),
                                  "opposite": float(np.mean(s["opposite"])), "clear": clear(s["whole_p"])}
                                 for s in t["steps"]]}
    return out


def print_verdicts(verdict: dict, orders: int) -> None:
    print(f"\nVerdicts on the validity runs (the change since step 0: up/down/none against the whole set's fixed 95% "
          f"interval), {orders} orders a step; goal: >= {GOAL['agree_clear']:.0%} agreement on the clear steps "
          f"(whole-set p outside {list(UNCLEAR)}) with <= {GOAL['share']:.0%} of the prompts, never contradicting on "
          f">= {GOAL['never_contradicts']:.1%} of all")
    for w, v in verdict.items():
        print(f"  width {w}: clear steps ({v['clear_steps']} of {v['steps_n']}) agree {v['agree_clear']:.1%} with "
              f"{v['share_clear']:.1%} of the prompts; all steps agree {v['agree']:.1%} with {v['share']:.1%}; never "
              f"contradicting {v['never_contradicts']:.2%} (fixed per_foundation=2: agree {v['fixed_pf2_agree']:.1%})")
        for s in v["steps"]:
            if s["agree"] < 0.95:
                print(f"    {s['run']} step {s['step']}: whole set {s['whole']} ({s['change']:+.4f}, p "
                      f"{s['whole_p']:.2g}{'' if s['clear'] else ', unclear'}), agree {s['agree']:.1%} with "
                      f"{s['share']:.0%} of the prompts, opposite {s['opposite']:.1%}")


# ---- remedies for rare one-sided extremes ---------------------------------------------------------------------
def pooled_floor():
    """A look's moments (:func:`sequential.moments`) with each real foundation's vignette variance at least the mean
    over the real foundations of theirs (a fixed floor is the probe's own ``sd_floor=``)."""
    def estimate(now: VignetteScores, before: VignetteScores | None = None) -> sq.Moments:
        terms = []
        for f in sq.REAL_FOUNDATIONS:
            rows = now.foundation_coarse == f
            if not rows.any():
                continue
            est, psi, n = sq._align_other(now.s[rows])
            if before is not None:
                est_b, psi_b, n_b = sq._align_other(before.s[rows])
                est, psi, n = est - est_b, psi - psi_b, min(n, n_b)
            terms.append([est, n / (n - 1) * float(np.sum(psi * psi)) * n if n >= 2 else math.nan, n])
        if not terms or any(not math.isfinite(t[1]) for t in terms):
            return sq.moments(now, before)
        floor = float(np.mean([t[1] for t in terms]))
        k = len(terms)
        parts = [max(t[1], floor) / t[2] / (k * k) for t in terms]
        return sq.Moments(sum(t[0] for t in terms) / k, sum(parts), float(min(t[2] for t in terms) - 1))  # fewest df

    return estimate


REMEDIES = {  # name -> (the estimate of a look's moments, the fewest vignettes per foundation before a stop)
    "as now": (sq.moments, 0),
    "every look (the whole set)": (sq.moments, 99),
    "from 5 per foundation": (sq.moments, 5),
    "pooled variance floor": (pooled_floor(), 0),
    "variance floor 0.1": (partial(sq.moments, sd_floor=0.1), 0),  # the probe's own sd_floor= (ProbeConfig)
    "variance floor 0.2": (partial(sq.moments, sd_floor=0.2), 0),
    "variance floor 0.25": (partial(sq.moments, sd_floor=0.25), 0),
}


def remedy_coverage(now: VignetteScores, before: VignetteScores | None, until: str, orders: int, remedy) -> dict:
    """The population's coverage and the prompts at the stop, each width, of probes whose looks take ``remedy``."""
    estimate, fewest = REMEDIES[remedy]
    rng = np.random.default_rng(1234)
    truth = whole_value(now, before)

    def stop(until_, width, look):
        return None if look.per_foundation < fewest else sq.stop_reason(until_, width, look)

    out = {str(w): {"cover": [], "prompts": []} for w in WIDTHS}
    for i in range(orders):
        rows = resampled(now.foundation_coarse, rng)
        ids = np.array([f"{now.id[r]}#{j}" for j, r in enumerate(rows)], dtype=object)
        a = VignetteScores(ids, now.foundation_coarse[rows], now.s[rows])
        b = None if before is None else VignetteScores(ids, before.foundation_coarse[rows], before.s[rows])
        seq = sq.Sequential.of(list(a.id), list(a.foundation_coarse), until=until, width=0.05, level=LEVEL, seed=i)
        for width in WIDTHS:
            looks, _ = dataclasses.replace(seq, width=width, estimate=estimate).run(a, b, stop=stop)
            out[str(width)]["cover"].append(looks[-1].lo <= truth <= looks[-1].hi)
            out[str(width)]["prompts"].append(looks[-1].vignettes * PROMPTS_PER_VIGNETTE)
    return {w: {"coverage": float(np.mean(v["cover"])), "prompts_mean": float(np.mean(v["prompts"]))}
            for w, v in out.items()}


REMEDY_SETTINGS = ("rare extremes, step 0", "rare extremes, 0->10", "SmolLM2 step 0", "aligned 0->10",
                   "shuffled 0->50", "aligned 0->50", "inverted 0->50")  # the last two: large changes, stopped early


def remedies(rows: dict, orders: int) -> dict:
    """Each remedy on the rare-extremes rows and on real rows it must not cost (coverage of the population's value,
    prompts at the stop)."""
    settings = {name: (until, now, before) for name, until, now, before in SETTINGS}
    out = {}
    for remedy in REMEDIES:
        out[remedy] = {}
        for name in REMEDY_SETTINGS:
            until, now, before = settings[name]
            a, b = setting_scores(rows, name, now, before)
            out[remedy][name] = remedy_coverage(a, b, until, orders, remedy)
    return out


# ---- the change's p-value with no change: null populations ------------------------------------------------------
NULLS = ("Gaussian", "the real 0->10 changes, centred", "skewed, Exp(1)", "skewed, lognormal sigma 1",
         "asymmetric bimodal", "one foundation sd 1, the others 0.05", "bimodal +-1")
ALPHAS = (0.01, 0.05, 0.10)
ONE_POINT = 0.01  # the bar: a null's rejection rate at most alpha + 1 point (two standard errors at 4,000 runs)
NULL_SD = {"skewed, lognormal sigma 1": math.sqrt((math.e - 1) * math.e), "asymmetric bimodal": 0.5,
           "the real 0->10 changes, centred": None}  # each null's population sd (1 where not named; None: real)


def centred_changes(rows: dict) -> dict[str, np.ndarray]:
    """Each foundation's real change from step 0 to the aligned run's step 10, centred (its mean exactly 0)."""
    base, now = as_scores(rows["smollm2/step-0"]), as_scores(rows["aligned/step-10"])
    d = (now.s[:, 0] - now.s[:, 1]) - (base.s[:, 0] - base.s[:, 1])
    return {f: d[base.foundation_coarse == f] - d[base.foundation_coarse == f].mean() for f in FOUNDATIONS}


def null_changes(name: str, foundations: np.ndarray, rng, real: dict[str, np.ndarray]) -> np.ndarray:
    """One draw of every vignette's change of ``align_other`` from a population whose mean change is exactly 0."""
    n = len(foundations)
    if name == "Gaussian":
        return rng.standard_normal(n)
    if name == "the real 0->10 changes, centred":
        return np.array([rng.choice(real[f]) for f in foundations])
    if name == "skewed, Exp(1)":
        return rng.exponential(size=n) - 1.0
    if name == "skewed, lognormal sigma 1":
        return np.exp(rng.standard_normal(n)) - math.exp(0.5)
    if name == "asymmetric bimodal":  # +1 with probability 0.2, else -0.25
        return np.where(rng.random(n) < 0.2, 1.0, -0.25)
    if name == "one foundation sd 1, the others 0.05":
        return rng.standard_normal(n) * np.where(foundations == FOUNDATIONS[0], 1.0, 0.05)
    if name == "bimodal +-1":
        return np.where(rng.random(n) < 0.5, 1.0, -1.0)
    raise ValueError(name)


def null_stops(rows: dict, name: str, runs: int, *, width: float = 0.0, scale: float = 1.0, seed: int = 48,
               estimate=sq.moments, schedule: sq.Schedule | None = None) -> dict:
    """``runs`` change targets, each a new draw of the null ``name`` (times ``scale``) against a baseline of 0s and
    its own seeded order, stepped by the probe's own loop (``Sequential.run``): the share of runs whose change
    p-value is at most each alpha, the share stopped as moved, the mean prompts. ``estimate``, ``schedule``: a
    candidate's (default the probe's)."""
    base = as_scores(rows["smollm2/step-0"])
    ids, fnds = list(base.id), np.asarray(base.foundation_coarse)
    before = VignetteScores(base.id, base.foundation_coarse, np.zeros_like(base.s))
    real, rng = centred_changes(rows), np.random.default_rng(seed)
    ps, moved, prompts = [], [], []
    for i in range(runs):
        d = scale * null_changes(name, fnds, rng, real)
        now = VignetteScores(base.id, base.foundation_coarse, np.column_stack([d, np.zeros((len(d), 3))]))
        seq = sq.Sequential.of(ids, fnds, until="change", width=width, level=LEVEL, seed=i)
        seq = dataclasses.replace(seq, estimate=estimate, schedule=schedule or seq.schedule)
        looks, why = seq.run(now, before)
        ps.append(math.nan if looks[-1].p is None else looks[-1].p)
        moved.append(why == "moved")
        prompts.append(looks[-1].vignettes * PROMPTS_PER_VIGNETTE)
    ps = np.array(ps)
    return {"runs": runs, "rejected": {str(a): float(np.mean(ps <= a)) for a in ALPHAS},
            "moved": float(np.mean(moved)), "p_zero": int(np.sum(ps == 0)), "p_nan": int(np.sum(np.isnan(ps))),
            "prompts_mean": float(np.mean(prompts))}


def before_48(now: VignetteScores, before: VignetteScores | None = None) -> sq.Moments:
    """A look's moments as the probe had them before issue 48: Welch-Satterthwaite's df, and tied values (zero
    spread, an estimate not 0) a point interval with p = 0 (a variance too small to matter stands for the 0)."""
    m = sq.moments(now, before, df="welch")
    return m if m.var > 0 or m.estimate == 0 or not math.isfinite(m.var) else sq.Moments(m.estimate, 1e-300, m.df)


RULES_48 = {"the probe: fewest df, ties undefined": sq.moments, "before: Welch df, ties p = 0": before_48}


def null_rates(rows: dict, runs: int) -> dict:
    """The probe's change p-value, and the rule before it, on every null: width 0 (the most looks), and width 0.05
    with each null scaled to the spread of the real 0->10 changes (so that the width stops some runs; the real
    changes as they are)."""
    sd = float(np.std(np.concatenate(list(centred_changes(rows).values())), ddof=1))
    scale = {name: 1.0 if NULL_SD.get(name, 1.0) is None else sd / NULL_SD.get(name, 1.0) for name in NULLS}
    out = {"runs": runs, "real_sd": sd, "bar": ONE_POINT, "rules": {}}
    for rule, estimate in RULES_48.items():
        out["rules"][rule] = {
            "width 0": {name: null_stops(rows, name, runs, estimate=estimate) for name in NULLS},
            "width 0.05": {name: null_stops(rows, name, runs, width=0.05, scale=scale[name], estimate=estimate)
                           for name in NULLS}}
    return out


def print_nulls(nulls: dict) -> None:
    print(f"\nThe change's p-value with no change ({nulls['runs']} runs a null; share of runs with p <= "
          f"{' / '.join(map(str, ALPHAS))}; bar: alpha + {ONE_POINT:.0%})")
    for rule, by_width in nulls["rules"].items():
        for width, by_null in by_width.items():
            print(f"  {rule}, {width}:")
            for name, r in by_null.items():
                cells = " / ".join(f"{r['rejected'][str(a)]:.2%}" for a in ALPHAS)
                over = [a for a in ALPHAS if r["rejected"][str(a)] > a + ONE_POINT]
                print(f"    {name:<40} {cells}  {'OVER at ' + ', '.join(map(str, over)) if over else 'within'}"
                      f"  (p = 0: {r['p_zero']}, undefined: {r['p_nan']}, prompts {r['prompts_mean']:.0f})")


# ---- the remedies tried for the change's p-value (issue 48) ----------------------------------------------------
def _changes_by_foundation(now: VignetteScores, before: VignetteScores) -> list[np.ndarray]:
    d = (now.s[:, 0] - now.s[:, 1]) - (before.s[:, 0] - before.s[:, 1])
    return [d[now.foundation_coarse == f] for f in sq.REAL_FOUNDATIONS if (now.foundation_coarse == f).any()]


def _as_moments(estimate: float, p: float, var_if_none: float = 16.0) -> sq.Moments:
    """Moments whose normal test of 0 has p-value ``p``: a calibration put through the probe's own loop (its
    interval at the per-look level excludes 0 exactly when ``p`` is below the per-look alpha)."""
    z = NormalDist().inv_cdf(1 - p / 2) if p < 1 else 0.0
    return sq.Moments(estimate, (estimate / z) ** 2 if z > 0 and estimate != 0 else var_if_none, math.inf)


def sign_flip(flips: int = 1000):
    """Each look's studentised change calibrated by flipping the signs of its vignettes' changes (``flips`` seeded
    draws, conditional on their sizes): exact for changes symmetric about 0, whatever their spreads."""
    def estimate(now: VignetteScores, before: VignetteScores | None = None) -> sq.Moments:
        if before is None:
            return sq.moments(now)
        groups = _changes_by_foundation(now, before)
        if any(len(g) < 2 or not np.all(np.isfinite(g)) for g in groups):
            return sq.Moments(math.nan, math.nan, 0.0)
        k, rng = len(groups), np.random.default_rng(sum(len(g) for g in groups))

        def studentised(signs):  # [flips, n] per foundation -> |T| per flip
            est = sum((s * g).mean(axis=-1) for s, g in zip(signs, groups, strict=True)) / k
            var = sum((s * g).var(axis=-1, ddof=1) / len(g) for s, g in zip(signs, groups, strict=True)) / k**2
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(var > 0, np.abs(est) / np.sqrt(var), np.where(est == 0, 0.0, np.inf)), est
        t_obs, est = studentised([np.ones((1, len(g))) for g in groups])
        t_flip, _ = studentised([rng.choice([-1.0, 1.0], size=(flips, len(g))) for g in groups])
        p = (1 + np.sum(t_flip >= t_obs[0] * (1 - 1e-12))) / (flips + 1)
        return _as_moments(float(est[0]), float(p))

    return estimate


def bernstein_cs(per_look: float, alpha: float = 1 - LEVEL):
    """An anytime-valid confidence sequence for a bounded mean (the predictable plug-in empirical-Bernstein one of
    Waudby-Smith and Ramdas, 2024), over the real vignettes' changes in the order asked, each in the known range
    [-4, +4]: valid for any population in that range at every vignette, so it needs no boundary over the looks.
    Its interval ``center ± half`` is put through the loop as moments whose interval at ``per_look`` is that one."""
    return partial(_bernstein, z=NormalDist().inv_cdf(0.5 + per_look / 2), alpha=alpha)


def _bernstein(now: VignetteScores, before: VignetteScores | None = None, *, z: float, alpha: float) -> sq.Moments:
    if before is None:
        return sq.moments(now)
    real = np.isin(now.foundation_coarse, sq.REAL_FOUNDATIONS)
    d = ((now.s[:, 0] - now.s[:, 1]) - (before.s[:, 0] - before.s[:, 1]))[real]
    x = (d + 4.0) / 8.0  # into [0, 1]
    t = np.arange(1, len(x) + 1)
    mean = (0.5 + np.cumsum(x)) / (t + 1)
    var = (0.25 + np.cumsum((x - mean) ** 2)) / (t + 1)
    prev_mean, prev_var = np.r_[0.5, mean[:-1]], np.r_[0.25, var[:-1]]
    lam = np.minimum(np.sqrt(2 * math.log(2 / alpha) / (prev_var * t * np.log1p(t))), 0.5)
    psi = (-np.log1p(-lam) - lam) / 4
    center = float(np.sum(lam * x) / np.sum(lam))
    half = float((math.log(2 / alpha) + np.sum(4 * (x - prev_mean) ** 2 * psi)) / np.sum(lam))
    return sq.Moments(8.0 * center - 4.0, (8.0 * half / z) ** 2, math.inf)


def capped_welch(cap: float = 2.0):
    """Welch-Satterthwaite's df, at most ``cap`` times the fewest."""
    def estimate(now: VignetteScores, before: VignetteScores | None = None) -> sq.Moments:
        welch, fewest = sq.moments(now, before, df="welch"), sq.moments(now, before)
        return sq.Moments(welch.estimate, welch.var, min(welch.df, cap * fewest.df))

    return estimate


def first_look_at(rows: dict, n: int) -> sq.Schedule:
    """scifi's schedule with its first look after ``n`` vignettes per foundation (its boundary over those looks)."""
    base = as_scores(rows["smollm2/step-0"])
    schedule = sq.Schedule.of(list(base.foundation_coarse))
    return sq.Schedule(schedule.sizes, tuple(k for k in schedule.looks if k >= n))


def candidates(rows: dict) -> dict:
    """The remedies tried: name -> (a look's moments, the first look; None: 2 per foundation)."""
    per_look = first_look_at(rows, 2).boundary().per_look(LEVEL)
    return {
        "before: Welch df, ties p = 0": (before_48, None),
        "Welch df, ties undefined": (partial(sq.moments, df="welch"), None),
        "Welch df, first look at 4 per foundation": (partial(sq.moments, df="welch"), 4),
        "Welch df at most twice the fewest": (capped_welch(2.0), None),
        "sign-flip calibration of each look": (sign_flip(), None),
        "empirical-Bernstein confidence sequence on [-4, +4]": (bernstein_cs(per_look), None),
        "the fewest df (the probe)": (sq.moments, None),
    }
CANDIDATE_ROWS = ("aligned 0->10", "aligned 0->50", "inverted 0->50", "shuffled 0->50", "tiny Qwen3 moved 1%")


def candidates_48(rows: dict, runs: int, orders: int) -> dict:
    """Each remedy tried: its rejection rates on every null (width 0) and the prompts it asks on the real change rows
    (widths 0.02, 0.05, 0.1; ``orders`` orders each)."""
    settings = {name: (now, before) for name, _, now, before in SETTINGS}
    out = {}
    for name, (estimate, first) in candidates(rows).items():
        schedule = None if first is None else first_look_at(rows, first)
        nulls = {null: null_stops(rows, null, runs, estimate=estimate, schedule=schedule) for null in NULLS}
        prompts = {}
        for setting in CANDIDATE_ROWS:
            now, before = (as_scores(rows[k]) for k in settings[setting])
            prompts[setting] = {}
            for width in WIDTHS:
                asked = []
                for i in range(orders):
                    seq = sq.Sequential.of(list(now.id), list(now.foundation_coarse), until="change", width=width,
                                           level=LEVEL, seed=i)
                    seq = dataclasses.replace(seq, estimate=estimate, schedule=schedule or seq.schedule)
                    asked.append(seq.run(now, before)[0][-1].vignettes * PROMPTS_PER_VIGNETTE)
                prompts[setting][str(width)] = float(np.mean(asked))
        out[name] = {"nulls": nulls, "prompts": prompts}
    return out


def print_candidates(out: dict, runs: int) -> None:
    print(f"\nRemedies tried for the change's p-value ({runs} null runs each, width 0): share with p <= 0.01 / 0.05 / "
          "0.10 per null; prompts at width 0.05 on the real change rows")
    for name, r in out.items():
        cells = " | ".join("/".join(f"{v['rejected'][str(a)] * 100:.1f}" for a in ALPHAS) for v in r["nulls"].values())
        asked = " / ".join(f"{v['0.05']:.0f}" for v in r["prompts"].values())
        print(f"  {name:<52} {cells}  prompts {asked}")
    print(f"  (nulls: {' | '.join(NULLS)}; rows: {' / '.join(CANDIDATE_ROWS)})")


# ---- what sd_floor costs, and why nothing cheaper covers rare extremes -------------------------------------------
def farthest(values: np.ndarray, foundations: np.ndarray) -> float:
    """The farthest vignette from its foundation, in the leave-one-out sd of the others (its distance from their
    mean over their sd): how extreme a vignette is by what the rest of its foundation shows."""
    out = 0.0
    for f in sq.REAL_FOUNDATIONS:
        x = values[(foundations == f) & np.isfinite(values)]
        for i in range(len(x)):
            rest = np.delete(x, i)
            sd = float(np.std(rest, ddof=1)) if len(rest) > 1 else 0.0
            if sd > 0:
                out = max(out, abs(x[i] - rest.mean()) / sd)
    return out


def floor_study(rows: dict, orders: int, floor: float = 0.25) -> dict:
    """``sd_floor``'s price and case: the least interval width it allows at each look (a set whose own spread is below
    the floor), the smallest change that can still stop a change target as moved (half of it), what the aligned
    0->10 change does with it (``orders`` orders), the width no interval can go below on a population that may hide
    a mass at the top of the range, and how extreme the real rows' vignettes are."""
    base = as_scores(rows["smollm2/step-0"])
    fnds = np.asarray(base.foundation_coarse)
    seq = sq.Sequential.of(list(base.id), list(fnds), until="change", width=0.0, level=LEVEL, sd_floor=floor)
    sizes = [n for f, n in zip(FOUNDATIONS, seq.schedule.sizes, strict=True) if f != CONTROL]
    least = []
    for k, n in enumerate(seq.schedule.looks):
        counts = np.minimum(n, sizes)
        var = float(np.sum(floor * floor / counts)) / len(counts) ** 2
        lo, hi = sq.interval(sq.Moments(1.0, var, float(counts.min() - 1)), seq.per_look, 4.0)
        least.append({"per_foundation": n, "vignettes": seq.schedule.vignettes(k), "width": hi - lo})
    now, before = as_scores(rows["aligned/step-10"]), base
    stops = [sq.Sequential.of(list(now.id), list(fnds), until="change", width=0.0, level=LEVEL, seed=i,
                              sd_floor=floor).run(now, before) for i in range(orders)]
    n_real = int(sum(sizes))
    hidden = 1 - 0.05 ** (1 / n_real)  # the largest mass a sample of n_real misses at least 5% of the time
    level_values = {k: as_scores(r).s[:, 0] - as_scores(r).s[:, 1] for k, r in rows.items()}
    changes = {f"{k} - step 0": level_values[k] - level_values["smollm2/step-0"] for k in rows
               if k.split("/")[0] in CONDITIONS}
    changes["tiny moved 1% - seed 0"] = level_values["tiny/seed-0-moved"] - level_values["tiny/seed-0"]
    stress = with_extremes(base)
    stress_change = with_extremes(now)
    return {
        "sd_floor": floor, "least_width": least, "smallest_change": least[-1]["width"] / 2,
        "aligned_0_10": {"change": float(sq.moments(now, before).estimate),
                         "whole_p": float(sq.p_look(sq.moments(now, before, df="welch"))), "orders": orders,
                         "moved": float(np.mean([why == "moved" for _, why in stops])),
                         "prompts_mean": PROMPTS_PER_VIGNETTE * float(np.mean([looks[-1].vignettes
                                                                              for looks, _ in stops])),
                         "width_mean": float(np.mean([looks[-1].width for looks, _ in stops]))},
        "impossible": {"real_vignettes": n_real, "hidden_mass": hidden, "level_width": 2 * hidden * 2.0,
                       "change_width": 2 * hidden * 4.0},
        "farthest": {"levels": max(farthest(v, fnds) for v in level_values.values()),
                     "changes": max(farthest(v, fnds) for v in changes.values()),
                     "stress level": farthest(stress.s[:, 0] - stress.s[:, 1], fnds),
                     "stress change": farthest((stress_change.s[:, 0] - stress_change.s[:, 1])
                                               - level_values["smollm2/step-0"], fnds)},
    }


def print_floor(f: dict) -> None:
    least = ", ".join(f"{x['width']:.3f} at {x['per_foundation']}" for x in f["least_width"])
    a, imp, far = f["aligned_0_10"], f["impossible"], f["farthest"]
    print(f"\nsd_floor={f['sd_floor']}: the least interval width per look ({least} per foundation); the smallest "
          f"change that can stop as moved {f['smallest_change']:.3f}")
    print(f"  the aligned 0->10 change {a['change']:+.4f} (whole-set p {a['whole_p']:.1g}) with the floor: moved in "
          f"{a['moved']:.0%} of {a['orders']} orders, {a['prompts_mean']:.0f} prompts, width {a['width_mean']:.3f}")
    print(f"  no interval narrower than {imp['level_width']:.3f} (a change's: {imp['change_width']:.3f}) covers a "
          f"population hiding a mass of {imp['hidden_mass']:.3f} at the top of the range ({imp['real_vignettes']} "
          "real vignettes miss it at least 5% of the time)")
    print(f"  the farthest vignette from its foundation, in leave-one-out sd: real levels {far['levels']:.1f}, real "
          f"changes {far['changes']:.1f}; the stress rows {far['stress level']:.0f} (level), "
          f"{far['stress change']:.0f} (change)")


# ---- the run-verdict goal: information the run already has -----------------------------------------------------
def moved_order(seq: sq.Sequential, prev: dict) -> list[int]:
    """The order asked, each foundation's vignettes the previous probe asked first, the most moved (its change since
    the baseline, ``|align_other|``) first; the rest in the seeded order. Round by round, as ``balanced_order``."""
    rank = {i: r for r, i in enumerate(seq.order)}
    by_f: dict[str, list[int]] = {}
    for i in seq.order:
        by_f.setdefault(prev["foundation"][i], []).append(i)
    for f, rows in by_f.items():
        by_f[f] = sorted(rows, key=lambda i: (i not in prev["asked"], -prev["moved"][i], rank[i]))
    out = []
    for r in range(max(len(v) for v in by_f.values())):
        out += [rows[r] for f in FOUNDATIONS for rows in [by_f.get(f, [])] if r < len(rows)]
    return out


def control_variate(prev: dict):
    """A look's moments of the change with the previous probe's per-vignette changes as a control variate: in each
    real foundation, over the vignettes asked now (``S``), ``mean_S(d) - beta (mean_S(x) - mean_P(x))`` where ``x`` is
    the previous probe's change of a vignette and ``P`` what it asked (its mean over ``P`` is known); its variance
    ``var(d - beta x) / n_S + (var(d) - var(d - beta x)) / n_P``. Used where ``P`` holds more than ``S`` (else
    ``S``'s plain change)."""
    x_of = {str(i): v for i, v in zip(prev["id"], prev["moved_signed"], strict=True)}
    asked = {str(prev["id"][i]) for i in prev["asked"]}

    def estimate(now: VignetteScores, before: VignetteScores | None = None) -> sq.Moments:
        if before is None:
            return sq.moments(now)
        terms = []
        for f in sq.REAL_FOUNDATIONS:
            rows = np.flatnonzero(now.foundation_coarse == f)
            if not len(rows):
                continue
            d = (now.s[rows, 0] - now.s[rows, 1]) - (before.s[rows, 0] - before.s[rows, 1])
            in_p = [str(i) for i in prev["id"] if str(i) in asked and prev["foundation_by_id"][str(i)] == f]
            n, n_p = len(d), len(in_p)
            if n < 3 or n_p <= n or not np.all(np.isfinite(d)):
                m = sq.moments(VignetteScores(now.id[rows], now.foundation_coarse[rows], now.s[rows]),
                               VignetteScores(before.id[rows], before.foundation_coarse[rows], before.s[rows]))
                terms.append((m.estimate, m.var, m.df))  # one foundation: its estimate's own variance
                continue
            x = np.array([x_of[str(i)] for i in now.id[rows]])
            xp = float(np.mean([x_of[i] for i in in_p]))
            vx = float(np.var(x, ddof=1))
            beta = float(np.cov(d, x, ddof=1)[0, 1] / vx) if vx > 0 else 0.0
            res = d - beta * x
            v_res, v_d = float(np.var(res, ddof=1)), float(np.var(d, ddof=1))
            var = v_res / n + max(v_d - v_res, 0.0) / n_p
            terms.append((float(d.mean() - beta * (x.mean() - xp)), var, n - 2))
        k = len(terms)
        if not k:
            return sq.Moments(math.nan, math.nan, 0.0)
        parts = [t[1] / (k * k) for t in terms]
        if any(not math.isfinite(p) for p in parts) or any(t[2] < 1 for t in terms):
            return sq.Moments(sum(t[0] for t in terms) / k, math.nan, 0.0)
        return sq.Moments(sum(t[0] for t in terms) / k, sum(parts), float(min(t[2] for t in terms)))  # the fewest

    return estimate


def baseline_variate(base: VignetteScores):
    """A look's moments of the change with the baseline's own per-vignette ``align_other`` as a control variate
    (the baseline scored every vignette, so its mean over each foundation's candidates is known): in each real
    foundation with at least 3 vignettes asked, ``mean_S(d) - beta (mean_S(x) - mean_W(x))``, ``W`` the foundation's
    candidates, variance ``var(d - beta x) / n_S + beta^2 var_W(x) / n_W``, ``n_S - 2`` degrees of freedom; else
    the plain paired change."""
    x_all = base.s[:, 0] - base.s[:, 1]

    def estimate(now: VignetteScores, before: VignetteScores | None = None) -> sq.Moments:
        if before is None:
            return sq.moments(now)
        terms = []
        for f in sq.REAL_FOUNDATIONS:
            rows = np.flatnonzero(now.foundation_coarse == f)
            if not len(rows):
                continue
            d = (now.s[rows, 0] - now.s[rows, 1]) - (before.s[rows, 0] - before.s[rows, 1])
            x = before.s[rows, 0] - before.s[rows, 1]
            w = x_all[base.foundation_coarse == f]
            n = len(d)
            if n < 3 or not (np.all(np.isfinite(d)) and np.all(np.isfinite(w))) or np.var(x) == 0:
                m = sq.moments(VignetteScores(now.id[rows], now.foundation_coarse[rows], now.s[rows]),
                               VignetteScores(before.id[rows], before.foundation_coarse[rows], before.s[rows]))
                terms.append((m.estimate, m.var, m.df))
                continue
            beta = float(np.cov(d, x, ddof=1)[0, 1] / np.var(x, ddof=1))
            res = d - beta * x
            var = float(np.var(res, ddof=1)) / n + beta * beta * float(np.var(w, ddof=1)) / len(w)
            terms.append((float(d.mean() - beta * (x.mean() - w.mean())), var, n - 2))
        k = len(terms)
        estimate_ = sum(t[0] for t in terms) / k if k else math.nan
        if not k or any(not math.isfinite(t[1]) or t[2] < 1 for t in terms):
            return sq.Moments(estimate_, math.nan, 0.0)
        parts = [t[1] / (k * k) for t in terms]
        return sq.Moments(estimate_, sum(parts), float(min(t[2] for t in terms)))  # the fewest df, as the probe's

    return estimate


VERDICT_RULES = ("as now", "control variate: the previous probe's changes", "order: the most moved first",
                 "control variate: the baseline's own values",
                 "order and control variate: the most moved first, the baseline's own values")


def run_verdicts(rows: dict, orders: int, rule: str, widths=VERDICT_WIDTHS) -> dict:
    """Each validity run stepped as a run is (one order for all its probes, each probe after the previous one's
    stop): how often each step's verdict is the whole set's (on the clear steps, and on all), how often the
    opposite, with what share of its prompts, and how often its interval covers the whole set's change."""
    base = as_scores(rows["smollm2/step-0"])
    wholes = {(c, step): whole_set(as_scores(rows[f"{c}/step-{step}"]), base) for c in CONDITIONS for step in STEPS}
    out = {}
    for width in widths:
        steps = {key: {"whole_p": w[2], "agree": [], "share": [], "opposite": []} for key, w in wholes.items()}
        cover = []
        for i in range(orders):
            for c in CONDITIONS:
                prev = None
                for step in STEPS:
                    now = as_scores(rows[f"{c}/step-{step}"])
                    whole, truth, _ = wholes[(c, step)]
                    seq = sq.Sequential.of(list(now.id), list(now.foundation_coarse), until="change", width=width,
                                           level=LEVEL, seed=i)
                    if prev is not None and rule.startswith("order"):
                        seq = dataclasses.replace(seq, order=moved_order(seq, prev))
                    if prev is not None and rule == "control variate: the previous probe's changes":
                        seq = dataclasses.replace(seq, estimate=control_variate(prev))
                    if rule.endswith("the baseline's own values"):
                        seq = dataclasses.replace(seq, estimate=baseline_variate(base))
                    looks, _ = seq.run(now, base)
                    look = looks[-1]
                    said, tally = verdict(look.lo, look.hi), steps[(c, step)]
                    tally["agree"].append(said == truth)
                    tally["opposite"].append(opposite(said, truth))
                    tally["share"].append(look.vignettes / len(now.id))
                    cover.append(look.lo <= whole.estimate <= look.hi)
                    d = (now.s[:, 0] - now.s[:, 1]) - (base.s[:, 0] - base.s[:, 1])
                    prev = {"id": list(now.id), "foundation": list(now.foundation_coarse),
                            "foundation_by_id": {str(v): f for v, f in zip(now.id, now.foundation_coarse,
                                                                          strict=True)},
                            "asked": set(seq.order[:look.vignettes]), "moved": np.abs(d), "moved_signed": d}
        out[str(width)] = {**verdict_summary(list(steps.values())), "covers_whole": float(np.mean(cover))}
    return out


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
                m = sq.moments(VignetteScores(base.id, base.foundation_coarse, step), zero, df="welch")  # fixed
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

    from tinymcf_callback import Probe, make_probe
    from tinymcf_callback import testing as offline_assets

    tok = AutoTokenizer.from_pretrained(offline_assets.smollm2_dir())
    ckpts = sorted((validity / "aligned").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    path = ckpts[-1] if ckpts else offline_assets.smollm2_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    baseline_report = json.loads((validity / "aligned" / "reports" / "step-0.json").read_text())
    from tinymcf_callback.stats.metrics import baseline_record

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
            s, report = best(make_probe(tok, "scifi", until=until, width=width), **kw)
            adaptive = report["info"]["adaptive"]
            out["rows"].append({"probe": f"until={until} width={width}", "seconds": s, "prompts": adaptive["prompts"],
                                "stopped": adaptive["stopped"], "reached": adaptive["reached"],
                                "ratio": s / whole_s})
    return out


# ---- the printout -----------------------------------------------------------------------------------------------
SETTINGS = [  # (name, until, now, before); a name starting "rare extremes" has 2 vignettes of its rows pushed to +2
    ("SmolLM2 step 0", "level", "smollm2/step-0", None),
    ("SmolLM2 aligned step 50", "level", "aligned/step-50", None),
    ("tiny Qwen3 seed 0", "level", "tiny/seed-0", None),
    ("tiny Qwen3 seed 1", "level", "tiny/seed-1", None),
    ("aligned 0->10", "change", "aligned/step-10", "smollm2/step-0"),
    ("aligned 0->50", "change", "aligned/step-50", "smollm2/step-0"),
    ("inverted 0->50", "change", "inverted/step-50", "smollm2/step-0"),
    ("shuffled 0->50", "change", "shuffled/step-50", "smollm2/step-0"),
    ("tiny Qwen3 moved 1%", "change", "tiny/seed-0-moved", "tiny/seed-0"),
    ("rare extremes, step 0", "level", "smollm2/step-0", None),
    ("rare extremes, 0->10", "change", "aligned/step-10", "smollm2/step-0"),
]


def setting_scores(rows: dict, name: str, now: str, before: str | None):
    """A setting's rows (the candidates' scores, and the baseline's): real, or with rare one-sided extremes."""
    a, b = as_scores(rows[now]), None if before is None else as_scores(rows[before])
    return (with_extremes(a) if name.startswith("rare extremes") else a), b


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


def prompts(by_width: dict) -> str:
    return " / ".join(f"{v['prompts_mean']:.0f}" for v in by_width.values())


def section(name: str, rows: dict, args) -> dict:
    """One section run on its own (``--only``), printed, as its keys in adaptive.json."""
    t0 = time.perf_counter()
    if name == "coverage":
        out = {}
        for setting, until, now, before in SETTINGS:
            a, b = setting_scores(rows, setting, now, before)
            out[setting] = {sup: simulate(a, b, until, args.orders, superpopulation=sup == "superpopulation")
                            for sup in ("orders", "superpopulation")}
            out[setting]["until"] = until
        print_coverage(out, "superpopulation", "Coverage of the population's value")
        return {"coverage": out}
    if name == "remedies":
        out = remedies(rows, args.remedy_orders)
        print(f"\nRemedies for rare one-sided extremes ({args.remedy_orders} probes each): the population's coverage, "
              "lowest over the widths, and mean prompts at width 0.02 / 0.05 / 0.1")
        for remedy, by in out.items():
            cells = [f"{min(v['coverage'] for v in r.values()):.1%} ({prompts(r)})" for r in by.values()]
            print(f"  {remedy:<28} " + " | ".join(f"{n}: {c}" for n, c in zip(by, cells, strict=True)))
        print(f"  ({time.perf_counter() - t0:.0f} s)")
        return {"remedies": out}
    if name == "steps":
        out, before = verdicts(rows, args.verdict_orders), verdicts(rows, args.verdict_orders, before_48)
        print_verdicts(out, args.verdict_orders)
        print("  the rule before (Welch df): " + "; ".join(
            f"{w}: clear {v['agree_clear']:.1%} with {v['share_clear']:.1%}, all {v['agree']:.1%} with "
            f"{v['share']:.1%}, never contradicting {v['never_contradicts']:.2%}" for w, v in before.items()))
        return {"verdicts": out, "verdicts_before": {w: {k: x for k, x in v.items() if k != "steps"}
                                                     for w, v in before.items()}}
    if name == "nulls":
        out = null_rates(rows, args.null_orders)
        print_nulls(out)
        print(f"  ({time.perf_counter() - t0:.0f} s)")
        return {"nulls": out}
    if name == "candidates":
        out = candidates_48(rows, args.candidate_runs, args.candidate_orders)
        print_candidates(out, args.candidate_runs)
        print(f"  ({time.perf_counter() - t0:.0f} s)")
        return {"candidates": out}
    if name == "floor":
        out = floor_study(rows, args.remedy_orders)
        print_floor(out)
        return {"floor": out}
    out = {rule: run_verdicts(rows, args.rule_orders, rule) for rule in VERDICT_RULES}
    print(f"\nThe run-verdict goal (>= {GOAL['agree_clear']:.0%} agreement on the clear steps with <= "
          f"{GOAL['share']:.0%} of the prompts; never contradicting >= {GOAL['never_contradicts']:.1%}), runs stepped "
          f"in order, {args.rule_orders} orders:")
    for rule, by in out.items():
        print(f"  {rule:<48} " + " | ".join(f"{w}: {v['agree_clear']:.1%} with {v['share_clear']:.1%} (all "
                                             f"{v['agree']:.1%}), never contradicting {v['never_contradicts']:.2%}, "
                                             f"covers {v['covers_whole']:.1%}" for w, v in by.items()))
    print(f"  ({time.perf_counter() - t0:.0f} s)")
    return {"verdict_rules": out}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from-rows", action="store_true", help="simulate from --rows (no model, no runs)")
    p.add_argument("--rows", default=str(ROWS), help=f"the rows file (default {ROWS.name} beside this script)")
    p.add_argument("--validity", default=str(ROOT / "runs" / "validity"), help="the validity runs' folder")
    p.add_argument("--orders", type=int, default=2000, help="simulated probes per setting (default 2000)")
    p.add_argument("--verdict-orders", type=int, default=400, help="orders per validity step (default 400)")
    p.add_argument("--null-runs", type=int, default=2000, help="simulated null runs (default 2000)")
    p.add_argument("--remedy-orders", type=int, default=400, help="simulated probes per remedy and setting "
                   "(default 400)")
    p.add_argument("--rule-orders", type=int, default=200, help="simulated runs per verdict rule (default 200)")
    p.add_argument("--null-orders", type=int, default=4000, help="simulated change targets per null population "
                   "and rule, the p-value's validity (default 4000)")
    p.add_argument("--candidate-runs", type=int, default=2000, help="null runs per remedy tried and null "
                   "(default 2000)")
    p.add_argument("--candidate-orders", type=int, default=200, help="orders per real change row and remedy tried "
                   "(default 200)")
    p.add_argument("--only", choices=("coverage", "remedies", "verdicts", "steps", "nulls", "candidates", "floor"),
                   help="this section only, the others kept from --out (from the rows); verdicts: the run-verdict "
                   "rules, steps: the verdicts per validity step")
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
    if args.only:
        kept = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        kept.update(section(args.only, rows, args))
        kept.setdefault("rerun", {})[args.only] = time.strftime("%Y-%m-%d")
        Path(args.out).write_text(json.dumps(kept, indent=1) + "\n")
        return 0
    t0 = time.perf_counter()
    results = {}
    for name, until, now, before in SETTINGS:
        a, b = setting_scores(rows, name, now, before)
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
    print_verdicts(verdict, args.verdict_orders)
    extra = {**section("remedies", rows, args), **section("verdicts", rows, args), **section("nulls", rows, args),
             **section("candidates", rows, args), **section("floor", rows, args)}
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
                                          "coverage": results, "verdicts": verdict, **extra, "null_runs": nulls,
                                          "real_flags": real, "time": timing}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
