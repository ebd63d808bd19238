"""One planner of a run's state: what is done, what is pending, the baseline, the precision, the fingerprints.

A sweep is one look with no waiting; a watcher is the same look repeated (:class:`Planner`, kept between looks,
remembers what only time shows). Every decision about a run is made here, once, and read by both.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import LoadError, SweepError
from ..extras import require
from ..loading import check_model_source
from ..rundir.checkpoints import (
    ADAPTER_CONFIG,
    DTYPES,
    FORMATS,
    FULL,
    ZERO,
    Checkpoint,
    adapter_base_name,
    checkpoint_folders,
    fingerprint,
    read_trainer_state,
    same_model_source,
    saved_dtype,
    weight_files,
)
from ..rundir.curve import HistoryView
from ..rundir.history import BASELINE_EVENT, DELETED_EVENT, SWEEP_EVENT, WATCH_EVENT, is_point
from ..rundir.layouts import LAYOUTS, TRAINER, Found, find_saves, read_save
from ..rundir.precision import Precision
from ..rundir.queue import HandOffQueue, queue_dir
from ..rundir.record import UNKNOWN, Attempt, RunRecord
from .guards import check_same_format, check_same_vignettes
from .settings import RunSettings

logger = logging.getLogger(__name__)


@dataclass
class Task:
    """A checkpoint to score, and why: ``replaces`` is the fingerprint of the line its new one supersedes;
    ``tokenizer`` the tokenizer it is scored with (decided with the plan)."""

    checkpoint: Checkpoint
    replaces: str | None = None
    why: str = "new"
    tokenizer: str | None = None

    @property
    def step(self) -> int:
        return self.checkpoint.step


@dataclass
class Gap:
    """A saved step that will not be scored (its checkpoint is gone, or unreadable), and why."""

    step: int
    epoch: float | None
    why: str
    event: str = DELETED_EVENT


@dataclass
class Plan:
    """One look at a run: what to do now. Plain values, sent from the main process to the others."""

    history: Path
    pending: list[Task]
    settled: list[int]  # steps whose line stands and whose checkpoint is still here (queue entries may go)
    done: list[int]  # every step with a line in the current run
    gaps: list[Gap] = field(default_factory=list)
    resume: dict | None = None  # a resume line to write before anything else
    precision: Precision | None = None  # what every line is scored in (None: the first line's decides)
    dtype: str | None = None  # what every model is loaded in (None: each in its own)
    baseline: dict | None = None  # the step-0 baseline's per-vignette scores, when known
    baseline_event: str = BASELINE_EVENT
    event: str = SWEEP_EVENT
    by: str = "sweep"
    base_model: str | None = None  # the run's starting model (step 0, adapters, sharded checkpoints' config)
    notes: list[str] = field(default_factory=list)  # what to say once, before scoring
    ended: str | None = None  # why the run is over, when it is
    life: str = "unknown"  # the training: alive, gone, quiet (no heartbeat from another machine), ended or unknown
    liveness: str = ""  # what was seen, and where
    present: dict[int, Checkpoint] = field(default_factory=dict)  # the complete saves at this look, by step
    saves: list[int] = field(default_factory=list)  # every step the run saved that can be known (saved_steps)
    length: tuple[int | None, int | None] = (None, None)  # the run's max_steps and save_steps, where it says

    @property
    def behind(self) -> int:
        """Complete checkpoints waiting (the baseline not counted)."""
        return len([t for t in self.pending if not t.checkpoint.baseline])


class Planner:
    """Looks at a run folder and says what to do (see the module); kept between a watcher's looks."""

    def __init__(self, settings: RunSettings, *, following: bool = False, dead_after: float | None = None):
        self.settings, self.following = settings, following
        self.curve = settings.curve()  # the run's history and baseline report
        self.dead_after = dead_after
        self.seen: dict[int, float | None] = {}  # every step listed at some look, with its epoch
        self.saves = Found(None, {})  # the run folder's layout and saves, at the last look
        self.base: tuple[str | None, str] | None = None  # the starting model and how it was found, once known
        self.precision: Precision | None = None
        self.baseline: dict | None = None
        self._why_precision = ""
        self._fingerprints: dict[tuple, str | None] = {}
        self._said: set[str] = set()

    # ---- one look -------------------------------------------------------------------------------------------
    def look(self, hold: Collection[int] = ()) -> Plan:
        """What the run folder holds now and what is left to do; ``hold``: steps not to score at this look
        (failed for good, or waiting for a retry). Raises :class:`SweepError` for a history or setup that cannot
        be extended, before any model loads."""
        s = self.settings
        view = self.curve.read()
        check_same_format(view.lines, s.probe.answer_format, s.history)
        check_same_vignettes(view.lines, s.probe, s.history)
        record = RunRecord.read(s.run_dir)
        event = WATCH_EVENT if self.following else SWEEP_EVENT
        plan = Plan(s.history, [], [], [], event=event, by="watch" if self.following else "sweep",
                    baseline_event=BASELINE_EVENT if not view.lines else event)
        attempt = record.attempt if record else None
        if attempt is not None:  # a resume line for an attempt that resumed before steps the history holds
            plan.resume = view.resume_line(s.name, s.probe.answer_format, from_step=attempt.from_step,
                                           started=attempt.started)
        if plan.resume is not None:
            view.lines = [line for line in view.lines if line["step"] <= plan.resume["step"]]
        present = self._present(record, plan)
        for step, checkpoint in present.items():
            self.seen.setdefault(step, checkpoint.epoch)
        newest = view.newest()
        plan.done = sorted(newest)
        for step, checkpoint in sorted(present.items()):
            line = newest.get(step)
            if step in hold:
                continue
            if line is None:
                plan.pending.append(Task(checkpoint))
            elif not is_point(line):
                plan.pending.append(Task(checkpoint, why=f"its checkpoint is here again after a {line['event']} gap"))
            else:
                now, then = self.fingerprint(checkpoint), line.get("fingerprint")
                if now is not None and then is not None and now != then:
                    plan.pending.append(Task(checkpoint, replaces=then, why="saved again with other weights"))
                else:
                    plan.settled.append(step)
        self._starting_model(plan, record, present)
        self._plan_baseline(plan, view, present, hold)
        self._settle_precision(plan, view, record, present)
        if plan.pending:
            self._check_loadable(plan)
        plan.gaps = self._gaps(record, present, newest, hold)
        plan.present, plan.length = present, run_length(record, present)
        plan.saves = sorted(saved_steps(record, present) | set(present) | set(self.seen))
        if self.following or record is not None:
            self._run_state(plan, record, present, newest)
        plan.notes = [n for n in plan.notes if not (n in self._said or self._said.add(n))]
        return plan

    # ---- what is there -------------------------------------------------------------------------------------
    def _present(self, record: RunRecord | None, plan: Plan) -> dict[int, Checkpoint]:
        """The complete saves to consider, by step: the hand-off queue's first, then the run folder's, in the layout
        the run folder holds (:mod:`~tinymcf_callback.rundir.layouts`: one rule, the sweep's and the watcher's)."""
        s = self.settings
        if not self.following and not s.run_dir.is_dir():
            raise SweepError(f"no such folder {s.run_dir}: tinymcf sweep takes a training run's output folder (a "
                             f"Trainer's output_dir, or the folder an RL trainer saves its checkpoints in)")
        attempt = record.attempt if record else None
        found: dict[int, Checkpoint] = {}
        for step, folder in checkpoint_folders(queue_dir(s.run_dir)).items():
            checkpoint = read_save(TRAINER, step, folder, s.run_dir)  # the queue holds Trainer checkpoints
            if checkpoint is not None and _of_branch(step, folder, attempt):
                found[step] = dataclasses.replace(checkpoint, shown_as=str(s.run_dir / folder.name))
        saves = self.saves = find_saves(s.run_dir)
        if saves.layout is not None:
            plan.notes.append(f"{s.run_dir} holds {saves.described}")
        expect_state = record is not None or any((f / "trainer_state.json").exists() for f in saves.saves.values())
        waiting = []
        for step, folder in saves.saves.items():
            if step in found:
                continue
            checkpoint = read_save(saves.layout, step, folder, s.run_dir, settle=s.settle, expect_state=expect_state)
            if checkpoint is None:
                waiting.append(folder.name if folder.parent == s.run_dir else str(folder.relative_to(s.run_dir)))
            elif _of_branch(step, folder, attempt):
                found[step] = checkpoint
        if waiting and not self.following:
            plan.notes.append(f"not complete yet, so not scored now (a later sweep scores them): {', '.join(waiting)}")
        if not self.following and not found and not saves.saves and not queue_dir(s.run_dir).is_dir():
            known = "; ".join(layout.described for layout in LAYOUTS.values())
            raise SweepError(f"{s.run_dir} holds no saved model of a layout tinymcf reads ({known}): pass the folder "
                             f"a training run saved its checkpoints in")
        return found

    def fingerprint(self, checkpoint: Checkpoint) -> str | None:
        """The checkpoint's fingerprint, read again only when its weight files changed (size, time, inode)."""
        try:
            files = weight_files(checkpoint.folder, checkpoint.format or None)
            key = tuple((str(p), st.st_size, st.st_mtime_ns, st.st_ino) for p in files for st in [os.stat(p)])
            if key not in self._fingerprints:
                self._fingerprints[key] = fingerprint(checkpoint.folder, checkpoint.format)
            return self._fingerprints[key]
        except OSError:
            return None  # being written or deleted: not known at this look

    # ---- the starting model --------------------------------------------------------------------------------
    def _starting_model(self, plan: Plan, record: RunRecord | None, present: dict[int, Checkpoint]) -> None:
        """The run's starting model, checked against every place that names it, before anything is scored."""
        s = self.settings
        named = ((c.folder.name, adapter_base_name(c.folder)) for c in present.values() if c.adapter)
        sources = [(f"{k}/{ADAPTER_CONFIG}", v) for k, v in named if v]
        if record is not None and record.base_model:
            sources.insert(0, ("the run's moral_probe_run.json", record.base_model))
        if s.base_model:
            if not s.force_base_model:
                for where, other in sources:
                    if not same_model_source(s.base_model, other):
                        raise SweepError(
                            f"--base-model {s.base_model} is not the model this run started from: {where} names "
                            f"{other}. Adapters and step 0 scored on another base give another model's numbers: "
                            f"leave --base-model out to use {other}, or pass --force-base-model if {s.base_model} is "
                            f"a copy of it")
            self.base = (s.base_model, "--base-model")
        elif self.base is None or self.base[0] is None:
            for where, other in sources:
                clash = next((w for w, o in sources if not same_model_source(o, other)), None)
                if clash is not None:
                    other_name = dict(sources)[clash]
                    raise SweepError(f"{where} names {other} as the run's starting model and {clash} names "
                                     f"{other_name}: pass --base-model with the right one (and --force-base-model "
                                     f"if the other place is wrong)")
            usable = next(((where, o) for where, o in sources if _loadable(o)), None)
            self.base = (usable[1], f"named by {usable[0]}") if usable else (None, "")
        plan.base_model = self.base[0]

    def _plan_baseline(self, plan: Plan, view: HistoryView, present: dict[int, Checkpoint],
                       hold: Collection[int]) -> None:
        """Step 0: scored first when it is not in the history; else its baseline report gives the change."""
        s = self.settings
        newest = view.newest()
        if 0 in newest and is_point(newest[0]):
            if self.baseline is None:
                self.baseline, why = self.curve.baseline_record()
                if self.baseline is None:
                    plan.notes.append(f"step 0 is in the history but {why}")
            plan.baseline = self.baseline
            return
        plan.baseline = self.baseline
        if not s.baseline or 0 in hold:
            return
        first = next((t for t in plan.pending if t.step == 0), None)
        if first is not None:  # a checkpoint-0 folder: the starting weights, saved
            first.checkpoint = dataclasses.replace(first.checkpoint, baseline=True)
            plan.pending.remove(first)
            plan.pending.insert(0, first)
            return
        source, how = self.base or (None, "")
        if source is None:
            plan.notes.append("no step-0 baseline: the run's starting weights are unknown (pass --base-model PATH to "
                              "score them and log the change since them; --no-baseline to say you do not want it; "
                              "MoralProbeCallback(hand_off=True) records them)")
            return
        plan.notes.append(f"step 0: the starting weights {source} ({how}) are scored as the baseline")
        plan.pending.insert(0, Task(Checkpoint(0, Path(source), 0.0, FULL, baseline=True)))

    # ---- what the scoring saw ------------------------------------------------------------------------------
    def saw(self, plan: Plan, outcomes) -> None:
        """What the scoring of a round found (on every process): the step-0 baseline's scores and, when the run named
        no precision, the first line's, which every later line is held to."""
        for o in outcomes:
            if o.baseline is not None:
                self.baseline = plan.baseline = o.baseline
            if o.line is not None and self.precision is None:
                self.precision = plan.precision = Precision.of(o.line)
                self._why_precision = f"the precision of {o.folder}, the first line"

    # ---- the precision -------------------------------------------------------------------------------------
    def _settle_precision(self, plan: Plan, view: HistoryView, record: RunRecord | None,
                          present: dict[int, Checkpoint]) -> None:
        """One precision for every line of the run, decided before any model loads (see the module); a history
        scored in another precision is refused now, with the options that work, not after the first checkpoint."""
        s = self.settings
        history = view.precision()
        if self.precision is None:
            found = self._precision_of_run(history, record, present)
            if found is not None:
                self.precision, self._why_precision = found
        if self.precision is not None and not self.precision.same_curve(history) and plan.pending:
            raise SweepError(f"{s.history} holds probes scored in {history}, and this run is scored in "
                             f"{self.precision} ({self._why_precision}): one curve holds one precision (the change "
                             f"between them would be the precision's): pass {history.options()} to extend it as it "
                             f"is, or --restart to start it again in {self.precision} (the old lines and baseline "
                             f"report are kept aside, renamed)")
        plan.precision = self.precision
        plan.dtype = self.precision.dtype if self.precision else None
        base = next((t.checkpoint for t in plan.pending if t.checkpoint.baseline), None)
        if self.precision is None:
            if self.following and base is not None:
                plan.pending = [t for t in plan.pending if not t.checkpoint.baseline]  # wait: the run says later
            return
        if base is not None and s.served is None and saved_dtype(base.folder) not in (None, plan.dtype):
            plan.notes.append(f"every model is loaded in {plan.dtype} ({self._why_precision}), the step-0 baseline "
                              f"included")

    def _precision_of_run(self, history, record, present) -> tuple[Precision, str] | None:
        """``--dtype``/``--autocast``; else what the run trains in; else what its checkpoints were saved in; else
        the precision of the history's own lines (a run that records none of the others)."""
        s = self.settings
        if s.served is not None:  # the server computes in its own precision; its reports say "served"
            return Precision("served"), "--endpoint: scored by the server"
        if s.requested is not None:
            return s.requested, "--autocast" if s.autocast else "--dtype"
        if record is not None and record.dtype in DTYPES:
            return Precision(record.dtype), "the dtype the run trained in (moral_probe_run.json)"
        for c in present.values():
            found = saved_dtype(c.folder) if c.format in (FULL, ZERO) else None
            if found:
                return Precision(found), f"the dtype {c.folder.name} was saved in"
        if history is not None:
            return history, "the precision of the history's lines"
        return None

    # ---- what loading needs --------------------------------------------------------------------------------
    def _check_loadable(self, plan: Plan) -> None:
        """Every pending checkpoint has what loading it needs: a base model, a tokenizer, peft or deepspeed."""
        for task in plan.pending:
            c = task.checkpoint
            form = FORMATS[c.format]
            if (form.needs_base or c.needs_base) and not plan.base_model:
                named = adapter_base_name(c.folder) if c.adapter else None
                hint = f"; its {ADAPTER_CONFIG} names {named!r}, which is not here" if named else ""
                raise SweepError(f"{c.folder.name} is {form.what}{hint}: pass --base-model PATH, the model the run "
                                 f"started from")
            if c.baseline and not c.folder.is_dir():
                try:
                    check_model_source(str(c.folder))
                except LoadError as e:
                    raise SweepError(f"the run's starting model cannot be loaded: {e}") from None
            task.tokenizer = tokenizer_source(self.settings, c, plan)
            if task.tokenizer is None:
                raise SweepError(f"{c.folder.name} has no tokenizer files (the Trainer saves them when given "
                                 f"processing_class=tok): pass --tokenizer PATH")
        pending = {t.checkpoint.format for t in plan.pending}
        for form in FORMATS.values():  # the extras the pending formats' loaders need, in the table's order
            if form.name in pending and form.requires:
                require(form.requires)

    # ---- what is missing, and the run's end ----------------------------------------------------------------
    def _gaps(self, record: RunRecord | None, present: dict[int, Checkpoint], newest: dict[int, dict],
              hold: Collection[int]) -> list[Gap]:
        known = set(self.seen) | saved_steps(record, present)
        there = set(self.saves.saves) | set(checkpoint_folders(queue_dir(self.settings.run_dir)))  # partial: not gone
        gone = sorted(known - set(present) - there - set(newest) - set(hold))
        return [Gap(step, self.seen.get(step), self._why_gone(step, record)) for step in gone if step > 0]

    def _why_gone(self, step: int, record: RunRecord | None) -> str:
        if record is not None and step in record.hand_off_failures:
            return (f"deleted before it could be scored: it was not handed off ({record.hand_off_failures[step]}), "
                    f"and save_total_limit removed it")
        if record is not None and record.hand_off:
            return (f"gone from the hand-off queue before the {self.settings.consumer!r} probe scored it (a consumer "
                    f"registered after the others had scored it: start every watcher of a run before its training)")
        return ("deleted before it could be scored (save_total_limit removes older checkpoints at each save; "
                "MoralProbeCallback(hand_off=True) keeps them for tinymcf watch)")

    def _run_state(self, plan: Plan, record: RunRecord | None, present: dict[int, Checkpoint],
                   newest: dict[int, dict]) -> None:
        if record is None:
            plan.life, plan.liveness = UNKNOWN, "the run has no moral_probe_run.json (MoralProbeCallback writes it)"
        else:
            plan.life, plan.liveness = record.liveness(dead_after=self.dead_after or 900.0)
        if plan.pending:
            return
        if record is not None and record.ended:
            plan.ended = "the run ended (its moral_probe_run.json says so)"
            return
        for step, checkpoint in present.items():
            state = read_trainer_state(checkpoint.folder) or {}
            last = state.get("max_steps")
            if isinstance(last, int) and 0 < last <= step and step in newest:
                plan.ended = f"checkpoint-{step} is the run's last step (max_steps {last})"
                return

    # ---- the queue -----------------------------------------------------------------------------------------
    def queue(self) -> HandOffQueue:
        return HandOffQueue(self.settings.run_dir)


def tokenizer_source(settings: RunSettings, checkpoint: Checkpoint, plan: Plan) -> str | None:
    """``--tokenizer``, else the checkpoint's own files (where its layout keeps them), else the run's starting
    model."""
    if settings.tokenizer:
        return settings.tokenizer
    if checkpoint.tokenizer is not None:
        return str(checkpoint.tokenizer)
    if any((checkpoint.folder / f).exists() for f in ("tokenizer_config.json", "tokenizer.json")):
        return str(checkpoint.folder)
    if checkpoint.baseline and not checkpoint.folder.exists():
        return str(checkpoint.folder)  # a Hub id
    return plan.base_model


def saved_steps(record: RunRecord | None, present: dict[int, Checkpoint]) -> set[int]:
    """Every step the run saved that can be known: the record's saves on the current branch, else the steps
    ``save_steps`` implies up to the newest checkpoint (when every checkpoint seen fits that pattern)."""
    if record is not None and (record.saves or record.attempts):
        attempt = record.attempt
        if attempt is None or not attempt.from_step:
            return set(record.saves)
        return {s for s in record.saves if s <= attempt.from_step} | set(attempt.saves)
    if not present:
        return set()
    newest = present[max(present)]
    state = read_trainer_state(newest.folder) or {}
    every, last = state.get("save_steps"), state.get("max_steps")
    if not isinstance(every, int) or every <= 0:
        return set()
    if not all(step % every == 0 or step == last for step in present):
        return set()  # saved by epoch, or by hand: no pattern to infer missed saves from
    return set(range(every, newest.step + 1, every)) | set(present)


def run_length(record: RunRecord | None, present: dict[int, Checkpoint]) -> tuple[int | None, int | None]:
    """The run's ``max_steps`` and ``save_steps``: its record's, else the newest checkpoint's ``trainer_state.json``
    (None where neither says)."""
    length = record.max_steps if record is not None else None
    every = record.save_steps if record is not None else None
    if (length is None or every is None) and present:
        state = read_trainer_state(present[max(present)].folder) or {}
        length = length if length is not None else state.get("max_steps")
        every = every if every is not None else state.get("save_steps")
    number = lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None  # noqa: E731
    length, every = number(length), number(every)
    if every is not None and every < 1:  # a fraction of the run's length (TrainingArguments takes save_steps=0.25)
        every = math.ceil(every * length) if length else None
    return (int(length) if length else None), (int(every) if every else None)


def _of_branch(step: int, folder: Path, attempt: Attempt | None) -> bool:
    """Whether a checkpoint belongs to the current branch: after a resume from step K, a later step counts only
    once this attempt saved it (the old branch's folder may still be there)."""
    if attempt is None or not attempt.from_step or step <= attempt.from_step:
        return True
    if step in attempt.saves:
        return True
    try:
        return (folder / "trainer_state.json").stat().st_mtime >= attempt.started
    except OSError:
        return False


def _loadable(source: str) -> bool:
    try:
        check_model_source(source)
    except LoadError:
        return False
    return True
