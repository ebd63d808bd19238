"""tinymcf watch: a run followed from another process while it trains, into its history and its dashboards."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cli_checks import one_error_line
from helpers.fake_runs import fake_checkpoint, planner_for, watch_settings
from helpers.runs import budget_free, clone
from helpers.trackers import read_wandb_records

from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.follow.planner import saved_steps
from tinymcf_callback.follow.watch import run_watch
from tinymcf_callback.rundir.checkpoints import checkpoint_folders, fingerprint
from tinymcf_callback.rundir.history import DELETED_EVENT, gap_line, read_lines, sole_writer
from tinymcf_callback.rundir.layouts import TRAINER, read_save
from tinymcf_callback.rundir.record import RunRecord

HERE = Path(__file__).resolve().parent
RUN = HERE / "helpers" / "watched_run.py"
HISTORY = "moral_probe_scifi.jsonl"
PROBE = ["--per-foundation", "1", "--n-resamples", "0"]
TIMING = ("elapsed_s", "seconds")
APART = ("event", "model", "by")  # what triggered and wrote the line; the callback names the model it started from


def env_for(tmp_path: Path) -> dict:
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_PROJECT": "tinymcf-test",
            "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def watcher(run: Path, tmp_path: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tinymcf_callback", "watch", str(run), *PROBE, "--device", "cpu",
                             "--poll", "0.2", "--no-progress", *extra], env=env_for(tmp_path), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def history(run: Path) -> list[dict]:
    path = run / HISTORY
    return [line for _, line in read_lines(path)] if path.exists() else []


def without_timing(value):
    """A history line with the fields that time the probe (and the event that triggered it) left out."""
    value = budget_free(value)
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k not in APART and not k.endswith(TIMING)}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def tensorboard_points(folder: Path, tag: str) -> dict[str, dict[int, float]]:
    """{event file suffix: {step: value}} of one tag over the folder's event files (a killed watcher's file too)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for path in glob.glob(str(folder / "events.out.tfevents*")):
        acc = EventAccumulator(path)
        acc.Reload()
        if tag in acc.Tags()["scalars"]:  # one file per writer: the watchers' files merged by their suffix
            out.setdefault(Path(path).name.rsplit(".", 1)[-1], {}).update({s.step: s.value for s in acc.Scalars(tag)})
    return out


@pytest.mark.slow
def test_a_watched_run_gives_the_callbacks_lines_survives_a_restart_and_reaches_the_dashboards(tmp_path):
    init, env = tmp_path / "init", env_for(tmp_path)
    # the reference: the same run, probed in-process by the callback at every save
    ref = tmp_path / "ref"
    subprocess.run([sys.executable, str(RUN), str(ref), str(init), "callback"], env=env, cwd=tmp_path, check=True,
                   capture_output=True, timeout=600)
    # the run followed: the callback hands off, save_total_limit=2 deletes all but the newest two checkpoints
    run = tmp_path / "run"
    gate = tmp_path / "go-on"
    training = subprocess.Popen([sys.executable, str(RUN), str(run), str(init), "watch", str(gate)], env=env,
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run / "moral_probe_run.json").exists():
        assert training.poll() is None and time.monotonic() < deadline, training.stderr.read()
        time.sleep(0.2)
    first = watcher(run, tmp_path)
    while len(history(run)) < 3 and time.monotonic() < deadline:  # step 0 and two checkpoints
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)  # killed midway, with the training waiting after step 3
    first.wait(timeout=30)
    killed_at = len(history(run))
    assert training.poll() is None
    second = watcher(run, tmp_path)
    gate.write_text("")  # the training goes on while the second watcher follows
    out, _ = second.communicate(timeout=600)  # ends by itself when the run is over
    assert training.wait(timeout=600) == 0
    assert second.returncode == 0, out
    assert "stopped: the run ended" in out

    lines, reference = history(run), history(ref)
    steps = [line["step"] for line in lines]
    assert steps == sorted(set(steps)) == list(range(7)), steps  # every saved step once, none lost, in order
    assert 3 <= killed_at < 7
    assert [line["model"] for line in lines[1:]] == [str(run / f"checkpoint-{s}") for s in range(1, 7)]
    assert [line["event"] for line in lines] == ["train_begin"] + ["watch"] * 6
    assert [line["step"] for line in reference] == list(range(7))
    # step 0: the watcher scored the starting model's folder, the callback the live model (no saved weights)
    assert lines[0]["fingerprint"] == fingerprint(init) and reference[0]["fingerprint"] is None
    lines[0]["fingerprint"] = None
    for mine, theirs in zip(lines, reference, strict=True):  # the callback's numbers, bit for bit in float32
        assert without_timing(mine) == without_timing(theirs), mine["step"]  # fingerprints included
    assert not (run / ".moral_probe_queue").exists()  # every hand-off copy scored and removed
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-5", "checkpoint-6"]

    info = json.loads((run / "moral_probe_run.json").read_text())
    assert info["saves"] == list(range(1, 7)) and info["ended"] is True
    # TensorBoard: the probe's curve in the Trainer's own logging folder, beside the loss, at the Trainer's steps
    tb = Path(info["trackers"]["tensorboard"]["dir"])
    assert tb.parent == run / "runs"
    points = tensorboard_points(tb / "moral_probe_scifi", "eval/moral_scifi/score")  # the probe's own folder
    assert list(points) == ["tinymcf"] and sorted(points["tinymcf"]) == list(range(7))
    assert pytest.approx(points["tinymcf"][6], abs=1e-6) == lines[6]["score"]
    assert tensorboard_points(tb, "train/loss")  # the Trainer's own file, alone in its folder
    assert not tensorboard_points(tb, "eval/moral_scifi/score")  # a second file there would freeze a live TensorBoard
    # wandb (offline): the watcher's writer carries the training run's id; its rows sit on the Trainer's step axis
    wandb_id = info["trackers"]["wandb"]["id"]
    runs = [r for r in glob.glob(str(tmp_path / "wandb" / "offline-run-*")) if r.endswith("-" + wandb_id)]
    assert len(runs) == 3  # the training's, and the two watchers' (the reference run has an id of its own)
    mine = [r for r in runs if any("eval/moral_scifi/score" in row for row in _rows(r))]
    assert 1 <= len(mine) <= 2  # the training process logged no probe (hand_off); a killed watcher may lose its rows
    assert "line(s) an earlier sweep or watch wrote:" in out  # ... so the second one sends what the first's lost
    logged = {json.loads(row["train/global_step"]) for r in mine for row in _rows(r) if "eval/moral_scifi/score" in row}
    assert logged == set(range(7))
    assert any(m.step_metric == "train/global_step" and m.glob_name == "eval/moral_scifi/*"
               for r in mine for m in _metrics(r))


def _records(run_folder: str):
    files = glob.glob(str(Path(run_folder) / "*.wandb"))
    return list(read_wandb_records(files[0])) if files else []


def _rows(run_folder: str) -> list[dict]:
    return [{i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
            for r in _records(run_folder) if r.WhichOneof("record_type") == "history"]


def _metrics(run_folder: str):
    return [r.metric for r in _records(run_folder) if r.WhichOneof("record_type") == "metric"]


@pytest.fixture(scope="module")
def handed_off_run(tmp_path_factory) -> Path:
    """One hand-off run (save_total_limit=2, steps 1-6, TensorBoard and offline wandb), trained once for the tests
    below; each works on a copy of it (``clone``)."""
    folder = tmp_path_factory.mktemp("handed_off")
    run = folder / "run"
    subprocess.run([sys.executable, str(RUN), str(run), str(folder / "init"), "watch"], env=env_for(folder),
                   cwd=folder, check=True, capture_output=True, timeout=600)
    return run


@pytest.mark.slow
def test_checkpoints_deleted_before_the_watcher_came_are_gaps_said_once(tmp_path, handed_off_run):
    """No hand-off: a watcher started after save_total_limit deleted checkpoints 1-4 records them as gaps (from
    the run's record of its saves), scores the two left and the baseline, and a second watch adds nothing."""
    run = clone(handed_off_run, tmp_path / "run")
    shutil.rmtree(run / ".moral_probe_queue")  # as if the hand-off had been off
    p = watcher(run, tmp_path, "--report-to", "none")
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 4, out  # the curve has gaps: a launch script can tell it from a whole one
    assert "error: 4 saved step(s) are gaps in the curve, never scored: 1, 2, 3, 4" in out
    lines = sorted(history(run), key=lambda line: line["step"])  # the gaps are written once step 0 is in
    assert [(line["step"], line["event"]) for line in lines] == [
        (0, "train_begin"), (1, DELETED_EVENT), (2, DELETED_EVENT), (3, DELETED_EVENT), (4, DELETED_EVENT),
        (5, "watch"), (6, "watch")]
    assert out.count("recorded as a gap") == 4 and "4 deleted before they could be scored" in out
    assert lines[1]["score"] is None and lines[1]["metrics"] == {} and "deleted" in lines[1]["info"]
    again = watcher(run, tmp_path, "--report-to", "none")
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 4 and "0 checkpoint(s) scored" in out and len(history(run)) == 7  # still gaps


# ---- one look at a run folder (no model) ---------------------------------------------------------
def present(run: Path) -> dict:
    found = {s: read_save(TRAINER, s, f, run) for s, f in checkpoint_folders(run).items()}
    return {s: c for s, c in found.items() if c is not None}


def test_a_checkpoint_counts_once_its_trainer_state_is_written_whole(tmp_path):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4, state='{"global_step": 4, "epo')  # the Trainer is still writing it
    (tmp_path / "checkpoint-6").mkdir()  # weights only so far
    assert sorted(present(tmp_path)) == [2]
    found = planner_for(tmp_path).look()
    assert [t.step for t in found.pending] == [2] and found.ended is None and found.gaps == []


def test_the_steps_saved_are_the_runs_record_else_what_save_steps_implies(tmp_path):
    fake_checkpoint(tmp_path, 6)
    fake_checkpoint(tmp_path, 8, max_steps=8)
    assert saved_steps(None, present(tmp_path)) == {2, 4, 6, 8}
    assert saved_steps(RunRecord(saves=[3, 8]), present(tmp_path)) == {3, 8}
    fake_checkpoint(tmp_path, 7)  # off the pattern (saved by hand, or by epoch): nothing is inferred
    assert saved_steps(None, present(tmp_path)) == set()


def test_a_checkpoint_seen_then_deleted_is_a_gap_and_the_run_end_is_read(tmp_path):
    planner = planner_for(tmp_path)
    fake_checkpoint(tmp_path, 2)
    planner.look()
    assert planner.seen == {2: 1.0}
    shutil.rmtree(tmp_path / "checkpoint-2")  # rotated away by the Trainer before it was scored
    fake_checkpoint(tmp_path, 4)
    found = planner.look()
    assert [(g.step, g.epoch) for g in found.gaps] == [(2, 1.0)] and [t.step for t in found.pending] == [4]
    assert "save_total_limit" in found.gaps[0].why
    RunRecord(saves=[2, 4], ended=True).write(tmp_path)
    (tmp_path / HISTORY).write_text(json.dumps(gap_line("scifi", "yesno", step=2, epoch=1.0, why="x")) + "\n")
    assert planner.look(hold={4}).ended.startswith("the run ended")


def test_a_second_watcher_of_one_run_is_refused_in_one_line(tmp_path, capsys):
    fake_checkpoint(tmp_path, 2)
    with sole_writer(tmp_path / HISTORY, "the first watcher"):
        rc = tinymcf(["watch", str(tmp_path), "--limit", "2", "--no-progress", "--report-to", "none"])
    one_error_line(rc, capsys.readouterr().err, "another sweep or watch is writing", "tinymcf watch")


@pytest.mark.parametrize("args, needle", [
    (["--poll", "0"], "--poll must be a number of seconds above 0"),
    (["--stop-at", "-1"], "--stop-at must be a training step >= 0"),
    (["--retries", "-1"], "--retries must be a whole number >= 0"),
    (["--dead-after", "0"], "--dead-after must be a number of seconds above 0"),
    (["--report-to", "wandb"], "no wandb run to log into"),
])
def test_bad_watch_input_is_one_line(tmp_path, capsys, args, needle):
    fake_checkpoint(tmp_path, 2)
    rc = tinymcf(["watch", str(tmp_path), "--limit", "2", "--no-progress", *args])
    one_error_line(rc, capsys.readouterr().err, needle)


def test_idle_timeout_and_stop_at_end_a_watch_with_nothing_to_score(tmp_path):
    fake_checkpoint(tmp_path, 2)
    (tmp_path / HISTORY).write_text(json.dumps(gap_line("scifi", "yesno", step=2, epoch=1.0, why="x")) + "\n")
    shutil.rmtree(tmp_path / "checkpoint-2")  # recorded as a gap: nothing left to score
    result = run_watch(watch_settings(tmp_path, idle_timeout=0.05))
    assert result.why_stopped.startswith("no new checkpoint for 0.05 s") and result.scored == []
    result = run_watch(watch_settings(tmp_path, stop_at=2))
    assert result.why_stopped == "step 2 is done (--stop-at)"


@pytest.mark.slow
def test_a_sweep_after_the_fact_logs_into_the_runs_own_dashboards(tmp_path, handed_off_run):
    init, env = handed_off_run.parent / "init", env_for(tmp_path)
    run = clone(handed_off_run, tmp_path / "run")
    p = subprocess.run([sys.executable, "-m", "tinymcf_callback", "sweep", str(run), *PROBE, "--device", "cpu",
                        "--report-to", "auto", "--no-progress"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    info = json.loads((run / "moral_probe_run.json").read_text())
    assert "logging each line to TensorBoard" in p.stderr and f"wandb run {info['trackers']['wandb']['id']}" in \
        p.stderr
    # the sweep plans the run as the watcher does: the recorded starting model is step 0, the queue keeps 1-4
    assert f"step 0: the starting weights {init} (named by the run's moral_probe_run.json)" in p.stderr
    lines = history(run)
    assert [line["step"] for line in lines] == list(range(7)) and {line["by"] for line in lines} == {"sweep"}
    assert not (run / ".moral_probe_queue").exists() or not list((run / ".moral_probe_queue").glob("checkpoint-*"))
    # the run folder is a copy (clone): its own logging folder gets the points, not the one the record names
    recorded = Path(info["trackers"]["tensorboard"]["dir"])
    assert recorded.parent.parent == handed_off_run and "this folder is a copy of that run" in p.stderr
    assert not (recorded / "moral_probe_scifi").exists()
    points = tensorboard_points(run / "runs" / recorded.name / "moral_probe_scifi", "eval/moral_scifi/score_change")
    assert sorted(points["tinymcf"]) == list(range(7))
    assert points["tinymcf"][6] == pytest.approx(lines[6]["metrics"]["eval_moral_scifi/score_change"], abs=1e-6)


_PARENT = """
import os, subprocess, sys, wandb
run = wandb.init(mode="offline", id="trainrun1", project="tinymcf-test", dir=sys.argv[1])
assert os.environ.get("WANDB_SERVICE")  # what a child of this process inherits: the service holding the id
child = subprocess.run([sys.executable, "-c", sys.argv[2], sys.argv[1]], env=os.environ, capture_output=True, text=True)
print(child.stdout + child.stderr)
from pathlib import Path
from tinymcf_callback.trackers.open import open_trackers
inside = open_trackers(Path(sys.argv[1]), ["wandb"], "scifi", runs={"wandb": "trainrun1"})  # in it
print("inside:", inside.names, inside.sinks and wandb.run is run)
inside.close()
other = open_trackers(Path(sys.argv[1]), ["wandb"], "scifi", runs={"wandb": "otherrun1"})  # another
other.close()
print("still live:", wandb.run is run and not run._is_finished)
run.finish()
"""
_CHILD = """
import sys
from pathlib import Path
from tinymcf_callback.trackers.open import open_trackers
dashboards = open_trackers(Path(sys.argv[1]), ["wandb"], "scifi", runs={"wandb": "trainrun1"})
print("child:", dashboards.names)
dashboards.close()
"""


@pytest.mark.slow
def test_a_watcher_started_by_the_training_process_logs_into_its_wandb_run(tmp_path):
    """A child inherits the parent's wandb-core service, which holds the training run's id: it opens a service of
    its own rather than being refused ("run ID is in use"); inside the training process, the live run is used
    and left open."""
    p = subprocess.run([sys.executable, "-c", _PARENT, str(tmp_path), _CHILD], env=env_for(tmp_path), cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "child: ['wandb run trainrun1']" in p.stdout, p.stdout + p.stderr
    assert "inside: ['wandb run trainrun1'] True" in p.stdout and "still live: True" in p.stdout, p.stdout
    assert len(glob.glob(str(tmp_path / "wandb" / "offline-run-*-trainrun1"))) == 2  # the training's and the child's
    assert len(glob.glob(str(tmp_path / "wandb" / "offline-run-*-otherrun1"))) == 1
