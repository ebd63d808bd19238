"""The planner's decisions about a run, as tables on run folders made of files (tests/helpers/fake_runs.py).

``Planner.look`` is a function of the files in a run folder (its checkpoints, its record, its history, its hand-off
queue) and of what the planner remembers between a watcher's looks. Each row builds a folder, looks once and
holds the plan to what the decision must be: what is pending and why, what is settled, the gaps and their
causes, the resume mark, the precision, the starting model, the run's end and its training's life, or the
refusal. Each decision is also followed end to end on real training in test_run_life.py (slow).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cli_checks import names
from helpers.fake_runs import HISTORY, fake_checkpoint, fake_model, line, planner_for, write_history

from tinymcf_callback.errors import SweepError
from tinymcf_callback.rundir.checkpoints import fingerprint
from tinymcf_callback.rundir.precision import Precision
from tinymcf_callback.rundir.queue import HandOffQueue
from tinymcf_callback.rundir.record import Attempt, RunRecord


class Ago(float):
    """A heartbeat this many seconds before the test runs (a parameter is made when the suite is collected)."""

    def at(self) -> float:
        return time.time() - self


def when(value):
    return value.at() if isinstance(value, Ago) else value


def gone_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def summary(plan) -> dict:
    """What a plan decided, in plain values."""
    return {"pending": [(t.step, t.why) for t in plan.pending], "settled": plan.settled,
            "gaps": [(g.step, g.event) for g in plan.gaps],
            "resume": None if plan.resume is None else (plan.resume["step"],
                                                        plan.resume["info"]["resumed"]["superseded"])}


# ---- what is done, what is pending ---------------------------------------------------------------------------------
def fresh(run):
    fake_checkpoint(run, 2)
    fake_checkpoint(run, 4)


def same_weights(run):
    fake_checkpoint(run, 2)
    write_history(run, [line(2, fingerprint=fingerprint(run / "checkpoint-2"))])


def rewritten(run):
    fake_checkpoint(run, 2)
    write_history(run, [line(2, fingerprint="f-of-the-old-weights")])


def back_after_a_gap(run):
    fake_checkpoint(run, 2)
    write_history(run, [line(2, event="deleted", score=None)])


def unknown_fingerprint(run):
    fake_checkpoint(run, 2)
    write_history(run, [line(2, fingerprint=None)])  # a callback line of a live model between saves: not rescored


def half_written(run):
    fake_checkpoint(run, 2)
    fake_checkpoint(run, 4, state='{"global_step": 4, "epo')  # the Trainer is still writing it
    (run / "checkpoint-6").mkdir()  # weights not even started


def a_new_run_in_the_same_folder(run):
    fake_checkpoint(run, 2)
    write_history(run, [line(0, event="train_begin"), line(2, fingerprint=fingerprint(run / "checkpoint-2")),
                        line(0, event="train_begin")])  # a second run's baseline: the first run's step 2 is not done


@pytest.mark.parametrize("build, expected", [
    (fresh, {"pending": [(2, "new"), (4, "new")], "settled": [], "gaps": [], "resume": None}),
    (same_weights, {"pending": [], "settled": [2], "gaps": [], "resume": None}),
    (rewritten, {"pending": [(2, "saved again with other weights")], "settled": [], "gaps": [], "resume": None}),
    (back_after_a_gap, {"pending": [(2, "its checkpoint is here again after a deleted gap")], "settled": [],
                        "gaps": [], "resume": None}),
    (unknown_fingerprint, {"pending": [], "settled": [2], "gaps": [], "resume": None}),
    (half_written, {"pending": [(2, "new")], "settled": [], "gaps": [], "resume": None}),
    (a_new_run_in_the_same_folder, {"pending": [(2, "new")], "settled": [], "gaps": [], "resume": None}),
], ids=lambda x: getattr(x, "__name__", ""))
def test_what_is_done_and_what_is_pending(tmp_path, build, expected):
    build(tmp_path)
    assert summary(planner_for(tmp_path).look()) == expected


def test_a_rewritten_step_names_the_line_it_supersedes(tmp_path):
    rewritten(tmp_path)
    [task] = planner_for(tmp_path).look().pending
    assert task.replaces == "f-of-the-old-weights"


# ---- a resumed training ------------------------------------------------------------------------------------------
def resumed(run, *, marked: bool = False):
    """Trained to step 6, resumed from checkpoint-2: the new attempt has saved step 4 again (other weights)."""
    now = time.time()
    first = Attempt(from_step=0, started=now - 100, host="elsewhere", pid=1, heartbeat=now - 90, saves=[2, 4, 6])
    second = Attempt(from_step=2, started=now - 50, host="elsewhere", pid=2, heartbeat=now - 1, saves=[4])
    RunRecord(saves=[2, 4, 6], attempts=[first, second]).write(run)
    fake_checkpoint(run, 2, mtime=now - 95)
    fake_checkpoint(run, 4, value=40.0, mtime=now - 40)  # saved again by the resumed attempt
    fake_checkpoint(run, 6, mtime=now - 91)  # the abandoned branch's: older than the attempt, not saved by it
    lines = [line(s, fingerprint=f"old-{s}") for s in (2, 4, 6)]
    lines[0]["fingerprint"] = fingerprint(run / "checkpoint-2")
    if marked:
        lines.append({**line(2, event="resumed", score=None), "info": {"resumed": {
            "from_step": 2, "attempt_started": second.started, "superseded": [4, 6]}}})
    write_history(run, lines)


def test_a_resume_sets_the_abandoned_branch_aside_once_and_scores_the_new_saves(tmp_path):
    resumed(tmp_path)
    plan = planner_for(tmp_path).look()
    assert summary(plan) == {"pending": [(4, "new")], "settled": [2], "gaps": [], "resume": (2, [4, 6])}
    assert plan.resume["info"]["resumed"]["attempt_started"] == RunRecord.read(tmp_path).attempt.started
    assert 6 not in plan.done  # its line belongs to the abandoned branch


def test_a_resume_already_marked_is_not_marked_again(tmp_path):
    resumed(tmp_path, marked=True)
    plan = planner_for(tmp_path).look()
    assert plan.resume is None and [t.step for t in plan.pending] == [4]


# ---- gaps, with their causes -----------------------------------------------------------------------------------
def rotated_away(run):
    RunRecord(saves=[2, 4, 6]).write(run)
    fake_checkpoint(run, 6)


def not_handed_off(run):
    RunRecord(saves=[2, 4, 6], hand_off=True, hand_off_failures={2: "hard links need the queue on the same "
                                                                    "filesystem"}).write(run)
    fake_checkpoint(run, 6)


def left_the_queue(run):
    RunRecord(saves=[2, 4], hand_off=True).write(run)
    fake_checkpoint(run, 4)


def implied_by_save_steps(run):
    fake_checkpoint(run, 6, max_steps=6, save_steps=2)  # no record: save_steps says 2 and 4 were saved too


@pytest.mark.parametrize("build, gaps, cause", [
    (rotated_away, [2, 4], "save_total_limit removes older checkpoints at each save"),
    (not_handed_off, [2, 4], "it was not handed off (hard links need the queue on the same filesystem)"),
    (left_the_queue, [2], "gone from the hand-off queue before the 'scifi' probe scored it"),
    (implied_by_save_steps, [2, 4], "save_total_limit removes older checkpoints"),
], ids=lambda x: getattr(x, "__name__", ""))
def test_a_saved_step_that_is_gone_is_a_gap_with_its_cause(tmp_path, build, gaps, cause):
    build(tmp_path)
    plan = planner_for(tmp_path).look()
    assert [g.step for g in plan.gaps] == gaps and all(g.event == "deleted" for g in plan.gaps)
    assert cause in plan.gaps[0].why


def test_a_step_the_scoring_holds_back_is_neither_pending_nor_a_gap(tmp_path):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4)
    plan = planner_for(tmp_path).look(hold={2})
    assert [t.step for t in plan.pending] == [4] and plan.gaps == []


def test_a_checkpoint_seen_then_deleted_is_a_gap_remembered_between_looks(tmp_path):
    planner = planner_for(tmp_path)
    fake_checkpoint(tmp_path, 2)
    planner.look()
    (tmp_path / "checkpoint-2" / "model.safetensors").unlink()
    (tmp_path / "checkpoint-2" / "trainer_state.json").unlink()
    (tmp_path / "checkpoint-2" / "config.json").unlink()
    (tmp_path / "checkpoint-2" / "tokenizer_config.json").unlink()
    (tmp_path / "checkpoint-2").rmdir()
    assert [(g.step, g.epoch) for g in planner.look().gaps] == [(2, 1.0)]


# ---- the precision -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("history, record, saved, requested, expected", [
    ([], None, None, {}, None),  # nothing says: each checkpoint in its own, the first line decides
    ([], None, "bfloat16", {}, Precision("bfloat16")),  # what the checkpoints were saved in
    ([], "float16", "bfloat16", {}, Precision("float16")),  # what the run trains in, over the checkpoints'
    ([line(2, compute="tf32")], None, None, {}, Precision("tf32")),  # the history's own lines
    ([], "float32", None, {"dtype": "bfloat16"}, Precision("bfloat16")),  # --dtype over everything
    ([], None, None, {"autocast": "bfloat16"}, Precision("bfloat16", "bfloat16")),
], ids=["unknown", "checkpoints", "record", "history", "--dtype", "--autocast"])
def test_one_precision_for_every_line_decided_before_anything_loads(tmp_path, history, record, saved, requested,
                                                                    expected):
    if record:
        RunRecord(dtype=record).write(tmp_path)
    fake_checkpoint(tmp_path, 4, dtype=saved)
    write_history(tmp_path, history)
    plan = planner_for(tmp_path, **requested).look()
    assert plan.precision == expected and plan.dtype == (expected.dtype if expected else None)


@pytest.mark.parametrize("history, record, requested, advice", [
    ([line(2, compute="tf32")], "float32", {}, "pass --dtype tf32 to extend it"),
    ([line(2, compute="bfloat16", autocast="bfloat16")], None, {"dtype": "float32"},
     "pass --dtype float32 --autocast bfloat16 to extend it"),
    ([line(2, compute="float32")], None, {"dtype": "bfloat16"}, "pass --dtype float32 to extend it"),
], ids=["record", "autocast", "--dtype"])
def test_a_history_scored_in_another_precision_is_refused_with_options_that_extend_it(tmp_path, history, record,
                                                                                     requested, advice):
    if record:
        RunRecord(dtype=record).write(tmp_path)
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4)
    write_history(tmp_path, [{**history[0], "fingerprint": fingerprint(tmp_path / "checkpoint-2")}])
    with pytest.raises(SweepError, match="precision") as refused:
        planner_for(tmp_path, **requested).look()
    assert advice in str(refused.value) and "--restart" in str(refused.value)


# ---- the starting model ------------------------------------------------------------------------------------------
def test_the_starting_model_comes_from_base_model_then_the_record_then_the_adapters(tmp_path):
    base, other = fake_model(tmp_path / "base"), fake_model(tmp_path / "other")
    run = tmp_path / "run"
    fake_checkpoint(run, 2, adapter_of=str(base))
    assert planner_for(run).look().base_model == str(base)  # the adapter names it
    RunRecord(base_model=str(base)).write(run)
    assert planner_for(run).look().base_model == str(base)  # the record names the same
    with pytest.raises(SweepError, match=f"--base-model {other} is not the model this run started from"):
        planner_for(run, base_model=str(other)).look()
    assert planner_for(run, base_model=str(other), force_base_model=True).look().base_model == str(other)
    RunRecord(base_model=str(other)).write(run)  # the record and the adapter disagree: a person must say which
    with pytest.raises(SweepError, match="names .* as the run's starting model and .* names"):
        planner_for(run).look()


def test_an_adapter_without_a_known_base_is_refused_before_anything_is_scored(tmp_path):
    fake_checkpoint(tmp_path, 2, adapter_of="no/such-model-here")
    with pytest.raises(SweepError) as refused:
        planner_for(tmp_path).look()
    names(refused.value, "checkpoint-2", "'no/such-model-here'", "--base-model PATH")


def test_step_0_is_the_starting_weights_scored_first_once_the_precision_is_known(tmp_path):
    base = fake_model(tmp_path / "base")
    run = tmp_path / "run"
    RunRecord(base_model=str(base)).write(run)
    fake_checkpoint(run, 2)
    waiting = planner_for(run, baseline=True).look()  # a watcher: the run has not said what it trains in yet
    assert [t.step for t in waiting.pending] == [2]
    RunRecord(base_model=str(base), dtype="float32").write(run)
    plan = planner_for(run, baseline=True).look()
    first = plan.pending[0]
    assert first.checkpoint.baseline and first.step == 0 and first.checkpoint.folder == base
    assert [t.step for t in plan.pending] == [0, 2] and first.tokenizer == str(base)
    assert any("step 0: the starting weights" in n for n in plan.notes)


def test_a_history_with_step_0_but_no_baseline_report_says_why_no_change_is_logged(tmp_path):
    fake_checkpoint(tmp_path, 2)
    write_history(tmp_path, [line(0, event="train_begin")])
    plan = planner_for(tmp_path, baseline=True).look()
    assert plan.baseline is None and any("moral_probe_scifi_baseline.json is not beside the history" in n
                                         for n in plan.notes)


def test_each_task_carries_its_tokenizer_decided_once(tmp_path):
    fake_checkpoint(tmp_path, 2)
    (tmp_path / "checkpoint-2" / "tokenizer_config.json").unlink()
    with pytest.raises(SweepError) as refused:
        planner_for(tmp_path).look()
    names(refused.value, "checkpoint-2", "--tokenizer PATH")
    [task] = planner_for(tmp_path, tokenizer="some/tokenizer").look().pending
    assert task.tokenizer == "some/tokenizer"


# ---- two consumers of one hand-off queue ---------------------------------------------------------------------------
def test_the_queues_entries_come_first_and_each_consumer_plans_its_own(tmp_path):
    RunRecord(saves=[2], hand_off=True).write(tmp_path)
    queue = HandOffQueue(tmp_path)
    for consumer in ("scifi", "scifi_json"):
        queue.register(consumer)
    fake_checkpoint(queue.folder, 2)  # the entry (the run folder's checkpoint-2 was rotated away)
    plan = planner_for(tmp_path).look()
    [task] = plan.pending
    assert task.checkpoint.folder == queue.entry(2) and task.checkpoint.shown_as == str(tmp_path / "checkpoint-2")
    queue.scored(2, "scifi")
    assert queue.entry(2).exists()  # the JSON probe has not scored it yet: kept
    assert [t.step for t in planner_for(tmp_path, answer_format="json").look().pending] == [2]


# ---- the run's end and its training's life -----------------------------------------------------------------------
@pytest.mark.parametrize("attempt, life, why", [
    ({"host": socket.gethostname(), "pid": os.getpid()}, "alive", "is running"),
    ({"host": socket.gethostname(), "pid": "gone"}, "gone", "is gone"),
    ({"host": "gpu-node-7", "pid": 42, "heartbeat": Ago(60)}, "alive", "gave a sign of life"),
    ({"host": "gpu-node-7", "pid": 42, "heartbeat": Ago(5000)}, "quiet", "has given no sign of life for"),
    ({"host": "gpu-node-7", "pid": 42, "heartbeat": None}, "unknown", "left no heartbeat"),
], ids=["this process", "a dead process here", "a heartbeat elsewhere", "a stale heartbeat", "no heartbeat"])
def test_the_training_is_told_alive_gone_quiet_or_unknown(tmp_path, attempt, life, why):
    from tinymcf_callback.rundir.record import boot_id, process_start

    here = Attempt.here(0)
    fields = {**here.__dict__, **attempt}
    fields["heartbeat"] = when(fields["heartbeat"])
    if fields["pid"] == "gone":
        fields["pid"] = gone_pid()
    if fields["host"] != here.host:
        fields["boot_id"] = None
    else:
        fields["boot_id"], fields["pid_started"] = boot_id(), process_start(fields["pid"])
    RunRecord(attempts=[Attempt(**fields)]).write(tmp_path)
    fake_checkpoint(tmp_path, 2)
    write_history(tmp_path, [line(2, fingerprint=fingerprint(tmp_path / "checkpoint-2"))])
    plan = planner_for(tmp_path).look()
    assert plan.life == life and why in plan.liveness


@pytest.mark.parametrize("record, max_steps, ended", [
    ({"ended": True}, 6, "the run ended (its moral_probe_run.json says so)"),
    (None, 4, "checkpoint-4 is the run's last step (max_steps 4)"),
    (None, 6, None),  # max_steps 6, the newest is 4: more to come
])
def test_the_run_is_over_when_its_record_says_so_or_its_last_step_is_scored(tmp_path, record, max_steps, ended):
    if record:
        RunRecord(**record).write(tmp_path)
    fake_checkpoint(tmp_path, 4, max_steps=max_steps)
    write_history(tmp_path, [line(4, fingerprint=fingerprint(tmp_path / "checkpoint-4"))])
    assert planner_for(tmp_path).look().ended == ended


def test_a_folder_of_no_checkpoints_is_refused_by_the_sweep_at_once_naming_the_layouts_it_reads(tmp_path):
    (tmp_path / "weights_final").mkdir()  # nothing of a layout it knows
    with pytest.raises(SweepError, match="holds no saved model of a layout tinymcf reads") as refused:
        planner_for(tmp_path, following=False).look()
    for layout in ("checkpoint-<step>", "verl global_step_<N>/actor", "OpenRLHF global_step<N>_hf", "NeMo-RL step_<N>",
                   "torchtitan step-<N>", "step_<N>"):
        assert layout in str(refused.value)
    assert not (tmp_path / HISTORY).exists()


def test_the_history_is_refused_when_a_line_is_not_one(tmp_path):
    fake_checkpoint(tmp_path, 2)
    (tmp_path / HISTORY).write_text(json.dumps({"step": "two"}) + "\n")
    from tinymcf_callback.errors import HistoryError

    with pytest.raises(HistoryError, match="the history is only ever appended to; repair or move that line"):
        planner_for(tmp_path).look()



def test_a_refused_sweep_or_watch_leaves_no_lock_behind(tmp_path, capsys):
    from helpers.cli_checks import one_error_line

    from tinymcf_callback.cli.main import main as tinymcf

    fake_checkpoint(tmp_path, 2, adapter_of="no/such-model-here")  # refused at the first look, the lock held
    for command in ("sweep", "watch"):
        rc = tinymcf([command, str(tmp_path), "--limit", "2", "--no-progress", "--report-to", "none"])
        one_error_line(rc, capsys.readouterr().err, "pass --base-model PATH")
        assert not list(tmp_path.glob(".*lock")), command


# ---- what the exit status says ---------------------------------------------------------------------------------
@pytest.mark.parametrize("attempt, status, said", [
    ({"host": "gpu-node-7", "pid": 42, "heartbeat": Ago(5000)}, 5, "the training has gone quiet: process 42 on "
     "gpu-node-7 has given no sign of life for"),
    ({"host": socket.gethostname(), "pid": "gone"}, 3, "the training stopped without ending: process"),
], ids=["quiet elsewhere", "gone here"])
def test_a_watcher_says_a_quiet_training_apart_from_a_dead_one(tmp_path, capsys, attempt, status, said):
    from tinymcf_callback.cli.main import main as tinymcf
    from tinymcf_callback.rundir.record import boot_id

    pid = gone_pid() if attempt["pid"] == "gone" else attempt["pid"]
    started = time.time() - 6000
    RunRecord(saves=[2], attempts=[Attempt(**{**attempt, "pid": pid, "boot_id": boot_id(), "started": started,
                                              "heartbeat": when(attempt.get("heartbeat"))})]).write(tmp_path)
    fake_checkpoint(tmp_path, 2)
    write_history(tmp_path, [line(2, fingerprint=fingerprint(tmp_path / "checkpoint-2"))])  # nothing left to score
    rc = tinymcf(["watch", str(tmp_path), "--limit", "2", "--no-progress", "--report-to", "none", "--poll", "0.05",
                  "--no-baseline"])
    err = capsys.readouterr().err
    assert rc == status and said in err, err
    if status == 5:
        assert "if it is still running, start the watcher again" in err and "resume it and start" not in err


def test_saved_steps_that_are_gaps_give_their_own_status_and_say_which():
    from tinymcf_callback.cli.followed import said_failures
    from tinymcf_callback.cli.options import EXIT_GAPS
    from tinymcf_callback.follow.rounds import RunResult

    assert said_failures(RunResult(Path("h.jsonl"))) == 0
    assert said_failures(RunResult(Path("h.jsonl"), gaps=[2, 4])) == EXIT_GAPS == 4


@pytest.mark.parametrize("what, status", [
    ({"gaps": [2]}, 4), ({"training_quiet": "no heartbeat"}, 5), ({"training_gone": "process 7 is gone"}, 3),
    ({"training_quiet": "no heartbeat", "gaps": [2]}, 5), ({"training_gone": "gone", "gaps": [2]}, 3),
    ({"undelivered": ["tensorboard: step 2"], "gaps": [2]}, 1), ({"failed": True, "gaps": [2, 4]}, 1),
    ({"failed": True, "training_gone": "gone"}, 1)])
def test_the_exit_status_a_follower_prints_is_the_one_it_exits_with(capsys, what, status):
    """Each problem is said once, without a number; the last line names the status returned (a sweep with an
    unreadable checkpoint and a gap printed "exit status 4" and exited 1)."""
    from tinymcf_callback.cli.followed import said_failures
    from tinymcf_callback.follow.rounds import RunResult
    from tinymcf_callback.follow.scoring import Outcome

    failures = [Outcome(2, "checkpoint-2", 0, error="unreadable")] if what.pop("failed", False) else []
    assert said_failures(RunResult(Path("h.jsonl"), failures=failures, **what)) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"[tinymcf] exit status {status}: ")
    assert sum("exit status" in line for line in err) == 1


def test_checkpoint_folders_of_a_loop_without_trainer_state_are_read_alike_by_the_sweep_and_the_watcher(tmp_path):
    """A loop of one's own that names its saves checkpoint-<N> but writes no trainer_state.json: once steady, the
    sweep and the watcher both take them (the watcher used to skip them, waiting for a file that never comes)."""
    for step in (1, 2):
        folder = fake_checkpoint(tmp_path, step)
        (folder / "trainer_state.json").unlink()
    old = time.time() - 60
    for p in tmp_path.rglob("*"):
        os.utime(p, (old, old))
    for following in (True, False):
        assert [t.step for t in planner_for(tmp_path, following=following).look().pending] == [1, 2], following
    fresh = fake_checkpoint(tmp_path, 3)
    (fresh / "trainer_state.json").unlink()  # just written: not steady yet, for either
    for following in (True, False):
        assert [t.step for t in planner_for(tmp_path, following=following).look().pending] == [1, 2], following
