"""Where a finished probe goes besides ``Trainer.log``: the checkpoint's report, the baseline's, the wandb table.

All of them run on the main process only and never raise: a file the probe cannot write is a
warning, and training goes on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil

from .._io import atomic_write_text
from ..extras import require
from ..results.history import baseline_path
from ..results.metrics import probe_key
from ..results.report import answer_format, write_report
from ..results.runinfo import RUN_INFO, queue_dir, read_run_info, write_run_info
from ..scoring.model_info import weights_dtype
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
        if os.path.exists(os.path.join(folder, "trainer_state.json")):  # atomically: a watcher may be reading it
            atomic_write_text(os.path.join(folder, "trainer_state.json"), state_json(state))
    except OSError as e:
        logger.warning("moral probe [%s]: could not write the checkpoint report: %s", name, e)


def state_json(state) -> str:
    """``TrainerState.save_to_json``'s text (sorted keys, indent 2), to be written atomically."""
    return json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"


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


# ---- what a watcher in another process reads (results.runinfo) ---------------------------------------
HAND_OFF_SKIPPED = ("optimizer", "scheduler", "rng_state", "scaler", "training_args")  # not the model: not linked


class RunRecord:
    """The run's ``moral_probe_run.json``, kept by the callback on the main process; a write that fails is a warning.

    See :mod:`tinymcf_callback.results.runinfo` for what it holds and who reads it.
    """

    def __init__(self, name: str, output_dir: str, info: dict):
        self.name, self.output_dir = name, output_dir
        saved = read_run_info(output_dir)  # a resumed run keeps the saves it made before
        self.info = {**info, "saves": [s for s in saved.get("saves", []) if isinstance(s, int)], "ended": False}
        self._write()

    def saved(self, step: int, folder: str, hand_off: bool) -> None:
        """A checkpoint was saved (``on_save``, after the Trainer's rotation): record it; with the hand-off, link
        its model files into the queue, where ``save_total_limit`` cannot reach them."""
        if hand_off:
            self._link(step, folder)
        if step not in self.info["saves"]:
            self.info["saves"].append(step)
        self._write()

    def ended(self, step: int) -> None:
        self.info.update(ended=True, global_step=step)
        self._write()

    def _link(self, step: int, folder: str) -> None:
        target = queue_dir(self.output_dir) / os.path.basename(folder)
        try:
            target.mkdir(parents=True, exist_ok=True)
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if entry.is_file() and not entry.name.startswith(HAND_OFF_SKIPPED):
                    dest = target / entry.name
                    if dest.exists():
                        dest.unlink()
                    os.link(entry.path, dest)  # the same blocks on disk: no copy, no time
        except OSError as e:
            shutil.rmtree(target, ignore_errors=True)
            logger.warning("moral probe [%s]: checkpoint-%d not handed off (%s: hard links need the queue on the "
                           "checkpoint's filesystem); the watcher reads the checkpoint itself while it is there",
                           self.name, step, e.strerror or e)

    def _write(self) -> None:
        try:
            write_run_info(self.output_dir, self.info)
        except OSError as e:
            logger.warning("moral probe [%s]: could not write %s: %s", self.name, RUN_INFO, e)


def run_facts(args, state, trainer, model, hand_off: bool) -> dict:
    """What the Trainer run tells a watcher: its dashboards, its starting model, its length."""
    report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    return {"hand_off": hand_off, "report_to": [r for r in report_to if r and r != "none"],
            "max_steps": state.max_steps, "save_steps": getattr(args, "save_steps", None),
            "base_model": _model_source(model), "dtype": _dtype_name(model),
            "tensorboard_dir": _tensorboard_dir(trainer),
            "wandb": _wandb_facts() if reports_to_wandb(args) else None}


def _model_source(model) -> str | None:
    config = getattr(model, "config", None)
    source = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    return str(source) if source else None


def _dtype_name(model) -> str | None:
    """What the model trains in (its weights' dtype): what a watcher scores every model of the run in."""
    dtype = weights_dtype(model) if model is not None else None
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def _tensorboard_dir(trainer) -> str | None:
    for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", ()):
        if type(cb).__name__ == "TensorBoardCallback" and getattr(cb, "logging_dir", None):
            return os.path.abspath(cb.logging_dir)
    return None


def _wandb_facts() -> dict | None:
    run = active_wandb_run()
    if run is None:
        return None
    settings = getattr(run, "settings", None)
    return {"id": run.id, "project": run.project, "entity": getattr(run, "entity", None),
            "mode": getattr(settings, "mode", None), "dir": getattr(settings, "root_dir", None)}
