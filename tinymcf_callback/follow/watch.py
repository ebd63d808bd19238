"""Follow a run as it trains: the sweep's look (:mod:`~tinymcf_callback.follow.planner`), repeated every ``--poll``
seconds until the run ends or its training dies (docs/watch.md).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from ..errors import SweepError
from ..rundir.history import history_path
from ..rundir.layouts import LAYOUTS, find_saves
from ..rundir.queue import HandOffQueue, queue_dir
from ..rundir.record import GONE, QUIET, RUN_INFO, UNKNOWN, RunRecord
from .planner import Plan, Planner
from .processes import agree, process_state
from .rounds import Rounds, RunResult
from .session import look, open_run_trackers, take_history
from .settings import WatchSettings

logger = logging.getLogger(__name__)


def run_watch(settings: WatchSettings) -> RunResult:
    """Follow the run until it ends; every process calls this (see :func:`~.sweep.run_sweep`)."""
    return Follower(settings).follow()


class Follower:
    """The watcher's loop and everything it keeps between looks."""

    def __init__(self, settings: WatchSettings):
        self.settings = settings
        run = settings.run
        self.state = process_state(run.device)
        self.result = RunResult(run.history)
        self.planner = Planner(run, following=True, dead_after=settings.dead_after)
        self.rounds: Rounds | None = None
        self.last_news = time.monotonic()
        self.registered = False
        self._said: set[str] = set()

    @property
    def main(self) -> bool:
        return self.state.is_main_process

    def follow(self) -> RunResult:
        with contextlib.ExitStack() as held:
            error = agree(self.state, self._start(held) if self.main else None)
            if isinstance(error, Exception):
                raise error
            if error == "idle":
                return self.result
            self.rounds = Rounds(self.planner, self.state, self.result, retries=self.settings.retries,
                                 backoff=self.settings.backoff)
            held.callback(self.rounds.close)
            if self.main:
                self.rounds.trackers = open_run_trackers(self.settings.run)
            while not self._step():
                pass
            self.rounds.finish_benchmark()  # the run is over: its end (and middle) are known now
            if self.main:
                self.result.gaps = self.planner.curve.read().gaps()  # every saved step not scored, at the end
        return self.result

    # ---- before the first look -----------------------------------------------------------------------------
    def _start(self, held: contextlib.ExitStack):
        """Wait until the folder is a run, then hold its history; an error, "idle" (timed out), or None."""
        try:
            if not self._wait_for_run():
                return "idle"
        except SweepError as e:
            return e
        return take_history(self.settings.run, held, "watch")

    def _wait_for_run(self) -> bool:
        """Wait (said once) until the run folder holds something of a run; False when --idle-timeout passed."""
        run = self.settings.run
        start = time.monotonic()
        while True:
            missing = what_is_missing(run.run_dir, run.history)
            if missing is None:
                return True
            self._say(f"waiting for {run.run_dir}: {missing}")
            if self.settings.idle_timeout is not None and time.monotonic() - start > self.settings.idle_timeout:
                self.result.why_stopped = f"{run.run_dir} never became a run ({missing}; --idle-timeout)"
                return False
            time.sleep(self.settings.poll)

    # ---- one look ------------------------------------------------------------------------------------------
    def _step(self) -> bool:
        """One look and what follows from it; True when the watch is over."""
        if self.main:
            self._register()
        plan = agree(self.state, look(self.planner, self.rounds.hold()) if self.main else None)
        if isinstance(plan, Exception):
            raise plan
        if plan.behind > 1 and self.main:
            logger.info("%d complete checkpoints are waiting: the watcher is %d behind the newest (checkpoint-%d)",
                        plan.behind, plan.behind - 1, plan.pending[-1].step)
        self.rounds.run(plan)
        if plan.pending:
            self.last_news = time.monotonic()
            return False  # look again at once: more may have come while these were scored
        if self.rounds.waiting:
            time.sleep(min(self.settings.poll, self.rounds.next_retry() or 0.0))
            return False
        stop = self._why_stop(plan)
        if stop is not None:
            self.result.why_stopped = stop
            if self.main and plan.ended:
                self._leave_queue()
            return True
        time.sleep(self.settings.poll)
        return False

    def _why_stop(self, plan: Plan) -> str | None:
        if plan.ended:
            return plan.ended
        if plan.life == GONE:
            self.result.training_gone = plan.liveness
            return f"the training is gone without ending ({plan.liveness}); everything it saved is scored"
        if plan.life == QUIET:
            self.result.training_quiet = plan.liveness
            return (f"the training has gone quiet ({plan.liveness}): paused, slow, or gone on its machine, which "
                    "cannot be told from here; everything it saved so far is scored")
        stop_at = self.settings.stop_at
        if stop_at is not None and any(s >= stop_at for s in plan.done):
            return f"step {stop_at} is done (--stop-at)"
        if plan.life == UNKNOWN and self.main:
            self._say(f"{plan.liveness}: the watcher cannot tell when the training ends or dies; it stops at the "
                      f"run's max_steps, --stop-at or --idle-timeout")
        idle = self.settings.idle_timeout
        if idle is not None and time.monotonic() - self.last_news > idle:
            return f"no new checkpoint for {idle:g} s (--idle-timeout)"
        return None

    # ---- the hand-off queue --------------------------------------------------------------------------------
    def _register(self) -> None:
        """This probe is a consumer of the run's queue (once the run hands off): no entry goes before it scored it."""
        if self.registered:
            return
        run = self.settings.run
        record = RunRecord.read(run.run_dir)
        if (record is not None and record.hand_off) or queue_dir(run.run_dir).is_dir():
            try:
                HandOffQueue(run.run_dir).register(run.consumer)
                self.registered = True
            except OSError as e:
                self._say(f"could not register as a consumer of the hand-off queue ({e}): another consumer may "
                          f"remove checkpoints before this watcher scores them")

    def _leave_queue(self) -> None:
        queue = HandOffQueue(self.settings.run.run_dir)
        waiting = {c: steps for c, steps in queue.waiting_for().items() if steps}
        for consumer, steps in waiting.items():
            logger.info("the hand-off queue keeps %d checkpoint(s) for the %r probe, which has not scored them yet "
                        "(steps %s): `tinymcf watch` or `tinymcf sweep` of that probe scores and removes them",
                        len(steps), consumer, ", ".join(map(str, steps)))
        if not waiting:
            queue.remove_if_empty()

    def _say(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            logger.info("%s", text)


def what_is_missing(run_dir: Path, history: Path) -> str | None:
    """None when ``run_dir`` holds something of a run; else what is missing, said so a user sees a typo. A folder
    that holds runs instead of being one is a :class:`SweepError` naming them."""
    if not run_dir.exists():
        return "no such folder yet (the training creates it; a typo?)"
    if not run_dir.is_dir():
        raise SweepError(f"{run_dir} is a file: tinymcf watch takes the training run's output folder")
    if (run_dir / RUN_INFO).exists() or history.exists() or queue_dir(run_dir).exists() or find_saves(run_dir).saves:
        return None
    runs = sorted(p.name for p in run_dir.iterdir() if p.is_dir() and ((p / RUN_INFO).exists() or find_saves(p).saves))
    if runs:
        shown = ", ".join(str(run_dir / r) for r in runs[:5])
        raise SweepError(f"{run_dir} holds runs rather than being one ({shown}): pass one of them (the training run's "
                         f"output folder)")
    name = Path(history_path(str(run_dir), "x")).name.replace("_x", "_<name>")
    return (f"no {RUN_INFO}, no saved model of a layout tinymcf reads ({LAYOUTS.listed()}) and no {name} yet "
            "(MoralProbeCallback writes the first when the training starts, the trainer the second at its first save)")
