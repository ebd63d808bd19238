"""A :class:`~tinymcf_callback.probe.Probe` with a precision target: scored look by look until it knows enough.

``Probe(tok, "scifi", until="change", width=0.05)`` holds every candidate vignette but asks them in the
seeded, foundation-balanced order of :mod:`tinymcf_callback.results.sequential`: at each look it scores the
vignettes the look adds (one :class:`~tinymcf_callback.probe.Probe` of its own per look, built once, so each
look's batches, prefix sharing and self-check are a probe's like any other), puts the interval together and
stops once the interval says what was asked. The report is then the report of ``per_foundation=k`` (the
vignettes asked: the first ``k`` of each foundation in that order), every interval in it built at the
per-look level that makes the looks hold together, plus ``info["adaptive"]``: what was asked, each look,
why it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .results.analysis import scenario_scores
from .results.sequential import STOPS, Look, Sequential, stop_reason
from .results.stats import VignetteScores, vignette_scores
from .scoring.engine import ScoreResult, empty_result


@dataclass
class Asked:
    """What a probe with a precision target asked: the look it stopped at, every look, why, the baseline's change."""

    k: int
    looks: list[Look]
    stopped: str
    change: Look | None = None  # with a baseline: the change at the stop (a change target's is ``looks[-1]``)
    notes: list[str] = field(default_factory=list)
    sample: int = 0  # the prompt whose next tokens the result holds (an index into the stopped prefix's prompts)


class Stopping:
    """The looks of one :class:`~tinymcf_callback.probe.Probe` (``probe.stopping``) and the probes that score them."""

    def __init__(self, probe):
        config = probe.config
        self.probe, self.config = probe, config
        ids = [v["id"] for v in probe.vignettes]
        self.sequential = Sequential.of(ids, [v["foundation_coarse"] for v in probe.vignettes], until=config.until,
                                        width=config.width, level=config.level, seed=config.subset_seed)
        self._looks: dict[int, object] = {}  # look -> the Probe of the vignettes it adds
        self._prefixes: dict[int, object] = {}  # look -> the Probe of every vignette asked by then (its report)

    @property
    def n_looks(self) -> int:
        return len(self.sequential.schedule.looks)

    def _sub(self, rows: list[int], per_foundation: int | None):
        stored = sorted(rows)  # the set's own order: the prompts, and so the digest, of per_foundation=k
        config = self.config.replace(until=None, limit=None, per_foundation=per_foundation)
        return type(self.probe)(self.probe.tok, config=config, vignettes=[self.probe.vignettes[i] for i in stored])

    def look_probe(self, k: int):
        """The probe of the vignettes look ``k`` adds (all of look 0's)."""
        if k not in self._looks:
            seq = self.sequential
            new = seq.prefix(k)[len(seq.prefix(k - 1)) if k else 0:]
            self._looks[k] = self._sub(new, None)
        return self._looks[k]

    def prefix_probe(self, k: int):
        """The probe of every vignette asked by look ``k``: ``per_foundation=k`` of the candidates."""
        if k not in self._prefixes:
            seq = self.sequential
            whole = k == self.n_looks - 1
            cap = self.config.per_foundation if whole else seq.schedule.looks[k]
            self._prefixes[k] = self._sub(seq.prefix(k), cap)
        return self._prefixes[k]

    # ---- scoring ---------------------------------------------------------------------------------------------
    def score(self, model, *, progress: bool = False, ranks=None, baseline: dict | None = None) -> ScoreResult:
        """Score look by look until the stop; the result is over the stopped prefix's prompts with ``.asked``."""
        seq, until, notes = self.sequential, self.config.until, []
        before = self._baseline_rows(baseline, notes)
        covered = -1 if before is None else self._looks_covered(before, notes)
        if covered < 0:
            before = None
        last = self.n_looks - 1
        usable = covered if until == "change" and before is not None else last
        measure = until == "level" or before is not None  # a change target without a baseline is the baseline
        parts: list[tuple[object, ScoreResult]] = []
        tables = []  # each look's per-scenario scores, computed once
        looks: list[Look] = []
        stopped = None
        for k in range(usable + 1):
            sub = self.look_probe(k)
            parts.append((sub, sub.score(model, progress=progress, ranks=ranks)))
            if measure:
                res_k = parts[-1][1]
                tables.append(scenario_scores(res_k.p_yes, sub.meta, res_k.yn_mass))
                now = _scores(tables)
                look = seq.look(k, now, _take(before, now) if until == "change" else None)
                looks.append(look)
                stopped = stop_reason(until, seq.width, look)
                if stopped is not None:
                    break
        k = len(parts) - 1
        if stopped is None:
            stopped = "used up" if measure else "baseline"
        change = None
        if before is not None:  # over the vignettes both asked: the baseline's, when it stopped earlier
            paired = min(k, covered)
            change = looks[-1] if until == "change" else _change_look(seq, paired, _scores(tables[:paired + 1]),
                                                                       before)
        res, sample = self._merged(k, parts)
        res.asked = Asked(k, looks, stopped, change, notes, sample)
        return res

    def check_baseline(self, baseline: dict) -> dict:
        """``baseline`` (a report or its :func:`~tinymcf_callback.results.metrics.baseline_record`) as a record, when
        its vignettes pair with this probe's; else :class:`~tinymcf_callback.errors.ConfigError` naming why. Never
        scored as a new baseline in its place: the change asked for would not exist, and the run would say nothing."""
        from .errors import ConfigError
        from .results.metrics import as_baseline, pairing_difference

        baseline = as_baseline(baseline)  # a whole report (the baseline's JSON, as loaded): its per-vignette rows
        why = pairing_difference(baseline, self.probe)
        if why is not None:
            raise ConfigError(f"the baseline cannot be paired with this probe: {why}")
        return baseline

    def _baseline_rows(self, baseline: dict | None, notes: list[str]) -> VignetteScores | None:
        """The baseline's scores of the candidates, in the candidates' order (NaN where it did not score one)."""
        if baseline is None:
            return None
        from .results.metrics import baseline_scores

        baseline = self.check_baseline(baseline)
        scores = baseline_scores(baseline)
        where = {str(i): r for r, i in enumerate(scores.id)}
        s = np.full((len(self.probe.vignettes), scores.s.shape[1]), np.nan)
        for r, v in enumerate(self.probe.vignettes):
            if v["id"] in where:
                s[r] = scores.s[where[v["id"]]]
        ids = [v["id"] for v in self.probe.vignettes]
        return VignetteScores(ids, [v["foundation_coarse"] for v in self.probe.vignettes], s)

    def _looks_covered(self, before: VignetteScores, notes: list[str]) -> int:
        """The last look whose vignettes the baseline scored (a baseline that stopped early limits the change)."""
        have = {str(before.id[r]) for r in range(len(before.id)) if np.isfinite(before.s[r]).any()}
        seq, last = self.sequential, -1
        for k in range(self.n_looks):
            if all(str(self.probe.vignettes[i]["id"]) in have for i in seq.prefix(k)):
                last = k
        if last < self.n_looks - 1:
            n = seq.schedule.vignettes(last) if last >= 0 else 0
            notes.append(f"the baseline scored {n} of the {len(self.probe.vignettes)} vignettes, so the change is "
                         "measured over those at most (a baseline with until='change' scores them all)")
        return max(last, 0)

    def _merged(self, k: int, parts) -> tuple[ScoreResult, int]:
        """The looks' results as one, over look ``k``'s prefix probe's prompts (its order), and which prompt's next
        tokens it holds."""
        prefix = self.prefix_probe(k)
        where = {key: i for i, key in enumerate(zip(prefix.meta["id"], prefix.meta["condition"],
                                                    prefix.meta["frame"], strict=True))}
        res = empty_result(len(prefix))
        checks, sample = [], None
        for sub, r in parts:
            idx = np.array([where[key] for key in zip(sub.meta["id"], sub.meta["condition"], sub.meta["frame"],
                                                      strict=True)])
            res.p_yes[idx], res.yn_mass[idx], res.yn_top3[idx] = r.p_yes, r.yn_mass, r.yn_top3
            res.n_forward += r.n_forward
            if r.check is not None:
                checks.append((r.check, idx))
            if sample is None and r.top_tokens:
                sample, res.top_tokens = int(idx[sub.sample_index]), r.top_tokens
        first = parts[0][1]
        res.strategy = max((r.strategy for _, r in parts if r.strategy),
                           key=lambda s: _strategy_rank(s), default=first.strategy)
        res.precision, res.model = first.precision, first.model
        res.backend = _merged_backend([r.backend for _, r in parts])
        plans = [r.batch_plan for _, r in parts if r.batch_plan]
        res.batch_plan = {**plans[0], "batches": sum(p["batches"] for p in plans)} if plans else None
        res.check = merged_check(checks)
        return res, sample if sample is not None else 0

    # ---- the report --------------------------------------------------------------------------------------------
    def report(self, res: ScoreResult, elapsed: float | None) -> dict:
        """The stopped prefix's report, every interval at the per-look level, with ``info["adaptive"]``."""
        asked: Asked = res.asked
        seq, config = self.sequential, self.config
        prefix = self.prefix_probe(asked.k)
        prefix.sample_index = asked.sample
        # a probe that scored everything without looking (a change target's baseline) has fixed-size intervals
        level = config.level if asked.stopped == "baseline" else seq.per_look
        report = prefix.report(res, elapsed, level=level)
        report["level"] = config.level  # the sequence's: every interval holds, over the looks, at this level
        stop = asked.looks[-1] if asked.looks else None
        if config.until == "level" and stop is not None and math.isfinite(stop.lo):
            report["score_lo"], report["score_hi"] = stop.lo, stop.hi
        info = report["info"]
        info["subset"] = config.subset(self.probe.vignettes)  # the candidates: what every probe of the run orders
        info["adaptive"] = {
            "until": config.until, "width": config.width, "level": config.level, "per_look_level": level,
            "order": self.probe.prompt_digest, "order_seed": config.subset_seed,
            "per_foundation": seq.schedule.looks[asked.k], "vignettes": seq.schedule.vignettes(asked.k),
            "of_vignettes": len(self.probe.vignettes), "prompts": len(prefix), "of_prompts": len(self.probe),
            "asked": prefix.config.subset(prefix.vignettes),
            "stopped": asked.stopped, "why": STOPS[asked.stopped],
            "reached": None if stop is None or not math.isfinite(stop.width) else stop.width,
            "looks": [look.as_dict() for look in asked.looks],
            "change": None if asked.change is None else asked.change.as_dict(),
        }
        info["warnings"] = list(info["warnings"]) + asked.notes
        return report


def _scores(tables) -> VignetteScores:
    """The per-vignette ``s`` of everything scored so far (the looks' per-scenario tables, in order)."""
    import pandas as pd

    return vignette_scores(pd.concat(tables, ignore_index=True))


def _take(before: VignetteScores, now: VignetteScores) -> VignetteScores:
    """The baseline's rows of ``now``'s vignettes, in ``now``'s order."""
    where = {str(i): r for r, i in enumerate(before.id)}
    pick = np.array([where[str(i)] for i in now.id])
    return VignetteScores(before.id[pick], before.foundation_coarse[pick], before.s[pick])


def _change_look(seq: Sequential, k: int, now: VignetteScores, before: VignetteScores) -> Look:
    """The change since the baseline at look ``k`` of a level target: the same looks and per-look level."""
    return Sequential("change", seq.width, seq.level, seq.schedule, seq.order).look(k, now, _take(before, now))


_STRATEGY_ORDER = ("shared", "full", "unpadded")


def _strategy_rank(strategy: str) -> int:
    return _STRATEGY_ORDER.index(strategy) if strategy in _STRATEGY_ORDER else -1


def _merged_backend(backends: list[dict | None]) -> dict | None:
    if not backends or backends[0] is None:
        return None
    out = dict(backends[0])
    for key in ("requests", "retries"):
        if all(isinstance(b.get(key), int) for b in backends if b):
            out[key] = sum(b[key] for b in backends if b)
    return out


def merged_check(checks: list[tuple[dict, np.ndarray]]) -> dict | None:
    """The self-checks of a probe's looks as one record (prompt indices into the merged result): the largest
    differences, every fallback, the checked prompts of all, what they cost together."""
    if not checks:
        return None
    first = checks[0][0]
    out = dict(first)
    out["checked"] = [int(idx[i]) for check, idx in checks for i in check["checked"]]
    for key in ("max_diff", "max_mass_diff", "scored_diff", "scored_mass_diff"):
        values = [c[key] for c, _ in checks if c.get(key) is not None]
        out[key] = max(values) if values else None
    resolutions = [c["resolution"] for c, _ in checks if c.get("resolution") is not None]
    out["resolution"] = max(resolutions) if resolutions else None
    out["strategy"] = checks[-1][0]["strategy"]
    out["fallbacks"] = list(dict.fromkeys(f for c, _ in checks for f in c.get("fallbacks") or []))
    out["waiting"] = all(c.get("waiting") for c, _ in checks)
    out["copy_bytes"] = max(c.get("copy_bytes") or 0 for c, _ in checks)
    out["n_forward"] = sum(c.get("n_forward") or 0 for c, _ in checks)
    out["seconds"] = sum(c.get("seconds") or 0.0 for c, _ in checks)
    for key in ("reference", "replay_note", "scored_tolerance"):
        out[key] = next((c[key] for c, _ in checks if c.get(key) is not None), None)
    cover = [c.get("coverage") or {} for c, _ in checks]
    out["coverage"] = {"checked_this_cycle": sum(c.get("checked_this_cycle", 0) for c in cover),
                       "prompts": sum(c.get("prompts", 0) for c in cover),
                       "cycles_completed": min(c.get("cycles_completed", 0) for c in cover),
                       "probes": max(c.get("probes", 0) for c in cover)}
    return out

