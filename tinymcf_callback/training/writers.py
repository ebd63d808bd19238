"""Where a finished probe goes besides ``Trainer.log``: the checkpoint's report, the baseline's, the wandb table.

All of them run on the main process only and never raise: a file the probe cannot write is a
warning, and training goes on.
"""

from __future__ import annotations

import logging
import os

from ..extras import require
from ..results.history import baseline_path
from ..results.metrics import probe_key
from ..results.report import answer_format, write_report
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT

logger = logging.getLogger("tinymcf_callback")

PRECISION_CONFIG = ("dtype", "autocast", "compute", "device")  # the report fields put in a wandb run's config


def write_baseline(output_dir: str, name: str, report: dict, *, step: int, epoch) -> bool:
    """The baseline's full report, for ``tinymcf compare`` against any checkpoint's ``moral_probe_<name>.json``.

    False (and a warning) when it cannot be written; the file is then as it was (written atomically).
    """
    try:
        write_report(baseline_path(output_dir, name, answer_format(report)), report, step=step, epoch=epoch)
    except OSError as e:
        logger.warning("moral probe [%s]: could not write the baseline report (%s); it is tried again at the next "
                       "probe", name, e)
        return False
    return True


def write_checkpoint(folder: str, name: str, state, report: dict | None) -> None:
    """Add the probe to a checkpoint the Trainer has just written.

    Writes ``moral_probe_<name>.json`` (``moral_probe_<name>_json.json`` for JSON answers; the full
    report) when this step was probed, and
    rewrites ``trainer_state.json``: the Trainer wrote it before ``on_save``, so without the
    refresh it would miss this step's log entry and this save's callback counters.
    """
    if not os.path.isdir(folder):
        return
    try:
        if report is not None:
            write_report(os.path.join(folder, f"moral_probe_{probe_key(name, answer_format(report))}.json"), report,
                         step=state.global_step, epoch=state.epoch)
        if os.path.exists(os.path.join(folder, "trainer_state.json")):
            state.save_to_json(os.path.join(folder, "trainer_state.json"))
    except OSError as e:
        logger.warning("moral probe [%s]: could not write the checkpoint report: %s", name, e)


def reports_to_wandb(args) -> bool:
    """Did the user ask the Trainer for wandb (``report_to``)? An active run alone is not consent."""
    report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    return "wandb" in report_to


def active_wandb_run():
    """The current wandb run, or None (no run started). ``report_to`` asked for wandb, so it is installed, or
    the Trainer itself refused to start; should it be missing, :func:`~tinymcf_callback.extras.require` names
    the ``[wandb]`` extra."""
    return getattr(require("wandb"), "run", None)


class WandbWriter:
    """The probe in a wandb run, one recipe for the callback and :class:`~tinymcf_callback.training.logger.ProbeLogger`.

    Once per run (a new run id: a new hyperparameter-search trial, say): every ``eval/moral_<name>/...``
    key is plotted against ``train/global_step`` (``define_metric``), and the probe's precision goes into
    the run's config (``moral_<name>/dtype``, ``/autocast``, ``/compute``, ``/device``). At each probe: the
    given metrics and the per-foundation table (``eval/moral_<name>/table``), at the Trainer's step.
    """

    def __init__(self, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT):
        self.key = f"moral_{probe_key(name, answer_format)}"
        self._defined: str | None = None  # the run whose metrics are defined
        self._recorded: str | None = None  # the run whose config holds the precision

    def write(self, run, step: int, report: dict | None = None, metrics: dict | None = None) -> None:
        if self._defined != run.id:
            run.define_metric(f"eval/{self.key}/*", step_metric="train/global_step")
            self._defined = run.id
        if report is not None and self._recorded != run.id:
            run.config.update({f"{self.key}/{field}": report.get(field) for field in PRECISION_CONFIG},
                              allow_val_change=True)
            self._recorded = run.id
        payload = dict(metrics or {})
        if report is not None:
            payload[f"eval/{self.key}/table"] = require("wandb").Table(dataframe=report["table"].reset_index())
        if payload:
            run.log({**payload, "train/global_step": step})
