"""Checkpoint sweep: the probe's curve for a run, after the fact: one look at the run folder, no waiting.

    tinymcf sweep OUT --name scifi [--base-model BASE] [--answer-format json]

Scores every checkpoint of a Trainer output directory (and of its hand-off queue) that the history does not
hold yet, in step order, and appends one line per checkpoint to ``OUT/moral_probe_<name>.jsonl``
(``..._<name>_json.jsonl`` with JSON answers): the file ``MoralProbeCallback`` writes, each line built by
the same ``probe_line`` (:mod:`tinymcf_callback.rundir.history`, with ``event: "sweep"``). What to score,
the step-0 baseline, the precision and what each line scored are the planner's
(:mod:`~tinymcf_callback.follow.planner`), the same as the watcher's:

- **Resumable**: a step whose line scored the weights its checkpoint holds is skipped; a checkpoint saved
  again with other weights (a resumed run) is scored again, its line superseding the old one.
- **From step 0**: the run's starting weights (``--base-model``, else the run's record, else the base its
  adapters name) are scored as the step-0 baseline, and every line carries the change since it.
- **Failures**: a checkpoint that cannot be read is tried again a few times with a doubling wait; after
  that its step is a gap line with the cause, the sweep goes on, and its status says so.
- **Several processes** (``accelerate launch`` or ``torchrun``): the checkpoints go in rounds of one per
  process; the main process writes each round's lines in step order, once.
"""

from __future__ import annotations

import contextlib
import time

from .planner import Planner
from .processes import agree, process_state
from .rounds import Rounds, RunResult
from .session import look, open_run_trackers, take_history
from .settings import RunSettings


def run_sweep(settings: RunSettings, *, retries: int = 4, backoff: float = 2.0) -> RunResult:
    """Score the run's checkpoints the history does not hold yet and append their lines (main process).

    Under several processes every process calls this; each scores its share and all return the same
    :class:`~.rounds.RunResult`. Raises :class:`SweepError` on every process for bad input or when the history
    cannot be appended to.
    """
    state = process_state(settings.device)
    result = RunResult(settings.history)
    planner = Planner(settings)
    with contextlib.ExitStack() as held:
        error = agree(state, take_history(settings, held, "sweep") if state.is_main_process else None)
        if error is not None:
            raise error
        rounds = Rounds(planner, state, result, retries=retries, backoff=backoff)
        held.callback(rounds.close)
        if state.is_main_process:
            rounds.trackers = open_run_trackers(settings)
        while True:
            plan = agree(state, look(planner, rounds.hold()) if state.is_main_process else None)
            if isinstance(plan, Exception):
                raise plan
            rounds.run(plan)
            wait = agree(state, rounds.next_retry() if state.is_main_process else None)
            if wait is None:
                if state.is_main_process:
                    result.gaps = planner.curve.read().gaps()  # every saved step not scored, this sweep's or not
                return result
            time.sleep(wait)
