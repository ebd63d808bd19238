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


def define_wandb_metrics(run, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> None:
    """Plot every ``eval/moral_<name>/...`` key against the Trainer's step (once per run)."""
    run.define_metric(f"eval/moral_{probe_key(name, answer_format)}/*", step_metric="train/global_step")


def record_wandb_precision(run, name: str, report: dict) -> None:
    """The probe's precision in the run's config (``moral_<name>/dtype``, ``/autocast``, ``/compute``, ``/device``)."""
    key = f"moral_{probe_key(name, answer_format(report))}"
    run.config.update({f"{key}/{field}": report.get(field) for field in ("dtype", "autocast", "compute", "device")},
                      allow_val_change=True)


def log_wandb_table(run, name: str, report: dict, step: int) -> None:
    """Log the per-foundation table as ``eval/moral_<name>/table`` at ``step``."""
    table = require("wandb").Table(dataframe=report["table"].reset_index())
    run.log({f"eval/moral_{probe_key(name, answer_format(report))}/table": table, "train/global_step": step})


