"""The probe in the training's own MLflow run: its metrics with their bounds, its figure and its tables at each step.

The callback records the run the Trainer's ``MLflowCallback`` opened (its id, experiment and tracking URI) in
``moral_probe_run.json``; the sweep and the watcher write into that run through an ``MlflowClient`` of that URI
(a tracking server, or the sqlite store the training writes to: each write is one transaction of MLflow's own, with
the store's busy timeout), never starting a run and never ending one. What a point gives the run, at the
Trainer's global step:

- the metrics under the names ``MLflowCallback`` gives the callback's (``eval_moral_<name>/score``; MLflow keeps a
  name as logged): each value beside its ``_lo`` and ``_hi``;
- the figure of the curve so far, ``mlflow.log_image`` with the step (the run's image panels, with a step slider);
- the per-foundation rows and the per-vignette rows, each one table with a ``step`` column
  (``moral_probe_<name>/foundations.json``, ``/vignettes.json``: ``log_table`` appends, so every probe's rows are
  kept; the run's Artifacts and Evaluation views show them).

A tracking URI is recorded without the credentials it may carry (``https://user:token@host``): the follower takes
them from its own environment (``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``/``_TOKEN``), as MLflow does.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pandas as pd

from ..errors import SweepError
from ..extras import require
from ..rundir.record import RunRecord
from .sinks import Point, Sink, line_probe_key

logger = logging.getLogger(__name__)

NAMED_STORES = ("databricks", "databricks-uc", "uc")  # tracking URIs MLflow takes by name, not as a path


def mlflow_name(key: str) -> str:
    """A logged name as ``MLflowCallback`` writes it (characters MLflow refuses become ``_``)."""
    return re.sub(r"[^0-9A-Za-z_\-\.\ :/]", "_", key)


class MlflowWriter:
    """Points into one MLflow run through a client: metrics (``metrics=False``: they went through ``Trainer.log``),
    the figure and the tables."""

    def __init__(self, client, run_id: str, *, metrics: bool = True):
        self.client, self.run_id, self.metrics = client, run_id, metrics
        # log_table reads the table back to append to it: without this, MLflow draws a download bar at every probe
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    def send(self, point: Point) -> None:
        from mlflow.entities import Metric

        line, step = point.line, point.step
        key = line_probe_key(line)
        now = int(time.time() * 1000)
        if self.metrics:
            values = [Metric(mlflow_name(k), float(v), now, step) for k, v in (line.get("metrics") or {}).items()]
            for start in range(0, len(values), 1000):  # MLflow takes at most 1000 metrics per batch
                self.client.log_batch(self.run_id, metrics=values[start:start + 1000])
        if point.figure is not None:
            self.client.log_image(self.run_id, point.figure, key=f"eval_moral_{key}/figure", step=step, timestamp=now)
        if point.fresh and line.get("table"):
            table = pd.DataFrame([{"step": step, **row} for row in line["table"]])
            self.client.log_table(self.run_id, table, f"moral_probe_{key}/foundations.json")
        if point.rows:
            self.client.log_table(self.run_id, pd.DataFrame(point.rows), f"moral_probe_{key}/vignettes.json")


def public_uri(uri: str) -> str:
    """``uri`` without a user name or password in it (never written to a file); a relative sqlite or file store made
    absolute (a follower started elsewhere finds it)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + os.path.abspath(uri[len("sqlite:///"):])
    parts = urlsplit(uri)
    if uri in NAMED_STORES:
        return uri
    if parts.scheme in ("", "file") and not parts.netloc:
        return Path(os.path.abspath(parts.path)).as_uri() if parts.path else uri
    if "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return uri


def active_run_facts() -> dict | None:
    """The MLflow run open in this process (the Trainer's ``MLflowCallback`` opens it at train begin): its id,
    experiment, name and tracking URI (without credentials); None when none is open."""
    mlflow = require("mlflow")
    run = mlflow.active_run()
    if run is None:
        return None
    return {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id, "run_name": run.info.run_name,
            "tracking_uri": public_uri(mlflow.get_tracking_uri())}


def mlflow_sink(run_dir: Path, record: RunRecord | None, given: str | None = None) -> Sink:
    """The training's MLflow run (``given``: a run id, with ``MLFLOW_TRACKING_URI``; else the one the run's record
    names), written to through a client: never a new run."""
    mlflow = require("mlflow")
    from mlflow.tracking import MlflowClient

    recorded = record.mlflow if record and record.mlflow else {}
    run_id = given or recorded.get("run_id")
    if not run_id:
        raise SweepError(f"no MLflow run to log into: {run_dir} has no moral_probe_run.json naming one (the callback "
                         f"writes it when the Trainer reports to mlflow); pass --mlflow-run RUN_ID (and "
                         f"MLFLOW_TRACKING_URI)")
    uri = (recorded.get("tracking_uri") if not given else None) or mlflow.get_tracking_uri()
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except Exception as e:  # noqa: BLE001 - a run that is not there: the user's setup, said in one line
        raise SweepError(f"the MLflow run {run_id} cannot be read at {public_uri(uri)} ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]}); pass --mlflow-run RUN_ID with MLFLOW_TRACKING_URI of "
                         f"the store the training logs to") from None
    if run.info.lifecycle_stage != "active":
        raise SweepError(f"the MLflow run {run_id} at {public_uri(uri)} is deleted: restore it (mlflow runs restore) "
                         f"or pass --mlflow-run RUN_ID of another")
    return Sink(f"MLflow run {run_id} ({public_uri(uri)})", MlflowWriter(client, run_id).send, figure=True)


def mlflow_extras() -> Sink:
    """For the callback in the training process, whose metrics reach the run through ``Trainer.log``
    (``MLflowCallback``): the figure and the tables, into the run open in the process (none open: nothing)."""
    writers: dict[str, MlflowWriter] = {}

    def send(point: Point) -> None:
        mlflow = require("mlflow")
        run = mlflow.active_run()
        if run is None:
            return
        run_id = run.info.run_id
        if run_id not in writers:
            writers[run_id] = MlflowWriter(mlflow.tracking.MlflowClient(), run_id, metrics=False)
        writers[run_id].send(point)

    return Sink("the training's MLflow run", send, figure=True)
