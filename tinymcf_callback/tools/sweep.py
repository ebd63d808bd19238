"""Checkpoint sweep: the probe's curve for a run trained without the callback.

    tinymcf sweep OUT --name scifi [--base-model BASE] [--answer-format json]

Scores every ``checkpoint-<step>`` folder of a Trainer output directory in step order and
appends one line per checkpoint to ``OUT/moral_probe_<name>.jsonl`` (``..._<name>_json.jsonl``
with JSON answers; a history of another answer format is refused): the file
``MoralProbeCallback`` writes, each line built by the same ``history_line``
(:mod:`tinymcf_callback.results.history`, with ``event: "sweep"``), so the plot and compare
tools read both alike.

- **Resumable**: a step already in the history (written by the callback or by an earlier sweep)
  is skipped. The file is only ever appended to, one atomic line at a time.
- **One Probe per tokenizer**: checkpoints whose tokenizer files are identical share one
  :class:`Probe` (prompts formatted and tokenised once).
- **PEFT adapters** (``adapter_config.json`` without full weights) are scored on top of
  ``--base-model``.
- **From step 0**: the run's starting weights (``--base-model``, else the local folder an adapter's
  ``adapter_config.json`` names) are scored as the step-0 baseline, as the callback's
  ``train_begin`` probe is (its report written to ``moral_probe_<name>_baseline.json`` when none is
  there), and every line carries the change since it (``score_change``, ``score_change_p``, and
  ``selectivity`` with a ``--target``). A step 0 already in the history is not scored again: its
  baseline report gives the change. ``--no-baseline`` leaves step 0 out.
- **Failures**: a checkpoint that cannot be loaded or scored is reported with its cause and the
  sweep goes on; the caller gets the list.
- **Several processes** (``accelerate launch`` or ``torchrun``): the checkpoints go in rounds of
  one per process (accelerate's ``split_between_processes``). Each process loads and scores its
  own checkpoint whole, the round's results are gathered (``gather_object``) and the main
  process appends them in step order. Every line is the one a single process would write, it is
  written once, and a crash loses at most the round in progress.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from accelerate import PartialState
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from ..config import ProbeConfig
from ..errors import HistoryError, SweepError
from ..extras import require
from ..probe import Probe
from ..results.history import (
    BASELINE_EVENT,
    SWEEP_EVENT,
    append_line,
    baseline_path,
    history_path,
    probe_line,
    sole_writer,
)
from ..results.metrics import baseline_record
from ..results.report import describe_precision, load_report, precision_key, write_report
from ..results.runinfo import read_run_info
from ..results.text import with_bounds
from .checkpoints import (
    ADAPTER_CONFIG,
    DTYPES,
    Checkpoint,
    adapter_base_name,
    find_checkpoints,
    saved_dtype,
    tokenizer_fingerprint,
)
from .dashboards import Dashboards, open_dashboards
from .loading import load_model, release_memory
from .processes import agree, process_state
from .resume import (
    check_same_format,
    check_same_vignettes,
    current_run_lines,
    history_precision,
    precision_clash,
    recorded_steps,
)


@dataclass(frozen=True)
class SweepSettings:
    """What to sweep and how: the run folder, the probe's settings, and how each checkpoint is loaded."""

    run_dir: Path
    probe: ProbeConfig = field(default_factory=ProbeConfig)  # the set, limit, answer format, intervals, ...
    base_model: str | None = None  # the model PEFT adapter checkpoints were trained on
    tokenizer: str | None = None  # default: each checkpoint's own tokenizer files, else --base-model's
    device: str | None = None  # default: this process's device (accelerate's PartialState)
    dtype: str = "auto"
    progress: bool = True
    baseline: bool = True  # score the starting weights as step 0 and log the change since them
    report_to: tuple[str, ...] = ()  # the run's dashboards to log each line into (tools.dashboards)
    wandb_run: str | None = None  # the wandb run id to log into (default: the one moral_probe_run.json records)
    tensorboard_dir: str | None = None  # the TensorBoard folder (default: the Trainer's, as the run records it)
    restart: bool = False  # set the history and its baseline report aside (renamed, kept) and start them again

    @property
    def name(self) -> str:
        return self.probe.name


@dataclass
class SweepPlan:
    """The checkpoints still to score (step order) and the steps the history already holds."""

    history: Path
    pending: list[Checkpoint]
    skipped: list[int]
    precision: tuple[str, str | None] | None = None  # the precision of the history's lines, when they record one
    baseline: dict | None = None  # the step-0 baseline's per-vignette scores (metrics.baseline_record), when known
    baseline_event: str = BASELINE_EVENT  # train_begin in an empty history; sweep when lines are there already
    event: str = SWEEP_EVENT  # the event of a checkpoint's line (watch: WATCH_EVENT)
    by: str = "sweep"  # the line's ``by``: the command that scored it
    dtype: str | None = None  # what every model of the run is loaded in (--dtype, or the run's own: run_dtype)
    notes: list[str] = field(default_factory=list)  # what the main process says before scoring (the baseline's source)


@dataclass
class Outcome:
    """One checkpoint's result as plain values (sent between processes): its history line, or why it failed."""

    step: int
    folder: str
    process: int
    line: dict | None = None
    error: str | None = None
    report: dict | None = None  # the baseline's report (step 0 only), for its file and the change of the others


@dataclass
class SweepResult:
    history: Path
    skipped: list[int]
    scored: list[int] = field(default_factory=list)
    failures: list[Outcome] = field(default_factory=list)


# ---- the run folder ------------------------------------------------------------------------------
def tokenizer_source(checkpoint: Checkpoint, settings: SweepSettings) -> str | None:
    """Where a checkpoint's tokenizer is read: ``--tokenizer``, else its own files, else ``--base-model``."""
    if settings.tokenizer:
        return settings.tokenizer
    if any((checkpoint.folder / f).exists() for f in ("tokenizer_config.json", "tokenizer.json")):
        return str(checkpoint.folder)
    return settings.base_model


# ---- planning (main process) ---------------------------------------------------------------------
def plan_sweep(settings: SweepSettings) -> SweepPlan:
    """Check the input and decide which checkpoints to score; raises :class:`SweepError` before any model loads."""
    checkpoints = find_checkpoints(settings.run_dir)
    config = settings.probe
    config.vignettes()  # an unknown or unprepared set fails here
    history = Path(history_path(str(settings.run_dir), config.name, config.answer_format))
    lines = current_run_lines(history)
    check_same_format(lines, config.answer_format, history)
    check_same_vignettes(lines, config, history)
    done = recorded_steps(lines)
    pending = [c for c in checkpoints if c.step not in done]
    plan = SweepPlan(history, pending, [c.step for c in checkpoints if c.step in done], history_precision(lines),
                     baseline_event=BASELINE_EVENT if not lines else SWEEP_EVENT)
    if settings.baseline:
        plan_baseline(plan, settings, checkpoints, done)
    settle_dtype(plan, settings, checkpoints, read_run_info(settings.run_dir))
    if plan.pending:
        check_writable(settings.run_dir, history)
        check_loadable(plan.pending, settings)
    return plan


def settle_dtype(plan: SweepPlan, settings: SweepSettings, checkpoints: list[Checkpoint], info: dict) -> None:
    """One dtype for every model of the run, decided before any loads (:func:`run_dtype`); a history already
    scored in another precision is refused now, with the two ways out, not after the first checkpoint."""
    found = run_dtype(settings, checkpoints, info)
    if found is None:
        return
    plan.dtype, why = found
    base = next((c for c in plan.pending if c.baseline), None)
    if settings.dtype == "auto" and base is not None and saved_dtype(base.folder) not in (None, plan.dtype):
        plan.notes.append(f"every model is loaded in {plan.dtype} ({why}), the step-0 baseline included")
    recorded = plan.precision
    if recorded is not None and recorded[1] is None and recorded[0] != plan.dtype and plan.pending:
        raise SweepError(f"{plan.history} holds probes scored in {describe_precision(recorded)}, and this run is "
                         f"scored in {plan.dtype} ({why}): one curve holds one precision. Start the history again "
                         f"in {plan.dtype} with --restart (the old lines and baseline report are kept aside, renamed), "
                         f"or pass --dtype {recorded[0]} to extend it as it is")


def starting_model(settings: SweepSettings, checkpoints: list[Checkpoint]) -> tuple[str | None, str]:
    """Where the run's starting weights are, and how that was found (``--base-model``, an adapter's config)."""
    if settings.base_model:
        return settings.base_model, "--base-model"
    for c in checkpoints:
        named = adapter_base_name(c.folder) if c.adapter else None
        if named and Path(named).is_dir():
            return named, f"the base_model_name_or_path of {c.folder.name}/{ADAPTER_CONFIG}"
    return None, ""


def plan_baseline(plan: SweepPlan, settings: SweepSettings, checkpoints: list[Checkpoint], done: set[int]) -> None:
    """Put the step-0 baseline in the plan: to be scored first, or read back from the baseline report on disk."""
    config = settings.probe
    if 0 in done or any(c.step == 0 for c in checkpoints):
        if 0 in done:
            plan.baseline = saved_baseline(settings.run_dir, config.name, config.answer_format, plan)
        return
    source, how = starting_model(settings, checkpoints)
    if source is None:
        plan.notes.append("no step-0 baseline: the run's starting weights are unknown (pass --base-model PATH to "
                          "score them and log the change since them; --no-baseline to say you do not want it)")
        return
    plan.notes.append(f"step 0: the starting weights {source} ({how}) are scored as the baseline")
    plan.pending.insert(0, Checkpoint(0, Path(source), 0.0, adapter=False, baseline=True))


def saved_baseline(run_dir: Path, name: str, answer_format: str, plan: SweepPlan) -> dict | None:
    """The baseline record from the run's ``moral_probe_<name>_baseline.json`` (the callback's), or None (a note)."""
    path = Path(baseline_path(str(run_dir), name, answer_format))
    if not path.exists():
        plan.notes.append(f"step 0 is in the history but {path.name} is not beside it: no change since the "
                          f"baseline is logged")
        return None
    try:
        report = load_report(path)
        return baseline_record(report, int(report.get("step") or 0))
    except Exception as e:  # noqa: BLE001 - an unreadable baseline costs the change, not the sweep
        plan.notes.append(f"{path} cannot be read ({describe(e)}): no change since the baseline is logged")
        return None


def check_writable(run_dir: Path, history: Path) -> None:
    target = history if history.exists() else run_dir
    if not os.access(target, os.W_OK):
        raise SweepError(f"{target} is not writable: the sweep appends its lines to {history}")


def check_loadable(pending: list[Checkpoint], settings: SweepSettings) -> None:
    """Every pending checkpoint has what loading it needs: a base model for adapters, a tokenizer, peft."""
    for c in pending:
        if c.adapter and not settings.base_model:
            named = adapter_base_name(c.folder)
            hint = f"; its {ADAPTER_CONFIG} names {named!r}" if named else ""
            raise SweepError(f"{c.folder.name} is a PEFT adapter ({ADAPTER_CONFIG}, no full weights){hint}: pass "
                             f"--base-model PATH, the model the adapter was trained on")
        if tokenizer_source(c, settings) is None:
            raise SweepError(f"{c.folder.name} has no tokenizer files (the Trainer saves them when given "
                             f"processing_class=tok): pass --tokenizer PATH")
    if any(c.adapter for c in pending):
        require("peft")  # the adapters are loaded with it


# ---- scoring one checkpoint (any process) --------------------------------------------------------
class ProbeCache:
    """One :class:`Probe` per distinct tokenizer: built for the first checkpoint that needs it, then reused."""

    def __init__(self, settings: SweepSettings):
        self.settings = settings
        self._probes: dict[str, Probe] = {}

    def __len__(self) -> int:
        return len(self._probes)

    def for_checkpoint(self, checkpoint: Checkpoint) -> Probe:
        source = tokenizer_source(checkpoint, self.settings)
        key = tokenizer_fingerprint(source)
        if key not in self._probes:
            self._probes[key] = Probe(AutoTokenizer.from_pretrained(source), config=self.settings.probe)
        return self._probes[key]


def load_checkpoint(checkpoint: Checkpoint, settings: SweepSettings, device: str, dtype: str | None = None):
    """The checkpoint's model on ``device``: its full weights, or the base model with its PEFT adapter applied."""
    dtype = dtype or settings.dtype
    if checkpoint.adapter:
        return load_model(settings.base_model, device=device, dtype=dtype, adapter=checkpoint.folder)
    return load_model(str(checkpoint.folder), device=device, dtype=dtype)  # a Hub id as --base-model too


def run_dtype(settings: SweepSettings, checkpoints: list[Checkpoint], info: dict) -> tuple[str, str] | None:
    """The one dtype every model of the run is scored in, and why: ``--dtype``; else what the training ran in
    (the callback's ``moral_probe_run.json``); else what its checkpoints were saved in. Not the base model's
    own: a bfloat16 starting model fine-tuned in float32 would give a bfloat16 step 0 against float32 steps."""
    if settings.dtype != "auto":
        return settings.dtype, "--dtype"
    if info.get("dtype") in DTYPES:
        return info["dtype"], "the dtype the run trained in (moral_probe_run.json)"
    for c in checkpoints:
        found = None if c.baseline or c.adapter else saved_dtype(c.folder)
        if found:
            return found, f"the dtype {c.folder.name} was saved in"
    return None


def score_checkpoint(checkpoint: Checkpoint, probes: ProbeCache, settings: SweepSettings, device: str,
                     process: int, plan: SweepPlan) -> Outcome:
    """Load and score one checkpoint into its history line; any failure becomes the outcome's ``error``.

    The line's metrics are the callback's: the report's, and the change since ``plan.baseline``
    (when it scored the same prompts). The baseline's own outcome carries its report.
    """
    label = "the starting weights (step 0)" if checkpoint.baseline else checkpoint.folder.name
    try:
        model = load_checkpoint(checkpoint, settings, device, plan.dtype)
        try:
            probe = probes.for_checkpoint(checkpoint)
            report = probe.run(model)
        finally:
            del model
            release_memory()
    except Exception as e:  # noqa: BLE001 - one unreadable checkpoint must not end the sweep of the others
        return Outcome(checkpoint.step, label, process, error=describe(e))
    if checkpoint.shown_as:
        report["model"] = checkpoint.shown_as
    # another tokenizer's prompts than the baseline's: no paired change (said once, by the main process)
    baseline = baseline_record(report, 0) if checkpoint.baseline else plan.baseline
    event = plan.baseline_event if checkpoint.baseline else plan.event
    line = probe_line(settings.name, report, baseline=baseline, target=settings.probe.target, step=checkpoint.step,
                      epoch=checkpoint.epoch, event=event)
    line["by"] = plan.by
    return Outcome(checkpoint.step, label, process, line=line, report=report if checkpoint.baseline else None)


def describe(error: Exception) -> str:
    """``Type: message`` on one line (loader messages can run over many)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:400]}{'...' if len(text) > 400 else ''}"


# ---- the sweep -----------------------------------------------------------------------------------
def run_sweep(settings: SweepSettings) -> SweepResult:
    """Score the run's checkpoints not yet in its history and append their lines (main process), in step order.

    Under several processes every process calls this; each scores its share and all return the
    same :class:`SweepResult`. Raises :class:`SweepError` on every process for bad input or when
    the history cannot be appended to.
    """
    state = process_state(settings.device)
    with contextlib.ExitStack() as held:
        plan = agree(state, _plan_or_error(settings, held) if state.is_main_process else None)
        if isinstance(plan, Exception):
            raise plan
        dashboards = None
        if state.is_main_process and settings.report_to and plan.pending:
            dashboards = open_dashboards(settings.run_dir, list(settings.report_to), wandb_run=settings.wandb_run,
                                         tensorboard_dir=settings.tensorboard_dir)
            held.callback(dashboards.close)
            if dashboards:
                print(f"[tinymcf] logging each line to {', '.join(dashboards.names)}", file=sys.stderr)
        return score_plan(settings, plan, state, dashboards=dashboards)


def score_plan(settings: SweepSettings, plan: SweepPlan, state: PartialState, *, probes: ProbeCache | None = None,
               dashboards: Dashboards | None = None) -> SweepResult:
    """Score the plan's pending checkpoints in rounds of one per process; the main process writes each round's
    lines in step order (and sends them to ``dashboards``). The sweep calls it once, the watcher at each look."""
    # No --device, or only its kind (--device cuda): each process's own (cuda:0, cuda:1, ... under torchrun).
    device = str(state.device) if settings.device in (None, state.device.type) else settings.device
    probes = probes or ProbeCache(settings)
    result = SweepResult(plan.history, plan.skipped)
    if state.is_main_process:
        for note in plan.notes:
            print(f"[tinymcf] {note}", file=sys.stderr)
    bar = tqdm(total=len(plan.pending), desc=f"sweep [{settings.name}]", unit="checkpoint",
               disable=not (settings.progress and state.is_main_process and plan.pending))
    # The baseline goes first and alone: every later line needs its scores for the change since step 0.
    rounds = [plan.pending[:1]] if plan.pending and plan.pending[0].baseline else []
    rest = plan.pending[len(rounds):]
    rounds += [rest[i:i + state.num_processes] for i in range(0, len(rest), state.num_processes)]
    try:
        for round_ in rounds:
            with state.split_between_processes(round_) as mine:
                outcomes = [score_checkpoint(c, probes, settings, device, state.process_index, plan) for c in mine]
            outcomes = sorted(gather_object(outcomes), key=lambda o: o.step)
            failed_write = agree(state, _write_round(plan, outcomes, state, settings, dashboards)
                                 if state.is_main_process else None)
            if failed_write:
                later = len(plan.pending) - sum(map(len, rounds[:rounds.index(round_) + 1]))
                raise SweepError(failed_write + (f"; the {later} checkpoint(s) after them were not scored" if later
                                                 else "") + "; a rerun scores what is missing")
            for o in outcomes:
                if o.report is not None:
                    plan.baseline = baseline_record(o.report, 0)
            result.scored += [o.step for o in outcomes if o.line is not None]
            result.failures += [o for o in outcomes if o.line is None]
            bar.update(len(round_))
    finally:
        bar.close()
    return result


def _plan_or_error(settings: SweepSettings, held: contextlib.ExitStack) -> SweepPlan | Exception:
    """The plan, made while this process holds the history's writer lock (kept in ``held`` for the whole sweep)."""
    try:
        config = settings.probe
        history = history_path(str(settings.run_dir), config.name, config.answer_format)
        if settings.run_dir.is_dir():
            held.enter_context(sole_writer(history, f"tinymcf sweep {settings.run_dir}"))
            set_aside(settings)
        return plan_sweep(settings)
    except HistoryError as e:
        return SweepError(str(e))
    except Exception as e:  # noqa: BLE001 - sent to the other processes, raised on all of them
        return e


def set_aside(settings: SweepSettings) -> list[Path]:
    """With ``restart``: the history and its baseline report renamed ``<file>.set-aside-<time>`` (never deleted),
    so that the run's curve starts again (a baseline scored in the wrong precision, say); what was renamed."""
    if not settings.restart:
        return []
    config, stamp = settings.probe, time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for path in (history_path(str(settings.run_dir), config.name, config.answer_format),
                 baseline_path(str(settings.run_dir), config.name, config.answer_format)):
        path = Path(path)
        if path.exists():
            target = path.with_name(f"{path.name}.set-aside-{stamp}")
            path.rename(target)
            moved.append(target)
            print(f"[tinymcf] --restart: {path.name} set aside as {target.name}", file=sys.stderr)
    return moved


def _write_round(plan: SweepPlan, outcomes: list[Outcome], state: PartialState,
                 settings: SweepSettings | None = None, dashboards: Dashboards | None = None) -> str | None:
    """Append the round's lines in step order and print one line per checkpoint; a refusal or write error as text.

    A line scored in another precision than the history's is not written (the sweep stops: a rerun with
    the right ``--dtype`` picks up from there).
    """
    history = plan.history
    for n, o in enumerate(outcomes):
        if o.line is None:
            tqdm.write(f"[tinymcf] {o.folder}: not scored: {o.error}", file=sys.stderr)
            continue
        clash = precision_clash(history, plan.precision, o.line, o.folder)
        if clash:
            return clash
        plan.precision = plan.precision or precision_key(o.line)
        unwritten = ", ".join(str(later.step) for later in outcomes[n:] if later.line is not None)
        if dashboards:  # before the line: a watcher killed in between scores it again and sends it twice, never
            dashboards.send(o.line)  # not at all (the same point twice draws one point)
        try:
            if o.report is not None and settings is not None:
                keep_baseline_report(settings, o.report)  # before its line: a line without its report misleads
            written = append_line(history, o.line, once=True)
        except OSError as e:
            return (f"cannot write to {e.filename or history}: {e.strerror or e}; step(s) {unwritten} scored but not "
                    f"written")
        where = f" on process {o.process + 1} of {state.num_processes}" if state.num_processes > 1 else ""
        said = summary(o.line) if written else "already in the history (written by another process): not written again"
        tqdm.write(f"[tinymcf] step {o.step} ({o.folder}{where}): {said}")
    return None


def keep_baseline_report(settings: SweepSettings, report: dict) -> None:
    """Write the baseline's report beside the history (``compare`` against any checkpoint), never over one there."""
    path = Path(baseline_path(str(settings.run_dir), settings.name, settings.probe.answer_format))
    if path.exists():
        tqdm.write(f"[tinymcf] {path.name} is there already: kept as it is", file=sys.stderr)
        return
    write_report(path, report, step=0, epoch=0.0)  # OSError: the sweep stops, naming the file


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
