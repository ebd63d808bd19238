"""The trackers a run folder names, opened for probes scored outside the training process (sweep, watch).

Each line the watcher or the sweep writes goes, on the main process, to the same places the callback's
metrics reach through ``Trainer.log``, under the same names, at the Trainer's global step:

- ``tensorboard``: a second event file in the run's own TensorBoard folder (:mod:`.tensorboard`);
- ``wandb``: the training run itself, resumed by its id, without disturbing the training process
  (:mod:`.wandb`);
- any other tracker accelerate knows (``comet_ml``, ``mlflow``, ``aim``, ...): through
  ``accelerate.Accelerator(log_with=...)``, a run named after the run folder;
- ``auto``: the Trainer's own reporters, as the run's ``moral_probe_run.json`` records them.

A tracker that fails is a warning and a missed step (:class:`~.sinks.Trackers`); the history is the record.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import SweepError
from ..rundir.record import RunRecord
from .sinks import Sink, Trackers
from .targets import as_sink
from .tensorboard import tensorboard_sink
from .wandb import wandb_sink

logger = logging.getLogger(__name__)

AUTO = "auto"  # the Trainer's own reporters, as the run's moral_probe_run.json records them


def open_trackers(run_dir: Path, report_to: list[str] | tuple[str, ...], *, record: RunRecord | None = None,
                  wandb_run: str | None = None, tensorboard_dir: str | None = None) -> Trackers:
    """The trackers of ``report_to`` opened for the run in ``run_dir``; ``auto`` adds the ones the run's record
    names (nothing when there is none). A wandb service not answering is a warning, not an error."""
    record = record if record is not None else RunRecord.read(run_dir)
    names = list(report_to)
    if AUTO in names:
        names.remove(AUTO)
        names += [n for n in (record.report_to if record else []) if n not in names]
    sinks = []
    for name in dict.fromkeys(names):
        if name == "tensorboard":
            sinks.append(tensorboard_sink(run_dir, record, tensorboard_dir))
        elif name == "wandb":
            try:
                sinks.append(wandb_sink(run_dir, record, wandb_run))
            except SweepError:
                raise  # nothing names a run: the user's setup, said in one line
            except Exception as e:  # noqa: BLE001 - wandb's service not answering costs its curve, not the scoring
                logger.warning("moral probe: the wandb run could not be opened (%s: %s); lines go to the history "
                               "and the other trackers only", type(e).__name__, " ".join(str(e).split())[:300])
        elif name not in ("none", ""):
            sinks.append(_accelerate_sink(run_dir, name))
    return Trackers(sinks)


def _accelerate_sink(run_dir: Path, name: str) -> Sink:
    from accelerate import Accelerator

    accelerator = Accelerator(log_with=[name], project_dir=str(run_dir))
    accelerator.init_trackers(run_dir.name)
    return Sink(f"accelerate's {name} tracker", as_sink(accelerator).send, accelerator.end_training)
