"""Scoring a plan: its checkpoints in rounds of one per process, their lines written in step order (main process).

The sweep calls this once per look, the watcher at each look. Here live what both do with a plan:

- the resume line and the gap lines go in first (a gap only once the step-0 baseline is in, whose line
  starts the history's run);
- the step-0 baseline is scored first and alone: every later line carries the change since it;
- a line goes to the trackers, then (the baseline's report first) into the history; a checkpoint
  saved again with other weights gets a new line, said once;
- a checkpoint that cannot be read while it is there is tried again, ``retries`` times with a doubling
  wait; after that its step is a gap line with the cause (``unreadable``), and the caller hears of it;
- a scored checkpoint's hand-off entry is marked as scored by this probe, and goes once every consumer
  of the run has scored it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from accelerate import PartialState
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from ..errors import SweepError
from ..results.history import UNREADABLE_EVENT, append_line, baseline_path, gap_line
from ..results.metrics import baseline_record
from ..results.precision import Precision
from ..results.report import write_report
from ..results.text import with_bounds
from ..trackers.sinks import Trackers
from .guards import precision_clash
from .planner import Gap, Plan, Planner, Task
from .processes import agree
from .scoring import Outcome, ProbeCache, score_task

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a sweep or a watch did (the same on every process)."""

    history: Path
    scored: list[int] = field(default_factory=list)
    settled: list[int] = field(default_factory=list)  # already in the history, their checkpoint unchanged
    replaced: list[int] = field(default_factory=list)  # scored again: saved again with other weights
    failures: list[Outcome] = field(default_factory=list)  # unreadable after every try (a gap line each)
    deleted: list[int] = field(default_factory=list)  # saved, gone before they could be scored (a gap line each)
    why_stopped: str = ""
    training_gone: str | None = None  # the training died without ending (the watcher's status says so)
    most_behind: int = 0  # the most complete checkpoints that waited at one look
    undelivered: list[str] = field(default_factory=list)  # per tracker, the points it did not get


@dataclass
class Retry:
    tries: int
    due: float
    error: str


class Rounds:
    """Scores plans for one sweep or watch: the probes, the retries and the trackers kept between looks."""

    def __init__(self, planner: Planner, state: PartialState, result: RunResult, *, trackers: Trackers | None = None,
                 retries: int = 4, backoff: float = 2.0):
        self.planner, self.state, self.result = planner, state, result
        self.trackers = trackers if trackers is not None else Trackers()
        self.retries, self.backoff = retries, backoff
        self.probes = ProbeCache(planner.settings)
        self.waiting: dict[int, Retry] = {}  # steps to try again, when
        self.given_up: set[int] = set()  # unreadable after every try (a new sweep or watch tries again)
        self.said_gaps: set[int] = set()
        settings = planner.settings
        self.device = str(state.device) if settings.device in (None, state.device.type) else settings.device

    # ---- what the planner is told to leave alone -----------------------------------------------------------
    def hold(self) -> set[int]:
        now = time.monotonic()
        return self.given_up | {step for step, r in self.waiting.items() if r.due > now}

    def next_retry(self) -> float | None:
        """Seconds until the next retry is due (0 when one is), or None when none waits."""
        if not self.waiting:
            return None
        return max(0.0, min(r.due for r in self.waiting.values()) - time.monotonic())

    # ---- one plan ------------------------------------------------------------------------------------------
    def run(self, plan: Plan) -> None:
        """Write the plan's resume and gap lines, then score its pending checkpoints (every process calls this)."""
        main = self.state.is_main_process
        if main:
            for note in plan.notes:
                logger.info("%s", note)
            self._preamble(plan)
            for step in plan.settled:
                self.planner.queue().scored(step, self.planner.settings.consumer)
        self.result.settled = sorted((set(self.result.settled) | set(plan.settled)) - set(self.result.scored))
        self.result.most_behind = max(self.result.most_behind, plan.behind)
        if not plan.pending:
            return
        settings = self.planner.settings
        bar = tqdm(total=len(plan.pending), desc=f"{plan.by} [{settings.name}]", unit="checkpoint",
                   disable=not (settings.progress and main))
        rounds = [plan.pending[:1]] if plan.pending[0].checkpoint.baseline else []
        rest = plan.pending[len(rounds):]
        n = self.state.num_processes
        rounds += [rest[i:i + n] for i in range(0, len(rest), n)]
        try:
            for k, round_ in enumerate(rounds):
                with self.state.split_between_processes(round_) as mine:
                    outcomes = [score_task(t, self.planner, plan, self.probes, self.device, self.state.process_index)
                                for t in mine]
                outcomes = sorted(gather_object(outcomes), key=lambda o: o.step)
                failed = agree(self.state, self._write(plan, round_, outcomes) if main else None)
                if failed:
                    later = sum(map(len, rounds[k + 1:]))
                    raise SweepError(failed + (f"; the {later} checkpoint(s) after them were not scored" if later
                                               else "") + "; a rerun scores what is missing")
                for o in outcomes:
                    if o.report is not None:
                        plan.baseline = self.planner.baseline = baseline_record(o.report, 0)
                bar.update(len(round_))
        finally:
            bar.close()

    def _preamble(self, plan: Plan) -> None:
        """The resume line (once), then the gap lines, each once; gaps wait for step 0's line when it is pending."""
        if plan.resume is not None:
            mark = plan.resume
            self._append(plan, mark)
            logger.warning("the training resumed from checkpoint-%d: the history's lines of step(s) %s belong to the "
                           "branch it abandoned and are set aside; those steps are scored again as they are saved",
                           mark["step"], ", ".join(map(str, mark["info"]["resumed"]["superseded"])))
            plan.resume = None
        if plan.pending and plan.pending[0].checkpoint.baseline:
            return  # step 0's line starts the history's run: gaps after it
        self._gaps(plan)

    def _gaps(self, plan: Plan) -> None:
        for gap in plan.gaps:
            self._gap(plan, gap)

    def _gap(self, plan: Plan, gap: Gap) -> None:
        if (gap.step, gap.event) in self.said_gaps:
            return
        self.said_gaps.add((gap.step, gap.event))
        settings = self.planner.settings
        line = gap_line(settings.name, settings.probe.answer_format, step=gap.step, epoch=gap.epoch, why=gap.why,
                        event=gap.event)
        if self._append(plan, line, once=True):
            if gap.event != UNREADABLE_EVENT:
                self.result.deleted.append(gap.step)
            logger.warning("checkpoint-%d: %s; recorded as a gap in the history", gap.step, gap.why)

    def _append(self, plan: Plan, line: dict, *, once: bool = False) -> bool:
        try:
            return append_line(plan.history, line, once=once)
        except OSError as e:
            raise SweepError(f"cannot write to {e.filename or plan.history}: {e.strerror or e}") from None

    # ---- a round's lines -----------------------------------------------------------------------------------
    def _write(self, plan: Plan, tasks: list[Task], outcomes: list[Outcome]) -> str | None:
        """Append the round's lines in step order; a refusal or a write error as text (the sweep stops there)."""
        by_step = {t.step: t for t in tasks}
        for n, o in enumerate(outcomes):
            if o.line is None:
                self._failed(plan, by_step[o.step], o)
                continue
            self.waiting.pop(o.step, None)
            clash = precision_clash(plan.history, plan.precision, o.line, o.folder)
            if clash:
                return clash
            plan.precision = plan.precision or Precision.of(o.line)
            self.planner.precision = self.planner.precision or plan.precision
            unwritten = ", ".join(str(later.step) for later in outcomes[n:] if later.line is not None)
            self.trackers.send(o.line)  # before the line: a watcher killed in between sends it again, never loses it
            try:
                if o.report is not None:
                    self._keep_baseline_report(o.report)  # before its line: a line without its report misleads
                written = append_line(plan.history, o.line, once=True)
            except OSError as e:
                return (f"cannot write to {e.filename or plan.history}: {e.strerror or e}; step(s) {unwritten} scored "
                        f"but not written")
            where = f" on process {o.process + 1} of {self.state.num_processes}" if self.state.num_processes > 1 else ""
            if not written:
                logger.info("step %d (%s%s): already in the history (written by another process): not written "
                            "again", o.step, o.folder, where)
            else:
                self.result.scored.append(o.step)
                task = by_step[o.step]
                if task.replaces:
                    self.result.replaced.append(o.step)
                    logger.warning("checkpoint-%d was %s (fingerprint %s, was %s): scored again; its new line "
                                   "supersedes the old one", o.step, task.why, o.line["fingerprint"], task.replaces)
                logger.info("step %d (%s%s): %s", o.step, o.folder, where, summary(o.line))
            if not task_is_baseline(by_step[o.step]):
                self.planner.queue().scored(o.step, self.planner.settings.consumer)
        if outcomes and outcomes[0].report is not None:
            self._gaps(plan)  # step 0's line is in (it starts the history's run): the gaps follow
        return None

    def _failed(self, plan: Plan, task: Task, o: Outcome) -> None:
        if o.gone:
            return  # deleted while it was loaded: the next look records the gap
        tries = self.waiting[o.step].tries + 1 if o.step in self.waiting else 1
        if tries <= self.retries:
            wait = self.backoff * 2 ** (tries - 1)
            self.waiting[o.step] = Retry(tries, time.monotonic() + wait, o.error)
            logger.warning("%s: not scored (%s); trying again in %g s (try %d of %d)", o.folder, o.error, wait,
                           tries + 1, self.retries + 1)
            return
        self.waiting.pop(o.step, None)
        self.given_up.add(o.step)
        self.result.failures.append(o)
        logger.error("%s: not scored after %d tries: %s", o.folder, tries, o.error)
        if not task.checkpoint.baseline:
            self._gap(plan, Gap(o.step, task.checkpoint.epoch, f"could not be read after {tries} tries: {o.error}",
                                UNREADABLE_EVENT))

    def _keep_baseline_report(self, report: dict) -> None:
        """The baseline's report beside the history (``compare`` against any checkpoint), never over one there."""
        settings = self.planner.settings
        path = Path(baseline_path(str(settings.run_dir), settings.name, settings.probe.answer_format))
        if path.exists():
            logger.info("%s is there already: kept as it is", path.name)
            return
        write_report(path, report, step=0, epoch=0.0)  # OSError: the sweep stops, naming the file

    def close(self) -> None:
        self.trackers.close()
        self.result.undelivered = self.trackers.undelivered()


def task_is_baseline(task: Task) -> bool:
    return task.checkpoint.baseline


def summary(line: dict) -> str:
    f = lambda key: with_bounds(line[key], line.get(f"{key}_lo"), line.get(f"{key}_hi"),  # noqa: E731
                                bool(line.get("level")))
    warnings = len(line["info"].get("warnings") or [])
    note = f" ({warnings} warning{'s' * (warnings != 1)} in the history's info.warnings)" if warnings else ""
    change = line["metrics"].get(next((k for k in line["metrics"] if k.endswith("/score_change")), ""))
    p = line["metrics"].get(next((k for k in line["metrics"] if k.endswith("/score_change_p")), ""))
    since = "" if change is None or line["step"] == 0 else (
        f" change since step 0={change:+.3f}" + ("" if p is None else f" (p={p:.3f})"))
    return f"score={f('score')} gap={f('gap')} social-norms control={f('sn')}{since}{note}"
