"""A report as text: the sanity lines, the per-foundation table, numbers with their intervals.

What ``evaluate`` prints, what the eval command prints and what the callback prints at every
probe when ``verbose``: one rendering, here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..scoring.prompts import DEFAULT_ANSWER_FORMAT, answer_format_of
from ..stats.bootstrap import METRICS


def sanity_lines(report: dict) -> list[str]:
    """The human-readable sanity check of a report (printed by ``evaluate`` and the CLI)."""
    info = report["info"]
    fmt = answer_format_of(report.get("answer_format", DEFAULT_ANSWER_FORMAT))
    pos, neg = fmt.shown
    f = lambda x, spec=".3f": "n/a" if x is None else format(x, spec)  # noqa: E731
    answers = "" if fmt.name == DEFAULT_ANSWER_FORMAT else f" answer_format={fmt.name} ({pos}/{neg})"
    lines = [f"[tinymcf] set={report['name']}{answers} prompts={info['n_prompts']} vignettes={info['n_vignettes']} "
             f"forward calls={info['n_forward']} elapsed={f(info['elapsed_s'], '.1f')}s"]
    if info["top_tokens"]:
        tops = ", ".join(f"{t['token']!r} {t['prob']:.3f}" for t in info["top_tokens"])
        lines.append(f"[tinymcf] top-10 next tokens (sample prompt): {tops}")
    mass = "yn_mass" if fmt.name == DEFAULT_ANSWER_FORMAT else f"answer mass ({pos}+{neg})"
    lines.append(f"[tinymcf] {mass} mean={f(info['yn_mass_mean'])} min={f(info['yn_mass_min'])} "
                 f"{pos}/{neg} in top 3: {f(info['yn_top3_rate'], '.0%')} of prompts")
    lines.append(f"[tinymcf] inter-frame agreement corr(P({pos}|wrong), 1-P({pos}|acceptable)) = "
                 f"{f(info['frame_agreement'])}")
    if info.get("human_corr") is not None or report.get("name") == "clifford":
        lines.append(f"[tinymcf] correlation of s(other_violate) with human wrongness = {f(info['human_corr'])}")
    shown = lambda key: with_bounds(report.get(key), report.get(f"{key}_lo"), report.get(f"{key}_hi"),  # noqa: E731
                                    bool(report.get("level")))
    lines.append(f"[tinymcf] score={shown('score')} gap={shown('gap')} social-norms control={shown('sn')}")
    lines.append(f"[tinymcf] score minus control={shown('score_minus_sn')}; {interval_note(report)}")
    if info.get("adaptive"):
        lines.append(stop_line(info["adaptive"]))
    lines += [f"[tinymcf] WARNING: {w}" for w in info["warnings"]]
    return lines


def stop_line(adaptive: dict) -> str:
    """What a probe with a precision target asked and why it stopped, in one line."""
    a = adaptive
    reached = "" if a.get("reached") is None else f", width reached {a['reached']:.3f}"
    change = a.get("change")
    since = "" if not change or change.get("estimate") is None else (
        f"; change since the baseline {with_bounds(change['estimate'], change['lo'], change['hi'])}"
        + ("" if change.get("p") is None else f" p={change['p']:.3g}"))
    control = f"; {a['control']}" if a.get("control") else ""
    floor = "" if a.get("sd_floor") is None else f" sd_floor={a['sd_floor']:g}"
    if a["stopped"] == "baseline":  # scored whole, no look taken: its intervals are the fixed-size ones
        intervals = f"its intervals are fixed-size {a['level']:.0%} ones (it scored every vignette without looking)"
    else:
        intervals = (f"every interval is one of a {a['level']:.0%} confidence sequence over the probe's looks (each "
                     f"look at {a['per_look_level']:.1%})")
    return (f"[tinymcf] until={a['until']} width={a['width']:g}{floor}: asked {a['vignettes']} of {a['of_vignettes']} "
            f"vignettes ({a['per_foundation']} per foundation, {a['prompts']} of {a['of_prompts']} prompts) and "
            f"stopped: {a['why']}{reached}{since}{floor_note(a)}{control}; {intervals}")


def floor_note(adaptive: dict) -> str:
    """What ``sd_floor`` did, when it widened the intervals: the width it held the stop's at, and the stop it
    moved (empty without a floor, or when the floor widened nothing)."""
    effect = adaptive.get("floor")
    if not effect:
        return ""
    without = "" if effect["width_without"] is None else f" ({effect['width_without']:.3f} without it)"
    to = "" if adaptive.get("reached") is None else f" to {adaptive['reached']:.3f}"
    note = f"; sd_floor={adaptive['sd_floor']:g} widened the interval{to}{without}"
    if effect["stop_without"] is not None and effect["stop_without"] < adaptive["vignettes"]:
        note += (f", which is why it asked {adaptive['vignettes']} vignettes: without the floor it would have stopped "
                 f"at {effect['stop_without']}")
    return note


def with_bounds(estimate, lo, hi, intervals: bool = True) -> str:
    """``+0.590 [+0.410, +0.770]``; ``[n/a]`` for an undefined interval, the bare estimate when intervals are off."""
    if estimate is None or not math.isfinite(estimate):
        return "n/a"
    if not intervals:
        return f"{estimate:+.3f}"
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{estimate:+.3f} [n/a]"
    return f"{estimate:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def interval_note(report: dict) -> str:
    """What the brackets are, said once: the level, the resamples, the seed (or that intervals are off)."""
    if not report.get("level"):
        return "no intervals (n_resamples=0)"
    return (f"brackets: {report['level']:.0%} intervals (vignettes resampled {report['n_resamples']} times, "
            f"seed {report['seed']})")


def format_table(table: pd.DataFrame) -> str:
    """The per-foundation table as text; a metric with bounds shows as ``+0.123 [-0.100, +0.300]``."""
    shown = table.copy()
    for metric in METRICS:
        lo, hi = f"{metric}_lo", f"{metric}_hi"
        if metric not in shown or lo not in shown or hi not in shown:
            continue
        if np.isfinite(shown[lo].to_numpy(dtype=float)).any():  # all NaN: intervals off (or every n = 1)
            shown[metric] = [with_bounds(e, a, b) for e, a, b in zip(shown[metric], shown[lo], shown[hi], strict=True)]
        shown = shown.drop(columns=[lo, hi])
    return shown.to_string(float_format=lambda x: f"{x:+.3f}")


