"""The curve so far as long rows of ``(step, metric, value, lo, hi)``: what a chart draws as one band per metric.

A value without bounds (``n_resamples=0``) has ``lo`` and ``hi`` equal to it: a band of no width, the curve still
drawn.
"""

from __future__ import annotations

import math

HEADLINE = (("score", "score"), ("sn", "Social Norms control"), ("score_minus_sn", "score minus the control"),
            ("gap", "self-other gap"))


def band_rows(curve: list[dict]) -> list[dict]:
    """``[{"step", "metric", "value", "lo", "hi"}, ...]`` of the point lines in ``curve`` (finite values only)."""
    rows = []
    for line in curve:
        step = line["step"]
        for field, label in HEADLINE:
            _add(rows, step, label, line.get(field), line.get(f"{field}_lo"), line.get(f"{field}_hi"))
        change = _metric(line, "score_change")
        if change is not None:
            _add(rows, step, "change since step 0", change, _metric(line, "score_change_lo"),
                 _metric(line, "score_change_hi"))
        for row in line.get("table") or []:
            _add(rows, step, f"{row['foundation']} align_other", row.get("align_other"), row.get("align_other_lo"),
                 row.get("align_other_hi"))
    return rows


def _metric(line: dict, key: str) -> float | None:
    metrics = line.get("metrics") or {}
    name = next((k for k in metrics if k.endswith(f"/{key}") and k.count("/") == 1), None)
    return metrics.get(name) if name else None


def _add(rows: list[dict], step: int, metric: str, value, lo, hi) -> None:
    if not _finite(value):
        return
    value = float(value)
    both = _finite(lo) and _finite(hi)
    rows.append({"step": step, "metric": metric, "value": value, "lo": float(lo) if both else value,
                 "hi": float(hi) if both else value})


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
