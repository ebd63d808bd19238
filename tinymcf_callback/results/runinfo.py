"""What a training run tells a watcher in another process: moral_probe_run.json, and its hand-off queue.

``MoralProbeCallback`` writes the file on the main process at the start of training and keeps it up
to date (atomically, so a reader never sees half of it):

- where the Trainer's own dashboards are: the TensorBoard logging folder, the wandb run (id,
  project, entity, offline or online, its folder), so that ``tinymcf watch`` and ``tinymcf sweep
  --report-to`` log into the same run;
- the model the run started from (``base_model``: the folder or Hub id it was loaded from), scored as
  the step-0 baseline when the callback hands it off;
- ``max_steps``, every step saved so far (``saves``), and ``ended`` once ``on_train_end`` has run: how a
  watcher knows that the run is over and which checkpoints there were, even those the Trainer's
  ``save_total_limit`` deleted before the watcher saw them.

With ``hand_off=True`` the callback also links each checkpoint's model files into
``<output_dir>/.moral_probe_queue/checkpoint-<step>/`` (hard links: no copy, no time), so a checkpoint
rotated away by ``save_total_limit`` stays readable until the watcher has scored it and removed its
entry.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .._io import atomic_write_json

RUN_INFO = "moral_probe_run.json"
QUEUE = ".moral_probe_queue"


def run_info_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RUN_INFO


def read_run_info(run_dir: str | os.PathLike) -> dict:
    """The run's ``moral_probe_run.json`` as a dict ({} when there is none or it cannot be read)."""
    try:
        info = json.loads(run_info_path(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def write_run_info(run_dir: str | os.PathLike, info: dict) -> None:
    """Write the whole file atomically (OSError to the caller)."""
    atomic_write_json(run_info_path(run_dir), info)


def queue_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / QUEUE
