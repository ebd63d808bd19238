"""The probe in the training's own MLflow run: its metrics with their bounds, its figure and its tables at each step.

A follower writes into the run the callback recorded through an ``MlflowClient`` once the store is checked (never a
new run or a new store; a URI is recorded without credentials). docs/dashboards.md ("MLflow").
"""

from __future__ import annotations

import logging
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..errors import SweepError, one_line
from ..extras import require
from .sinks import Point, by_step, line_probe_key
from .tracker import Tracker

logger = logging.getLogger(__name__)

NAMED_STORES = ("databricks", "databricks-uc", "uc")  # tracking URIs MLflow takes by name, not as a path
SERVER_TIMEOUT_S = 10.0  # how long a tracking server has to answer before it is said not to


def mlflow_name(key: str) -> str:
    """A logged name as ``MLflowCallback`` writes it (characters MLflow refuses become ``_``)."""
    return re.sub(r"[^0-9A-Za-z_\-\.\ :/]", "_", key)


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


def check_store(uri: str) -> None:
    """Refuse, in one :class:`SweepError` line naming the whole URI, a tracking store that is not there: a sqlite
    file or a folder that does not exist (MLflow would make a new, empty one, and then not find the run in it), or a
    server that does not answer (MLflow would retry for minutes). Nothing is created; a server that answers anything,
    an error included, is there."""
    shown = public_uri(uri)
    fix = "set MLFLOW_TRACKING_URI to the store the training logs to (moral_probe_run.json records it)"
    if uri.startswith("sqlite:"):
        path = Path(uri.split("sqlite:///", 1)[-1].split("?", 1)[0])
        if not path.is_file():
            raise SweepError(f"the MLflow store {shown} does not exist (no file {path}): {fix}")
        return
    parts = urlsplit(uri)
    if uri in NAMED_STORES or parts.scheme not in ("", "file", "http", "https"):
        return  # a store MLflow reaches its own way (databricks, a plugin's): its client says what is wrong
    if parts.scheme in ("", "file"):
        if not Path(parts.path or ".").is_dir():
            raise SweepError(f"the MLflow store {shown} does not exist (no folder {parts.path}): {fix}")
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=SERVER_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return  # it answered
    except (OSError, ValueError) as e:
        why = getattr(e, "reason", None) or e
        raise SweepError(f"no MLflow tracking server answers at {shown} ({why}): start it, or {fix}") from None


class MlflowTracker(Tracker):
    """The training's MLflow run (see the module). The record keeps its ``run_id``, ``experiment_id``, ``run_name``
    and ``tracking_uri`` (without credentials)."""

    name = "mlflow"
    option = ("--mlflow-run", "RUN_ID", "the MLflow run to log into, at MLFLOW_TRACKING_URI (default: the one "
              "moral_probe_run.json records)")

    def __init__(self, client, run_id: str, where: str, *, metrics: bool = True):
        super().__init__(f"MLflow run {run_id} ({where})")
        self.client, self.run_id, self.metrics = client, run_id, metrics
        # log_table reads the table back to append to it: without this, MLflow draws a download bar at every probe
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    # ---- the training process ------------------------------------------------------------------------------
    @classmethod
    def recorded(cls, args, trainer=None) -> dict | None:
        """The run open in this process (the Trainer's ``MLflowCallback`` opens it at train begin)."""
        mlflow = require("mlflow")
        run = mlflow.active_run()
        if run is None:
            return None
        return {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id, "run_name": run.info.run_name,
                "tracking_uri": public_uri(mlflow.get_tracking_uri())}

    @classmethod
    def in_training(cls, args, key: str, run: dict | None, *, numbers: bool) -> MlflowTracker | None:
        """The figure and the tables (with ``numbers``, the metrics too, at the Trainer's step) into the run
        ``MLflowCallback`` opened (looked up once, at train begin: ``run``), through a client of this process's
        tracking URI."""
        if not run:
            return None
        mlflow = require("mlflow")
        return cls(mlflow.tracking.MlflowClient(), run["run_id"], "the training's", metrics=numbers)

    # ---- another process -----------------------------------------------------------------------------------
    @classmethod
    def reopen(cls, run_dir: Path, recorded: dict | None, given: str | None, key: str) -> MlflowTracker:
        """The training's run (``given``: a run id, with ``MLFLOW_TRACKING_URI``; else the one the record names),
        written to through a client once its store is checked: never a new run, never a new store."""
        mlflow = require("mlflow")
        from mlflow.tracking import MlflowClient

        recorded = recorded or {}
        run_id = given or recorded.get("run_id")
        if not run_id:
            raise SweepError(f"no MLflow run to log into: {run_dir} has no moral_probe_run.json naming one (the "
                             f"callback writes it when the Trainer reports to mlflow); pass --mlflow-run RUN_ID (and "
                             f"MLFLOW_TRACKING_URI)")
        uri = (recorded.get("tracking_uri") if not given else None) or mlflow.get_tracking_uri()
        check_store(uri)
        client = MlflowClient(tracking_uri=uri)
        try:
            run = client.get_run(run_id)
        except Exception as e:  # noqa: BLE001 - a run that is not there: the user's setup, said in one line
            raise SweepError(f"the MLflow run {run_id} cannot be read at {public_uri(uri)} ({one_line(e, 200)}); "
                             f"pass --mlflow-run RUN_ID with MLFLOW_TRACKING_URI of the store the training logs "
                             f"to") from None
        if run.info.lifecycle_stage != "active":
            raise SweepError(f"the MLflow run {run_id} at {public_uri(uri)} is deleted: restore it (mlflow runs "
                             f"restore) or pass --mlflow-run RUN_ID of another")
        return cls(client, run_id, public_uri(uri))

    # ---- points --------------------------------------------------------------------------------------------
    def send(self, point: Point) -> None:
        """The metrics (unless they went through ``Trainer.log``), the figure and the tables, at the point's step."""
        import pandas as pd
        from mlflow.entities import Metric

        line, step = point.line, point.step
        key = line_probe_key(line) or "probe"
        now = int(time.time() * 1000)
        if self.metrics:
            values = [Metric(mlflow_name(k), float(v), now, step) for k, v in (line.get("metrics") or {}).items()]
            for start in range(0, len(values), 1000):  # MLflow takes at most 1000 metrics per batch
                self.client.log_batch(self.run_id, metrics=values[start:start + 1000])
        if point.figure is not None:
            self.client.log_image(self.run_id, point.figure, key=f"eval_moral_{key}/figure", step=step, timestamp=now)
            self.client.log_image(self.run_id, point.figure, artifact_file=f"moral_probe_{key}/figure.png")
        if point.fresh and line.get("table"):
            table = pd.DataFrame([{"step": step, **row} for row in line["table"]])
            self.client.log_table(self.run_id, table, f"moral_probe_{key}/foundations.json")
        if point.rows:
            self.client.log_table(self.run_id, pd.DataFrame(point.rows), f"moral_probe_{key}/vignettes.json")

    def held(self, name: str) -> dict[int, list[float]]:
        """The run's metric history of ``name``, by step."""
        return by_step((m.step, m.value) for m in self.client.get_metric_history(self.run_id, mlflow_name(name)))
