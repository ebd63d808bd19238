"""Where a finished probe goes besides ``Trainer.log`` and the history: the checkpoint's report and its refreshed
``trainer_state.json``. Main process only; a file the probe cannot write is a warning, and training goes on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from .._io import atomic_write_text
from ..rundir.report import write_report
from ..stats.metrics import answer_format, probe_key

logger = logging.getLogger("tinymcf_callback")


def write_checkpoint(folder: str, name: str, state, report: dict | None) -> None:
    """Add the probe's report (when this step was probed) to a checkpoint the Trainer has just written, and rewrite its
    ``trainer_state.json``: the Trainer wrote it before ``on_save``, missing this step's log entry and counters."""
    if not os.path.isdir(folder):
        return
    try:
        if report is not None:
            write_report(os.path.join(folder, f"moral_probe_{probe_key(name, answer_format(report))}.json"), report,
                         step=state.global_step, epoch=state.epoch)
        if os.path.exists(os.path.join(folder, "trainer_state.json")):  # atomically: a watcher may be reading it
            # TrainerState.save_to_json's text (sorted keys, indent 2), written atomically
            text = json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"
            atomic_write_text(os.path.join(folder, "trainer_state.json"), text)
    except OSError as e:
        logger.warning("moral probe [%s]: could not write the checkpoint report: %s", name, e)

