"""The probe in the training's own trackio run: its metrics with their bounds, its figure and its tables.

A follower opens the run again (``resume="must"``: never a new one) and places each point on the Trainer's row of
its ``train/global_step`` (:meth:`TrackioTracker.anchor`), since trackio plots against a row counter, not the
training's step. docs/dashboards.md ("trackio").
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
from pathlib import Path

from ..errors import SweepError
from ..extras import require
from ..stats.metrics import dashboard_names
from .sinks import Point, by_step, line_metrics, line_probe_key
from .tracker import Tracker

logger = logging.getLogger(__name__)
SETTLE_S = 1.0  # twice trackio's batch interval (0.5 s): a row the training logged has reached its store by then


def _trackio_dir() -> Path:
    from trackio.utils import TRACKIO_DIR

    return Path(TRACKIO_DIR)


class TrackioTracker(Tracker):
    """The training's trackio run (see the module). The record keeps its ``project``, ``name``, ``id``, ``dir`` (the
    local folder) and ``space_id`` or ``server_url`` (never a token)."""

    name = "trackio"
    option = ("--trackio-run", "PROJECT/RUN", "the trackio run to log into (default: the one moral_probe_run.json "
              "records)")

    def __init__(self, run, where: str, *, metrics: bool = True, follower: bool = True, owned: bool = False):
        super().__init__(f"trackio run {run.name} of {run.project}{' (' + where + ')' if where else ''}")
        # in the training its rows come right after the Trainer's own row of the probe's step; a follower places each
        # point beside the Trainer's rows of its step
        self.run, self.metrics, self.follower, self._owned = run, metrics, follower, owned

    # ---- the training process ------------------------------------------------------------------------------
    @classmethod
    def recorded(cls, args, trainer=None) -> dict | None:
        """The run open in this process (the Trainer's ``TrackioCallback`` opens it): project, name, id, the local
        folder, and the Space or server it syncs to (never a token)."""
        trackio = require("trackio")
        run = trackio.context_vars.current_run.get()
        if run is None:
            return None
        space = trackio.context_vars.current_space_id.get()
        server = None if space else trackio.context_vars.current_server.get()
        return {"project": run.project, "name": run.name, "id": run.id, "dir": str(_trackio_dir()),
                "space_id": space, "server_url": server}

    @classmethod
    def in_training(cls, args, key: str, run: dict | None, *, numbers: bool) -> TrackioTracker | None:
        """The figure and the tables (with ``numbers``, the metrics too, with their ``train/global_step``) into the
        run ``TrackioCallback`` opened: the next rows, beside the Trainer's row of the probe's step."""
        live = require("trackio").context_vars.current_run.get()
        return None if live is None else cls(live, "the training's", metrics=numbers, follower=False)

    # ---- another process -----------------------------------------------------------------------------------
    @classmethod
    def reopen(cls, run_dir: Path, recorded: dict | None, given: str | None, key: str) -> TrackioTracker:
        """The training's run (``given``: ``PROJECT/RUN``; else the one the record names), opened again in this
        process: never a new run."""
        recorded = recorded or {}
        _use_recorded_dir(recorded.get("dir"))
        trackio = require("trackio")
        if given:
            project, sep, name = given.rpartition("/")
            if not sep or not project or not name:
                raise SweepError(f"--trackio-run takes PROJECT/RUN (the trackio project and run name), got {given!r}")
            recorded = {"project": project, "name": name}
        if not recorded.get("project") or not recorded.get("name"):
            raise SweepError(f"no trackio run to log into: {run_dir} has no moral_probe_run.json naming one (the "
                             f"callback writes it when the Trainer reports to trackio); pass --trackio-run PROJECT/RUN")
        live = trackio.context_vars.current_run.get()
        if live is not None:
            if (live.project, live.name) == (recorded["project"], recorded["name"]):
                return cls(live, "")
            raise SweepError(f"this process has the trackio run {live.name} of {live.project} open: logging into "
                             f"{recorded['name']} of {recorded['project']} would finish it (trackio keeps one run per "
                             f"process); run tinymcf sweep or watch in a process of its own")
        where = recorded.get("dir") or str(_trackio_dir())
        if recorded.get("dir") and Path(recorded["dir"]) != _trackio_dir():
            raise SweepError(f"the trackio run {recorded['name']} of {recorded['project']} is in {recorded['dir']}, "
                             f"but this process's trackio writes to {_trackio_dir()}: set TRACKIO_DIR="
                             f"{recorded['dir']}")
        try:
            with _quiet():  # trackio prints where it logs and how to open the dashboard: said once here instead
                run = trackio.init(project=recorded["project"], name=recorded["name"], resume="must",
                                   space_id=recorded.get("space_id"), server_url=recorded.get("server_url"),
                                   embed=False, auto_log_cpu=False, auto_log_gpu=False)
        except ValueError as e:
            raise SweepError(f"the trackio run {recorded['name']} of project {recorded['project']} cannot be resumed "
                             f"({e}; trackio's folder: {where}): pass --trackio-run PROJECT/RUN of the training's "
                             f"run, with the TRACKIO_DIR it logs to") from None
        return cls(run, where, owned=True)

    # ---- points --------------------------------------------------------------------------------------------
    def send(self, point: Point) -> None:
        """The metrics (unless they went through ``Trainer.log``), the figure and the tables, at :meth:`anchor`'s
        trackio step (a follower's) or trackio's next row."""
        import pandas as pd

        trackio = require("trackio")
        line, key = point.line, line_probe_key(point.line) or "probe"
        payload = line_metrics(line) if self.metrics else {}
        if point.figure is not None:
            payload[f"eval/moral_{key}/figure"] = trackio.Image(point.figure,
                                                                caption=f"train/global_step {point.step}")
        if point.fresh and line.get("table"):
            rows = pd.DataFrame([{"step": point.step, **row} for row in line["table"]])
            payload[f"eval/moral_{key}/table"] = trackio.Table(dataframe=rows)
        if point.rows:
            payload[f"eval/moral_{key}/vignette_rows"] = trackio.Table(dataframe=pd.DataFrame(point.rows))
        if payload:
            step = self.anchor(point) if self.follower else None
            self.run.log({**payload, "train/global_step": point.step}, step=step)

    def anchor(self, point: Point) -> int | None:
        """The trackio step of the point: the first row the Trainer logged at its ``train/global_step``, else the last
        it logged before it, else its first row (0 before any), the probe's own rows left out; past the Trainer's
        newest row the store is read again after :data:`SETTLE_S`. None (trackio's next row): a run not stored here."""
        if self.run_is_remote():
            return None
        at, before, after = self._around(point.step)
        if at is None and after is None and before is not None:
            time.sleep(SETTLE_S)  # at the training's newest step: its row may still be in its writer's queue
            at, before, after = self._around(point.step)
        return next((s for s in (at, before, after) if s is not None), 0)

    def _around(self, global_step: int) -> tuple[int | None, int | None, int | None]:
        """The trackio steps of the Trainer's rows (the probe's own left out): the first at ``global_step``, the last
        before it, the first after it."""
        at, before, after = None, None, None
        for row in self._rows():
            if any(k.startswith("eval/moral_") for k in row) or not _number(row.get("train/global_step")):
                continue
            step = row["step"]
            if row["train/global_step"] == global_step:
                at = step if at is None else min(at, step)
            elif row["train/global_step"] < global_step:
                before = step if before is None else max(before, step)
            else:
                after = step if after is None else min(after, step)
        return at, before, after

    def held(self, name: str) -> dict[int, list[float]] | None:
        """The values of ``name`` the run's rows hold, by ``train/global_step`` (local store only: None for a run
        synced to a Space or a server)."""
        if self.run_is_remote():
            return None
        tag = next(iter(dashboard_names({name: 0.0})))
        return by_step((int(row["train/global_step"]), float(row[tag])) for row in self._rows()
                       if _number(row.get(tag)) and _number(row.get("train/global_step")))

    def run_is_remote(self) -> bool:
        trackio = require("trackio")
        return bool(trackio.context_vars.current_space_id.get() or trackio.context_vars.current_server.get())

    def finish(self) -> None:
        if not self._owned:
            return  # the training's own run: the training finishes it
        trackio = require("trackio")
        with _quiet():
            self.run.finish()
        if trackio.context_vars.current_run.get() is self.run:
            trackio.context_vars.current_run.set(None)

    def _rows(self) -> list[dict]:
        """The run's rows in trackio's local store, numbers only (with trackio's ``step``)."""
        from trackio.sqlite_storage import SQLiteStorage

        return SQLiteStorage.get_logs(self.run.project, self.run.name, run_id=self.run.id, scalar_only=True)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
