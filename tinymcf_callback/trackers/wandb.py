"""The probe in a wandb run: one recipe for the callback, ``ProbeLogger``, the sweep and the watcher.

Once per run (a new run id: a new hyperparameter-search trial, say) every ``eval/moral_<name>/...``
key is plotted against ``train/global_step`` (``define_metric``): wandb silently drops a row whose own
step is below the run's current one, which is what a score that comes late is. The probe's precision
goes into the run's config (``moral_<name>/dtype``, ``/autocast``, ``/compute``, ``/device``); at each
probe come the metrics and the per-foundation table (``eval/moral_<name>/table``), at the Trainer's step.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SweepError
from ..extras import require
from ..results.metrics import probe_key
from ..rundir.record import RunRecord
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT
from .sinks import Sink, line_metrics

PRECISION_CONFIG = ("dtype", "autocast", "compute", "device")  # the line's fields put in a wandb run's config


class WandbWriter:
    """One probe (set and answer format) in wandb runs: its metric definitions and config once per run."""

    def __init__(self, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT):
        self.key = f"moral_{probe_key(name, answer_format)}"
        self._defined: str | None = None  # the run whose metrics are defined
        self._recorded: str | None = None  # the run whose config holds the precision

    def write(self, run, line: dict, *, metrics: bool = True) -> None:
        """The line's table (and, with ``metrics``, its metrics) at its step; ``metrics=False`` when the metrics
        went another way (the callback's, through ``Trainer.log``)."""
        if self._defined != run.id:
            run.define_metric(f"eval/{self.key}/*", step_metric="train/global_step")
            self._defined = run.id
        if self._recorded != run.id:
            run.config.update({f"{self.key}/{field}": line.get(field) for field in PRECISION_CONFIG},
                              allow_val_change=True)
            self._recorded = run.id
        payload = line_metrics(line) if metrics else {}
        if line.get("table"):
            import pandas as pd

            payload[f"eval/{self.key}/table"] = require("wandb").Table(dataframe=pd.DataFrame(line["table"]))
        if payload:
            run.log({**payload, "train/global_step": line["step"]})


def wandb_sender(run):
    """``send(line)`` into ``run``: one :class:`WandbWriter` per probe (set and answer format)."""
    writers: dict[tuple[str, str], WandbWriter] = {}

    def send(line: dict) -> None:
        probe = (line["name"], line.get("answer_format") or DEFAULT_ANSWER_FORMAT)
        writers.setdefault(probe, WandbWriter(*probe)).write(run, line)

    return send


def active_wandb_run():
    """The current wandb run, or None (no run started); :func:`~tinymcf_callback.extras.require` names the
    ``[wandb]`` extra when wandb is missing."""
    return getattr(require("wandb"), "run", None)


def wandb_sink(run_dir: Path, record: RunRecord | None, given: str | None = None) -> Sink:
    """The training's wandb run, resumed as a second writer (see :func:`open_run`)."""
    run, opened_here = open_run(run_dir, record, given)
    return Sink(f"wandb run {run.id}", wandb_sender(run), run.finish if opened_here else None)


def open_run(run_dir: Path, record: RunRecord | None, given: str | None):
    """The training's wandb run by its id, and whether it was opened here (else it is the training's own, open in
    this process, which the training finishes).

    Online it is joined in wandb's shared mode as a second, non-primary writer; offline as an offline run of the
    same id in the same folder (``wandb sync`` puts both into the run).
    """
    wandb = require("wandb")
    recorded = record.wandb if record and record.wandb else {}
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
