"""Made-up scored prompts of a known structure, for reports without a model (statistics, comparisons, formats)."""

from __future__ import annotations

import numpy as np

from tinymcf_callback.data.sets import CONTROL
from tinymcf_callback.probe import Probe
from tinymcf_callback.scoring.engine import ScoreResult
from tinymcf_callback.scoring.selfcheck import SelfCheck

# true mean s per condition (other_violate, other_uphold, self_violate, self_uphold)
TRUE_S = {"other_violate": 0.5, "other_uphold": -0.3, "self_violate": 0.3, "self_uphold": -0.2}


def made_up_scores(probe: Probe, seed: int = 0, shift: float = 0.0) -> ScoreResult:
    """P(Yes) per prompt from a per-vignette s: condition mean + vignette effect + noise (+ ``shift`` on violations).

    The control's conditions are pulled towards 0, so ``sn`` is near 0 and the score clearly positive.
    """
    rng = np.random.default_rng(seed)
    meta = probe.meta
    ids = meta["id"].unique()
    vignette = dict(zip(ids, rng.normal(0.0, 0.15, len(ids)), strict=True))
    p_yes = np.empty(len(meta))
    for i, row in enumerate(meta.itertuples()):
        mean = TRUE_S[row.condition] * (0.1 if row.foundation_coarse == CONTROL else 1.0)
        mean += shift if row.condition.endswith("violate") else 0.0
        s = np.clip(mean + vignette[row.id] + rng.normal(0.0, 0.2), -0.98, 0.98)
        wrongness = (s + 1.0) / 2.0
        p_yes[i] = wrongness if row.frame == "wrong" else 1.0 - wrongness
    return ScoreResult(p_yes, rng.uniform(0.6, 0.9, len(meta)), np.ones(len(meta), dtype=bool),
                       [("Yes", 0.5), ("No", 0.3)], n_forward=1, **ENGINE_FIELDS)


# What the engine adds to a scored result (made-up scores have no model run behind them: these say so plainly).
ENGINE_FIELDS = {
    "strategy": "shared", "model": "made-up",
    "check": SelfCheck("shared", [0, 1], 0.0, 0.0, 2e-5, "float32", reference="float32", resolution=2e-5,
                       n_forward=2, seconds=0.01).as_dict(),
    "precision": {"dtype": "float32", "autocast": None, "device": "cpu", "compute": "float32"},
}


def made_up_lines(probe: Probe, steps, *, name: str = "scifi") -> tuple[list[dict], list[dict]]:
    """History lines of ``probe`` at ``steps`` (the first the step-0 baseline, the score rising a little at each step)
    from made-up scores, and the last probe's report: for the dashboards' tests, no model."""
    from tinymcf_callback.rundir.history import probe_line
    from tinymcf_callback.stats.metrics import baseline_record

    lines, base, report = [], None, None
    for k, step in enumerate(steps):
        report = probe.report(made_up_scores(probe, seed=k, shift=0.02 * k), elapsed=1.0)
        if base is None:
            base = baseline_record(report, step)
        lines.append(probe_line(name, report, baseline=base, step=step, epoch=0.1 * k,
                                event="train_begin" if k == 0 else "watch"))
    return lines, report
