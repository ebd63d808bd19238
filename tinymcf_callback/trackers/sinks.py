"""A sink takes one probe's :class:`Point`; :class:`Trackers` feeds several and remembers what did not reach each.

A :class:`Point` is the history line that was written (its ``metrics`` under the logged names, ``step``, ``table``,
``dtype``/``autocast``/``compute``/``device``) and, for a probe just scored, what the dashboards show besides the
numbers: the probe's per-vignette rows (:mod:`~tinymcf_callback.results.rows`) and the figure of the curve so far.
A line sent again (a sweep or a watch sends the lines an earlier one wrote) carries neither: its rows and figure
went with it the first time, and a table that keeps its history would hold them twice.

``Sink(what, send)``: ``send(point)`` gives the point to one destination; ``what`` names it in messages;
``figure=True`` when it shows the figure (TensorBoard, wandb, MLflow, trackio). :func:`~.targets.as_sink` makes one
of what a training loop already has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..results.history import BASELINE_EVENT, is_point
from ..results.metrics import dashboard_names, probe_key
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT

logger = logging.getLogger(__name__)


def line_metrics(line: dict) -> dict[str, float]:
    """A history line's metrics under the names dashboards show (``eval/moral_<name>/score``, ...)."""
    return dashboard_names(line.get("metrics") or {})


def line_probe_key(line: dict) -> str | None:
    """The probe a line belongs to, as its metric names carry it (``scifi``, ``scifi_json``); None without a name."""
    name = line.get("name")
    return probe_key(name, line.get("answer_format") or DEFAULT_ANSWER_FORMAT) if name else None


@dataclass
class Point:
    """One probe for the trackers: its history line; for a probe just scored, its rows and figure."""

    line: dict
    rows: list[dict] | None = None  # per-vignette rows (results.rows.vignette_rows); None for a line sent again
    figure: object = None  # the curve so far: an RGB uint8 array (height, width, 3), or None
    curve: list[dict] = field(default_factory=list)  # the point lines so far, in step order, this one included

    @property
    def step(self) -> int:
        return self.line["step"]

    @property
    def fresh(self) -> bool:
        """A probe just scored (not a line sent again)."""
        return self.rows is not None


class Sink:
    """One destination of points; ``close`` ends what opening it started (a writer, a run)."""

    def __init__(self, what: str, send: Callable[[Point], None], close: Callable[[], None] | None = None, *,
                 figure: bool = False):
        self.what, self._send, self._close, self.figure = what, send, close, figure

    def send(self, point: Point) -> None:
        self._send(point)

    def close(self) -> None:
        if self._close is not None:
            self._close()


class Trackers:
    """Several sinks fed point by point. A sink that fails costs its point, never the caller's work: a warning, and
    the step kept in :attr:`missed` (by tracker), so that the end of a sweep or a watch can say what is missing.

    ``strict``: the first failure is raised instead (``ProbeLogger(strict=True)``). ``figure``: draws the curve so
    far (the point lines, in step order) as an RGB image, once per probe for every sink that shows it; a figure that
    cannot be drawn (matplotlib missing) is said once and left out, never a failure of the probe.
    """

    def __init__(self, sinks: list[Sink] | tuple = (), *, strict: bool = False,
                 figure: Callable[[list[dict]], object] | None = None):
        self.sinks, self.strict, self.figure = list(sinks), strict, figure
        self.missed: dict[str, list[int]] = {}  # tracker -> steps it did not get
        self.causes: dict[str, str] = {}  # tracker -> the first error it gave
        self.curve: dict[int, dict] = {}  # step -> the newest point line: what the figure draws

    def __bool__(self) -> bool:
        return bool(self.sinks)

    @property
    def names(self) -> list[str]:
        return [sink.what for sink in self.sinks]

    def seed(self, lines: list[dict]) -> None:
        """Start the curve so far from the history's lines (a resumed run, a watcher started again, a resume mark
        that set later steps aside), so that the next figure shows the whole curve."""
        self.curve = {line["step"]: line for line in lines if is_point(line) and line.get("metrics")}

    def send(self, line: dict, *, rows: list[dict] | None = None, again: bool = False,
             label: str = "moral probe", curve: bool = True) -> bool:
        """Give ``line`` to every sink (a gap line, which holds no number, to none); True when all took it.

        ``rows``: the probe's per-vignette rows; ``again``: a line an earlier sweep or watch wrote, sent again (no
        rows, no figure); ``curve=False``: a line beside the probe's curve (the benchmark's), its metrics at its step
        but neither in the curve the figure draws nor with rows or a figure of its own.
        """
        if not line.get("metrics"):
            return True
        if curve and line.get("event") == BASELINE_EVENT and line["step"] == 0:
            self.curve = {}  # a step-0 baseline starts a new run in the folder: its curve starts again
        if curve:
            self.curve[line["step"]] = line
        again = again or not curve
        point = Point(line, rows=None if again else list(rows or []), curve=[self.curve[s] for s in sorted(self.curve)])
        if not again:
            point.figure = self._draw(point.curve, label)
        ok = True
        for sink in self.sinks:
            try:
                sink.send(point)
            except Exception as e:  # noqa: BLE001 - a tracker's trouble costs its curve, not the history
                if self.strict:
                    raise
                ok = False
                cause = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
                self.missed.setdefault(sink.what, []).append(line["step"])
                self.causes.setdefault(sink.what, cause)
                logger.warning("%s: step %d not sent to %s: %s", label, line["step"], sink.what, cause)
        return ok

    def _draw(self, curve: list[dict], label: str):
        if self.figure is None or not any(sink.figure for sink in self.sinks):
            return None
        try:
            return self.figure(curve)
        except Exception as e:  # noqa: BLE001 - a figure that cannot be drawn costs the figure, never the probe
            if self.strict:
                raise
            self.figure = None
            logger.warning("%s: the dashboards get no figure in this run: %s: %s (figure=False, or --no-figure, "
                           "says so without this warning)", label, type(e).__name__, " ".join(str(e).split())[:300])
            return None

    def undelivered(self) -> list[str]:
        """One sentence per tracker that missed points: which steps, and the first cause."""
        return [f"{what}: step(s) {', '.join(map(str, sorted(set(steps))))} did not reach it ({self.causes[what]})"
                for what, steps in self.missed.items()]

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:  # noqa: BLE001 - closing a tracker must not lose what was scored
                self.missed.setdefault(sink.what, [])
                self.causes.setdefault(sink.what, f"closing it failed: {type(e).__name__}: {e}")
                logger.warning("moral probe: closing %s failed: %s: %s", sink.what, type(e).__name__, e)
