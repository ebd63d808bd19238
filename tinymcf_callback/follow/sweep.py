"""Checkpoint sweep: the probe's curve for a run, after the fact: one look at the run folder, no waiting.

    tinymcf sweep OUT --name scifi [--base-model BASE] [--answer-format json]

What to score is the planner's (:mod:`~tinymcf_callback.follow.planner`), the same as the watcher's (docs/cli.md).
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
