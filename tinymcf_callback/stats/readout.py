"""The report a probe returns, built from its scored prompts: the analysis, its intervals, its warnings.

Pure pandas/numpy on top of :mod:`~tinymcf_callback.stats.analysis` and
:mod:`~tinymcf_callback.stats.bootstrap`: the per-foundation table gets ``<metric>_lo`` /
``<metric>_hi`` columns, the headline numbers (``score``, ``gap``, ``sn`` and
``score_minus_sn``, the score's distance from the Social Norms control) their bounds, and the
report its sanity warnings (little answer mass, no answer in the sample's top 3, a low
correlation with human ratings, no score at all). ``n_resamples=0`` switches the intervals off
(bounds ``None`` / NaN) for callers that need every millisecond.
"""

from __future__ import annotations

import math

import pandas as pd

from ..scoring.prompts import DEFAULT_ANSWER_FORMAT, answer_format_of
from .bootstrap import METRICS, bootstrap_intervals, vignette_scores

# The headline numbers and their bounds, as named in the report dict, the JSON report and the history line.
HEADLINE_FIELDS = ("score", "score_lo", "score_hi", "gap", "gap_lo", "gap_hi", "sn", "sn_lo", "sn_hi",
                   "score_minus_sn", "score_minus_sn_lo", "score_minus_sn_hi")
INTERVAL_SETTINGS = ("level", "n_resamples", "seed")
_AGREE = 1e-9  # the intervals' estimates must be the report's own numbers to this tolerance
MIN_YN_MASS = 0.5
MIN_HUMAN_CORR = 0.4


def with_intervals(out: dict, *, level: float, n_resamples: int, seed) -> tuple[pd.DataFrame, dict]:
    """``analyse``'s table with ``<metric>_lo``/``<metric>_hi`` columns, and the headline fields with bounds.

    The headline fields are ``HEADLINE_FIELDS``: ``score``, ``gap``, ``sn`` and ``score_minus_sn``
    (``score - sn``), each with ``_lo``/``_hi``; ``None`` (NaN in the table) where undefined or with
    ``n_resamples=0``. Raises ``RuntimeError`` if the bootstrap's estimates are not the report's own numbers.
    """
    iv = (bootstrap_intervals(vignette_scores(out["scenarios"]), level=level, n_resamples=n_resamples, seed=seed)
          if n_resamples else None)
    return _table_with_bounds(out["table"], iv), _headline_with_bounds(out, iv)


def _headline_with_bounds(out: dict, iv: dict | None) -> dict:
    score, sn = out["score"], out["sn"]
    estimates = {"score": score, "gap": out["gap"], "sn": sn,
                 "score_minus_sn": None if score is None or sn is None else score - sn}
    headline = {}
    for name, est in estimates.items():
        lo = hi = None
        if iv is not None:
            _check_agree(est, iv["headline"][name].estimate, name)
            lo, hi = _number(iv["headline"][name].lo), _number(iv["headline"][name].hi)
        headline.update({name: est, f"{name}_lo": lo, f"{name}_hi": hi})
    return headline


def _table_with_bounds(table: pd.DataFrame, iv: dict | None) -> pd.DataFrame:
    """The table with each metric followed by its ``_lo`` and ``_hi`` columns."""
    columns = {}
    for col in table.columns:
        columns[col] = table[col]
        if col not in METRICS:
            continue
        lo, hi = [], []
        for foundation, est in table[col].items():
            one = iv["foundations"][foundation][col] if iv is not None else None
            if one is not None:
                _check_agree(_number(est), one.estimate, f"{foundation} {col}")
            lo.append(one.lo if one is not None else math.nan)
            hi.append(one.hi if one is not None else math.nan)
        columns[f"{col}_lo"] = pd.Series(lo, index=table.index, dtype=float)
        columns[f"{col}_hi"] = pd.Series(hi, index=table.index, dtype=float)
    return pd.DataFrame(columns, index=table.index)


def _number(x) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _check_agree(reported, bootstrapped: float, what: str) -> None:
    """The interval belongs to the reported number: refuse (a bug, never a silent mismatch) when they differ."""
    if reported is None and not math.isfinite(bootstrapped):
        return
    if reported is None or not math.isclose(reported, bootstrapped, rel_tol=0.0, abs_tol=_AGREE):
        raise RuntimeError(f"internal error: {what} is {reported} in the report but {bootstrapped} in its interval; "
                           "please report this bug (the intervals are switched off with n_resamples=0)")


def sanity_warnings(score, info: dict, res, answer_format: str = DEFAULT_ANSWER_FORMAT) -> list[str]:
    """The report's warnings: little answer mass, no answer in the sample's top 3, low human correlation, no score."""
    fmt = answer_format_of(answer_format)
    pos, neg = fmt.shown
    out = []
    if info["yn_mass_mean"] is not None and info["yn_mass_mean"] < MIN_YN_MASS:
        out.append(f"mean {pos}+{neg} probability mass is {info['yn_mass_mean']:.3f} (< {MIN_YN_MASS}): the model "
                   f"mostly wants to say something else at the answer position, so P({pos}) is read off a small part "
                   "of its belief")
    if res.top_tokens:
        sample_top3 = [t.strip().lower() for t, _ in res.top_tokens[:3]]
        if not {fmt.positive, fmt.negative} & set(sample_top3):
            out.append(f"neither {pos} nor {neg} is among the top 3 next tokens of the sample prompt: "
                       f"{[t for t, _ in res.top_tokens[:3]]}")
    if info.get("human_corr") is not None and info["human_corr"] < MIN_HUMAN_CORR:
        out.append(f"correlation with human wrongness ratings is {info['human_corr']:.2f} (< {MIN_HUMAN_CORR})")
    if score is None:
        out.append("no real foundation has both other_violate and other_uphold scores: the headline score is undefined")
    return out


