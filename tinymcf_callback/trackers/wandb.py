"""The probe in a wandb run: one recipe for the callback, ``ProbeLogger``, the sweep and the watcher.

Every ``eval/moral_<name>/...`` key is plotted against ``train/global_step`` (``define_metric``): wandb silently
drops a row whose own step is below the run's current one, which is what a score that comes late is. What a run
gets: docs/dashboards.md ("Weights & Biases").
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..errors import ConfigError, MissingExtraError, SweepError, one_line
from ..extras import require
from ..stats.metrics import dashboard_names
from ..views.rows import ROW_COLUMNS
from .bands import band_rows
from .sinks import Point, by_step, line_metrics, line_probe_key
from .tracker import Tracker

logger = logging.getLogger(__name__)

PRECISION_CONFIG = ("dtype", "autocast", "compute", "device")  # the line's fields put in a wandb run's config
BAND_CHART = "tinymcf-interval-band"  # the custom chart preset's name in the run's entity
BAND_FIELDS = {"step": "step", "metric": "metric", "value": "value", "lo": "lo", "hi": "hi"}
BAND_SPEC = {
    "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
    "description": "A value per training step with its interval as a band, one panel per metric (tinymcf_callback)",
    "data": {"name": "wandb"},
    "facet": {"field": "${field:metric}", "type": "nominal", "title": None,
              "header": {"labelFontSize": 11, "labelLimit": 260}},
    "columns": 4,
    "resolve": {"scale": {"y": "independent"}},
    "spec": {
        "width": 230, "height": 150,
        "encoding": {"x": {"field": "${field:step}", "type": "quantitative", "title": "training step"}},
        "layer": [
            {"mark": {"type": "area", "opacity": 0.25, "color": "#0072B2"},
             "encoding": {"y": {"field": "${field:lo}", "type": "quantitative", "title": None,
                                "scale": {"zero": False}},
                          "y2": {"field": "${field:hi}"}}},
            {"mark": {"type": "line", "point": True, "color": "#0072B2"},
             "encoding": {"y": {"field": "${field:value}", "type": "quantitative", "title": None,
                                "scale": {"zero": False}},
                          "tooltip": [{"field": "${field:step}", "type": "quantitative", "title": "step"},
                                      {"field": "${field:value}", "type": "quantitative", "format": "+.3f"},
                                      {"field": "${field:lo}", "type": "quantitative", "format": "+.3f"},
                                      {"field": "${field:hi}", "type": "quantitative", "format": "+.3f"}]}},
        ],
    },
}
RECORD_BLOCK = 32768  # a wandb run file's block size (a leveldb-style log)
RUN_FILE = "wandb"  # a wandb run file's suffix
_presets: dict[str, bool] = {}  # entity -> whether its band-chart preset is there (asked once per process)


class WandbWriter:
    """One probe (set and answer format) in wandb runs: its metric definitions and config once per run, its tables
    kept whole across probes (one incremental table per key and run)."""

    def __init__(self, key: str):
        self.key = f"moral_{key}"
        self._defined: str | None = None  # the run whose metrics are defined
        self._recorded: str | None = None  # the run whose config holds the precision
        self._tables: dict[str, object] = {}  # table key -> its incremental wandb.Table (of the run in _defined)
        self._said: set[str] = set()

    def write(self, run, point: Point, *, metrics: bool = True) -> None:
        """The point at its step: its metrics (``metrics=False`` when they went another way: the callback's, through
        ``Trainer.log``), tables, figure and band chart."""
        line = point.line
        wandb = require("wandb")
        if self._defined != run.id:
            run.define_metric(f"eval/{self.key}/*", step_metric="train/global_step")
            self._defined, self._tables = run.id, {}
        if self._recorded != run.id:
            run.config.update({f"{self.key}/{field}": line.get(field) for field in PRECISION_CONFIG},
                              allow_val_change=True)
            self._recorded = run.id
        payload = line_metrics(line) if metrics else {}
        if point.fresh:
            table = self._table(f"eval/{self.key}/table", ["step", *(line.get("table") or [{}])[0]],
                                [_foundation_rows(earlier) for earlier in point.curve[:-1]])
            if table is not None and self._add(table, _foundation_rows(line)):
                payload[f"eval/{self.key}/table"] = table
            vignettes = self._table(f"eval/{self.key}/vignette_rows", list(ROW_COLUMNS), [])
            if self._add(vignettes, point.rows or []):
                payload[f"eval/{self.key}/vignette_rows"] = vignettes
        if point.figure is not None:
            payload[f"eval/{self.key}/figure"] = wandb.Image(point.figure, caption=f"train/global_step {point.step}")
        if point.fresh and point.curve:
            chart = self._band_chart(wandb, run, point)
            if chart is not None:
                payload[f"eval/{self.key}/intervals"] = chart
        if payload:
            run.log({**payload, "train/global_step": point.step})

    # ---- tables --------------------------------------------------------------------------------------------
    def _table(self, key: str, columns: list[str], earlier: list[list[dict]]):
        """The run's incremental table under ``key``; a new one starts with the rows of ``earlier`` probes (the curve
        so far: a run resumed, a watcher started again)."""
        if key not in self._tables:
            if len(columns) <= 1:
                return None
            table = require("wandb").Table(columns=columns, log_mode="INCREMENTAL")
            for rows in earlier:
                self._add(table, rows)
            self._tables[key] = table
        return self._tables[key]

    @staticmethod
    def _add(table, rows: list[dict]) -> bool:
        for row in rows:
            table.add_data(*[row.get(column) for column in table.columns])
        return bool(rows)

    # ---- the band chart ------------------------------------------------------------------------------------
    def _band_chart(self, wandb, run, point: Point):
        entity = _entity(run)
        why = None
        if _offline(run):
            why = "the run is offline"
        elif not entity:
            why = "the run names no entity"
        elif not _preset(entity):
            why = f"the chart preset {entity}/{BAND_CHART} could not be created (see the earlier warning)"
        if why is not None:
            if "chart" not in self._said:
                self._said.add("chart")
                logger.warning("moral probe: the W&B interval chart (eval/%s/intervals) is left out: %s; the figure "
                            "(eval/%s/figure) shows every band", self.key, why, self.key)
            return None
        columns = list(BAND_FIELDS.values())
        table = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in band_rows(point.curve)])
        return wandb.plot_table(f"{entity}/{BAND_CHART}", table, BAND_FIELDS,
                                {"title": f"{self.key}: each value with its interval"})


def _foundation_rows(line: dict) -> list[dict]:
    return [{"step": line["step"], **row} for row in line.get("table") or []]


def _entity(run) -> str | None:
    return getattr(run, "entity", None) or os.environ.get("WANDB_ENTITY") or None


def _offline(run) -> bool:
    settings = getattr(run, "settings", None)
    return str(getattr(settings, "mode", "") or "").lower() in ("offline", "dryrun", "disabled")


def _preset(entity: str) -> bool:
    """Whether the entity has the band chart's preset: created here once per process (an error saying it exists is
    taken for yes)."""
    if entity not in _presets:
        wandb = require("wandb")
        try:
            wandb.Api().create_custom_chart(entity=entity, name=BAND_CHART, display_name="tinymcf: value with its "
                                            "interval band", spec_type="vega2", access="private",
                                            spec=json.dumps(BAND_SPEC))
            _presets[entity] = True
        except Exception as e:  # noqa: BLE001 - the chart is an extra: its trouble costs the chart
            exists = "exist" in str(e).lower()
            _presets[entity] = exists
            if not exists:
                logger.warning("moral probe: the W&B chart preset %s/%s could not be created (%s); the interval "
                               "chart is left out, the figure shows the bands", entity, BAND_CHART, one_line(e, 200))
    return _presets[entity]


class WandbTracker(Tracker):
    """The training's wandb run (see the module). The record keeps its ``id``, ``project``, ``entity``, ``mode``
    (offline or online) and ``dir`` (the folder its files are in)."""

    name = "wandb"
    option = ("--wandb-run", "ID", "the wandb run to log into (default: the one moral_probe_run.json records)")

    def __init__(self, run, *, metrics: bool = True, finish: bool = False):
        super().__init__(f"wandb run {run.id}")
        self.run, self.metrics, self._owned = run, metrics, finish
        self._writers: dict[str, WandbWriter] = {}

    # ---- the training process ------------------------------------------------------------------------------
    @classmethod
    def recorded(cls, args, trainer=None) -> dict | None:
        run = require("wandb").run  # the current run, None when none was started
        if run is None:
            return None
        settings = getattr(run, "settings", None)
        return {"id": run.id, "project": run.project, "entity": getattr(run, "entity", None),
                "mode": getattr(settings, "mode", None), "dir": getattr(settings, "root_dir", None)}

    @classmethod
    def in_training(cls, args, key: str, run: dict | None, *, numbers: bool) -> WandbTracker | None:
        """The tables, the figure and the band chart (with ``numbers``, the metrics too, against
        ``train/global_step``), into the run the Trainer's ``WandbCallback`` opened."""
        live = require("wandb").run
        return None if live is None else cls(live, metrics=numbers)

    # ---- another process -----------------------------------------------------------------------------------
    @classmethod
    def reopen(cls, run_dir: Path, recorded: dict | None, given: str | None, key: str) -> WandbTracker | None:
        """The training's run resumed as a second writer (:func:`open_run`); a wandb service that does not answer is
        a warning (None): the other trackers and the history go on."""
        try:
            run, opened_here = open_run(run_dir, recorded, given)
        except (SweepError, ConfigError, MissingExtraError):
            raise  # nothing names a run, or wandb is not installed: the user's setup, said in one line
        except Exception as e:  # noqa: BLE001 - wandb's service not answering costs its curve, not the scoring
            logger.warning("moral probe: the wandb run could not be opened (%s); lines go to the history and the "
                           "other trackers only", one_line(e))
            return None
        return cls(run, finish=opened_here)

    # ---- points --------------------------------------------------------------------------------------------
    def send(self, point: Point) -> None:
        key = line_probe_key(point.line) or "probe"
        self._writers.setdefault(key, WandbWriter(key)).write(self.run, point, metrics=self.metrics)

    def held(self, name: str) -> dict[int, list[float]] | None:
        """The values of ``name`` the run holds, by ``train/global_step``: asked of W&B's server for an online run
        (its public API), read from the run's files here for an offline one (or when the server cannot be asked)."""
        tag = next(iter(dashboard_names({name: 0.0})))
        if not _offline(self.run):
            try:
                return _held_online(self.run, tag)
            except Exception as e:  # noqa: BLE001 - the files of this machine may still say
                logger.debug("wandb's API could not say what run %s holds: %s", self.run.id, e)
        return _held_in_files(self.run, tag)

    def finish(self) -> None:
        if self._owned:
            self.run.finish()


def _held_online(run, tag: str) -> dict[int, list[float]]:
    api = require("wandb").Api()
    path = "/".join(p for p in (_entity(run), run.project, run.id) if p)
    rows = api.run(path).scan_history(keys=[tag, "train/global_step"], page_size=1000)
    return by_step((int(row["train/global_step"]), float(row[tag])) for row in rows)


def _held_in_files(run, tag: str) -> dict[int, list[float]] | None:
    """What every local file of the run (``<dir>/wandb/*-<id>/run-<id>.wandb``: the training's, each follower's)
    holds of ``tag``; None when none is found (the run's files are on another machine)."""
    root = Path(getattr(getattr(run, "settings", None), "root_dir", None) or ".")
    files = sorted(root.glob(f"wandb/*-{run.id}/run-{run.id}.{RUN_FILE}"))
    if not files:
        return None
    return by_step((int(row["train/global_step"]), float(row[tag])) for path in files for row in history_rows(path)
                   if tag in row and "train/global_step" in row)


def history_rows(path: Path) -> list[dict]:
    """The logged rows of a wandb run file (``{key: value}``), read by wandb's own record type: the file is a log of
    32 KiB blocks, each record in chunks with a 7-byte header (checksum, length, kind). A torn last record (a run
    still writing) ends the reading."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    rows, pos, buffer = [], 7, b""  # 7: the file's own header (":W&B", version)
    while pos + 7 <= len(data):
        left = RECORD_BLOCK - pos % RECORD_BLOCK
        if left < 7:  # a block's padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buffer = chunk if kind in (1, 2) else buffer + chunk  # FULL and FIRST start a record, MIDDLE and LAST add
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(buffer)
            except Exception:  # noqa: BLE001 - a torn record: what came before it is all there is
                break
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def open_run(run_dir: Path, recorded: dict | None, given: str | None):
    """The training's wandb run by its id, and whether it was opened here (else it is the training's own, open in
    this process, which the training finishes).

    Online it is joined in wandb's shared mode as a second, non-primary writer; offline as an offline run of the
    same id in the same folder (``wandb sync`` puts both into the run).
    """
    wandb = require("wandb")
    recorded = recorded or {}
    run_id = given or recorded.get("id")
    if not run_id:
        raise SweepError(f"no wandb run to log into: {run_dir} has no moral_probe_run.json naming one (the callback "
                         f"writes it when the Trainer reports to wandb); pass --wandb-run ID (and WANDB_PROJECT)")
    kwargs = {"id": run_id, "project": recorded.get("project") or os.environ.get("WANDB_PROJECT"),
              "entity": recorded.get("entity") or os.environ.get("WANDB_ENTITY"), "dir": recorded.get("dir"),
              "resume": "allow", "reinit": "create_new"}  # a run this process has open (another id) stays open
    live = wandb.run
    if live is not None and live.id == run_id:
        return live, False  # called inside the training process itself: its open run is the one to log into
    # A wandb-core service inherited from a parent process (a training script that started the watcher, a test
    # runner) already holds the training run's id and refuses a second writer of it ("run ID is in use"): this
    # process starts a service of its own.
    os.environ.pop("WANDB_SERVICE", None)
    offline = (recorded.get("mode") or os.environ.get("WANDB_MODE") or "").lower() in ("offline", "dryrun")
    if offline:
        return wandb.init(**kwargs, mode="offline"), True
    settings = wandb.Settings(mode="shared", x_primary=False, x_label="tinymcf")
    return wandb.init(**kwargs, settings=settings), True
