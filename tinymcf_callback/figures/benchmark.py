"""The slow benchmark's points over the probe's curve: its accuracies, with intervals, on an axis of their own.

The probe's score lives on its own scale (-2..2); the preference pairs' accuracy and lm-eval's accuracies are shares
in [0, 1]. So they are drawn on a second y axis on the right of the score's panel, as open diamonds with their
intervals (the pairs' 95% interval; lm-eval's ± 1.96 of the standard error it reports), at the steps the benchmark
scored (start, middle, end): a reader sees whether the benchmark moved where the curve moved. Only steps the probe's
curve holds are drawn (a benchmark line of an abandoned branch is not).
"""

from __future__ import annotations

import logging
from statistics import NormalDist

from ..benchmark.history import read_bench
from ..benchmark.steps import bench_of
from ..errors import HistoryError
from ..views.curves import History
from .drawing import require_matplotlib

logger = logging.getLogger("tinymcf_callback")

MARKERS = ("D", "v", "^", "<", ">", "p")  # the pairs first, then each lm-eval task
BENCH_COLOUR = "#009E73"  # Okabe-Ito bluish green: apart from the probe's blue and its control's vermilion
Z = NormalDist().inv_cdf(0.975)


def benchmark_points(h: History) -> list[dict]:
    """The benchmark's points of ``h``'s run (none without its history beside ``h``'s): the pairs' accuracy and each
    lm-eval task's score, at the steps ``h`` holds."""
    path = bench_of(h.path)
    try:
        lines = read_bench(path)
    except HistoryError as e:
        logger.warning("the benchmark's points are left out of the figure: %s", e)
        return []
    steps = set(h.steps.tolist())
    out = []
    for line in lines:
        if line["step"] not in steps:
            continue
        if line["kind"] == "prefs":
            block = line["prefs"]
            out.append({"step": line["step"], "what": "preference accuracy", "value": block.get("accuracy"),
                        "lo": block.get("accuracy_lo"), "hi": block.get("accuracy_hi")})
        else:
            for task, r in line["lm_eval"]["tasks"].items():
                err = r.get("stderr")
                value = r.get("value")
                out.append({"step": line["step"], "what": f"lm-eval {task} {r['metric']}", "value": value,
                            "lo": None if err is None or value is None else value - Z * err,
                            "hi": None if err is None or value is None else value + Z * err})
    return [p for p in out if p["value"] is not None]


def draw_benchmark(ax, histories: list[History], colours: list[str], *, fontsize: float = 9, markersize: float = 6):
    """The benchmark's points of ``histories`` on a right-hand axis of ``ax`` (each run in its colour, each number
    its marker); the legend's handles, none when no run has a benchmark."""
    if not any(h.benchmark for h in histories):
        return []
    right = ax.twinx()
    right.set_ylim(-0.02, 1.02)
    right.set_ylabel("benchmark accuracy", fontsize=fontsize)
    right.tick_params(labelsize=fontsize - 1)
    kinds = sorted(dict.fromkeys(p["what"] for h in histories for p in h.benchmark),
                   key=lambda what: (not what.startswith("preference"), what))
    if len(histories) == 1:
        colours = [BENCH_COLOUR]  # one run: the benchmark apart from the probe's curve by colour too
    for h, colour in zip(histories, colours, strict=True):
        for what in kinds:
            points = sorted((p for p in h.benchmark if p["what"] == what), key=lambda p: p["step"])
            if not points:
                continue
            x = [p["step"] for p in points]
            y = [p["value"] for p in points]
            below = [p["value"] - p["lo"] if p["lo"] is not None else 0.0 for p in points]
            above = [p["hi"] - p["value"] if p["hi"] is not None else 0.0 for p in points]
            right.errorbar(x, y, yerr=[below, above], fmt=MARKERS[kinds.index(what) % len(MARKERS)],
                           linestyle=":", linewidth=0.8, color=colour, markerfacecolor="white", markersize=markersize,
                           capsize=2.5, elinewidth=0.9, label=f"{h.label} · {what}", zorder=4)
    Line2D = require_matplotlib().lines.Line2D
    shown = colours[0] if len(histories) == 1 else "0.3"
    return [Line2D([], [], linestyle=":", color=shown, marker=MARKERS[i % len(MARKERS)], markerfacecolor="white",
                   label=f"{what} (right axis, 95% interval)") for i, what in enumerate(kinds)]
