"""The callback's side of ``moral_probe_run.json`` and the hand-off queue (main process; what they hold and who reads
them: :mod:`tinymcf_callback.rundir.record`, :mod:`tinymcf_callback.rundir.queue`). A write that fails is a
warning: the training goes on.
"""

from __future__ import annotations

import logging
import time

from ..rundir.queue import HandOffQueue
from ..rundir.record import RUN_INFO, Attempt, RunRecord, updating
from ..scoring.model_info import weights_dtype
from ..trackers.table import requested

logger = logging.getLogger(__name__)


class RunKeeper:
    """Keeps the run's record (and, with ``hand_off``, its queue) as the training goes."""

    def __init__(self, name: str, consumer: str, output_dir: str, facts: RunRecord, *, hand_off: bool,
                 from_step: int, options: str = ""):
        self.name, self.consumer, self.output_dir, self.hand_off = name, consumer, output_dir, hand_off
        self.options = options or f"--name {name}"  # the watcher's options that ask this probe
        self.attempt = Attempt.here(from_step)
        self._beat = time.monotonic()
        self._link_failure_said = False
        self._handed_off = False
        self.announce: str | None = None  # said once by the callback (when verbose): where the checkpoints wait
        self.queue = HandOffQueue(output_dir)

        def start(record: RunRecord) -> None:
            for field in ("report_to", "max_steps", "save_steps", "base_model", "dtype", "trackers"):
                setattr(record, field, getattr(facts, field))
            record.hand_off = record.hand_off or hand_off  # a second callback without the hand-off leaves it on
            record.ended, record.global_step = False, None
            self._mine(record)  # this attempt, added once

        self._update(start)
        if hand_off:
            try:
                self.queue.register(consumer)
            except OSError as e:
                logger.warning("moral probe [%s]: could not register in the hand-off queue %s: %s", name,
                               self.queue.folder, e)

    def heartbeat(self, force: bool = False) -> None:
        """A sign of life (a step, a log, an evaluation): written at most every ``heartbeat_every`` seconds."""
        if not force and time.monotonic() - self._beat < RunRecord.heartbeat_every:
            return
        self._beat = time.monotonic()
        now = time.time()
        self._update(lambda record: self._mine(record).__setattr__("heartbeat", now))

    def saved(self, step: int, folder: str) -> None:
        """A checkpoint was saved (``on_save``, after the Trainer's rotation): with the hand-off, link its model
        files into the queue, where ``save_total_limit`` cannot reach them; then record it."""
        failure = self._hand_off(step, folder) if self.hand_off else None
        now = time.time()

        def record_save(record: RunRecord) -> None:
            mine = self._mine(record)
            mine.heartbeat = now
            for saves in (record.saves, mine.saves):
                if step not in saves:
                    saves.append(step)
            if failure:
                record.hand_off_failures[step] = failure
            else:
                record.hand_off_failures.pop(step, None)

        self._beat = time.monotonic()
        self._update(record_save)

    def ended(self, step: int) -> None:
        def end(record: RunRecord) -> None:
            record.ended, record.global_step = True, step
            self._mine(record).heartbeat = time.time()

        self._update(end)

    # ---- plumbing ------------------------------------------------------------------------------------------
    def _hand_off(self, step: int, folder: str) -> str | None:
        """Link the checkpoint into the queue; the cause when that cannot be done (said once per run)."""
        try:
            self.queue.link(step, folder)
        except OSError as e:
            cause = f"{e.strerror or e}: hard links need the queue on the checkpoint's filesystem"
            if not self._link_failure_said:
                self._link_failure_said = True
                logger.warning("moral probe [%s]: checkpoint-%d could not be handed off (%s). Until it can, a "
                               "watcher reads each checkpoint from the run folder while it is there, and "
                               "save_total_limit may delete one first (a gap in the curve, with this cause); "
                               "see docs/watch.md for what to do on such a filesystem. Said once; every save "
                               "that fails is recorded in %s", self.name, step, cause, RUN_INFO)
            return cause
        if not self._handed_off:
            self._handed_off = True
            self.announce = (f"moral probe [{self.name}]: checkpoints are handed off to {self.queue.folder} and wait "
                             f"there for `tinymcf watch {self.output_dir} {self.options}` (start it now, or after "
                             f"the training: it scores them all)")
        return None

    def _mine(self, record: RunRecord) -> Attempt:
        for attempt in reversed(record.attempts):
            if attempt.started == self.attempt.started and attempt.pid == self.attempt.pid:
                return attempt
        record.attempts.append(self.attempt)
        return self.attempt

    def _update(self, change) -> None:
        try:
            with updating(self.output_dir) as record:
                change(record)
        except OSError as e:
            logger.warning("moral probe [%s]: could not write %s: %s", self.name, RUN_INFO, e)


def run_facts(args, state, model, runs: dict[str, dict | None]) -> RunRecord:
    """What the Trainer run tells a follower: its reporters and the run each has open (``runs``, looked up once:
    :func:`~.reporters.reported_runs`), its starting model, its length."""
    save_steps = getattr(args, "save_steps", None)
    config = getattr(model, "config", None)
    source = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    dtype = weights_dtype(model) if model is not None else None  # what a watcher scores every model of the run in
    return RunRecord(report_to=requested(args.report_to), max_steps=state.max_steps,
                     save_steps=save_steps if isinstance(save_steps, (int, float)) else None,
                     base_model=str(source) if source else None,
                     dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
                     trackers={name: run for name, run in runs.items() if run})
