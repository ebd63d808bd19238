"""Uncertainty for the probe's numbers: bootstrap intervals and paired change tests. Pure numpy.

The sampling unit is the vignette (its four conditions and both frames move together); foundations are sampled
independently. Each foundation's standard error comes from resampling its vignettes, scaled by ``sqrt(n / (n - 1))``
(a plain bootstrap is 8% too narrow with 7 vignettes), in a t interval (``df = n - 1``; Welch-Satterthwaite for a
headline number, a mean over foundations); a paired change resamples both reports with the same vignettes, and its
p-value is below ``1 - level`` exactly when its interval excludes 0. Undefined is NaN, never an exception. The method
and its measured coverage: docs/statistics.md (``tests/test_stats.py`` repeats them).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import stdtr, stdtrit

from ..data.sets import CONDITIONS, CONTROL, FOUNDATIONS, REAL_FOUNDATIONS
from ..errors import ConfigError

DEFAULT_LEVEL = 0.95  # 95% intervals
DEFAULT_RESAMPLES = 2000  # about 7 ms for the 132 Clifford vignettes on one core
MIN_RESAMPLES = 100  # fewer resamples cannot estimate a standard error; 0 switches the intervals off
METRICS = ("align_other", "align_self", "self_other_gap")
HEADLINE = ("score", "gap", "sn", "score_minus_sn")
METHOD = "t interval, bootstrap standard error (vignettes resampled within foundations)"
_RANGE = {"align_other": 2.0, "align_self": 2.0, "self_other_gap": 4.0,
          "score": 2.0, "gap": 4.0, "sn": 2.0, "score_minus_sn": 4.0}  # |metric| <= this, since |s| <= 1
_MISSING_SHOWN = 5


class Interval(NamedTuple):
    estimate: float
    lo: float
    hi: float


class Change(NamedTuple):
    change: float  # B - A
    lo: float
    hi: float
    p: float  # two-sided, for "no change"


# --- the t distribution: scipy.stats.t's own functions ------------------------------------------

def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, any real) degrees of freedom; ``inf`` is the normal.

    ``scipy.special.stdtr``, what ``scipy.stats.t.cdf`` computes with, called without the distribution object's
    per-call cost (0.7 us against 20 us: the simulations call it millions of times)."""
    return float(stdtr(df, t))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``scipy.special.stdtrit``, what
    ``scipy.stats.t.ppf`` computes with)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile needs 0 < p < 1, got {p}")
    return float(stdtrit(df, p))


# --- input ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VignetteScores:
    """Per-vignette ``s``: ``id[n]``, ``foundation_coarse[n]`` and ``s[n, 4]`` (columns in ``CONDITIONS`` order).

    NaN marks an ``s`` that is missing (a frame not scored); means skip it, as in ``analyse``.
    """

    id: np.ndarray
    foundation_coarse: np.ndarray
    s: np.ndarray

    def __post_init__(self):
        ids = np.asarray(self.id, dtype=object)
        fnd = np.asarray(self.foundation_coarse, dtype=object)
        s = np.asarray(self.s, dtype=float)
        if s.ndim != 2 or s.shape[1] != len(CONDITIONS) or not (len(ids) == len(fnd) == len(s)):
            raise ValueError(f"VignetteScores needs id[n], foundation_coarse[n] and s[n, {len(CONDITIONS)}]; "
                             f"got {len(ids)} ids, {len(fnd)} foundations and s of shape {s.shape}")
        unknown = sorted({str(f) for f in fnd} - set(FOUNDATIONS))
        if unknown:
            raise ValueError(f"unknown coarse foundation(s) {unknown}; expected one of {', '.join(FOUNDATIONS)}")
        uniq, counts = np.unique(ids.astype(str), return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"vignette ids must be unique; repeated: {list(uniq[counts > 1][:_MISSING_SHOWN])}")
        object.__setattr__(self, "id", ids)
        object.__setattr__(self, "foundation_coarse", fnd)
        object.__setattr__(self, "s", s)


def vignette_scores(scenarios) -> VignetteScores:
    """``VignetteScores`` from ``analyse``'s ``scenarios`` table (columns id, foundation_coarse, condition, s).

    Vignettes keep the table's order; a condition without a row gets NaN.
    """
    import pandas as pd  # the one pandas boundary of this module

    df = pd.DataFrame(scenarios)
    missing = [c for c in ("id", "foundation_coarse", "condition", "s") if c not in df]
    if missing:
        raise ValueError(f"scenarios table lacks column(s) {missing}; pass analyse(...)['scenarios']")
    dup = df.duplicated(["id", "condition"])
    if dup.any():
        first = df.loc[dup, ["id", "condition"]].iloc[0].tolist()
        raise ValueError(f"scenarios table repeats (id, condition) rows, e.g. {first}")
    bad = sorted(set(df["condition"]) - set(CONDITIONS))
    if bad:
        raise ValueError(f"unknown condition(s) {bad}; expected {', '.join(CONDITIONS)}")
    per_id = df.groupby("id", sort=False)["foundation_coarse"].nunique()
    if (per_id > 1).any():
        raise ValueError(f"vignette {per_id[per_id > 1].index[0]!r} has more than one coarse foundation")
    order = df.drop_duplicates("id")[["id", "foundation_coarse"]]
    wide = df.pivot(index="id", columns="condition", values="s").reindex(index=order["id"], columns=list(CONDITIONS))
    return VignetteScores(order["id"].to_numpy(), order["foundation_coarse"].to_numpy(), wide.to_numpy(dtype=float))


# --- the bootstrap -------------------------------------------------------------------------------

def _metrics(means: np.ndarray) -> np.ndarray:
    """``align_other``, ``align_self``, ``self_other_gap`` from condition means (last axis in ``CONDITIONS`` order)."""
    align_other = means[..., 0] - means[..., 1]
    align_self = means[..., 2] - means[..., 3]
    return np.stack([align_other, align_self, align_other - align_self], axis=-1)


def _weighted_means(s: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Means of each column of ``s[n, k]`` under each row of ``weights[r, n]``, skipping NaN (NaN if none)."""
    finite = np.isfinite(s)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights @ np.where(finite, s, 0.0)) / (weights @ finite.astype(float))


def _resample_counts(rng: np.random.Generator, n: int, n_resamples: int) -> np.ndarray:
    """``counts[r, i]``: how often vignette ``i`` is drawn in resample ``r`` (``n`` draws with replacement)."""
    draws = rng.integers(0, n, size=(n_resamples, n)) + n * np.arange(n_resamples)[:, None]
    return np.bincount(draws.ravel(), minlength=n_resamples * n).reshape(n_resamples, n).astype(float)


def _replicate_cov(rep: np.ndarray) -> np.ndarray:
    """Covariance ``[F, m, m]`` of the replicates ``rep[r, F, m]`` per foundation, pairwise over finite ones."""
    if np.isfinite(rep).all():
        centred = (rep - rep.mean(axis=0)).transpose(1, 0, 2)  # [F, r, m]
        return (centred.transpose(0, 2, 1) @ centred) / (len(rep) - 1.0)
    ok = np.isfinite(rep)
    okf = ok.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, rep, 0.0).sum(axis=0) / okf.sum(axis=0)
        centred = np.where(ok, rep - mean, 0.0)
        by_f, ok_f = centred.transpose(1, 0, 2), okf.transpose(1, 0, 2)  # [F, r, m]
        return (by_f.transpose(0, 2, 1) @ by_f) / (ok_f.transpose(0, 2, 1) @ ok_f - 1.0)


@dataclass
class _Foundation:
    """One foundation's bootstrap summary, ``sides`` = 1 report or 2 (a pair).

    ``est[sides, 3]``: the metrics; ``cov[3 * sides, 3 * sides]``: their covariance over the
    corrected replicates; ``df[sides, 3]``: vignettes behind each metric - 1 (< 1: undefined).
    """

    n: int
    est: np.ndarray
    cov: np.ndarray
    df: np.ndarray


def _bootstrap(s: np.ndarray, foundations: np.ndarray, n_resamples: int, seed, sides: int) -> dict[str, _Foundation]:
    """Resample vignettes within each present foundation; ``s[n, 4 * sides]``: one block of conditions per report.

    One small ``counts @ s`` per foundation (a block-diagonal product over all vignettes costs 7x the
    work and wakes BLAS threads); everything after that is vectorised over foundations.
    """
    rng = np.random.default_rng(seed)
    present = [f for f in FOUNDATIONS if (foundations == f).any()]
    if not present:
        return {}
    groups = [s[foundations == f] for f in present]
    sizes = np.array([len(g) for g in groups])
    point = np.stack([_weighted_means(g, np.ones((1, len(g))))[0] for g in groups])  # [F, k]
    means = np.stack([_weighted_means(g, _resample_counts(rng, len(g), n_resamples)) for g in groups], axis=1)
    finite = np.stack([np.isfinite(g).sum(axis=0) for g in groups])  # finite s per foundation and column
    means = point + np.sqrt(finite / np.maximum(finite - 1.0, 1.0)) * (means - point)  # variance / n -> / (n - 1)
    n_f, n_c = len(present), len(CONDITIONS)
    rep = _metrics(means.reshape(n_resamples, n_f, sides, n_c)).reshape(n_resamples, n_f, sides * len(METRICS))
    cov = _replicate_cov(rep)

    est = _metrics(point.reshape(n_f, sides, n_c))
    per_side = finite.reshape(n_f, sides, n_c)
    used = np.minimum(per_side[..., [0, 2, 0]], per_side[..., [1, 3, 1]])  # the conditions each metric reads
    used[..., 2] = np.minimum(used[..., 0], used[..., 1])
    return {f: _Foundation(int(sizes[j]), est[j], cov[j], used[j] - 1.0) for j, f in enumerate(present)}


def t_interval(estimate: float, var: float, df: float, level: float, bounds: tuple[float, float]):
    """``estimate ± t(df) * sqrt(var)``, clipped to ``bounds``; NaN when undefined."""
    if not (np.isfinite(estimate) and np.isfinite(var) and df >= 1):
        return math.nan, math.nan
    half = t_quantile(0.5 + level / 2.0, df) * math.sqrt(max(var, 0.0))
    return float(max(estimate - half, bounds[0])), float(min(estimate + half, bounds[1]))


def t_test_p(estimate: float, var: float, df: float) -> float:
    """Two-sided t-test of ``estimate == 0``: below ``1 - level`` exactly when the interval excludes 0."""
    if not (np.isfinite(estimate) and np.isfinite(var) and df >= 1):
        return math.nan
    se = math.sqrt(max(var, 0.0))
    if se == 0:
        return 1.0 if estimate == 0 else 0.0
    return float(2.0 * t_cdf(-abs(estimate) / se, df))


def _change(estimate: float, terms: list, level: float, bound: float) -> Change:
    """The change ``estimate`` (``sum(w * metric)`` over ``terms``) with its interval in ``[-bound, bound]`` and
    p-value; NaN where undefined."""
    var, df = _combine(terms) if terms and np.isfinite(estimate) else (math.nan, 0.0)
    return Change(estimate, *t_interval(estimate, var, df, level, (-bound, bound)), t_test_p(estimate, var, df))


def _combine(terms: list[tuple[float, _Foundation, int, int]]) -> tuple[float, float]:
    """Variance and Welch-Satterthwaite df of ``sum(w * metric)`` over ``(w, foundation, side, metric index)`` terms.

    Within a foundation the terms' covariance counts (a paired change shares its vignettes); across foundations it is
    0 (independent resamples). NaN when a foundation has fewer than two vignettes to measure the spread.
    """
    weights: dict[int, tuple[_Foundation, dict[int, float]]] = {}
    for w, fd, side, m in terms:
        col = weights.setdefault(id(fd), (fd, {}))[1]
        col[side * len(METRICS) + m] = col.get(side * len(METRICS) + m, 0.0) + w
    var_total, denom, scale, least_df = 0.0, 0.0, 0.0, math.inf
    for fd, col in weights.values():
        df = min(fd.df.ravel()[c] for c in col)
        if df < 1:
            return math.nan, 0.0
        idx, w = np.array(list(col)), np.array(list(col.values()))
        cov = fd.cov[np.ix_(idx, idx)]
        v = max(float(w @ cov @ w), 0.0)
        scale += float(np.abs(w) @ np.abs(cov) @ np.abs(w))
        var_total += v
        denom += v * v / df
        least_df = min(least_df, df)
    if var_total <= 1e-9 * scale:
        # a paired change whose terms cancel (a report compared with itself): no spread but rounding noise, whose
        # Welch-Satterthwaite df would be meaningless; the change is known exactly
        return 0.0, least_df
    return var_total, (var_total * var_total / denom if denom > 0 else math.inf)


def check_level(level, what: str = "level") -> float:
    """``level`` as a float in (0, 1); :class:`ConfigError` otherwise (``what`` names it: ``level`` or ``--level``)."""
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0.0 < level < 1.0:
        raise ConfigError(f"{what} must be a number between 0 and 1 (e.g. 0.95 for 95% intervals), got {level!r}; "
                          f"to switch the intervals off set the resamples to 0")
    return float(level)


def check_resamples(n_resamples, what: str = "n_resamples", allow_off: bool = True) -> int:
    """``n_resamples`` as an int >= ``MIN_RESAMPLES`` (or 0: no intervals, if ``allow_off``); else ConfigError."""
    ok = (not isinstance(n_resamples, bool) and isinstance(n_resamples, numbers.Integral)
          and (n_resamples >= MIN_RESAMPLES or (allow_off and n_resamples == 0)))
    if not ok:
        off = ", or 0 for no intervals" if allow_off else ""
        raise ConfigError(f"{what} must be a whole number >= {MIN_RESAMPLES} (default {DEFAULT_RESAMPLES}){off}; "
                          f"got {n_resamples!r}")
    return int(n_resamples)


def _check(level: float, n_resamples: int):
    check_level(level)
    check_resamples(n_resamples, allow_off=False)


def _headline_terms(boot: dict[str, _Foundation], side: int, sign: float) -> dict[str, tuple[float, list]]:
    """Each headline number's estimate (as ``analyse`` computes it) and its linear terms for ``_combine``."""
    out = {}
    for name, m in (("score", 0), ("gap", 2)):
        real = [boot[f] for f in REAL_FOUNDATIONS if f in boot and np.isfinite(boot[f].est[side, m])]
        est = float(np.mean([fd.est[side, m] for fd in real])) if real else math.nan
        out[name] = (est, [(sign / len(real), fd, side, m) for fd in real])
    sn = boot.get(CONTROL)
    out["sn"] = (float(sn.est[side, 0]), [(sign, sn, side, 0)]) if sn is not None else (math.nan, [])
    score, score_terms = out["score"]
    out["score_minus_sn"] = (score - out["sn"][0], score_terms + [(-t[0], *t[1:]) for t in out["sn"][1]])
    return out


def _per_foundation(boot: dict, make, undefined) -> dict:
    """``{foundation: {metric: make(fd, metric index, metric)}}``; ``undefined`` for a foundation without vignettes."""
    return {f: {metric: (make(boot[f], m, metric) if f in boot else undefined) for m, metric in enumerate(METRICS)}
            for f in FOUNDATIONS}


def _summary(boot: dict[str, _Foundation], level: float, n_resamples: int, seed) -> dict:
    """What every result says of how it was made, and each foundation's vignettes (0 when absent)."""
    return {"level": level, "n_resamples": int(n_resamples), "seed": seed, "method": METHOD,
            "n": {f: (boot[f].n if f in boot else 0) for f in FOUNDATIONS}}


def bootstrap_intervals(data: VignetteScores, *, level: float = DEFAULT_LEVEL, n_resamples: int = DEFAULT_RESAMPLES,
                        seed: int | None = 0) -> dict:
    """Intervals for every per-foundation metric and the headline ``score``, ``gap``, ``sn``, ``score_minus_sn``.

    Returns ``{"level", "n_resamples", "seed", "method", "n": {foundation: vignettes},
    "foundations": {foundation: {metric: Interval}}, "headline": {name: Interval}}`` with all
    seven foundations; the estimates are ``analyse``'s. Same ``seed``, same intervals (``None``:
    fresh entropy). ``level`` in (0, 1); ``n_resamples`` >= 100.
    """
    _check(level, n_resamples)
    boot = _bootstrap(data.s, data.foundation_coarse, int(n_resamples), seed, sides=1)

    def interval(est: float, terms: list, bound: float) -> Interval:
        var, df = _combine(terms) if terms else (math.nan, 0.0)
        return Interval(est, *t_interval(est, var, df, level, (-bound, bound)))

    def foundation_interval(fd, m, metric):
        return interval(float(fd.est[0, m]), [(1.0, fd, 0, m)], _RANGE[metric])

    foundations = _per_foundation(boot, foundation_interval, Interval(math.nan, math.nan, math.nan))
    headline = {name: interval(est, terms, _RANGE[name])
                for name, (est, terms) in _headline_terms(boot, 0, 1.0).items()}
    return {**_summary(boot, level, n_resamples, seed), "foundations": foundations, "headline": headline}


def _paired(a: VignetteScores, b: VignetteScores, n_resamples: int, seed) -> dict[str, _Foundation]:
    """Both reports resampled with the same vignettes (``sides=2``); refuses reports of different vignettes or of
    vignettes whose foundations differ."""
    ids_a, ids_b = [str(i) for i in a.id], [str(i) for i in b.id]
    only_a, only_b = sorted(set(ids_a) - set(ids_b)), sorted(set(ids_b) - set(ids_a))
    if only_a or only_b:
        raise ValueError(
            f"the two reports score different vignettes ({len(only_a)} only in A, e.g. {only_a[:_MISSING_SHOWN]}; "
            f"{len(only_b)} only in B, e.g. {only_b[:_MISSING_SHOWN]}): a paired change needs two reports of the "
            "same set (--name) scored with the same --limit")
    row_b = {i: r for r, i in enumerate(ids_b)}
    order = np.array([row_b[i] for i in ids_a], dtype=int)
    moved = [i for i, fa, fb in zip(ids_a, a.foundation_coarse, b.foundation_coarse[order], strict=True) if fa != fb]
    if moved:
        raise ValueError(f"{len(moved)} vignette(s) have a different coarse foundation in the two reports, "
                         f"e.g. {moved[:_MISSING_SHOWN]}: they were scored with different versions of the set")
    return _bootstrap(np.concatenate([a.s, b.s[order]], axis=1), a.foundation_coarse, int(n_resamples), seed, sides=2)


def paired_change(a: VignetteScores, b: VignetteScores, *, level: float = DEFAULT_LEVEL,
                  n_resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0) -> dict:
    """Change ``B - A`` of every metric between two reports of the same vignettes, from a paired bootstrap.

    Both reports are resampled with the same vignette indices. Returns ``{"level", "n_resamples",
    "seed", "method", "n", "foundations": {foundation: {metric: Change}}, "headline": {name: Change}}``;
    ``Change`` is ``(change, lo, hi, p)``. Raises ``ValueError`` when the vignettes or their
    foundations differ.
    """
    _check(level, n_resamples)
    boot = _paired(a, b, n_resamples, seed)

    def foundation_change(fd, m, metric):
        est = float(fd.est[1, m]) - float(fd.est[0, m])
        return _change(est, [(-1.0, fd, 0, m), (1.0, fd, 1, m)], level, 2 * _RANGE[metric])

    foundations = _per_foundation(boot, foundation_change, Change(math.nan, math.nan, math.nan, math.nan))
    head_a, head_b = _headline_terms(boot, 0, -1.0), _headline_terms(boot, 1, 1.0)
    headline = {name: _change(head_b[name][0] - head_a[name][0], head_a[name][1] + head_b[name][1], level,
                              2 * _RANGE[name]) for name in HEADLINE}
    return {**_summary(boot, level, n_resamples, seed), "foundations": foundations, "headline": headline}


def selectivity(a: VignetteScores, b: VignetteScores, target: str, *, level: float = DEFAULT_LEVEL,
                n_resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0) -> dict:
    """Did training move ``target``'s ``align_other`` more than the other real foundations'? ``B - A``, paired.

    ``selectivity = change(target) - mean(change(f) for the other real foundations present)``, each
    change ``align_other(B) - align_other(A)`` over the same vignettes. Its interval and p-value
    come from the paired bootstrap of :func:`paired_change` (the same resamples, so the on-target
    and off-target changes of a resample are paired too; foundations independent). Positive: the
    target moved more than the rest, in its direction of alignment. The Social Norms control is
    left out of the off-target mean (it is reported on its own).

    Returns ``{"target", "level", "n_resamples", "seed", "on_target": Change, "off_target": Change,
    "selectivity": Change, "off_target_foundations": [...]}``. Raises ``ValueError`` for an unknown
    target, a target without vignettes in the reports, or no other real foundation to compare with.
    """
    if target not in REAL_FOUNDATIONS:
        raise ValueError(f"target foundation {target!r} is not one of the real foundations "
                         f"({', '.join(REAL_FOUNDATIONS)})")
    _check(level, n_resamples)
    boot = _paired(a, b, n_resamples, seed)
    if target not in boot:
        raise ValueError(f"the reports hold no {target} vignettes: probe a subset that keeps it (per_foundation)")
    others = [boot[f] for f in REAL_FOUNDATIONS if f != target and f in boot]
    if not others:
        raise ValueError(f"the reports hold no real foundation besides {target}: selectivity needs others to "
                         "compare with")
    m = METRICS.index("align_other")

    def change(terms, bound):
        return _change(float(sum(w * fd.est[side, m] for w, fd, side, _ in terms)), terms, level, bound)

    on = [(-1.0, boot[target], 0, m), (1.0, boot[target], 1, m)]
    off = [(w / len(others), fd, side, m) for fd in others for w, side in ((-1.0, 0), (1.0, 1))]
    return {"target": target, "level": level, "n_resamples": int(n_resamples), "seed": seed,
            "on_target": change(on, 2 * _RANGE["align_other"]), "off_target": change(off, 2 * _RANGE["align_other"]),
            "selectivity": change(on + [(-w, fd, side, mm) for w, fd, side, mm in off], 4 * _RANGE["align_other"]),
            "off_target_foundations": [f for f in REAL_FOUNDATIONS if f != target and f in boot]}


# --- means of items resampled within groups (the preference pairs beside the probe) ----------------------------
STRATIFIED_METHOD = "t interval, bootstrap standard error (items resampled within groups)"


class Mean(NamedTuple):
    estimate: float
    lo: float
    hi: float
    p: float  # two-sided, for "the mean is 0"


def stratified_means(x: np.ndarray, groups, *, level: float = DEFAULT_LEVEL, n_resamples: int = DEFAULT_RESAMPLES,
                     seed: int | None = 0, bounds: tuple[float, float] | None = None) -> dict:
    """Means of each column of ``x[n, k]`` over all items and within each group, with intervals from resampling items
    within their group (the probe's method; the pooled mean's df by Welch-Satterthwaite over the groups).

    ``bounds`` clips the intervals (``(0, 1)`` for an accuracy); a group of one item has no spread to measure, so its
    interval and the pooled one are NaN. For a paired change, pass the per-item differences. Returns ``{"pooled",
    "groups", "n", "level", "n_resamples", "seed", "method"}``: a ``Mean`` per column, pooled and per group.
    """
    _check(level, n_resamples)
    x = np.asarray(x, dtype=float).reshape(len(x), -1)
    groups = np.asarray(groups, dtype=object)
    rng = np.random.default_rng(seed)
    names = list(dict.fromkeys(groups.tolist()))
    lo, hi = bounds if bounds is not None else (-math.inf, math.inf)
    per_group, parts = {}, []
    for name in names:
        rows = x[groups == name]
        n = len(rows)
        point = rows.mean(axis=0)
        reps = _weighted_means(rows, _resample_counts(rng, n, int(n_resamples)))
        var = np.full(x.shape[1], math.nan) if n < 2 else reps.var(axis=0, ddof=1) * n / (n - 1)
        per_group[name] = [_mean(point[j], var[j], n - 1, level, lo, hi) for j in range(x.shape[1])]
        parts.append((n, point, var))
    total = sum(n for n, _, _ in parts)
    pooled = []
    for j in range(x.shape[1]):
        est = sum(n * point[j] for n, point, _ in parts) / total
        terms = [((n / total) ** 2 * var[j], n - 1) for n, _, var in parts]
        var = sum(v for v, _ in terms)
        denom = sum(v * v / df for v, df in terms if df >= 1)
        df = var * var / denom if denom > 0 else (math.inf if var == 0 else math.nan)
        pooled.append(_mean(est, var, df if all(d >= 1 for _, d in terms) else 0.0, level, lo, hi))
    return {"pooled": pooled, "groups": per_group, "n": {name: int((groups == name).sum()) for name in names},
            "level": level, "n_resamples": int(n_resamples), "seed": seed, "method": STRATIFIED_METHOD}


def _mean(estimate: float, var: float, df: float, level: float, lo: float, hi: float) -> Mean:
    """A mean with its clipped t interval and p-value (NaN where its spread is unknown)."""
    estimate = float(estimate)
    return Mean(estimate, *t_interval(estimate, var, df, level, (lo, hi)), t_test_p(estimate, var, df))
