"""The run's own dashboards for probes scored outside the training process: ``tinymcf watch`` and ``sweep --report-to``.

Each line the watcher or the sweep writes to the history goes, on the main process, to the same places
the callback's metrics reach through ``Trainer.log``, under the same names (``eval/moral_<name>/score``,
...) at the Trainer's global step:

- ``tensorboard``: a second event file in the run's own TensorBoard folder (the Trainer's
  ``runs/<time>_<host>``, as the run's ``moral_probe_run.json`` records it, else the newest folder under
  ``<run>/runs``, else ``TENSORBOARD_LOGGING_DIR``): TensorBoard merges the files of one folder into one
  run, so the probe's curves sit beside the loss;
- ``wandb``: the training run itself, resumed by its id (recorded by the callback, or ``--wandb-run``)
  without disturbing the training process: online in wandb's shared mode (a second writer, not the
  primary one), offline as an offline run of the same id in the same folder (``wandb sync`` puts both
  into the run). Every probe key is plotted against ``train/global_step`` (``define_metric``), because
  wandb drops a row whose own step is below the run's current one, which is what a late score is;
- any other tracker accelerate knows (``comet_ml``, ``mlflow``, ``aim``, ...): through
  ``accelerate.Accelerator(log_with=...)``, a run named after the run folder.

They go through :class:`~tinymcf_callback.training.logger.ProbeLogger`'s sinks, so a custom loop's
metrics and these reach a tracker alike. A tracker that fails is a warning; the history is the record.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from ..errors import SweepError
from ..extras import require
from ..results.metrics import dashboard_names
from ..results.runinfo import read_run_info
from ..training.logger import Sink, as_sink
from ..training.writers import PRECISION_CONFIG

logger = logging.getLogger("tinymcf_callback")

AUTO = "auto"  # the Trainer's own reporters, as the run's moral_probe_run.json records them


class Dashboards:
    """Open trackers of one run, fed line by line; :meth:`close` ends what this process opened."""

    def __init__(self, sinks: list[Sink], closers: list):
        self.sinks, self._closers = sinks, closers

    def __bool__(self) -> bool:
        return bool(self.sinks)

    @property
    def names(self) -> list[str]:
        return [sink.what for sink in self.sinks]

    def send(self, line: dict) -> None:
        """One history line's metrics (and its table) at its step; a gap line sends nothing."""
        if not line.get("metrics") or not self.sinks:
            return
        report = {**{f: line.get(f) for f in PRECISION_CONFIG},
                  "table": pd.DataFrame(line["table"]).set_index("foundation") if line.get("table") else None}
        probe = (line["name"], line.get("answer_format") or "yesno")
        for sink in self.sinks:
            try:
                sink(dashboard_names(line["metrics"]), line["step"], report if report["table"] is not None else None,
                     probe)
            except Exception as e:  # noqa: BLE001 - a tracker's trouble costs its curve, not the history
                logger.warning("moral probe: step %d not sent to %s: %s: %s", line["step"], sink.what,
                               type(e).__name__, e)

    def close(self) -> None:
        for close in self._closers:
            try:
                close()
            except Exception as e:  # noqa: BLE001
                logger.warning("moral probe: closing a tracker failed: %s: %s", type(e).__name__, e)


def open_dashboards(run_dir: Path, report_to: list[str], *, wandb_run: str | None = None,
                    tensorboard_dir: str | None = None) -> Dashboards:
    """The trackers of ``report_to`` opened for the run in ``run_dir`` (``["auto"]``: the Trainer's own ones that
    the run's ``moral_probe_run.json`` names; nothing when it names none)."""
    info = read_run_info(run_dir)
    names = list(report_to)
    if AUTO in names:
        names.remove(AUTO)
        names += [n for n in info.get("report_to") or [] if n not in names]
    sinks, closers = [], []
    for name in dict.fromkeys(names):
        if name == "tensorboard":
            writer = _tensorboard(run_dir, info, tensorboard_dir)
            sinks.append(Sink(f"TensorBoard ({writer.log_dir})", as_sink(writer)._send))
            closers.append(writer.close)
        elif name == "wandb":
            try:
                run, opened_here = _wandb(run_dir, info, wandb_run)
            except SweepError:
                raise  # nothing names a run: the user's setup, said in one line
            except Exception as e:  # noqa: BLE001 - wandb's service not answering costs its curve, not the scoring
                logger.warning("moral probe: the wandb run could not be opened (%s: %s); lines go to the history "
                               "and the other trackers only", type(e).__name__, " ".join(str(e).split())[:300])
                continue
            sinks.append(Sink(f"wandb run {run.id}", as_sink(run)._send))
            if opened_here:  # the run this process trains in is the training's to finish
                closers.append(run.finish)
        elif name not in ("none", ""):
            accelerator = _accelerate(run_dir, name)
            sinks.append(Sink(f"accelerate's {name} tracker", as_sink(accelerator)._send))
            closers.append(accelerator.end_training)
    return Dashboards(sinks, closers)


def tensorboard_folder(run_dir: Path, info: dict, given: str | None = None) -> Path:
    """Where the Trainer's TensorBoard events are: given, recorded by the callback, the newest ``runs/*``, or new."""
    for candidate in (given, info.get("tensorboard_dir"), os.environ.get("TENSORBOARD_LOGGING_DIR")):
        if candidate:
            return Path(candidate)
    runs = sorted((p for p in (run_dir / "runs").glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else run_dir / "runs" / "tinymcf"


def _tensorboard(run_dir: Path, info: dict, given: str | None):
    require("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(tensorboard_folder(run_dir, info, given)), filename_suffix=".tinymcf")


def _wandb(run_dir: Path, info: dict, given: str | None):
    """The training's wandb run, resumed as a second writer (shared mode online; an offline run of the same id),
    and whether it was opened here (else it is the training's own, open in this process)."""
    wandb = require("wandb")
    recorded = info.get("wandb") or {}
    run_id = given or recorded.get("id")
    if not run_id:
        raise SweepError(f"no wandb run to log into: {run_dir} has no moral_probe_run.json naming one (the callback "
                         f"writes it when the Trainer reports to wandb); pass --wandb-run ID (and WANDB_PROJECT)")
    project = recorded.get("project") or os.environ.get("WANDB_PROJECT")
    kwargs = {"id": run_id, "project": project, "entity": recorded.get("entity") or os.environ.get("WANDB_ENTITY"),
              "dir": recorded.get("dir"), "resume": "allow",
              "reinit": "create_new"}  # a run this process has open (another id) stays open, untouched
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


def _accelerate(run_dir: Path, name: str):
    from accelerate import Accelerator

    accelerator = Accelerator(log_with=[name], project_dir=str(run_dir))
    accelerator.init_trackers(run_dir.name)
    return accelerator
