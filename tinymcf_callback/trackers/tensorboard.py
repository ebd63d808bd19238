"""TensorBoard: the Trainer's logging folder, and a probe's points written beside the Trainer's own.

TensorBoard shows the event files of one folder as one run, so a second writer (``*.tinymcf``) in the
Trainer's folder puts the probe's curves beside the loss.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..extras import require
from ..rundir.record import RunRecord
from .sinks import Sink, line_metrics


def tensorboard_sender(writer):
    """``send(line)`` for a ``SummaryWriter``: each metric at the line's step, then a flush, so that a write the
    disk refuses raises here (the writer's own thread holds the error until the next write or flush)."""

    def send(line: dict) -> None:
        for key, value in line_metrics(line).items():
            writer.add_scalar(key, value, global_step=line["step"])
        if callable(getattr(writer, "flush", None)):
            writer.flush()

    return send


def tensorboard_folder(run_dir: Path, record: RunRecord | None, given: str | None = None) -> Path:
    """Where the Trainer's TensorBoard events are: given, recorded by the callback, ``TENSORBOARD_LOGGING_DIR``,
    the newest ``<run>/runs/*``, or a new ``<run>/runs/tinymcf``."""
    for candidate in (given, record.tensorboard_dir if record else None, os.environ.get("TENSORBOARD_LOGGING_DIR")):
        if candidate:
            return Path(candidate)
    runs = sorted((p for p in (run_dir / "runs").glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else run_dir / "runs" / "tinymcf"


def tensorboard_sink(run_dir: Path, record: RunRecord | None, given: str | None = None) -> Sink:
    """A second event file (``*.tinymcf``) in the run's TensorBoard folder."""
    require("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tensorboard_folder(run_dir, record, given)), filename_suffix=".tinymcf")
    return Sink(f"TensorBoard ({writer.log_dir})", tensorboard_sender(writer), writer.close)
