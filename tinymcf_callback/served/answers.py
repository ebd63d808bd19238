"""From a served probe's readings to its scores: P(Yes) and the answer mass of each prompt, the sample prompt's top
tokens, and, for a top-k form, the bound on what the unread tokens can hide."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..scoring.answers import yes_against_no
from ..scoring.engine import ScoreResult, empty_result
from .forms import Reading


def answer(reading: Reading, yes: list[int], no: list[int]) -> tuple[float, float]:
    """``(p_yes, yn_mass)`` from the answer tokens read (an unread one counts as 0), through the local path's own
    log-space :func:`~tinymcf_callback.scoring.answers.yes_against_no`."""
    p_yes, log_mass = log_answer(reading, yes, no)
    return p_yes, math.exp(log_mass)


def log_answer(reading: Reading, yes: list[int], no: list[int]) -> tuple[float, float]:
    """``(p_yes, log yn_mass)`` of one reading, in float64 and log space (``log yn_mass`` is ``-inf`` when no answer
    token was read; ``p_yes`` then NaN)."""
    def total(ids) -> float:
        vals = [reading.logp[a] for a in ids if a in reading.logp and math.isfinite(reading.logp[a])]
        return float(np.logaddexp.reduce(vals)) if vals else -math.inf
    p_yes, log_mass = yes_against_no(torch.tensor(total(yes), dtype=torch.float64),
                                     torch.tensor(total(no), dtype=torch.float64))
    return float(p_yes), float(log_mass)


def difference(a: Reading, b: Reading, yes: list[int], no: list[int]) -> tuple[float, float]:
    """``(|ΔP(Yes)|, |Δ log mass|)`` of two readings of one prompt, on the answer tokens both read."""
    y = [t for t in yes if t in a.logp and t in b.logp]
    n = [t for t in no if t in a.logp and t in b.logp]
    p0, m0 = log_answer(a, y, n)
    p1, m1 = log_answer(b, y, n)
    if math.isfinite(m0) != math.isfinite(m1):  # one reads the answers as impossible, the other does not
        return 1.0, math.inf
    dp = abs(p0 - p1) if y and n and math.isfinite(m0) else 0.0
    dm = abs(m0 - m1) if math.isfinite(m0) else 0.0
    return dp, dm


def result(readings: list[Reading], sample: Reading, tok, yes: list[int], no: list[int], *, rows: list[int],
           n: int) -> ScoreResult:
    """The :class:`~tinymcf_callback.scoring.engine.ScoreResult` of a probe's ``n`` prompts from one reading of each
    prompt of ``rows`` (NaN elsewhere); ``sample`` holds the sample prompt's top tokens."""
    res = empty_result(n)
    tops = []
    answers = {*yes, *no} | {tok.decode([a]) for a in (*yes, *no)}
    for i, reading in zip(rows, readings, strict=True):
        res.p_yes[i], res.yn_mass[i] = answer(reading, yes, no)
        if len(reading.top) >= 3:
            tops.append(any(t in answers for t, _ in reading.top[:3]))
    if len(tops) == len(rows):
        res.yn_top3[rows] = tops
    else:  # a form that reads no top tokens: unknown
        res.yn_top3 = np.zeros(0, dtype=bool)
    res.top_tokens = [(t if isinstance(t, str) else tok.decode([t]), float(math.exp(v))) for t, v in sample.top[:10]]
    return res


def joined_backend(backends: list[dict | None]) -> dict | None:
    """The backend record of several scorings of one probe through one server (a precision target's looks): the
    first's, with the requests and retries of all."""
    if not backends or backends[0] is None:
        return None
    out = dict(backends[0])
    for key in ("requests", "retries"):
        if all(isinstance(b.get(key), int) for b in backends if b):
            out[key] = sum(b[key] for b in backends if b)
    return out


def bounds(readings: list[Reading], yes: list[int], no: list[int]) -> tuple[float, float] | None:
    """For a top-k form: the widest P(Yes) interval and the most answer mass the unread tokens can hide; None when
    every answer token was read."""
    widest = hidden = 0.0
    inexact = False
    for r in readings:
        if r.floor is None:
            continue
        cap = math.exp(r.floor)
        miss_y, miss_n = sum(a not in r.logp for a in yes), sum(a not in r.logp for a in no)
        if not miss_y and not miss_n:
            continue
        inexact = True
        py = sum(math.exp(r.logp[a]) for a in yes if a in r.logp)
        pn = sum(math.exp(r.logp[a]) for a in no if a in r.logp)
        lo = py / (py + pn + miss_n * cap) if py + pn + miss_n * cap > 0 else 0.0
        hi = (py + miss_y * cap) / (py + miss_y * cap + pn) if py + miss_y * cap + pn > 0 else 1.0
        widest, hidden = max(widest, hi - lo), max(hidden, (miss_y + miss_n) * cap)
    return (widest, hidden) if inexact else None
