"""A sink takes one history line; :class:`Trackers` feeds several and remembers what did not reach each.

``Sink(what, send)``: ``send(line)`` gets the history line (its ``metrics`` under the logged names,
``step``, ``table``, ``dtype``/``autocast``/``compute``/``device``); ``what`` names the destination in
messages. :func:`~.targets.as_sink` makes one of what a training loop already has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..results.metrics import dashboard_names

logger = logging.getLogger(__name__)


def line_metrics(line: dict) -> dict[str, float]:
    """A history line's metrics under the names dashboards show (``eval/moral_<name>/score``, ...)."""
    return dashboard_names(line.get("metrics") or {})


class Sink:
    """One destination of history lines; ``close`` ends what opening it started (a writer, a run)."""

    def __init__(self, what: str, send: Callable[[dict], None], close: Callable[[], None] | None = None):
        self.what, self._send, self._close = what, send, close

    def send(self, line: dict) -> None:
        self._send(line)

    def close(self) -> None:
        if self._close is not None:
            self._close()


class Trackers:
    """Several sinks fed line by line. A sink that fails costs its point, never the caller's work: a warning, and
    the step kept in :attr:`missed` (by tracker), so that the end of a sweep or a watch can say what is missing.

    ``strict``: the first failure is raised instead (``ProbeLogger(strict=True)``).
    """

    def __init__(self, sinks: list[Sink] | tuple = (), *, strict: bool = False):
        self.sinks, self.strict = list(sinks), strict
        self.missed: dict[str, list[int]] = {}  # tracker -> steps it did not get
        self.causes: dict[str, str] = {}  # tracker -> the first error it gave

    def __bool__(self) -> bool:
        return bool(self.sinks)

    @property
    def names(self) -> list[str]:
        return [sink.what for sink in self.sinks]

    def send(self, line: dict, *, label: str = "moral probe") -> bool:
        """Give ``line`` to every sink (a gap line, which holds no number, to none); True when all took it."""
        if not line.get("metrics"):
            return True
        ok = True
        for sink in self.sinks:
            try:
                sink.send(line)
            except Exception as e:  # noqa: BLE001 - a tracker's trouble costs its curve, not the history
                if self.strict:
                    raise
                ok = False
                cause = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
                self.missed.setdefault(sink.what, []).append(line["step"])
                self.causes.setdefault(sink.what, cause)
                logger.warning("%s: step %d not sent to %s: %s", label, line["step"], sink.what, cause)
        return ok

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
