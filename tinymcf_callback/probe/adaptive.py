"""A probe with a precision target: scored look by look, each look a slice of one :class:`Probe` of every
candidate, until :mod:`tinymcf_callback.stats.sequential` stops it. The method: docs/statistics.md; the API:
docs/python.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..config import ProbeConfig, make_config
from ..data.sets import CONTROL
from ..errors import ConfigError
from ..scoring.engine import ScoreResult, joined
from ..scoring.ranks import Ranks
from ..scoring.selfcheck import joined_checks
from ..served.answers import joined_backend
from ..stats.analysis import scenario_scores
from ..stats.bootstrap import VignetteScores, vignette_scores
from ..stats.metrics import as_baseline, baseline_scores, pairing_difference
from ..stats.sequential import STOPS, Look, Sequential, floor_effect
from .fixed import Probe, prompt_notes

EXACT_DTYPES = ("float32", "float64")  # a prompt's P(Yes) does not move with its batch (to 1e-5)


@dataclass
class Asked:
    """What a probe with a precision target asked: the scores (``result``: every candidate prompt, NaN where it did
    not ask), the look it stopped at, every look, why, the baseline's change."""

    result: ScoreResult
    k: int
    looks: list[Look]
    stopped: str
    change: Look | None = None  # with a baseline: the change at the stop (a change target's is ``looks[-1]``)
    notes: list[str] = field(default_factory=list)


class AdaptiveProbe:
    """A probe with a precision target (``until``, ``width``): the candidates' one encoding, scored look by look until
    the stop. The same arguments as :class:`~tinymcf_callback.probe.fixed.Probe` and ``until`` besides, and the same
    ``run``; ``score`` returns what it :class:`Asked`, which ``report`` turns into the report.

    Example::

        probe = AdaptiveProbe(tok, "scifi", until="change", width=0.05)   # or make_probe(tok, "scifi", until=...)
        base = probe.run(model_at_step_0)                                 # the baseline: every vignette
        report = probe.run(model, baseline=base)                          # asks until the change is known
        report["info"]["adaptive"]["stopped"]                             # "moved", "width" or "used up"
    """

    def __init__(self, tok, name: str | None = None, limit: int | None = None, *, config: ProbeConfig | None = None,
                 vignettes: list[dict] | None = None, **settings):
        self.config = config = make_config(config, name, limit, **settings)
        if config.until is None:
            raise ConfigError("an AdaptiveProbe needs until='level' or 'change'; Probe(tok, name) asks a fixed set")
        # every candidate's prompts, formatted and tokenised once: the looks are slices of them
        self.candidates = Probe(tok, config=config.replace(until=None, sd_floor=None), vignettes=vignettes)
        ids = [v["id"] for v in self.vignettes]
        self.sequential = seq = Sequential.of(ids, [v["foundation_coarse"] for v in self.vignettes],
                                              until=config.until, width=config.width, level=config.level,
                                              seed=config.subset_seed, sd_floor=config.sd_floor)
        prompts_of: dict = {}  # a vignette's id -> its prompts (indices into the candidates')
        for i, vid in enumerate(self.meta["id"]):
            prompts_of.setdefault(str(vid), []).append(i)
        added = [seq.prefix(k)[len(seq.prefix(k - 1)) if k else 0:] for k in range(self.n_looks)]
        # each look's prompts: those of the vignettes it adds, in the set's order (what a probe of them would ask)
        self.look_rows = [sorted(i for r in new for i in prompts_of[str(ids[r])]) for new in added]
        self.candidates.sample_index = self.look_rows[0][0]  # the first prompt every probe of this order asks

    # ---- what a probe is, from its candidates -------------------------------------------------------------------
    tok = property(lambda self: self.candidates.tok)
    name = property(lambda self: self.candidates.name)
    answer_format = property(lambda self: self.candidates.answer_format)
    vignettes = property(lambda self: self.candidates.vignettes)
    prompts = property(lambda self: self.candidates.prompts)
    meta = property(lambda self: self.candidates.meta)
    notes = property(lambda self: self.candidates.notes)
    prompt_digest = property(lambda self: self.candidates.prompt_digest,
                             doc="the digest of every candidate's prompts: what two probes of one order share")

    def __len__(self) -> int:
        return len(self.candidates)

    @property
    def n_looks(self) -> int:
        return len(self.sequential.schedule.looks)

    def asked_rows(self, k: int) -> list[int]:
        """The prompts asked by look ``k`` (indices into the candidates'), in the set's order: per_foundation=k's."""
        return sorted(i for rows in self.look_rows[:k + 1] for i in rows)

    # ---- scoring ---------------------------------------------------------------------------------------------
    def score(self, model, *, progress: bool = False, batches=None, ranks: Ranks | None = None,
              baseline: dict | None = None) -> Asked:
        """Score look by look until the stop: what it :class:`Asked`. ``baseline``: the baseline's report as loaded,
        or its :func:`~tinymcf_callback.stats.metrics.baseline_record` (the change is measured from it)."""
        if batches is not None:
            raise ConfigError("a probe with a precision target (until=) scores look by look: batches= does not apply")
        seq, until, notes, candidates = self.sequential, self.config.until, [], self.candidates
        before = self._baseline_rows(baseline)
        covered = -1 if before is None else self._looks_covered(before, notes)
        if covered < 0:
            before = None
        parts: list[tuple[list[int], ScoreResult]] = []
        tables = []  # each look's per-scenario scores, computed once

        def scores_at(k: int) -> VignetteScores:  # look k: score the prompts of the vignettes it adds
            rows = self.look_rows[k]
            res = candidates.score(model, progress=progress, ranks=ranks, rows=rows)
            parts.append((rows, res))
            tables.append(scenario_scores(res.p_yes[rows], self.meta.iloc[rows], res.yn_mass[rows]))
            return vignette_scores(pd.concat(tables, ignore_index=True))

        if until == "level" or before is not None:
            last = covered if until == "change" else self.n_looks - 1
            looks, stopped = seq.step(scores_at, before if until == "change" else None, last=last)
        else:  # a change target without a baseline is the baseline: every look scored, none looked at
            looks, stopped = seq.step(scores_at, looking=False)
        k = len(parts) - 1
        change = None
        if before is not None:  # over the vignettes both asked: the baseline's, when it stopped earlier
            paired = min(k, covered)
            change = looks[-1] if until == "change" else seq.change_at(
                paired, vignette_scores(pd.concat(tables[:paired + 1], ignore_index=True)), before)
        res = joined(parts, len(self))
        res.check = joined_checks([part.check for _, part in parts if part.check is not None])
        res.backend = joined_backend([part.backend for _, part in parts])
        return Asked(res, k, looks, stopped, change, notes)

    def check_baseline(self, baseline: dict) -> dict:
        """``baseline`` (a report or its :func:`~tinymcf_callback.stats.metrics.baseline_record`) as a record, when
        its vignettes pair with this probe's; else :class:`~tinymcf_callback.errors.ConfigError` naming why. Never
        scored as a new baseline in its place: the change asked for would not exist, and the run would say nothing."""
        baseline = as_baseline(baseline)  # a whole report (the baseline's JSON, as loaded): its per-vignette rows
        why = pairing_difference(baseline, self.candidates)
        if why is not None:
            raise ConfigError(f"the baseline cannot be paired with this probe: {why}")
        return baseline

    def _baseline_rows(self, baseline: dict | None) -> VignetteScores | None:
        """The baseline's scores of the candidates, in the candidates' order (NaN where it did not score one)."""
        if baseline is None:
            return None
        scores = baseline_scores(self.check_baseline(baseline))
        where = {str(i): r for r, i in enumerate(scores.id)}
        s = np.full((len(self.vignettes), scores.s.shape[1]), np.nan)
        for r, v in enumerate(self.vignettes):
            if v["id"] in where:
                s[r] = scores.s[where[v["id"]]]
        ids = [v["id"] for v in self.vignettes]
        return VignetteScores(ids, [v["foundation_coarse"] for v in self.vignettes], s)

    def _looks_covered(self, before: VignetteScores, notes: list[str]) -> int:
        """The last look whose vignettes the baseline scored (a baseline that stopped early limits the change)."""
        have = {str(before.id[r]) for r in range(len(before.id)) if np.isfinite(before.s[r]).any()}
        seq, last = self.sequential, -1
        for k in range(self.n_looks):
            if all(str(self.vignettes[i]["id"]) in have for i in seq.prefix(k)):
                last = k
        if last < self.n_looks - 1:
            n = seq.schedule.vignettes(last) if last >= 0 else 0
            notes.append(f"the baseline scored {n} of the {len(self.vignettes)} vignettes, so the change is "
                         "measured over those at most (a baseline with until='change' scores them all)")
        return max(last, 0)

    # ---- the report --------------------------------------------------------------------------------------------
    def report(self, asked: Asked, elapsed: float | None = None) -> dict:
        """The stopped prefix's report, as ``per_foundation=k`` reports it, every interval at the per-look level, with
        ``info["adaptive"]``."""
        seq, config = self.sequential, self.config
        cap = config.per_foundation if asked.k == self.n_looks - 1 else seq.schedule.looks[asked.k]
        subset = config.replace(per_foundation=cap)  # the vignettes asked, as the options that choose them say
        vignettes = [self.vignettes[i] for i in sorted(seq.prefix(asked.k))]
        rows = self.asked_rows(asked.k)
        # a probe that scored everything without looking (a change target's baseline) has fixed-size intervals
        level = config.level if asked.stopped == "baseline" else seq.per_look
        report = self.candidates.report(asked.result, elapsed, level=level, rows=rows,
                                        notes=subset.subset_notes(vignettes) + prompt_notes(self.tok))
        report["level"] = config.level  # the sequence's: every interval holds, over the looks, at this level
        stop = asked.looks[-1] if asked.looks else None
        if config.until == "level" and stop is not None and math.isfinite(stop.lo):
            report["score_lo"], report["score_hi"] = stop.lo, stop.hi
        info = report["info"]
        info["subset"] = config.subset(self.vignettes)  # the candidates: what every probe of the run orders
        info["adaptive"] = {
            "until": config.until, "width": config.width, "sd_floor": config.sd_floor, "level": config.level,
            "per_look_level": level,
            "order": self.prompt_digest, "order_seed": config.subset_seed,
            "per_foundation": seq.schedule.looks[asked.k], "vignettes": seq.schedule.vignettes(asked.k),
            "of_vignettes": len(self.vignettes), "prompts": len(rows), "of_prompts": len(self),
            "asked": subset.subset(vignettes),
            "stopped": asked.stopped, "why": STOPS[asked.stopped],
            "reached": None if stop is None or not math.isfinite(stop.width) else stop.width,
            "looks": [look.as_dict() for look in asked.looks],
            "floor": floor_effect(config.until, config.width, asked.looks),
            "change": None if asked.change is None else asked.change.as_dict(),
            "control": control_note(report, vignettes),
            "batched_by_look": batched_by_look(report, len(asked.looks) or self.n_looks),
        }
        notes = list(asked.notes)
        if info["adaptive"]["batched_by_look"]:
            notes.append(BATCHED_NOTE.format(dtype=report.get("dtype") or report.get("compute")))
        info["warnings"] = list(info["warnings"]) + notes
        return report

    def run(self, model, *, progress: bool = False, ranks: Ranks | None = None, baseline: dict | None = None) -> dict:
        """Score ``model`` and return its report: :meth:`score` then :meth:`report`, timed."""
        start = time.perf_counter()
        asked = self.score(model, progress=progress, ranks=ranks, baseline=baseline)
        return self.report(asked, elapsed=time.perf_counter() - start)


BATCHED_NOTE = ("scored in {dtype}, look by look: each look's prompts were batched on their own, and in a half "
                "precision a prompt's P(Yes) moves with its batch, so these numbers may differ from per_foundation=k "
                "scored at once by that batch spread (float32 gives per_foundation=k's numbers)")


def batched_by_look(report: dict, looks: int) -> bool:
    """Whether the numbers may differ from ``per_foundation=k`` scored at once: more than one look's batches, in a
    precision where a prompt's P(Yes) moves with its batch."""
    dtype = str(report.get("compute") or report.get("dtype") or "float32").removeprefix("torch.")
    return looks > 1 and dtype not in EXACT_DTYPES


def control_note(report: dict, vignettes: list[dict]) -> str | None:
    """What the stop line says of a control (Social Norms) whose interval is undefined at the stop (too few control
    vignettes asked: NaN, or the whole range ``[-2, +2]``), so that ``score minus control`` is not bounded by it;
    None when it is defined (or the set has no control). ``vignettes``: those asked."""
    n = sum(1 for v in vignettes if v["foundation_coarse"] == CONTROL)
    lo, hi = report.get("sn_lo"), report.get("sn_hi")
    if not n or report.get("sn") is None:
        return None
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi) and hi - lo < 4.0 - 1e-9:
        return None
    return (f"the control's interval is undefined at this stop ({n} control vignette{'s' if n > 1 else ''} asked), "
            "so score minus control is not bounded by it (a narrower width, or per_foundation=N, asks more)")
