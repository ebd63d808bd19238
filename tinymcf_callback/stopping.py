"""A probe with a precision target, its own small object made of probes: scored look by look until it knows enough.

``Probe(tok, "scifi", until="change", width=0.05)`` gives an :class:`AdaptiveProbe`: it holds every candidate
vignette (``candidates``, a :class:`~tinymcf_callback.probe.Probe` of them all: their prompts and the order's
digest) and asks them in the seeded, foundation-balanced order of :mod:`tinymcf_callback.results.sequential`.
Each look scores the vignettes it adds with a :class:`~tinymcf_callback.probe.Probe` of its own (built once, so
each look's batches, prefix sharing and self-check are a probe's like any other); the looks are stepped by
:meth:`~tinymcf_callback.results.sequential.Sequential.step`, the loop the simulations run too, which puts the
interval together and stops once it says what was asked. The report is then the report of ``per_foundation=k``
(the vignettes asked: the first ``k`` of each foundation in that order), every interval in it built at the
per-look level that makes the looks hold together, plus ``info["adaptive"]``: what was asked, each look, why it
stopped.

In float32 the stopped report's numbers are ``per_foundation=k``'s. In bfloat16 (or float16) a prompt's P(Yes)
moves with the batch it is in, and the looks batch their prompts apart, so the numbers may differ from
``per_foundation=k`` scored at once by that batch spread (``info.adaptive.batched_by_look`` says so, and the
report warns).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .config import ProbeConfig, make_config
from .data.sets import CONTROL
from .errors import ConfigError
from .results.analysis import scenario_scores
from .results.sequential import STOPS, Look, Sequential, floor_effect
from .results.stats import VignetteScores, vignette_scores
from .scoring.engine import ScoreResult, empty_result

EXACT_DTYPES = ("float32", "float64")  # a prompt's P(Yes) does not move with its batch (to 1e-5)


@dataclass
class Asked:
    """What a probe with a precision target asked: the look it stopped at, every look, why, the baseline's change."""

    k: int
    looks: list[Look]
    stopped: str
    change: Look | None = None  # with a baseline: the change at the stop (a change target's is ``looks[-1]``)
    notes: list[str] = field(default_factory=list)
    sample: int = 0  # the prompt whose next tokens the result holds (an index into the stopped prefix's prompts)


class AdaptiveProbe:
    """A probe with a precision target (``until``, ``width``): probes of the vignettes each look adds, stepped until
    the stop. Built by ``Probe(tok, name, until=..., width=...)``; the same arguments as
    :class:`~tinymcf_callback.probe.Probe` (which passes itself as ``probe_class``: this module sits below
    ``probe`` and never imports it), and the same ``run``, ``score`` and ``report``.

    Example::

        probe = Probe(tok, "scifi", until="change", width=0.05)   # an AdaptiveProbe
        base = probe.run(model_at_step_0)                          # the baseline: every vignette
        report = probe.run(model, baseline=base)                   # asks until the change is known
        report["info"]["adaptive"]["stopped"]                      # "moved", "width" or "used up"
    """

    def __init__(self, tok, name: str | None = None, limit: int | None = None, *, config: ProbeConfig | None = None,
                 vignettes: list[dict] | None = None, probe_class: type, **settings):
        given = {k: v for k, v in (("name", name), ("limit", limit)) if v is not None}
        config = make_config(config, **given, **settings)
        if config.until is None:
            raise ConfigError("an AdaptiveProbe needs until='level' or 'change'; Probe(tok, name) asks a fixed set")
        self.config, self.probe_class = config, probe_class  # Probe: this module is below it, never imports it
        self.candidates = probe_class(tok, config=config.replace(until=None, sd_floor=None), vignettes=vignettes)
        ids = [v["id"] for v in self.vignettes]
        self.sequential = Sequential.of(ids, [v["foundation_coarse"] for v in self.vignettes], until=config.until,
                                        width=config.width, level=config.level, seed=config.subset_seed,
                                        sd_floor=config.sd_floor)
        self._looks: dict[int, object] = {}  # look -> the Probe of the vignettes it adds
        self._prefixes: dict[int, object] = {}  # look -> the Probe of every vignette asked by then (its report)

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

    def _sub(self, rows: list[int], per_foundation: int | None):
        stored = sorted(rows)  # the set's own order: the prompts, and so the digest, of per_foundation=k
        config = self.config.replace(until=None, sd_floor=None, limit=None, per_foundation=per_foundation)
        probe = self.probe_class(self.tok, config=config, vignettes=[self.vignettes[i] for i in stored])
        probe.memory = self.candidates.memory  # one model's forward, strategy and log for every look
        return probe

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
    def score(self, model, *, progress: bool = False, batches=None, ranks=None,
              baseline: dict | None = None) -> ScoreResult:
        """Score look by look until the stop; the result is over the stopped prefix's prompts with ``.asked``.
        ``baseline``: the baseline's report as loaded, or its :func:`~tinymcf_callback.results.metrics.baseline_record`
        (the change is measured from it)."""
        if batches is not None:
            raise ConfigError("a probe with a precision target (until=) scores look by look: batches= does not apply")
        seq, until, notes = self.sequential, self.config.until, []
        before = self._baseline_rows(baseline, notes)
        covered = -1 if before is None else self._looks_covered(before, notes)
        if covered < 0:
            before = None
        parts: list[tuple[object, ScoreResult]] = []
        tables = []  # each look's per-scenario scores, computed once

        def scores_at(k: int) -> VignetteScores:  # look k: score the vignettes it adds
            sub = self.look_probe(k)
            res = sub.score(model, progress=progress, ranks=ranks)
            parts.append((sub, res))
            tables.append(scenario_scores(res.p_yes, sub.meta, res.yn_mass))
            return _scores(tables)

        if until == "level" or before is not None:
            last = covered if until == "change" else self.n_looks - 1
            looks, stopped = seq.step(scores_at, before if until == "change" else None, last=last)
        else:  # a change target without a baseline is the baseline: every look scored, none looked at
            for k in range(self.n_looks):
                scores_at(k)
            looks, stopped = [], "baseline"
        k = len(parts) - 1
        change = None
        if before is not None:  # over the vignettes both asked: the baseline's, when it stopped earlier
            paired = min(k, covered)
            change = looks[-1] if until == "change" else seq.change_at(paired, _scores(tables[:paired + 1]), before)
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
        why = pairing_difference(baseline, self.candidates)
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
        info["subset"] = config.subset(self.vignettes)  # the candidates: what every probe of the run orders
        info["adaptive"] = {
            "until": config.until, "width": config.width, "sd_floor": config.sd_floor, "level": config.level,
            "per_look_level": level,
            "order": self.prompt_digest, "order_seed": config.subset_seed,
            "per_foundation": seq.schedule.looks[asked.k], "vignettes": seq.schedule.vignettes(asked.k),
            "of_vignettes": len(self.vignettes), "prompts": len(prefix), "of_prompts": len(self),
            "asked": prefix.config.subset(prefix.vignettes),
            "stopped": asked.stopped, "why": STOPS[asked.stopped],
            "reached": None if stop is None or not math.isfinite(stop.width) else stop.width,
            "looks": [look.as_dict() for look in asked.looks],
            "floor": floor_effect(config.until, config.width, asked.looks),
            "change": None if asked.change is None else asked.change.as_dict(),
            "control": control_note(report, prefix),
            "batched_by_look": batched_by_look(report, len(asked.looks) or self.n_looks),
        }
        notes = list(asked.notes)
        if info["adaptive"]["batched_by_look"]:
            notes.append(BATCHED_NOTE.format(dtype=report.get("dtype") or report.get("compute")))
        info["warnings"] = list(info["warnings"]) + notes
        return report

    def run(self, model, *, progress: bool = False, ranks=None, baseline: dict | None = None) -> dict:
        """Score ``model`` and return its report: :meth:`score` then :meth:`report`, timed."""
        start = time.perf_counter()
        res = self.score(model, progress=progress, ranks=ranks, baseline=baseline)
        return self.report(res, elapsed=time.perf_counter() - start)


BATCHED_NOTE = ("scored in {dtype}, look by look: each look's prompts were batched on their own, and in a half "
                "precision a prompt's P(Yes) moves with its batch, so these numbers may differ from per_foundation=k "
                "scored at once by that batch spread (float32 gives per_foundation=k's numbers)")


def batched_by_look(report: dict, looks: int) -> bool:
    """Whether the numbers may differ from ``per_foundation=k`` scored at once: more than one look's batches, in a
    precision where a prompt's P(Yes) moves with its batch."""
    dtype = str(report.get("compute") or report.get("dtype") or "float32").removeprefix("torch.")
    return looks > 1 and dtype not in EXACT_DTYPES


def control_note(report: dict, prefix) -> str | None:
    """What the stop line says of a control (Social Norms) whose interval is undefined at the stop (too few control
    vignettes asked: NaN, or the whole range ``[-2, +2]``), so that ``score minus control`` is not bounded by it;
    None when it is defined (or the set has no control)."""
    n = sum(1 for v in prefix.vignettes if v["foundation_coarse"] == CONTROL)
    lo, hi = report.get("sn_lo"), report.get("sn_hi")
    if not n or report.get("sn") is None:
        return None
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi) and hi - lo < 4.0 - 1e-9:
        return None
    return (f"the control's interval is undefined at this stop ({n} control vignette{'s' if n > 1 else ''} asked), "
            "so score minus control is not bounded by it (a narrower width, or per_foundation=N, asks more)")


def _scores(tables) -> VignetteScores:
    """The per-vignette ``s`` of everything scored so far (the looks' per-scenario tables, in order)."""
    import pandas as pd

    return vignette_scores(pd.concat(tables, ignore_index=True))


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

