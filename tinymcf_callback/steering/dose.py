"""Steering dose-response: the probe under a family of interventions indexed by a number, with a random control.

    steer = ResidualSteering(model, layer=15, vector=v)                  # add c * v after decoder layer 15
    result = dose_response(probe, model, steer, [-8, -4, 4, 8], n_random=4, output_dir="runs/steer")
    print(result.summary())                                              # per coefficient: change, random spread
    result.table()                                                       # one row per direction and coefficient

Any push of a steering vector's size moves P(Yes) somewhere, so the same intervention is applied along random
directions of the same norm, and a rank test (:meth:`DoseResponse.control`) says whether the real direction moved a
number more than they do. The history, its fields and a measured example: docs/steering.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..probe import Probe
from ..rundir.history import BASELINE_EVENT, DOSE_EVENT, append_line, dose_history_path, probe_line
from ..stats.analysis import MIN_YN_MASS
from ..stats.bootstrap import paired_change, vignette_scores
from ..stats.metrics import baseline_record
from .directions import random_directions
from .hooks import ResidualSteering

logger = logging.getLogger("tinymcf_callback")


@dataclass
class DoseResponse:
    """The probe under ``intervene(c)`` for each coefficient, against the unsteered model and random directions.

    ``reports[(direction, index, c)]``: the report of one probe (``("none", 0, 0.0)`` the unsteered
    one); ``changes[(direction, index, c)]``: its :func:`~tinymcf_callback.stats.bootstrap.paired_change`
    against the unsteered report. ``seconds[(direction, index, c)]``: the probe's wall time.
    """

    name: str
    coefficients: list[float]
    reports: dict = field(default_factory=dict)
    changes: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    n_random: int = 0
    level: float = 0.95  # the verdict's test is at 1 - level (the probe's interval level)
    history: Path | None = None
    baseline: dict | None = field(default=None, repr=False)  # metrics.baseline_record of the unsteered report

    @property
    def base(self) -> dict:
        return self.reports[("none", 0, 0.0)]

    def table(self) -> pd.DataFrame:
        """One row per (direction, index, coefficient): score with bounds, change since c=0 with bounds and p,
        Yes+No mass, frame agreement, ``answering`` (mass at or above the threshold), seconds."""
        rows = []
        for (direction, index, c), rep in self.reports.items():
            ch = self.changes.get((direction, index, c))
            score = ch["headline"]["score"] if ch else None
            rows.append({"direction": direction, "index": index, "coefficient": c, "score": rep["score"],
                         "score_lo": rep["score_lo"], "score_hi": rep["score_hi"],
                         "change": score.change if score else 0.0, "change_lo": score.lo if score else None,
                         "change_hi": score.hi if score else None, "change_p": score.p if score else None,
                         "yn_mass_mean": rep["info"]["yn_mass_mean"], "frame_agreement": rep["info"]["frame_agreement"],
                         "answering": answering(rep), "seconds": self.seconds.get((direction, index, c))})
        return pd.DataFrame(rows)

    def control(self, metric: str = "score", foundation: str | None = None) -> pd.DataFrame:
        """Per coefficient: the real direction's change of ``metric`` (or a foundation's ``align_other``) with its
        interval, the random directions' changes (min, median, max), and the rank test against them.

        ``rank_p``: the share of the ``k + 1`` directions (the real one included) whose change is at least as
        large in size as the real one's: the two-sided p-value of "the real direction moves the number no
        more than a random one of the same norm" (smallest possible ``1 / (k + 1)``). ``beyond_random``: that
        p is at most ``1 - level``; None without random directions, or when ``k`` is too small for any p
        to get there (``reachable`` false). ``direction``: ``+`` or ``-``, the sign of the real change.
        """
        rows = []
        alpha = 1.0 - self.level
        for c in self.coefficients:
            if c == 0.0:
                continue
            found = _change_of(self.changes.get(("real", 0, c)), metric, foundation)
            real, lo, hi = (float(getattr(found, k, math.nan)) for k in ("change", "lo", "hi"))
            rand = np.array([getattr(_change_of(self.changes.get(("random", j, c)), metric, foundation), "change",
                                     math.nan) for j in range(self.n_random)], dtype=float)
            rand = rand[np.isfinite(rand)]
            row = {"coefficient": c, "real": real, "real_lo": lo if math.isfinite(lo) else None,
                   "real_hi": hi if math.isfinite(hi) else None,
                   "direction": None if not math.isfinite(real) else ("+" if real >= 0 else "-"),
                   "random_min": None, "random_median": None, "random_max": None, "rank_p": None,
                   "reachable": bool(len(rand)) and 1.0 / (len(rand) + 1) <= alpha + 1e-12, "beyond_random": None,
                   "answering": answering(self.reports[("real", 0, c)])}
            if len(rand) and math.isfinite(real):
                p = float((1 + np.sum(np.abs(rand) >= abs(real))) / (len(rand) + 1))
                row.update(random_min=float(rand.min()), random_median=float(np.median(rand)),
                           random_max=float(rand.max()), rank_p=p,
                           beyond_random=bool(p <= alpha + 1e-12) if row["reachable"] else None)
            rows.append(row)
        return pd.DataFrame(rows)

    def foundations(self) -> pd.DataFrame:
        """:meth:`control` for every foundation's ``align_other``, one block of rows per foundation."""
        present = list(self.base["table"].index)
        return pd.concat([self.control(foundation=f).assign(foundation=f) for f in present], ignore_index=True)

    def summary(self) -> str:
        """The dose-response as text: per coefficient, the change with its interval, the random spread and the
        rank test's verdict (with its p-value and direction, or why there is none)."""
        alpha = 1.0 - self.level
        lines = [f"[tinymcf] dose-response on {self.name}: unsteered score {_fmt(self.base['score'])}, "
                 f"{self.n_random} random direction(s) of the same norm; a verdict is a rank test of |change| "
                 f"against theirs at p <= {alpha:.2g}"]
        if self.n_random > 0 and 1.0 / (self.n_random + 1) > alpha + 1e-12:
            needed = math.ceil(1.0 / alpha - 1.0 - 1e-9)
            lines.append(f"  n_random={self.n_random} is too few for a verdict: its smallest p is "
                         f"1/{self.n_random + 1} = {1.0 / (self.n_random + 1):.2f} > {alpha:.2g}; use n_random >= "
                         f"{needed} (the ranges below are descriptive only)")
        for row in self.control().itertuples():
            spread = ""
            if row.random_min is not None:
                if row.beyond_random is None:
                    verdict = ""
                elif row.beyond_random:
                    verdict = f" -> moved MORE than the random directions ({'up' if row.direction == '+' else 'down'})"
                else:
                    verdict = " -> no more than the random directions"
                spread = (f"  random [{row.random_min:+.3f}, {row.random_max:+.3f}] median {row.random_median:+.3f},"
                          f" p={row.rank_p:.2f}{verdict}")
            warn = "" if row.answering else "  (Yes+No mass below 0.5: the model stops answering; soft numbers)"
            lines.append(f"  c={row.coefficient:+g}: change {_fmt(row.real)} [{_fmt(row.real_lo)}, "
                         f"{_fmt(row.real_hi)}]{spread}{warn}")
        return "\n".join(lines)


def answering(report: dict) -> bool:
    mass = report["info"].get("yn_mass_mean")
    return mass is not None and mass >= MIN_YN_MASS


def _change_of(change: dict | None, metric: str, foundation: str | None):
    """The :class:`~tinymcf_callback.stats.bootstrap.Change` of ``metric`` (or ``foundation``'s ``align_other``) in a
    paired change, or None."""
    if change is None:
        return None
    return change["headline"][metric] if foundation is None else change["foundations"].get(foundation, {}).get(
        "align_other")


def _fmt(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:+.3f}"


def check_coefficients(coefficients) -> list[float]:
    """The coefficients as sorted floats with 0 (the unsteered model) added; refuses what is not a number."""
    try:
        values = [float(c) for c in coefficients]
    except (TypeError, ValueError):
        raise ConfigError(f"coefficients must be numbers, got {coefficients!r}") from None
    if not values or not all(math.isfinite(c) for c in values):
        raise ConfigError(f"coefficients must be finite numbers, at least one, got {coefficients!r}")
    return sorted(set(values) | {0.0})


def dose_response(probe: Probe, model, intervene, coefficients, *, controls=None, n_random: int = 0, seed: int = 0,
                  output_dir: str | os.PathLike | None = None, progress: bool = False) -> DoseResponse:
    """Probe ``model`` under ``intervene(c)`` for each coefficient: a steering dose-response with its control.

    ``probe``: a :class:`~tinymcf_callback.probe.Probe` (its set, subset and statistics). ``intervene(c)``
    returns a context manager (:class:`~tinymcf_callback.steering.hooks.ResidualSteering`, a PEFT
    adapter's scale, a steering library's context); ``c = 0`` is the unsteered model, scored once and
    added when absent. ``n_random=k`` (with a ``ResidualSteering``): the same intervention along ``k``
    seeded random directions of the same norm; ``controls=[...]``: your own. ``output_dir``: append the
    dose history ``moral_probe_<name>_dose.jsonl`` there (``tinymcf plot --x coefficient``).
    """
    coefs = check_coefficients(coefficients)
    if controls is None:
        controls = []
        if n_random:
            if not isinstance(intervene, ResidualSteering):
                raise ConfigError("n_random needs a ResidualSteering intervention (it knows its vector's norm); for "
                                  "another intervene(c), pass controls=[...] of the same kind along random directions")
            controls = [intervene.along(v, f"random-{j}") for j, v in enumerate(random_directions(
                intervene.vector, n_random, seed))]
    elif n_random:
        raise ConfigError("give controls=[...] or n_random=k, not both")
    if any(getattr(x, "needs_full_prompts", False) for x in [intervene, *controls]) and probe.config.share_prefix:
        probe = Probe(probe.tok, config=probe.config.replace(share_prefix=False))
    result = DoseResponse(probe.name, coefs, n_random=len(controls), level=probe.config.level)
    if output_dir is not None:
        result.history = dose_history_path(output_dir, probe.name, probe.answer_format)
    plan = [("none", 0, 0.0, None)]
    for direction, index, steer in [("real", 0, intervene), *(("random", j, x) for j, x in enumerate(controls))]:
        plan += [(direction, index, c, steer) for c in coefs if c != 0.0]
    base_scores = None
    for step, (direction, index, c, steer) in enumerate(plan):
        start = time.perf_counter()
        with steer(c) if steer is not None else contextlib.nullcontext():
            report = probe.run(model, progress=progress)
        result.seconds[(direction, index, c)] = time.perf_counter() - start
        result.reports[(direction, index, c)] = report
        if steer is None:
            base_scores = vignette_scores(report["scenarios"])
        else:
            result.changes[(direction, index, c)] = paired_change(
                base_scores, vignette_scores(report["scenarios"]), level=probe.config.level,
                n_resamples=probe.config.n_resamples, seed=probe.config.seed)
        if result.history is not None:
            _append(result, probe, report, step=step, direction=direction, index=index, c=c)
    for c in coefs:
        if c != 0.0 and not answering(result.reports[("real", 0, c)]):
            logger.warning("dose-response [%s]: at c=%+g the Yes+No mass is %.2f (below %.1f): the steered model "
                           "no longer answers Yes or No, and its numbers are soft", probe.name, c,
                           result.reports[("real", 0, c)]["info"]["yn_mass_mean"], MIN_YN_MASS)
    return result


def _append(result: DoseResponse, probe: Probe, report: dict, *, step: int, direction: str, index: int,
            c: float) -> None:
    if result.baseline is None:  # the unsteered report's per-vignette scores, made once for every line
        result.baseline = baseline_record(result.base, 0)
    # the unsteered line's own change is 0, as the callback's baseline
    line = probe_line(probe.name, report, baseline=result.baseline, target=probe.config.target, step=step, epoch=None,
                      event=BASELINE_EVENT if direction == "none" else DOSE_EVENT)
    line.update({"coefficient": c, "direction": direction, "direction_index": index, "answering": answering(report)})
    try:
        append_line(result.history, line)
    except OSError as e:
        logger.warning("dose-response [%s]: could not append the history %s: %s", probe.name, result.history, e)
