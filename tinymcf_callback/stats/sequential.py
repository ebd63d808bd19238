"""A probe that stops when it knows enough: the order it asks in, when it looks, and intervals that hold anyway.

In numpy, with no model: the probe (:class:`~tinymcf_callback.probe.adaptive.AdaptiveProbe`) and the simulations
that measure it (``benchmarks/adaptive.py``) step the looks through one loop, :meth:`Sequential.step`. The order,
the looks, the exact variances with the fewest degrees of freedom, Pocock's boundary and the z-ordered p-value
(Jennison and Turnbull, *Group Sequential Methods*, chapter 8), each with its reason, cost and coverage:
docs/statistics.md, "A probe that stops when it knows enough".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache, partial
from statistics import NormalDist

import numpy as np

from ..data.sets import CONTROL, FOUNDATIONS, REAL_FOUNDATIONS, balanced_rank
from ..errors import ConfigError
from .bootstrap import VignetteScores, t_interval, t_test_p

UNTIL = ("level", "change")  # what a precision target asks for: the score to within a width, or has it moved
FIRST_LOOK = 2  # vignettes per foundation at the first look: the fewest with a spread to measure
BOUNDARY_DRAWS = 200_000  # draws of the looks' joint errors behind a boundary (the level to about +-0.001)
_BOUNDARY_SEED = 0
_CHUNK = 25_000
_RANGE = {"level": 2.0, "change": 4.0}  # |score| <= 2, |score change| <= 4
STOPS = {  # why a probe stopped, as its report says it
    "width": "its interval was narrower than the width asked",
    "moved": "its interval of the change excluded 0: the score moved since the baseline",
    "used up": "the vignettes were used up before the interval was as narrow as asked",
    "baseline": "it is the baseline, which scores every vignette so that any later probe's change has its pairs",
}


# ---- the order and the looks ----------------------------------------------------------------------------------
def balanced_order(ids, foundations, seed: int = 0) -> list[int]:
    """Indices of the vignettes in the order a precision-target probe asks them: round by round, each round the
    next vignette of every foundation (in :data:`FOUNDATIONS` order), each foundation's in
    :func:`~tinymcf_callback.data.sets.balanced_rank` order."""
    by_f = {f: [i for i, g in enumerate(foundations) if g == f] for f in FOUNDATIONS}
    ranked = {f: sorted(rows, key=lambda i: balanced_rank(seed, str(ids[i]))) for f, rows in by_f.items()}
    out = []
    for r in range(max((len(v) for v in ranked.values()), default=0)):
        out += [rows[r] for rows in ranked.values() if r < len(rows)]
    return out


@dataclass(frozen=True)
class Schedule:
    """When a probe of a candidate set looks: after ``looks[k]`` vignettes per foundation (a foundation with fewer
    gives all it has). ``sizes``: each foundation's candidates, in :data:`FOUNDATIONS` order."""

    sizes: tuple[int, ...]
    looks: tuple[int, ...]

    @classmethod
    def of(cls, foundations) -> Schedule:
        counts = tuple(sum(1 for f in foundations if f == g) for g in FOUNDATIONS)
        top = max(counts, default=0)
        return cls(counts, tuple(range(min(FIRST_LOOK, top), top + 1)) if top else ())

    def vignettes(self, k: int) -> int:
        """The vignettes asked by look ``k``."""
        return sum(min(self.looks[k], n) for n in self.sizes)

    def boundary(self) -> Boundary:
        return Boundary.of(self)


class Boundary:
    """The constant of a confidence sequence over one schedule's looks (Pocock's, for this schedule).

    ``joint``: each look's standardised error ``|Z_k|`` in ``BOUNDARY_DRAWS`` seeded draws of the looks' joint
    Gaussian errors (real foundations only: the score and its change average them), ``[draws, looks]``; ``draws``:
    the largest over the looks, sorted.
    """

    def __init__(self, joint: np.ndarray):
        self.joint, self.n_looks = joint, joint.shape[1]
        self.draws = np.sort(joint.max(axis=1))

    @classmethod
    def of(cls, schedule: Schedule) -> Boundary:
        real = tuple(n for f, n in zip(FOUNDATIONS, schedule.sizes, strict=True) if f != CONTROL)
        return _boundary(real, schedule.looks)

    @lru_cache(maxsize=8)  # noqa: B019 - a boundary is cached and lives as long as the process
    def constant(self, level: float) -> float:
        """``c``: the intervals ``estimate ± c * se`` at every look hold together with ``level``."""
        return float(np.quantile(self.draws, level))

    def per_look(self, level: float) -> float:
        """The level each look's interval is built at so that all of them hold together with ``level``."""
        if self.n_looks <= 1:
            return level
        return 2.0 * NormalDist().cdf(self.constant(level)) - 1.0

    def p_value(self, p_look: float, level: float | None = None) -> float:
        """The p-value of a look whose own (fixed-size) p-value is ``p_look`` (docs/statistics.md): with
        ``level`` (the change stops the probe at this level) and an interval that excludes 0, the stop's; else the
        sequence's over all the looks. Never below ``p_look``."""
        if not math.isfinite(p_look):
            return math.nan
        if self.n_looks <= 1 or p_look >= 1.0 or p_look <= 0.0:
            return float(p_look)
        z = -NormalDist().inv_cdf(p_look / 2.0)  # the look's |z| (its lower tail: exact for tiny p)
        over_all = self._tail(self.draws, z, p_look)
        if level is None or z < self.constant(level):
            return over_all
        stops = self._stops(level)  # |Z| at the first crossing of each draw that crosses, sorted
        if len(stops) < 200:  # a level so high that the draws barely cross: the sequence's, an upper bound
            return over_all
        n = len(stops) - np.searchsorted(stops, z, side="left")
        if n >= 200:
            return float(min(1.0, max(n / len(self.joint), p_look)))
        # beyond what the draws resolve: the sequence's tail, times the ratio where the draws still resolve both
        edge = float(stops[-200])
        ratio = (200 / len(self.joint)) / self._tail(self.draws, edge, 2.0 * (1.0 - NormalDist().cdf(edge)))
        return float(min(over_all, max(over_all * ratio, p_look)))

    def _tail(self, sorted_draws: np.ndarray, z: float, p_look: float) -> float:
        """``P(max_j |Z_j| >= z)``; beyond what the draws resolve, the tail of the union of the looks, scaled to meet
        the draws where they still resolve it (the ratio is flat out there)."""
        tail = (len(sorted_draws) - np.searchsorted(sorted_draws, z, side="left")) / len(sorted_draws)
        if tail * len(sorted_draws) < 200:
            edge = float(sorted_draws[-200])
            edge_p = 2.0 * (1.0 - NormalDist().cdf(edge))
            tail = p_look * (200 / len(sorted_draws)) / edge_p if edge_p > 0 else p_look
        return float(min(1.0, max(tail, p_look)))

    @lru_cache(maxsize=4)  # noqa: B019 - a boundary is cached and lives as long as the process
    def _stops(self, level: float) -> np.ndarray:
        crossed = self.joint >= self.constant(level)
        rows = np.flatnonzero(crossed.any(axis=1))
        return np.sort(self.joint[rows, np.argmax(crossed[rows], axis=1)])


@lru_cache(maxsize=16)
def _boundary(real_sizes: tuple[int, ...], looks: tuple[int, ...]) -> Boundary:
    """The seeded draws behind :class:`Boundary` for real foundations of ``real_sizes`` looked at after ``looks``."""
    sizes = np.array([n for n in real_sizes if n > 0])
    if len(looks) <= 1 or not len(sizes):
        return Boundary(np.zeros((1, max(len(looks), 1)), dtype=np.float32))
    counts = np.minimum(np.array(looks)[:, None], sizes[None, :]).astype(float)  # [K, F]
    steps = np.diff(np.vstack([np.zeros((1, len(sizes))), counts]), axis=0)  # vignettes each look adds
    sd = np.sqrt(np.sum(1.0 / counts, axis=1))  # of the foundations' summed means, with unit spreads
    rng = np.random.default_rng(_BOUNDARY_SEED)
    out = []
    for start in range(0, BOUNDARY_DRAWS, _CHUNK):
        n = min(_CHUNK, BOUNDARY_DRAWS - start)
        added = rng.standard_normal((n, *steps.shape)) * np.sqrt(steps)  # each look's new vignettes, summed
        means = np.cumsum(added, axis=1) / counts  # [n, K, F]
        out.append(np.abs(means.sum(axis=2) / sd).astype(np.float32))
    return Boundary(np.concatenate(out))


# ---- one look -------------------------------------------------------------------------------------------------
@dataclass
class Moments:
    """The score (or its change) at a look: estimate, variance of the estimate, degrees of freedom (:func:`moments`)."""

    estimate: float
    var: float
    df: float


def _align_other(s: np.ndarray) -> tuple[float, np.ndarray, int]:
    """A foundation's ``align_other`` from its rows ``s[n, 4]``, each vignette's influence on it, the vignettes
    behind it. Means skip NaN as ``analyse``'s do (a condition's mean over its finite scores)."""
    ov, ou = s[:, 0], s[:, 1]
    fo, fu = np.isfinite(ov), np.isfinite(ou)
    no, nu = int(fo.sum()), int(fu.sum())
    if not no or not nu:
        return math.nan, np.zeros(len(s)), 0
    mo, mu = float(ov[fo].mean()), float(ou[fu].mean())
    psi = np.where(fo, (ov - mo) / no, 0.0) - np.where(fu, (ou - mu) / nu, 0.0)
    return mo - mu, psi, min(no, nu)


def moments(now: VignetteScores, before: VignetteScores | None = None, *, sd_floor: float = 0.0,
            df: str = "fewest") -> Moments:
    """The score of ``now`` (or, with ``before`` over the same vignettes in the same order, its change since
    ``before``), its variance (each real foundation's exactly: ``n / (n - 1)`` times the sum of its vignettes' squared
    influences, the bootstrap's expected variance) and degrees of freedom. ``sd_floor``: the least spread a foundation's
    vignettes are taken to have (docs/statistics.md). ``df``: ``"fewest"`` (the looks') or ``"welch"``."""
    terms = []
    for f in REAL_FOUNDATIONS:
        rows = now.foundation_coarse == f
        if not rows.any():
            continue
        est, psi, n = _align_other(now.s[rows])
        if before is not None:
            est_b, psi_b, n_b = _align_other(before.s[rows])
            est, psi, n = est - est_b, psi - psi_b, min(n, n_b)
        if not math.isfinite(est):
            continue
        var = float(n / (n - 1) * np.sum(psi * psi)) if n >= 2 else math.nan
        if sd_floor > 0 and math.isfinite(var):
            var = max(var, sd_floor * sd_floor / n)
        terms.append((est, var, n - 1))
    if not terms:
        return Moments(math.nan, math.nan, 0.0)
    k = len(terms)
    estimate = sum(t[0] for t in terms) / k
    if any(not math.isfinite(t[1]) or t[2] < 1 for t in terms):
        return Moments(estimate, math.nan, 0.0)
    parts = [t[1] / (k * k) for t in terms]
    var = sum(parts)
    if df == "fewest":
        return Moments(estimate, var, float(min(t[2] for t in terms)))
    denom = sum(p * p / t[2] for p, t in zip(parts, terms, strict=True))
    return Moments(estimate, var, var * var / denom if denom > 0 else math.inf)


@dataclass
class Look:
    """One look of a probe with a precision target: what it had asked and the interval it had."""

    per_foundation: int
    vignettes: int
    estimate: float
    lo: float
    hi: float
    p: float | None = None  # the change's p-value (a change target, or a level one with a baseline)
    unfloored: tuple[float, float] | None = field(default=None, compare=False)  # (lo, hi) without sd_floor

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def as_dict(self) -> dict:
        """The look as a report records it (``unfloored`` is the stop line's, :func:`floor_effect`)."""
        fields = {k: v for k, v in asdict(self).items() if k != "unfloored"}
        out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in fields.items()}
        out["width"] = None if out["lo"] is None or out["hi"] is None else self.width
        return out


def measured(m: Moments) -> bool:
    """Whether ``m`` has a spread to build an interval on: a finite variance with at least 1 df, and either some
    spread or an estimate of exactly 0 (every value 0: a model compared with itself). A nonzero estimate with zero
    spread (every foundation's values tied) has measured none: no interval, and a NaN p-value, never 0."""
    return math.isfinite(m.estimate) and math.isfinite(m.var) and m.df >= 1 and (m.var > 0 or m.estimate == 0)


def interval(m: Moments, per_look: float, bound: float) -> tuple[float, float]:
    """``estimate ± t(df) * se`` at the per-look level, clipped to ``[-bound, bound]``; NaN unless :func:`measured`."""
    return t_interval(m.estimate, m.var, m.df, per_look, (-bound, bound)) if measured(m) else (math.nan, math.nan)


def p_look(m: Moments) -> float:
    """The two-sided t-test of ``estimate == 0`` at one look (fixed size); NaN unless :func:`measured`."""
    return t_test_p(m.estimate, m.var, m.df) if measured(m) else math.nan


def floor_effect(until: str, width: float, looks: list[Look]) -> dict | None:
    """What ``sd_floor`` did to a probe's looks: ``width_without``, the stop's interval width without it, and
    ``stop_without``, the vignettes it would have stopped at without it (None: not before the stop; a floor only
    widens, so it never stops earlier). None when the looks had no floor or it widened no interval."""
    raw = [look.unfloored for look in looks]
    if not looks or any(r is None for r in raw):
        return None
    widened = [look.width > hi - lo + 1e-12 for look, (lo, hi) in zip(looks, raw, strict=True)
               if math.isfinite(look.width) and math.isfinite(hi - lo)]
    if not any(widened):
        return None
    stop = next((look.vignettes for look, (lo, hi) in zip(looks, raw, strict=True)
                 if stop_reason(until, width, dataclasses.replace(look, lo=lo, hi=hi)) is not None), None)
    lo, hi = raw[-1]
    return {"width_without": hi - lo if math.isfinite(hi - lo) else None, "stop_without": stop}


def stop_reason(until: str, width: float, look: Look) -> str | None:
    """Why a probe stops at ``look`` (a key of :data:`STOPS`), or None to go on. ``change``: also once its
    interval excludes 0 (the question "has it moved" is answered)."""
    if not (math.isfinite(look.lo) and math.isfinite(look.hi)):
        return None
    if until == "change" and (look.lo > 0 or look.hi < 0):
        return "moved"
    return "width" if look.width < width else None


# ---- a whole sequence, from per-vignette scores (a probe's loop and the simulations) ---------------------------
@dataclass
class Sequential:
    """The looks of one probe: ``order`` (indices into the candidates, :func:`balanced_order`), its
    :class:`Schedule`, the per-look level for ``level``; with ``before`` (the baseline's scores of the same
    candidates, NaN rows where it did not score one) the change is measured at each look. ``estimate``: a look's
    moments from its scores (:func:`moments`; the benchmarks try others through it)."""

    until: str
    width: float
    level: float
    schedule: Schedule
    order: list[int]
    estimate: Callable[..., Moments] = field(default=moments, repr=False, compare=False)  # a look's moments
    sd_floor: float | None = None  # the estimate's floor (Sequential.of): each look also keeps its interval without

    def __post_init__(self):
        self.boundary = self.schedule.boundary()
        self.per_look = self.boundary.per_look(self.level)

    @classmethod
    def of(cls, ids, foundations, *, until: str, width: float, level: float, seed: int = 0,
           sd_floor: float | None = None) -> Sequential:
        """``sd_floor``: the least spread a foundation's vignettes are taken to have (:func:`moments`)."""
        estimate = partial(moments, sd_floor=float(sd_floor)) if sd_floor else moments
        return cls(until, float(width), float(level), Schedule.of(list(foundations)),
                   balanced_order(list(ids), list(foundations), seed), estimate, float(sd_floor) if sd_floor else None)

    def prefix(self, k: int) -> list[int]:
        """The candidates asked by look ``k`` (indices, in the order they were asked)."""
        return self.order[:self.schedule.vignettes(k)]

    def look(self, k: int, now: VignetteScores, before: VignetteScores | None = None, *,
             stops: bool = True) -> Look:
        """Look ``k`` from the scores of its prefix (``now``; ``before``: the baseline's of the same vignettes, in
        the same order). ``stops``: a change target's change stops the probe here once its interval excludes 0, so
        its p-value is the stop's (a level target's change has the sequence's)."""
        change = self.estimate(now, before) if before is not None else None
        asked = change if self.until == "change" else self.estimate(now)
        lo, hi = interval(asked, self.per_look, _RANGE[self.until])
        stopping = self.level if stops and self.until == "change" else None
        p = None if change is None else self.boundary.p_value(p_look(change), stopping)
        unfloored = None
        if self.sd_floor:  # what the interval would be without the floor: the stop line says what the floor did
            raw = moments(now, before if self.until == "change" else None)
            unfloored = interval(raw, self.per_look, _RANGE[self.until])
        return Look(self.schedule.looks[k], self.schedule.vignettes(k), asked.estimate, lo, hi, p, unfloored)

    def step(self, scores_at: Callable[[int], VignetteScores], before: VignetteScores | None = None, *,
             last: int | None = None, stop=None, looking: bool = True) -> tuple[list[Look], str]:
        """The one loop over the looks: look ``k``'s prefix scores from ``scores_at(k)``, ``before`` the baseline's, up
        to look ``last`` (default the last); the looks until the stop and why it stopped (a key of :data:`STOPS`).
        ``stop``: another rule than :func:`stop_reason`. ``looking=False``: every look scored, none looked at."""
        last = len(self.schedule.looks) - 1 if last is None else last
        looks: list[Look] = []
        for k in range(last + 1):
            now = scores_at(k)
            if not looking:
                continue
            look = self.look(k, now, None if before is None else by_id(before, now.id))
            looks.append(look)
            why = (stop or stop_reason)(self.until, self.width, look)
            if why is not None:
                return looks, why
        return looks, "used up" if looking else "baseline"

    def run(self, scores: VignetteScores, before: VignetteScores | None = None, *, stop=None) -> tuple[list[Look], str]:
        """Every look until the stop, from the whole candidate set's scores (a simulation: the scores are known)."""
        return self.step(lambda k: _rows(scores, np.array(self.prefix(k))), before, stop=stop)

    def change_at(self, k: int, now: VignetteScores, before: VignetteScores) -> Look:
        """The change since the baseline at look ``k`` of a level target (its stop), from the scores of its prefix
        (``now``): the change's interval at the same per-look level, the sequence's p-value (the change did not
        stop it)."""
        return dataclasses.replace(self, until="change").look(k, now, by_id(before, now.id), stops=False)


def by_id(scores: VignetteScores, ids) -> VignetteScores:
    """The rows of ``scores`` of vignettes ``ids``, in that order."""
    where = {str(i): r for r, i in enumerate(scores.id)}
    return _rows(scores, np.array([where[str(i)] for i in ids], dtype=int))


def _rows(scores: VignetteScores, rows: np.ndarray) -> VignetteScores:
    return VignetteScores(scores.id[rows], scores.foundation_coarse[rows], scores.s[rows])


def check_until(value, what: str = "until"):
    """``until`` as given (None, ``"level"`` or ``"change"``), else a ConfigError naming it."""
    if value is None or value in UNTIL:
        return value
    raise ConfigError(f"{what} must be 'level' (stop once the score's interval is narrower than the width), 'change' "
                      f"(stop once the change since the baseline is known: its interval excludes 0 or is narrower "
                      f"than the width), or None for a fixed set of vignettes; got {value!r}")


def check_sd_floor(value, what: str = "sd_floor"):
    """``sd_floor`` as given (None, or a number in (0, 2]: the spread of a vignette's ``align_other``), else a
    ConfigError naming it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= 2:
        raise ConfigError(f"{what} must be a number above 0 and at most 2 (the least spread, as a standard deviation "
                          f"of a vignette's align_other, that a precision target's intervals assume in each "
                          f"foundation, e.g. 0.25), or None for none; got {value!r}")
    return float(value)


def check_width(value, what: str = "width"):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 4 or not math.isfinite(value):
        raise ConfigError(f"{what} must be a number above 0 (the interval's hi - lo to stop at, e.g. 0.05), or None "
                          f"for the default; got {value!r}")
    return float(value)
