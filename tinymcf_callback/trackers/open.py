"""The trackers a run folder names, opened for probes scored outside the training process (sweep, watch).

Each line the watcher or the sweep writes goes, on the main process, to the same places the callback's
metrics reach through ``Trainer.log``, under the same names, at the Trainer's global step:

- ``tensorboard``: the probe's own folder inside the run's TensorBoard logging folder (:mod:`.tensorboard`);
- ``wandb``: the training run itself, resumed by its id, without disturbing the training process (:mod:`.wandb`);
- ``mlflow``: the training's MLflow run, by its id and tracking URI (:mod:`.mlflow`);
- ``trackio``: the training's trackio run, by its project and name (:mod:`.trackio`);
- any other tracker accelerate knows (``comet_ml``, ``aim``, ``clearml``, ``dvclive``, ``swanlab``): through
  ``accelerate.Accelerator(log_with=...)``, a run named after the run folder;
- ``auto``: the Trainer's own reporters, as the run's ``moral_probe_run.json`` records them.

A tracker named but not installed is an error naming what to install, before anything is scored: nothing is logged
without a word. A tracker that fails later is a warning and a missed step (:class:`~.sinks.Trackers`); the history
is the record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, MissingExtraError, SweepError
from ..rundir.record import RunRecord
from .mlflow import mlflow_sink
from .sinks import Sink, Trackers
from .targets import as_sink
from .tensorboard import tensorboard_sink
from .trackio import trackio_sink
from .wandb import wandb_sink

logger = logging.getLogger(__name__)

AUTO = "auto"  # the Trainer's own reporters, as the run's moral_probe_run.json records them
OWN = ("tensorboard", "wandb", "mlflow", "trackio")  # written by this package, into the training's own run
# accelerate's other trackers: the package each needs
ACCELERATE = {"comet_ml": "comet_ml", "aim": "aim", "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab"}


@dataclass
class Destinations:
    """Which runs to log into when the run's record does not say (a run trained without the callback)."""

    wandb_run: str | None = None  # --wandb-run ID
    tensorboard_dir: str | None = None  # --tensorboard-dir DIR
    mlflow_run: str | None = None  # --mlflow-run RUN_ID
    trackio_run: str | None = None  # --trackio-run PROJECT/RUN


def tracker_names(report_to: list[str] | tuple[str, ...], record: RunRecord | None) -> list[str]:
    """``report_to`` with ``auto`` replaced by the Trainer's reporters the run's record names; an unknown name is a
    :class:`ConfigError` listing the known ones."""
    names = list(report_to)
    if AUTO in names:
        names.remove(AUTO)
        names += [n for n in (record.report_to if record else []) if n not in names]
    names = [n for n in dict.fromkeys(names) if n not in ("none", "")]
    unknown = [n for n in names if n not in OWN and n not in ACCELERATE]
    if unknown:
        raise ConfigError(f"--report-to: unknown tracker(s) {', '.join(unknown)}; choose from auto, "
                          f"{', '.join(OWN)}, {', '.join(ACCELERATE)} (comma-separated) or none")
    return names


def open_trackers(run_dir: Path, report_to: list[str] | tuple[str, ...], key: str, *,
                  record: RunRecord | None = None, where: Destinations | None = None,
                  figure: Callable[[list[dict]], object] | None = None) -> Trackers:
    """The trackers of ``report_to`` opened for probe ``key`` of the run in ``run_dir``; ``auto`` adds the ones the
    run's record names (nothing when there is none). A tracker that is not installed is a
    :class:`~tinymcf_callback.errors.MissingExtraError`, one whose run is not named a :class:`SweepError`; a wandb
    service not answering is a warning."""
    record = record if record is not None else RunRecord.read(run_dir)
    where = where or Destinations()
    sinks = []
    for name in tracker_names(report_to, record):
        if name == "tensorboard":
            sinks.append(tensorboard_sink(run_dir, record, key, where.tensorboard_dir))
        elif name == "wandb":
            sink = _wandb(run_dir, record, where.wandb_run)
            if sink is not None:
                sinks.append(sink)
        elif name == "mlflow":
            sinks.append(mlflow_sink(run_dir, record, where.mlflow_run))
        elif name == "trackio":
            sinks.append(trackio_sink(run_dir, record, where.trackio_run))
        else:
            sinks.append(_accelerate_sink(run_dir, name))
    return Trackers(sinks, figure=figure)


def _wandb(run_dir: Path, record: RunRecord | None, given: str | None) -> Sink | None:
    try:
        return wandb_sink(run_dir, record, given)
    except (SweepError, ConfigError, MissingExtraError):
        raise  # nothing names a run, or wandb is not installed: the user's setup, said in one line
    except Exception as e:  # noqa: BLE001 - wandb's service not answering costs its curve, not the scoring
        logger.warning("moral probe: the wandb run could not be opened (%s: %s); lines go to the history and the "
                       "other trackers only", type(e).__name__, " ".join(str(e).split())[:300])
        return None


def _accelerate_sink(run_dir: Path, name: str) -> Sink:
    from accelerate import Accelerator

    accelerator = Accelerator(log_with=[name], project_dir=str(run_dir))
    accelerator.init_trackers(run_dir.name)
    if not accelerator.trackers:
        raise ConfigError(f"--report-to {name}: accelerate found no {name} tracker (the {ACCELERATE[name]} package "
                          f"is not installed): pip install {ACCELERATE[name]}")
    return Sink(f"accelerate's {name} tracker", as_sink(accelerator).send, accelerator.end_training)
