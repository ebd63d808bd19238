"""What the Trainer's reporters get from the callback besides its numbers (main process).

The callback's metrics reach every reporter in ``report_to`` through ``Trainer.log``, under the Trainer's names and
at its global step. What a reporter shows besides scalars comes here, into the run that reporter has open, and only
for a reporter the user asked for (an active wandb run alone is not consent):

- ``tensorboard``: the custom-scalars layout (margin charts: each value with its band) and the figure, in the
  probe's own folder inside the Trainer's logging folder (:mod:`~tinymcf_callback.trackers.tensorboard`: a second
  event file in the Trainer's own folder would stop a live TensorBoard);
- ``wandb``: the per-foundation and per-vignette tables (kept across probes), the figure and the band chart;
- ``mlflow``: the figure (with the step) and the two tables (with a step column);
- ``trackio``: the figure and the two tables.

A reporter whose package is missing, or whose writer cannot be made, is a warning: the training goes on.
"""

from __future__ import annotations

import logging
import os

from ..results.metrics import probe_key
from ..trackers.mlflow import mlflow_extras
from ..trackers.sinks import Sink
from ..trackers.tensorboard import tensorboard_extras
from ..trackers.trackio import trackio_extras
from ..trackers.wandb import wandb_extras

logger = logging.getLogger("tinymcf_callback")


def reports_to(args, reporter: str) -> bool:
    """Did the user ask the Trainer for ``reporter`` (``report_to``)?"""
    report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    return reporter in report_to


def tensorboard_logging_dir(trainer) -> str | None:
    """The folder the Trainer's ``TensorBoardCallback`` writes to (set at its ``on_train_begin``), or None."""
    for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", ()):
        if type(cb).__name__ == "TensorBoardCallback" and getattr(cb, "logging_dir", None):
            return os.path.abspath(cb.logging_dir)
    return None


def reporter_sinks(args, trainer, name: str, answer_format: str) -> list[Sink]:
    """A sink per reporter of ``args.report_to`` that shows more than numbers (see the module)."""
    key = probe_key(name, answer_format)
    makers = {"tensorboard": lambda: _tensorboard(trainer, key), "wandb": lambda: wandb_extras(name, answer_format),
              "mlflow": mlflow_extras, "trackio": trackio_extras}
    sinks = []
    for reporter, make in makers.items():
        if not reports_to(args, reporter):
            continue
        try:
            sink = make()
        except Exception as e:  # noqa: BLE001 - a dashboard's extras must never stop the training
            logger.warning("moral probe [%s]: %s gets the probe's numbers only (%s: %s)", name, reporter,
                           type(e).__name__, e)
            continue
        if sink is not None:
            sinks.append(sink)
    return sinks


def _tensorboard(trainer, key: str) -> Sink | None:
    folder = tensorboard_logging_dir(trainer)
    if folder is None:
        logger.warning("moral probe: the Trainer reports to tensorboard but no TensorBoardCallback with a logging "
                       "folder was found: its dashboard gets the numbers, not the margin charts or the figure")
        return None
    return tensorboard_extras(folder, key)
