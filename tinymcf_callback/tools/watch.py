"""Follow a run as it trains: score each checkpoint once it is complete, from another process or device.

    tinymcf watch OUT --device cuda:1 [--base-model BASE] [--report-to auto]

The sweep's scoring, in a loop over time (:mod:`tinymcf_callback.tools.sweep`): every ``--poll``
seconds the watcher lists the run folder, scores the checkpoints that are complete and not yet in the
history (step order, the step-0 baseline first), appends their lines (event ``watch``) and sends them to
the run's dashboards (:mod:`tinymcf_callback.tools.dashboards`). The training process pays nothing.

- **Complete**: the Trainer writes a checkpoint's weights, then the optimizer, scheduler and RNG states,
  and ``trainer_state.json`` last; a folder counts once that file is there and parses (a half-written one
  waits for the next poll).
- **Deleted** (``save_total_limit``: the Trainer deletes older checkpoints at each save): a checkpoint the
  watcher knew of (listed, or named in the run's ``saves``, or implied by ``save_steps``) that is gone before
  or while it is scored is recorded once as a gap line (event ``deleted``: no number, a gap in the plot),
  never a crash and never a wrong line. With the callback's hand-off (``MoralProbeCallback(hand_off=True)``)
  the model files of each save are hard-linked into ``.moral_probe_queue/``, so nothing is lost to rotation.
- **Behind**: when more than one complete checkpoint waits, it says by how many.
- **The end**: the run's ``moral_probe_run.json`` says ``ended`` (the callback's ``on_train_end``); or a
  checkpoint at the run's ``max_steps`` is scored; or ``--stop-at STEP`` is reached; or nothing new came for
  ``--idle-timeout`` seconds.
- **Restartable**: the history says what is done; a restarted watcher picks up from there, and the
  history's writer lock keeps a second watcher (or a sweep) of the same run out.
- **Several processes** (``accelerate launch``): each round's checkpoints are shared out as the sweep does.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from accelerate import PartialState
from tqdm.auto import tqdm

from ..errors import HistoryError, SweepError
from ..results.history import (
    BASELINE_EVENT,
    WATCH_EVENT,
    append_line,
    gap_line,
    history_path,
    sole_writer,
)
from ..results.runinfo import queue_dir, read_run_info
from .checkpoints import CHECKPOINT_NAME, Checkpoint, is_adapter, read_trainer_state
from .dashboards import open_dashboards
from .processes import agree, process_state
from .resume import check_same_format, check_same_vignettes, current_run_lines, history_precision, recorded_steps
from .sweep import (
    ProbeCache,
    SweepPlan,
    SweepResult,
    SweepSettings,
    check_loadable,
    saved_baseline,
    score_plan,
    set_aside,
    settle_dtype,
    starting_model,
)


@dataclass(frozen=True)
class WatchSettings:
    """The sweep's settings, and when to look and when to stop."""

    sweep: SweepSettings
    poll: float = 10.0  # seconds between two looks at the run folder
    idle_timeout: float | None = None  # stop when no new checkpoint came for this long (None: wait for the end)
    stop_at: int | None = None  # stop once the checkpoint of this step (or a later one) is done


@dataclass
class WatchResult(SweepResult):
    deleted: list[int] = field(default_factory=list)  # saved checkpoints gone before they could be scored
    why_stopped: str = ""
    most_behind: int = 0  # the most complete checkpoints that waited at one look


@dataclass
class Look:
    """What one look at the run folder found (main process; sent to the others)."""

    plan: SweepPlan
    gaps: list[tuple[int, float | None, str]]  # (step, epoch, why) of saved checkpoints that are gone
    end: str | None  # why the run is over, when it is
    behind: int  # complete checkpoints waiting


def complete_checkpoints(run_dir: Path) -> dict[int, Checkpoint]:
    """The complete checkpoints by step: the hand-off queue's first, then the run folder's own."""
    found: dict[int, Checkpoint] = {}
    for folder in (queue_dir(run_dir), run_dir):
        for entry in sorted(folder.glob("checkpoint-*")) if folder.is_dir() else []:
            match = CHECKPOINT_NAME.fullmatch(entry.name)
            state = read_trainer_state(entry) if match and entry.is_dir() else None
            step = int(match.group(1)) if match else None
            if state is not None and step not in found:
                epoch = state.get("epoch")
                found[step] = Checkpoint(step, entry, float(epoch) if isinstance(epoch, (int, float)) else None,
                                         is_adapter(entry), shown_as=str(run_dir / entry.name))
    return found


def saved_steps(run_dir: Path, info: dict, complete: dict[int, Checkpoint]) -> set[int]:
    """Every step the run saved that the watcher can know of: the callback's record of saves, else the steps
    ``save_steps`` implies up to the newest checkpoint (when every checkpoint seen fits that pattern)."""
    if isinstance(info.get("saves"), list):
        return {s for s in info["saves"] if isinstance(s, int)}
    if not complete:
        return set()
    newest = complete[max(complete)]
    state = read_trainer_state(newest.folder) or {}
    every, last = state.get("save_steps"), state.get("max_steps")
    if not isinstance(every, int) or every <= 0:
        return set()
    fits = lambda step: step % every == 0 or step == last  # noqa: E731
    if not all(fits(step) for step in complete):
        return set()  # saved by epoch, or by hand: no pattern to infer missed saves from
    return {s for s in range(every, newest.step + 1, every)} | set(complete)


def run_ended(info: dict, complete: dict[int, Checkpoint], done: set[int]) -> str | None:
    if info.get("ended"):
        return "the run ended (its moral_probe_run.json says so)"
    for step, checkpoint in complete.items():
        state = read_trainer_state(checkpoint.folder) or {}
        if isinstance(state.get("max_steps"), int) and 0 < state["max_steps"] <= step and step in done:
            return f"checkpoint-{step} is the run's last step (max_steps {state['max_steps']})"
    return None


def look(settings: WatchSettings, seen: dict[int, float | None], failed: set[int], carried: SweepPlan | None) -> Look:
    """One look at the run folder (main process): what to score now, what is gone, whether the run is over."""
    sweep, run_dir = settings.sweep, settings.sweep.run_dir
    config = sweep.probe
    history = Path(history_path(str(run_dir), config.name, config.answer_format))
    lines = current_run_lines(history)
    check_same_format(lines, config.answer_format, history)
    check_same_vignettes(lines, config, history)
    done = recorded_steps(lines)
    info = read_run_info(run_dir)
    complete = complete_checkpoints(run_dir)
    for step, checkpoint in complete.items():
        seen.setdefault(step, checkpoint.epoch)
    pending = [c for step, c in sorted(complete.items()) if step not in done and step not in failed]
    plan = SweepPlan(history, pending, sorted(done), history_precision(lines) or (carried and carried.precision),
                     baseline=carried.baseline if carried else None,
                     baseline_event=BASELINE_EVENT if not lines else WATCH_EVENT, event=WATCH_EVENT, by="watch")
    if sweep.baseline and 0 not in done and 0 not in complete and 0 not in failed:
        source, how = starting_model(sweep, list(complete.values()))
        if source is None and info.get("base_model"):
            source, how = str(info["base_model"]), "the model the run started from (moral_probe_run.json)"
        if source is not None:
            plan.notes.append(f"step 0: the starting weights {source} ({how}) are scored as the baseline")
            plan.pending.insert(0, Checkpoint(0, Path(source), 0.0, adapter=False, baseline=True))
        elif carried is None:
            plan.notes.append("no step-0 baseline: the run's starting weights are unknown (pass --base-model PATH; "
                              "the callback with hand_off=True records them)")
    elif 0 in done and plan.baseline is None:
        plan.baseline = saved_baseline(run_dir, config.name, config.answer_format, plan)
    if carried is not None and carried.dtype:
        plan.dtype = carried.dtype
    else:
        settle_dtype(plan, sweep, list(complete.values()), info)
        if plan.dtype is None and sweep.dtype == "auto" and plan.pending and plan.pending[0].baseline:
            plan.pending.pop(0)  # the starting model waits until the run says what it trains in (a checkpoint)
    if plan.pending:
        check_loadable(plan.pending, sweep)
    known = set(seen) | saved_steps(run_dir, info, complete)
    gaps = [(step, seen.get(step), "deleted before it could be scored (save_total_limit?)")
            for step in sorted(known - done - set(complete) - failed) if step > 0]
    behind = len([c for c in pending if not c.baseline])
    end = None if pending else run_ended(info, complete, done | {s for s, _, _ in gaps})
    if end is None and settings.stop_at is not None and not pending and any(s >= settings.stop_at for s in done):
        end = f"step {settings.stop_at} is done (--stop-at)"
    return Look(plan, gaps, end, behind)


def run_watch(settings: WatchSettings) -> WatchResult:
    """Follow the run until it ends; every process calls this (see :func:`~.sweep.run_sweep`)."""
    sweep = settings.sweep
    state = process_state(sweep.device)
    result = WatchResult(Path(history_path(str(sweep.run_dir), sweep.name, sweep.probe.answer_format)), [])
    with contextlib.ExitStack() as held:
        error = agree(state, _hold(sweep, held) if state.is_main_process else None)
        if error is not None:
            raise error
        dashboards = None
        if state.is_main_process and sweep.report_to:
            dashboards = open_dashboards(sweep.run_dir, list(sweep.report_to), wandb_run=sweep.wandb_run,
                                         tensorboard_dir=sweep.tensorboard_dir)
            held.callback(dashboards.close)
            if dashboards:
                print(f"[tinymcf] logging each line to {', '.join(dashboards.names)}", file=sys.stderr)
                resend(dashboards, result.history)
        _follow(settings, state, result, dashboards)
    return result


def resend(dashboards, history: Path) -> None:
    """The lines an earlier watcher of this run wrote, sent again: a watcher killed after writing a line may not
    have got it to its trackers (they write from buffers), and the same point sent twice draws one point."""
    lines = [line for line in current_run_lines(history) if line.get("by") == "watch"]
    for line in lines:
        dashboards.send(line)
    if lines:
        print(f"[tinymcf] {len(lines)} line(s) an earlier watch wrote sent to the dashboards again", file=sys.stderr)


def _hold(sweep: SweepSettings, held: contextlib.ExitStack) -> Exception | None:
    if not sweep.run_dir.is_dir():
        return SweepError(f"no such folder {sweep.run_dir}: tinymcf watch takes the Trainer's output directory "
                          f"(TrainingArguments.output_dir; start the watcher once the training has created it)")
    try:
        config = sweep.probe
        held.enter_context(sole_writer(history_path(str(sweep.run_dir), config.name, config.answer_format),
                                       f"tinymcf watch {sweep.run_dir}"))
        set_aside(sweep)
        config.vignettes()  # an unknown or unprepared set fails before the first look
    except HistoryError as e:
        return SweepError(str(e))
    except Exception as e:  # noqa: BLE001 - sent to the other processes, raised on all of them
        return e
    return None


def _follow(settings: WatchSettings, state: PartialState, result: WatchResult, dashboards) -> None:
    sweep = settings.sweep
    probes = ProbeCache(sweep)
    seen: dict[int, float | None] = {}
    failed: set[int] = set()
    said_gaps: set[int] = set()
    carried: SweepPlan | None = None
    last_news = time.monotonic()
    while True:
        found = agree(state, _look_or_error(settings, seen, failed, carried) if state.is_main_process else None)
        if isinstance(found, Exception):
            raise found
        baseline_first = bool(found.plan.pending) and found.plan.pending[0].baseline
        if state.is_main_process and not baseline_first:  # after step 0's line, which starts the history's run
            _record_gaps(found, sweep, result, said_gaps)
            _drop_from_queue(sweep.run_dir, found.plan.skipped)  # scored before a restart: its copy is not needed
        if found.behind > 1 and state.is_main_process:
            tqdm.write(f"[tinymcf] {found.behind} complete checkpoints are waiting: the watcher is {found.behind - 1} "
                       f"behind the newest (checkpoint-{found.plan.pending[-1].step})", file=sys.stderr)
        result.most_behind = max(result.most_behind, found.behind)
        if found.plan.pending:
            done = score_plan(sweep, found.plan, state, probes=probes, dashboards=dashboards)
            result.scored += done.scored
            # a checkpoint deleted while it was loaded is a gap (the next look records it), not a failure
            there = set(agree(state, list(complete_checkpoints(sweep.run_dir)) if state.is_main_process else None))
            lost = [o for o in done.failures if o.step in seen and o.step not in there]
            result.failures += [o for o in done.failures if o not in lost]
            failed |= {o.step for o in done.failures if o not in lost}
            if state.is_main_process:
                _drop_from_queue(sweep.run_dir, done.scored)
            carried, last_news = found.plan, time.monotonic()
            continue  # look again at once: more may have come while these were scored
        if carried is None and state.is_main_process:
            for note in found.plan.notes:
                print(f"[tinymcf] {note}", file=sys.stderr)
        carried = carried or found.plan
        if found.end:
            result.why_stopped = found.end
            if state.is_main_process:
                with contextlib.suppress(OSError):
                    queue_dir(sweep.run_dir).rmdir()  # the run is over and the queue empty: nothing left to hand off
            return
        if settings.idle_timeout is not None and time.monotonic() - last_news > settings.idle_timeout:
            result.why_stopped = f"no new checkpoint for {settings.idle_timeout:g} s (--idle-timeout)"
            return
        time.sleep(settings.poll)


def _look_or_error(settings, seen, failed, carried) -> Look | Exception:
    try:
        return look(settings, seen, failed, carried)
    except HistoryError as e:
        return SweepError(str(e))
    except Exception as e:  # noqa: BLE001 - sent to the other processes, raised on all of them
        return e


def _record_gaps(found: Look, sweep: SweepSettings, result: WatchResult, said: set[int]) -> None:
    """Each deleted checkpoint once: a gap line in the history and one line on the terminal."""
    for step, epoch, why in found.gaps:
        if step in said:
            continue
        said.add(step)
        try:
            written = append_line(found.plan.history, gap_line(sweep.name, sweep.probe.answer_format, step=step,
                                                               epoch=epoch, why=why), once=True)
        except OSError as e:
            raise SweepError(f"cannot write to {found.plan.history}: {e.strerror or e}") from None
        if written:
            result.deleted.append(step)
            tqdm.write(f"[tinymcf] checkpoint-{step}: {why}; recorded as a gap in the history", file=sys.stderr)


def _drop_from_queue(run_dir: Path, steps: list[int]) -> None:
    """The hand-off copies of scored checkpoints are not needed any more (their line is in the history)."""
    for step in steps:
        folder = queue_dir(run_dir) / f"checkpoint-{step}"
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
