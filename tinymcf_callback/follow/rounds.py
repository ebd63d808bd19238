"""Scoring a plan: its checkpoints in rounds of one per process, their lines written in step order (main process).

Every line goes through the run's one curve writer (:class:`~tinymcf_callback.rundir.curve.Curve`); what the scoring
saw is told to the planner (:meth:`~.planner.Planner.saw`), which decides. An unreadable checkpoint is tried again
``retries`` times with a doubling wait, then its step is a gap line with the cause.
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
from ..rundir.curve import Unwritten
from ..rundir.history import UNREADABLE_EVENT
from ..trackers.sinks import Trackers
from ..views.text import with_bounds
from .benchmark import RunBenchmark, check_followable
from .guards import precision_clash
from .planner import Gap, Plan, Planner, Task
from .processes import agree
from .scoring import Outcome, ProbeCache, in_precision, load_checkpoint, score_task

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
    training_quiet: str | None = None  # the training gave no sign of life for --dead-after (the status says so)
    gaps: list[int] = field(default_factory=list)  # saved steps whose newest line is a gap, at the end
    most_behind: int = 0  # the most complete checkpoints that waited at one look
    undelivered: list[str] = field(default_factory=list)  # per tracker, the points it did not get
    benchmarked: list[int] = field(default_factory=list)  # steps whose benchmark (--prefs, --lm-eval) was scored
    bench_failures: list[str] = field(default_factory=list)  # steps whose benchmark failed, and why


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
        if planner.settings.served is not None and state.num_processes > 1:
            raise SweepError(f"--endpoint scores every checkpoint through one server, which {state.num_processes} "
                             "processes would reload under each other: run the command in one process (without "
                             "torchrun or accelerate launch)")
        self.server_checked = False  # whether the server was asked if it can take the run's checkpoints exactly
        self.waiting: dict[int, Retry] = {}  # steps to try again, when
        self.given_up: set[int] = set()  # unreadable after every try (a new sweep or watch tries again)
        self.said_gaps: set[int] = set()
        self.said: set[str] = set()
        self.curve = planner.curve
        settings = planner.settings
        self.device = str(state.device) if settings.device in (None, state.device.type) else settings.device
        check_followable(settings, state.num_processes)
        self.bench = RunBenchmark(settings) if settings.benchmark is not None else None
        self.last_plan: Plan | None = None

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
        self.last_plan = plan
        due = self._benchmark_due(plan, ended=not self.planner.following or plan.ended is not None)
        if not plan.pending:
            self._benchmark_rest(plan, set())
            return
        settings = self.planner.settings
        if settings.served is not None and settings.served.reload and not self.server_checked:
            # before anything is scored: a model the reload cannot give exactly (a checkpoint's, else the start's)
            saved = [str(t.checkpoint.folder) for t in plan.pending if not t.checkpoint.baseline]
            self.probes.reloader.refuse_inexact(saved[0] if saved else plan.base_model)
            self.server_checked = True
        bar = tqdm(total=len(plan.pending), desc=f"{plan.by} [{settings.name}]", unit="checkpoint",
                   disable=not (settings.progress and main))
        rounds = [plan.pending[:1]] if plan.pending[0].checkpoint.baseline else []
        rest = plan.pending[len(rounds):]
        n = self.state.num_processes
        rounds += [rest[i:i + n] for i in range(0, len(rest), n)]
        try:
            for k, round_ in enumerate(rounds):
                with self.state.split_between_processes(round_) as mine:
                    outcomes = [score_task(t, self.planner.settings, plan, self.probes, self.device,
                                           self.state.process_index, bench=self.bench if t.step in due else None)
                                for t in mine]
                outcomes = sorted(gather_object(outcomes), key=lambda o: o.step)
                self.planner.saw(plan, outcomes)  # the baseline's scores, the first line's precision: the planner's
                failed = agree(self.state, self._write(plan, round_, outcomes) if main else None)
                if failed:
                    later = sum(map(len, rounds[k + 1:]))
                    raise SweepError(failed + (f"; the {later} checkpoint(s) after them were not scored" if later
                                               else "") + "; a rerun scores what is missing")
                bar.update(len(round_))
        finally:
            bar.close()
        self._benchmark_rest(plan, {t.step for t in plan.pending})

    # ---- the benchmark beside the run (--prefs, --lm-eval) -------------------------------------------------
    def _benchmark_due(self, plan: Plan, *, ended: bool) -> dict[int, tuple[str, ...]]:
        if self.bench is None:
            return {}
        return self.bench.look(plan, self.planner.fingerprint, ended=ended)

    def _benchmark_rest(self, plan: Plan, loaded: set[int]) -> None:
        """The due steps the probe's rounds did not load (their line stood already), each loaded for the benchmark."""
        if self.bench is None:
            return
        def load(checkpoint):
            return load_checkpoint(checkpoint, plan, self.device), in_precision(plan.precision, self.device)
        self.result.bench_failures += self.bench.catch_up(plan, loaded, load, self.trackers)
        self.result.benchmarked = sorted(set(self.result.benchmarked) | set(self.bench.scored))

    def finish_benchmark(self) -> None:
        """At the end of a watch: the run is over, so its end and middle are known; score what is due."""
        if self.bench is not None and self.last_plan is not None:
            self._benchmark_due(self.last_plan, ended=True)
            self._benchmark_rest(self.last_plan, set())

    def _preamble(self, plan: Plan) -> None:
        """The resume line (once), then the gap lines, each once; gaps wait for step 0's line when it is pending."""
        if plan.resume is not None:
            mark = plan.resume
            self._append(plan, mark)
            logger.warning("the training resumed from checkpoint-%d: the history's lines of step(s) %s belong to the "
                           "branch it abandoned and are set aside; those steps are scored again as they are saved",
                           mark["step"], ", ".join(map(str, mark["info"]["resumed"]["superseded"])))
            plan.resume = None
            self.trackers.seed(self.curve.read().lines)  # the figures draw the branch the training took
        if plan.pending and plan.pending[0].checkpoint.baseline:
            return  # step 0's line starts the history's run: gaps after it
        for gap in plan.gaps:
            self._gap(plan, gap)

    def _gap(self, plan: Plan, gap: Gap, *, said: bool = False) -> None:
        """Record the step as a gap line (``said``: its one log line is already out)."""
        if (gap.step, gap.event) in self.said_gaps:
            return
        self.said_gaps.add((gap.step, gap.event))
        line = self.curve.gap(step=gap.step, epoch=gap.epoch, why=gap.why, event=gap.event)
        if self._append(plan, line, once=True):
            if gap.event != UNREADABLE_EVENT:
                self.result.deleted.append(gap.step)
            if not said:
                logger.warning("checkpoint-%d: %s; recorded as a gap in the history", gap.step, gap.why)

    def _append(self, plan: Plan, line: dict, *, once: bool = False) -> bool:
        try:
            return self.curve.append(line, once=once)
        except Unwritten as e:
            self.curve.pending.clear()  # the sweep stops here; a rerun writes what is missing
            raise SweepError(f"cannot write to {e.path}: {e.reason}") from None

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
            for note in o.notes:
                self._say(note)
            unwritten = ", ".join(str(later.step) for later in outcomes[n:] if later.line is not None)
            self.curve.number(o.line)  # its run-level change p, as the next test of the history's run
            self.trackers.send(o.line, rows=o.rows)  # before the line: a watcher killed in between sends it again
            try:  # the baseline's report before its line: a line without its report misleads
                written = self.curve.append(o.line, once=True, baseline=(o.report, 0, 0.0) if o.report else None)
            except Unwritten as e:
                self.curve.pending.clear()  # the sweep stops here; a rerun scores and writes what is missing
                return f"cannot write to {e.path}: {e.reason}; step(s) {unwritten} scored but not written"
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
            self._write_benchmark(o)
            if not by_step[o.step].checkpoint.baseline:
                self.planner.queue().scored(o.step, self.planner.settings.consumer)
        if outcomes and outcomes[0].report is not None:  # step 0's line is in (it starts the history's run)
            for gap in plan.gaps:
                self._gap(plan, gap)
        return None

    def _write_benchmark(self, o: Outcome) -> None:
        """The benchmark's lines of a step the probe's round scored (after its probe line), or why it failed."""
        if self.bench is None:
            return
        if o.bench_error is not None:
            self.result.bench_failures.append(f"step {o.step}: {o.bench_error}")
            logger.error("step %d (%s): the benchmark was not scored: %s (its probe line stands; a rerun scores the "
                         "benchmark again)", o.step, o.folder, o.bench_error)
            return
        self.bench.write(o.bench, self.trackers)
        self.result.benchmarked = sorted(set(self.result.benchmarked) | set(self.bench.scored))

    def _failed(self, plan: Plan, task: Task, o: Outcome) -> None:
        if o.gone:
            return  # deleted while it was loaded: the next look records the gap
        tries = self.waiting[o.step].tries + 1 if o.step in self.waiting else 1
        # A file cut short in a complete save will not grow: the sweep says so at once. A watcher may meet a copy in
        # progress: it reads the headers again (never loads or sends the weights), quietly after the first word.
        final = o.final or (o.incomplete and not self.planner.following)
        if tries <= self.retries and not final:
            wait = self.backoff * 2 ** (tries - 1)
            self.waiting[o.step] = Retry(tries, time.monotonic() + wait, o.error)
            level = logging.WARNING if not o.incomplete else logging.INFO if tries == 1 else logging.DEBUG
            logger.log(level, "%s: not scored (%s); trying again in %g s (try %d of %d)", o.folder, o.error, wait,
                       tries + 1, self.retries + 1)
            return
        self.waiting.pop(o.step, None)
        self.given_up.add(o.step)
        self.result.failures.append(o)
        after = "" if final else f" after {tries} tries"
        gap = "" if task.checkpoint.baseline else "; recorded as a gap in the history"
        logger.error("%s: not scored%s: %s%s", o.folder, after, o.error, gap)
        if not task.checkpoint.baseline:
            why = o.error if final else f"could not be read after {tries} tries: {o.error}"
            self._gap(plan, Gap(o.step, task.checkpoint.epoch, why, UNREADABLE_EVENT), said=True)

    def _say(self, note: str) -> None:
        if note not in self.said:
            self.said.add(note)
            logger.warning("%s", note)

    def close(self) -> None:
        self.trackers.close()
        self.result.undelivered = self.trackers.undelivered()


def summary(line: dict) -> str:
    f = lambda key: with_bounds(line[key], line.get(f"{key}_lo"), line.get(f"{key}_hi"),  # noqa: E731
                                bool(line.get("level")))
    warnings = len(line["info"].get("warnings") or [])
    note = f" ({warnings} warning{'s' * (warnings != 1)} in the history's info.warnings)" if warnings else ""
    change, p, run = (next((v for k, v in line["metrics"].items() if k.endswith(end)), None)
                      for end in ("/score_change", "/score_change_p", "/score_change_p_run"))
    since = "" if change is None or line["step"] == 0 else (
        f" change since step 0={change:+.3f}" + ("" if p is None else f" (p={p:.3f}")
        + ("" if run is None else f", run-level p={run:.3f}") + ("" if p is None else ")"))
    return f"score={f('score')} gap={f('gap')} social-norms control={f('sn')}{since}{note}"
