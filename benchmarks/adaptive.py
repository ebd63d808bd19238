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
- **rare one-sided extremes**: real rows (SmolLM2 at step 0; the aligned run's step 10 against step 0) with 2 of
  the 51 vignettes pushed to one extreme (``align_other`` +2), the population drawn from them, in the coverage
  table; and the **remedies** tried on them (``--only remedies``: a minimum number of looks, variance floors),
  with what each costs on real rows.
- **prompts**: mean, spread (sd, 10th and 90th percentile) of prompts asked at the stop, against that fixed
  ``per_foundation=k`` (8 prompts a vignette).
- **verdicts**: on the validity runs, at each probed step, whether the change since step 0 (up, down, none: its
  interval excludes 0 or not) is decided like the whole set's fixed 95% interval decides it, with what share of
  the whole set's prompts; the goal is at least 95% of steps with at most 40% of the prompts. And the **verdict
  rules** (``--only verdicts``): each run stepped as a run is (one order, each probe after the previous one's
  stop), as now, with the previous probe's per-vignette changes as a control variate, and asking the most moved
  vignettes first.
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
    python -m benchmarks.adaptive --from-rows --only coverage   # one section, the others kept (~10 / 3 / 2 min:
                                                                # coverage, remedies, verdicts)
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

import numpy as np  # noqa: E402

from tinymcf_callback.data.sets import CONTROL, FOUNDATIONS  # noqa: E402
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
EXTREMES = 2  # vignettes pushed to one extreme in the rare-extremes rows


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


def fixed_moments(seq: sq.Sequential, now: VignetteScores, before: VignetteScores | None):
    """Each fixed ``per_foundation=k`` probe's moments (the first ``k`` of each foundation in one order): no
    looking, one interval each."""
    return [sq.moments(_take(now, seq.prefix(k)), None if before is None else _take(before, seq.prefix(k)))
            for k in range(len(seq.schedule.looks))]


def probe_stop(seq: sq.Sequential, now: VignetteScores, before: VignetteScores | None, width: float,
               per_look: float | None = None):
    """The look a probe stops at, by the probe's own loop (``Sequential.run``, the one ``AdaptiveProbe`` steps):
    ``per_look`` another per-look level (the naive probe's plain 95%)."""
    run = dataclasses.replace(seq, width=width)
    if per_look is not None:
        run.per_look = per_look
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
            first = [sq.moments(_take(now, seq.prefix(0)), _take(base, seq.prefix(0))) for seq in seqs]
            for width in VERDICT_WIDTHS:
                agree, share, fixed, consistent = [], [], [], []
                for seq, m0 in zip(seqs, first, strict=True):
                    look = probe_stop(seq, now, base, width)
                    said = verdict(look.lo, look.hi)
                    agree.append(said == truth)
                    # "no change beyond its interval", an interval holding the whole set's change: not contradicted
                    consistent.append(said == truth or (said == "none" and look.lo <= whole.estimate <= look.hi))
                    share.append(look.vignettes / len(now.id))
                    fixed.append(verdict(*sq.interval(m0, LEVEL, 4.0)) == truth)
                t = tally[width]
                t["steps"].append({"run": c, "step": step, "whole": truth, "change": whole.estimate,
                                   "agree": float(np.mean(agree)), "share": float(np.mean(share)),
                                   "consistent": float(np.mean(consistent)), "fixed_pf2_agree": float(np.mean(fixed))})
                for key, values in (("agree", agree), ("share", share), ("fixed", fixed), ("consistent", consistent)):
                    t[key] += values
    return {str(w): {"agree": float(np.mean(t["agree"])), "share": float(np.mean(t["share"])),
                     "consistent": float(np.mean(t["consistent"])), "fixed_pf2_agree": float(np.mean(t["fixed"])),
                     "steps": t["steps"]} for w, t in tally.items()}


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
        var = sum(parts)
        denom = sum(p * p / (t[2] - 1) for p, t in zip(parts, terms, strict=True))
        return sq.Moments(sum(t[0] for t in terms) / k, var, var * var / denom if denom > 0 else math.inf)

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
        var = sum(parts)
        if any(not math.isfinite(p) for p in parts) or any(t[2] < 1 for t in terms):
            return sq.Moments(sum(t[0] for t in terms) / k, math.nan, 0.0)
        denom = sum(p * p / t[2] for p, t in zip(parts, terms, strict=True))
        return sq.Moments(sum(t[0] for t in terms) / k, var, var * var / denom if denom > 0 else math.inf)

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
        var = sum(parts)
        denom = sum(p * p / t[2] for p, t in zip(parts, terms, strict=True))
        return sq.Moments(estimate_, var, var * var / denom if denom > 0 else math.inf)

    return estimate


VERDICT_RULES = ("as now", "control variate: the previous probe's changes", "order: the most moved first",
                 "control variate: the baseline's own values",
                 "order and control variate: the most moved first, the baseline's own values")


def run_verdicts(rows: dict, orders: int, rule: str, widths=VERDICT_WIDTHS) -> dict:
    """Each validity run stepped as a run is (one order for all its probes, each probe after the previous one's
    stop): how often each step's verdict is the whole set's, with what share of its prompts, and how often its
    interval covers the whole set's change."""
    base = as_scores(rows["smollm2/step-0"])
    out = {}
    for width in widths:
        agree, share, cover = [], [], []
        for i in range(orders):
            for c in CONDITIONS:
                prev = None
                for step in STEPS:
                    now = as_scores(rows[f"{c}/step-{step}"])
                    whole = sq.moments(now, base)
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
                    agree.append(verdict(look.lo, look.hi) == verdict(*sq.interval(whole, LEVEL, 4.0)))
                    share.append(look.vignettes / len(now.id))
                    cover.append(look.lo <= whole.estimate <= look.hi)
                    d = (now.s[:, 0] - now.s[:, 1]) - (base.s[:, 0] - base.s[:, 1])
                    prev = {"id": list(now.id), "foundation": list(now.foundation_coarse),
                            "foundation_by_id": {str(v): f for v, f in zip(now.id, now.foundation_coarse,
                                                                          strict=True)},
                            "asked": set(seq.order[:look.vignettes]), "moved": np.abs(d), "moved_signed": d}
        out[str(width)] = {"agree": float(np.mean(agree)), "share": float(np.mean(share)),
                           "covers_whole": float(np.mean(cover))}
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
    out = {rule: run_verdicts(rows, args.rule_orders, rule) for rule in VERDICT_RULES}
    print(f"\nThe run-verdict goal (95% of steps, at most 40% of the prompts), runs stepped in order, "
          f"{args.rule_orders} orders:")
    for rule, by in out.items():
        print(f"  {rule:<48} " + " | ".join(f"{w}: {v['agree']:.1%} with {v['share']:.1%}, covers "
                                             f"{v['covers_whole']:.1%}" for w, v in by.items()))
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
    p.add_argument("--only", choices=("coverage", "remedies", "verdicts"), help="this section only, the others "
                   "kept from --out (from the rows)")
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
    extra = {**section("remedies", rows, args), **section("verdicts", rows, args)}
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
