"""What one sweep or one watch of a run holds from its start to its end, the same for both: the history's writer lock
(and ``--restart``), the run's trackers opened with what an earlier follower sent them repaired, and each look at the
run (its error sent to every process)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from ..benchmark.history import bench_path, read_bench
from ..errors import HistoryError, SweepError
from ..figures.tracked import probe_figure
from ..rundir.history import baseline_path, set_aside, sole_writer
from ..trackers.open import open_trackers
from ..trackers.sinks import Trackers
from .planner import Planner
from .settings import RunSettings

logger = logging.getLogger(__name__)


def open_run_trackers(settings: RunSettings) -> Trackers:
    """The trackers ``--report-to`` names, opened on the main process, first sent the lines an earlier sweep or watch
    wrote that they do not hold yet (a point a tracker holds is not sent again: it would be drawn twice)."""
    if not settings.report_to:
        return Trackers()
    history = settings.history
    trackers = open_trackers(settings.run_dir, settings.report_to, settings.consumer, runs=settings.runs,
                             figure=(lambda lines: probe_figure(lines, history)) if settings.figure else None)
    if not trackers:
        return trackers
    logger.info("logging each line to %s", "; ".join(trackers.names))
    lines = settings.curve().read().lines
    again = [line for line in lines if line.get("by") in ("sweep", "watch") and line.get("metrics")]
    for line in again:
        trackers.send(line, again=True)
    bench = read_bench(bench_path(settings.run_dir, settings.name, settings.probe.answer_format))
    for line in bench:  # the benchmark's lines beside the curve, repaired the same way
        if line.get("by") in ("sweep", "watch"):
            trackers.send(line, again=True, label="benchmark")
    trackers.seed(lines)  # the figures draw the whole curve, the callback's lines included
    if again:
        logger.info("%d line(s) an earlier sweep or watch wrote: %s", len(again), sent_again(trackers))
    return trackers


def sent_again(trackers: Trackers) -> str:
    """What each tracker got again of the lines an earlier sweep or watch wrote, in a phrase."""
    resent = {what: n for what, n in trackers.resent.items() if n}
    if not resent:
        return "every tracker holds them already"
    said = "; ".join(f"{n} to {what}" for what, n in resent.items())
    missed = f"; {sum(map(len, trackers.missed.values()))} did not reach a tracker (said above)" if trackers.missed \
        else ""
    return f"sent to the dashboards again where they were missing ({said}){missed}"


def look(planner: Planner, hold) -> object:
    """The planner's look, or the error it raised (sent to the other processes, raised on all of them)."""
    try:
        return planner.look(hold)
    except HistoryError as e:
        return SweepError(str(e))
    except Exception as e:  # noqa: BLE001
        return e


def take_history(settings: RunSettings, held: contextlib.ExitStack, command: str) -> Exception | None:
    """Hold the history's writer lock for the whole sweep or watch (in ``held``), set the history aside with
    ``--restart``, and check the vignette set; the error, when any (sent to every process)."""
    if not settings.run_dir.is_dir():
        return SweepError(f"no such folder {settings.run_dir}: tinymcf {command} takes a Trainer output directory "
                          f"(TrainingArguments.output_dir)")
    try:
        held.enter_context(sole_writer(settings.history, f"tinymcf {command} {settings.run_dir}"))
        restart_history(settings)
        settings.probe.vignettes()  # an unknown or unprepared set fails before the first look
    except HistoryError as e:
        return SweepError(str(e))
    except Exception as e:  # noqa: BLE001 - sent to the other processes, raised on all of them
        return e
    return None


def restart_history(settings: RunSettings) -> list:
    """With ``restart``: the history and its baseline report set aside (renamed ``<file>.set-aside-<time>``), so that
    the run's curve starts again; what was renamed."""
    if not settings.restart:
        return []
    paths = (settings.history, Path(baseline_path(str(settings.run_dir), settings.name, settings.probe.answer_format)))
    moved = set_aside(*paths)
    for target in moved:
        logger.info("--restart: %s set aside as %s", target.name.split(".set-aside-")[0], target.name)
    return moved
