"""The probe in the training's own trackio run: its metrics with their bounds, its figure and its tables.

The callback records the run the Trainer's ``TrackioCallback`` opened (project, run name and id, the local folder
trackio writes to, a Space or a self-hosted server) in ``moral_probe_run.json``; the sweep and the watcher open
that run again (``trackio.init(..., resume="must")``: never a new one) and log into it beside the training, which
trackio allows: its local store takes each write under a lock of its own (``<project>.lock``), so two processes
writing one project's database wait for each other. A point gives the run, with ``train/global_step`` (the x axis
the Trainer's own rows carry, as the callback's rows do):

- the metrics under the dashboard names (``eval/moral_<name>/score``, ``_lo``, ``_hi``, ...), as
  ``TrackioCallback`` logs the callback's;
- ``eval/moral_<name>/figure`` (a ``trackio.Image``), the curve so far with its bands;
- ``eval/moral_<name>/table`` and ``eval/moral_<name>/vignette_rows`` (``trackio.Table``), the per-foundation and the
  per-vignette rows of the probe, each with its ``step`` column (trackio keeps a table per logged step).

trackio reports its own failures as warnings (its writer is a background thread): a point it could not store is
said by trackio, not counted here. A write token of a self-hosted server is never recorded: the follower takes it
from ``TRACKIO_WRITE_TOKEN``, as trackio does.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from pathlib import Path

import pandas as pd

from ..errors import SweepError
from ..extras import require
from ..rundir.record import RunRecord
from .sinks import Point, Sink, line_metrics, line_probe_key

logger = logging.getLogger(__name__)


class TrackioWriter:
    """Points into one trackio run (``metrics=False``: they went through ``Trainer.log``)."""

    def __init__(self, run, *, metrics: bool = True):
        self.run, self.metrics = run, metrics

    def send(self, point: Point) -> None:
        trackio = require("trackio")
        line, key = point.line, line_probe_key(point.line)
        payload = line_metrics(line) if self.metrics else {}
        if point.figure is not None:
            payload[f"eval/moral_{key}/figure"] = trackio.Image(point.figure, caption=f"step {point.step}")
        if point.fresh and line.get("table"):
            rows = pd.DataFrame([{"step": point.step, **row} for row in line["table"]])
            payload[f"eval/moral_{key}/table"] = trackio.Table(dataframe=rows)
        if point.rows:
            payload[f"eval/moral_{key}/vignette_rows"] = trackio.Table(dataframe=pd.DataFrame(point.rows))
        if payload:
            self.run.log({**payload, "train/global_step": point.step})


def active_run_facts() -> dict | None:
    """The trackio run open in this process (the Trainer's ``TrackioCallback`` opens it): project, name, id, the
    local folder, and the Space or server it syncs to (never a token); None when none is open."""
    trackio = require("trackio")
    run = trackio.context_vars.current_run.get()
    if run is None:
        return None
    space = trackio.context_vars.current_space_id.get()
    server = None if space else trackio.context_vars.current_server.get()
    return {"project": run.project, "name": run.name, "id": run.id, "dir": str(_trackio_dir()),
            "space_id": space, "server_url": server}


def _trackio_dir() -> Path:
    from trackio.utils import TRACKIO_DIR

    return Path(TRACKIO_DIR)


def trackio_sink(run_dir: Path, record: RunRecord | None, given: str | None = None) -> Sink:
    """The training's trackio run (``given``: ``PROJECT/RUN``; else the one the run's record names), opened again
    in this process: never a new run."""
    recorded = record.trackio if record and record.trackio else {}
    _use_recorded_dir(recorded.get("dir"))
    trackio = require("trackio")
    if given:
        project, sep, name = given.rpartition("/")
        if not sep or not project or not name:
            raise SweepError(f"--trackio-run takes PROJECT/RUN (the trackio project and run name), got {given!r}")
        recorded = {"project": project, "name": name}
    if not recorded.get("project") or not recorded.get("name"):
        raise SweepError(f"no trackio run to log into: {run_dir} has no moral_probe_run.json naming one (the callback "
                         f"writes it when the Trainer reports to trackio); pass --trackio-run PROJECT/RUN")
    live = trackio.context_vars.current_run.get()
    if live is not None:
        if (live.project, live.name) == (recorded["project"], recorded["name"]):
            return Sink(f"trackio run {live.name} of {live.project}", TrackioWriter(live).send, figure=True)
        raise SweepError(f"this process has the trackio run {live.name} of {live.project} open: logging into "
                         f"{recorded['name']} of {recorded['project']} would finish it (trackio keeps one run per "
                         f"process); run tinymcf sweep or watch in a process of its own")
    where = recorded.get("dir") or str(_trackio_dir())
    if recorded.get("dir") and Path(recorded["dir"]) != _trackio_dir():
        raise SweepError(f"the trackio run {recorded['name']} of {recorded['project']} is in {recorded['dir']}, but "
                         f"this process's trackio writes to {_trackio_dir()}: set TRACKIO_DIR={recorded['dir']}")
    try:
        with _quiet():  # trackio prints where it logs and how to open the dashboard: said once here instead
            run = trackio.init(project=recorded["project"], name=recorded["name"], resume="must",
                               space_id=recorded.get("space_id"), server_url=recorded.get("server_url"),
                               embed=False, auto_log_cpu=False, auto_log_gpu=False)
    except ValueError as e:
        raise SweepError(f"the trackio run {recorded['name']} of project {recorded['project']} cannot be resumed "
                         f"({e}; trackio's folder: {where}): pass --trackio-run PROJECT/RUN of the training's run, "
                         f"with the TRACKIO_DIR it logs to") from None

    def close() -> None:
        with _quiet():
            run.finish()
        if trackio.context_vars.current_run.get() is run:
            trackio.context_vars.current_run.set(None)

    return Sink(f"trackio run {run.name} of {run.project} ({where})", TrackioWriter(run).send, close, figure=True)


def _use_recorded_dir(recorded: str | None) -> None:
    """Before trackio is first imported (it reads ``TRACKIO_DIR`` then), point it at the folder the training's run is
    in, unless the user chose one."""
    if recorded and "trackio" not in sys.modules and not os.environ.get("TRACKIO_DIR"):
        os.environ["TRACKIO_DIR"] = recorded


@contextlib.contextmanager
def _quiet():
    """trackio's own ``print`` lines go to this module's debug log, not the command's output."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        for text in buffer.getvalue().splitlines():
            logger.debug("trackio: %s", text)


def trackio_extras() -> Sink:
    """For the callback in the training process, whose metrics reach the run through ``Trainer.log``
    (``TrackioCallback``): the figure and the tables, into the run open in the process (none open: nothing)."""
    writers: dict[str, TrackioWriter] = {}

    def send(point: Point) -> None:
        run = require("trackio").context_vars.current_run.get()
        if run is None:
            return
        writer = writers.setdefault(run.id, TrackioWriter(run, metrics=False))
        writer.send(point)

    return Sink("the training's trackio run", send, figure=True)
