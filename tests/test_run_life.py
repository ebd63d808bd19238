"""A run's whole life, followed: each case of a run that does not stay healthy, on a real Trainer run.

A resumed run that saves a step again with other weights, a LoRA run given the wrong base, two watchers of one
hand-off queue, a training killed without its end marker, a queue on another filesystem, FSDP and DeepSpeed
sharded checkpoints, a checkpoint unreadable for a moment, a TensorBoard folder on a full disk, a TF32 history,
and the sweep planning a run as the watcher does. Each asserts the history afterwards line by line. Tiny random
Qwen3 runs (tests/helpers/runs.py): mechanics, never moral content.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from helpers.cli_checks import names, one_error_line
from helpers.ports import torchrun
from helpers.runs import (
    HISTORY,
    PROBE,
    PROBE_ARGS,
    clone,
    env_for,
    history,
    start_model,
    steps_events,
    train_run,
    wait_for,
    without,
)

from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.config import ProbeConfig
from tinymcf_callback.follow.settings import RunSettings, WatchSettings
from tinymcf_callback.follow.watch import run_watch
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir import queue as queue_module
from tinymcf_callback.rundir.checkpoints import fingerprint
from tinymcf_callback.rundir.record import RunRecord

HERE = Path(__file__).resolve().parent
RUNS = HERE / "helpers" / "runs.py"
JSON_HISTORY = "moral_probe_scifi_json.jsonl"


def watch(run: Path, *extra: str) -> int:
    return tinymcf(["watch", str(run), *PROBE_ARGS, "--device", "cpu", "--poll", "0.05", "--no-progress",
                    "--report-to", "none", *extra])


def sweep(run: Path, *extra: str) -> int:
    return tinymcf(["sweep", str(run), *PROBE_ARGS, "--device", "cpu", "--no-progress", *extra])


@pytest.fixture
def init(tmp_path, qwen_tok) -> Path:
    return start_model(tmp_path / "init", qwen_tok)


# ---- 1. a resumed run saves a step again with other weights --------------------------------------------------
@pytest.mark.slow
def test_a_resumed_run_sets_its_abandoned_branch_aside_and_scores_the_steps_again(tmp_path, qwen_tok, init, capsys):
    """Resumed from checkpoint-2 (the latest was corrupt) with other data: steps 3 and 4 are saved again with other
    weights. The watcher marks the resume, sets the old lines of 3 and 4 aside and scores the new checkpoints; the
    in-process callback in the same situation writes the same history, number for number."""
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=4, save_only_model=False)  # hand_off: the watcher scores
    assert watch(run) == 0
    first = history(run)
    assert steps_events(first) == [(0, "train_begin"), *((s, "watch") for s in (1, 2, 3, 4))]
    train_run(run, qwen_tok, init, max_steps=4, resume=str(run / "checkpoint-2"), seed=1)  # other batches
    capsys.readouterr()
    assert watch(run) == 0
    err = capsys.readouterr().err
    names(err, "checkpoint-2", "3, 4")  # where it resumed, the abandoned branch's steps set aside
    lines = history(run)
    assert steps_events(lines) == [*steps_events(first), (2, "resumed"), (3, "watch"), (4, "watch")]
    mark = lines[5]
    assert mark["info"]["resumed"]["superseded"] == [3, 4] and mark["score"] is None and mark["metrics"] == {}
    assert mark["info"]["resumed"]["attempt_started"] == RunRecord.read(run).attempt.started
    for old, new in ((first[3], lines[6]), (first[4], lines[7])):
        assert new["fingerprint"] == fingerprint(run / f"checkpoint-{new['step']}") != old["fingerprint"]
        assert new["score"] != old["score"] or new["info"]["yn_mass_mean"] != old["info"]["yn_mass_mean"]
    # every reader takes the current branch: the plot's curve holds the new lines of 3 and 4
    from tinymcf_callback.views.curves import load_history

    curve = load_history(run / HISTORY)
    assert list(curve.steps) == [0, 1, 2, 3, 4]
    assert curve.series("score").est[3] == pytest.approx(lines[6]["score"], abs=1e-12)
    # a second watch finds nothing to do
    assert watch(run) == 0 and len(history(run)) == 8

    # the same two trainings probed by the callback in-process: the same history
    ref = tmp_path / "ref"
    train_run(ref, qwen_tok, init, max_steps=4, hand_off=False, save_only_model=False)
    train_run(ref, qwen_tok, init, max_steps=4, hand_off=False, resume=str(ref / "checkpoint-2"), seed=1)
    theirs = history(ref)
    assert steps_events(theirs) == [(0, "train_begin"), *((s, "save") for s in (1, 2, 3, 4)), (2, "resumed"),
                                    (3, "save"), (4, "save")]
    lines[0]["fingerprint"] = None  # the watcher scored the starting model's folder, the callback its live model
    apart = ("event", "model", "by", "attempt_started", "elapsed_s", "seconds")
    for mine, ref_line in zip(lines, theirs, strict=True):
        assert without(mine, apart) == without(ref_line, apart), mine["step"]  # fingerprints included


@pytest.mark.slow
def test_a_checkpoint_saved_again_without_a_record_is_scored_again_by_its_fingerprint(tmp_path, qwen_tok, init,
                                                                                     capsys):
    """No callback, no record: the sweep sees the rewritten checkpoints by their weights alone; the new line names the
    one it supersedes (``replaces``) and the readers take it."""
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=3, probe=False, save_only_model=False)
    assert sweep(run) == 0
    first = history(run)
    train_run(run, qwen_tok, init, max_steps=3, probe=False, resume=str(run / "checkpoint-1"), seed=1)
    capsys.readouterr()
    assert sweep(run) == 0
    out = capsys.readouterr()
    names(out.out, "2 checkpoint(s) scored", "steps 2, 3")  # scored again: the steps saved with other weights
    names(out.err, "checkpoint-2")
    lines = history(run)
    assert steps_events(lines) == [(1, "sweep"), (2, "sweep"), (3, "sweep"), (2, "sweep"), (3, "sweep")]
    assert [line.get("replaces") for line in lines] == [None, None, None, first[1]["fingerprint"],
                                                        first[2]["fingerprint"]]
    assert lines[3]["fingerprint"] == fingerprint(run / "checkpoint-2") != first[1]["fingerprint"]
    from tinymcf_callback.views.curves import load_history

    assert load_history(run / HISTORY).series("score").est[1] == pytest.approx(lines[3]["score"], abs=1e-12)
    assert sweep(run) == 0 and len(history(run)) == 5  # nothing more to do


# ---- 2. adapters scored on the wrong base --------------------------------------------------------------------
@pytest.mark.slow
def test_a_lora_runs_base_is_checked_before_anything_is_scored_and_the_recorded_one_used(tmp_path, qwen_tok, init,
                                                                                       capsys):
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=2, peft=True, learning_rate=1e-2)
    assert json.loads((run / "checkpoint-1" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        str(init)
    other = start_model(tmp_path / "other", qwen_tok, seed=1)  # the same architecture, other weights
    import transformers as T

    llama = tmp_path / "llama"  # another architecture altogether
    T.LlamaForCausalLM(T.LlamaConfig(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1)).save_pretrained(llama)
    for wrong in (other, llama):
        capsys.readouterr()
        rc = watch(run, "--base-model", str(wrong))
        one_error_line(rc, capsys.readouterr().err, f"--base-model {wrong} is not the model this run started from",
                       f"names {init}", "leave --base-model out", "--force-base-model")
        assert not (run / HISTORY).exists()  # refused before step 0 was scored
    assert watch(run) == 0  # the base the record and the adapters name
    lines = history(run)
    assert steps_events(lines) == [(0, "train_begin"), (1, "watch"), (2, "watch")]
    assert lines[0]["model"] == str(init) and all("eval_moral_scifi/score_change" in line["metrics"] for line in lines)
    assert not (run / ".moral_probe_queue").exists()


# ---- 3. one hand-off queue, two consumers --------------------------------------------------------------------
@pytest.mark.slow
def test_two_watchers_of_one_queue_each_score_every_checkpoint(tmp_path, qwen_tok, init, capsys):
    """Both answer formats hand off (save_total_limit=1): a queue entry goes only once both have scored it."""
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=3, save_total_limit=1, answer_formats=("yesno", "json"))
    queue = run / ".moral_probe_queue"
    assert sorted(p.name for p in (queue / ".consumers").iterdir()) == ["scifi", "scifi_json"]
    assert watch(run) == 0
    assert sorted(p.name for p in queue.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert "keeps 3 checkpoint(s) for the 'scifi_json' probe" in capsys.readouterr().err
    assert watch(run, "--answer-format", "json") == 0
    assert not queue.exists()  # both have scored every entry: nothing is kept any more
    for name, event in ((HISTORY, "watch"), (JSON_HISTORY, "watch")):
        assert steps_events(history(run, name)) == [(0, "train_begin"), (1, event), (2, event), (3, event)]


@pytest.mark.slow
def test_a_consumer_that_came_late_gets_gaps_with_their_real_cause(tmp_path, qwen_tok, init, capsys):
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=3, save_total_limit=1)  # only the Yes/No probe hands off
    assert watch(run) == 0 and not (run / ".moral_probe_queue").exists()
    capsys.readouterr()
    assert watch(run, "--answer-format", "json") == 4  # a curve with gaps: its own status
    out = capsys.readouterr()
    names(out.err, "error: 2 saved step(s)", ": 1, 2")
    lines = history(run, JSON_HISTORY)
    assert steps_events(lines) == [(0, "train_begin"), (1, "deleted"), (2, "deleted"), (3, "watch")]
    names(lines[1]["info"]["deleted"], "hand-off queue", "'scifi_json'")
    names(out.out, "2 deleted")


# ---- 4. a training that dies -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_killed_training_ends_the_watch_with_a_status_that_says_so(tmp_path, init):
    """The training is killed (no end marker) while the watcher follows it with no time limit: once what it saved
    is scored, the watcher says the training is gone and exits 3."""
    run, env = tmp_path / "run", env_for(tmp_path)
    training = subprocess.Popen([sys.executable, str(RUNS), str(run), str(init), "max_steps=6", "pause_at=2",
                                 "pause=600"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (run / "moral_probe_run.json").exists(), what="the run's record")
        watcher = subprocess.Popen([sys.executable, "-m", "tinymcf_callback", "watch", str(run), *PROBE_ARGS,
                                    "--device", "cpu", "--poll", "0.2", "--no-progress", "--report-to", "none"],
                                   env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: [line["step"] for line in history(run)] == [0, 1, 2], what="steps 0-2 scored")
        assert watcher.poll() is None  # the training lives (paused after its save of step 2): the watcher waits
    finally:
        training.send_signal(signal.SIGKILL)
        training.wait(timeout=60)
    out, _ = watcher.communicate(timeout=120)
    assert watcher.returncode == 3, out
    record = RunRecord.read(run)
    assert not record.ended and record.attempt.pid == training.pid
    names(out, "the training is gone without ending", f"process {training.pid} on ")
    assert steps_events(history(run)) == [(0, "train_begin"), (1, "watch"), (2, "watch")]


def test_a_training_on_another_machine_that_goes_silent_is_quiet_and_one_here_that_is_gone_is_gone(tmp_path):
    from tinymcf_callback.rundir.record import Attempt

    now = 1_000_000.0
    elsewhere = Attempt(from_step=0, started=now - 5000, host="gpu-node-7", pid=4242, heartbeat=now - 120)
    record = RunRecord(attempts=[elsewhere])
    assert record.liveness(now, dead_after=900) == ("alive", "process 4242 on gpu-node-7 gave a sign of life 120 s ago")
    elsewhere.heartbeat = now - 1200
    life, why = record.liveness(now, dead_after=900)
    assert life == "quiet"
    names(why, "1200 s", "900 s")  # how long since its heartbeat, and the --dead-after it passed
    here = Attempt.here(0)
    assert RunRecord(attempts=[here]).liveness()[0] == "alive"  # this very process
    gone = Attempt(**{**here.__dict__, "pid": _a_pid_that_is_gone()})
    assert RunRecord(attempts=[gone]).liveness()[0] == "gone"
    reused = Attempt(**{**here.__dict__, "pid_started": "1"})  # the pid lives, but it is another process now
    assert RunRecord(attempts=[reused]).liveness() == ("gone", f"process {os.getpid()} on {here.host} is gone (its "
                                                               f"process id now belongs to another process)")
    assert RunRecord(attempts=[gone], ended=True).liveness() == ("ended", "the run ended")
    assert RunRecord().liveness()[0] == "unknown"


def _a_pid_that_is_gone() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---- 5. hard links that cannot be made ---------------------------------------------------------------------
@contextlib.contextmanager
def another_filesystem(path: Path, size: str = "1m"):
    """``path`` on a filesystem of its own (a tmpfs of ``size``); skipped where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(f"a filesystem of its own needs mount (root): {p.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.slow
def test_a_queue_on_another_filesystem_is_said_once_and_its_gaps_name_the_cause(tmp_path, qwen_tok, init, caplog,
                                                                              capsys):
    run = tmp_path / "run"
    with another_filesystem(run / ".moral_probe_queue"):
        with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
            train_run(run, qwen_tok, init, max_steps=4, save_total_limit=1)
        said = [r.getMessage() for r in caplog.records if "could not be handed off" in r.getMessage()]
        assert len(said) == 1 and "Invalid cross-device link" in said[0] and "docs/watch.md" in said[0]
        record = RunRecord.read(run)
        assert sorted(record.hand_off_failures) == [1, 2, 3, 4]
        assert watch(run) == 4  # three saved steps are gaps
    lines = history(run)
    assert steps_events(lines) == [(0, "train_begin"), (1, "deleted"), (2, "deleted"), (3, "deleted"), (4, "watch")]
    for line in lines[1:4]:
        assert "it was not handed off (Invalid cross-device link: hard links need the queue on the checkpoint's " \
               "filesystem)" in line["info"]["deleted"]
    assert "3 deleted before they could be scored" in capsys.readouterr().out


# ---- 6. sharded checkpoints ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fsdp", "zero3"])
def test_sharded_checkpoints_are_handed_off_and_scored_through_their_own_libraries(kind, tmp_path, qwen_tok, init):
    """A real Trainer run under torchrun (2 processes, gloo, CPU) saving FSDP ``SHARDED_STATE_DICT`` or DeepSpeed
    ZeRO-3 checkpoints, ``save_total_limit=1``: the queue keeps the shard folders, the watcher scores every step,
    each equal to the checkpoint converted by the library's own tool and scored as a plain model."""
    if kind == "zero3":
        pytest.importorskip("deepspeed")
    run = tmp_path / "run"
    env = {**env_for(tmp_path), "DS_ACCELERATOR": "cpu"}
    p = subprocess.run([*torchrun(2), str(HERE / "helpers" / "sharded_run.py"), str(run), str(init), kind], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    queue = run / ".moral_probe_queue"
    shards = "pytorch_model_fsdp_0" if kind == "fsdp" else "global_step{}"
    for step in (1, 2, 3):
        entry = queue / f"checkpoint-{step}" / shards.format(step)
        assert entry.is_dir() and any(entry.iterdir()), entry
        assert not (queue / f"checkpoint-{step}" / "model.safetensors").exists()
    kept = clone(queue, tmp_path / "kept")  # the references below read these after the watcher removed them
    assert watch(run) == 0
    lines = history(run)
    assert steps_events(lines) == [(0, "train_begin"), (1, "watch"), (2, "watch"), (3, "watch")]
    probe = Probe(qwen_tok, config=ProbeConfig(**PROBE))
    for line in lines[1:]:
        reference = probe.run(_converted(kind, kept / f"checkpoint-{line['step']}", init, tmp_path))
        assert line["fingerprint"] == fingerprint(kept / f"checkpoint-{line['step']}")
        for field in ("score", "gap"):
            assert line[field] == pytest.approx(reference[field], abs=1e-6)
        assert line["info"]["yn_mass_mean"] == pytest.approx(reference["info"]["yn_mass_mean"], abs=1e-6)
    assert len({line["info"]["yn_mass_mean"] for line in lines}) == 4  # training moved the weights each step


def _converted(kind: str, checkpoint: Path, init: Path, tmp: Path):
    """The checkpoint as a plain model, through the library's own conversion: torch's ``dcp_to_torch_save``,
    DeepSpeed's ``convert_zero_checkpoint_to_fp32_state_dict``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(init), dtype=torch.float32)
    out = tmp / f"converted-{kind}-{checkpoint.name}"
    if kind == "fsdp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dcp_to_torch_save(str(checkpoint / "pytorch_model_fsdp_0"), str(out))
        state = torch.load(out, weights_only=False)["model"]  # {"model": the model's own state dict}
    else:
        from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

        convert_zero_checkpoint_to_fp32_state_dict(str(checkpoint), str(out), safe_serialization=False)
        state = torch.load(out / "pytorch_model.bin", weights_only=False)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    model.tie_weights()
    return model.eval()


# ---- 7. a checkpoint unreadable for a moment -------------------------------------------------------------------
@pytest.mark.slow
def test_a_checkpoint_unreadable_for_a_moment_is_retried_and_one_that_stays_so_is_a_gap_with_its_cause(
        tmp_path, qwen_tok, init, caplog, capsys):
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=2, probe=False)
    weights = run / "checkpoint-2" / "model.safetensors"
    data = weights.read_bytes()

    def tear():
        weights.unlink()
        weights.write_bytes(data[: len(data) // 3])  # a copy in progress

    def mend():
        weights.unlink()
        weights.write_bytes(data)

    class MendAtTheFirstRetry(logging.Handler):  # the copy finishes while the watcher waits to try again
        def emit(self, record):
            if "trying again in" in record.getMessage() and len(weights.read_bytes()) < len(data):
                threading.Timer(0.2, mend).start()

    tear()
    settings = WatchSettings(RunSettings(run, ProbeConfig(**PROBE), baseline=False, progress=False), poll=0.05,
                             stop_at=2, retries=5, backoff=0.5)
    mender = MendAtTheFirstRetry()
    logging.getLogger("tinymcf_callback").addHandler(mender)
    try:
        with caplog.at_level(logging.INFO, logger="tinymcf_callback"):
            result = run_watch(settings)
    finally:
        logging.getLogger("tinymcf_callback").removeHandler(mender)
    assert result.scored == [1, 2] and result.failures == []
    retried = [r.getMessage() for r in caplog.records if "trying again in" in r.getMessage()]
    assert retried
    names(retried[0], "checkpoint-2", "CheckpointIncomplete", "model.safetensors")
    assert steps_events(history(run)) == [(1, "watch"), (2, "watch")]

    # unreadable through every try: a gap line with its cause, status 1; readable again: the next watch scores it
    other = tmp_path / "other"
    train_run(other, qwen_tok, init, max_steps=2, probe=False)
    broken = other / "checkpoint-2" / "model.safetensors"
    good = broken.read_bytes()
    broken.unlink()
    broken.write_bytes(good[: len(good) // 3])
    capsys.readouterr()
    assert watch(other, "--retries", "1", "--no-baseline", "--stop-at", "2") == 1
    err = capsys.readouterr().err
    names(err, "checkpoint-2", "2 tries", "CheckpointIncomplete", "model.safetensors", "1 checkpoint(s)")
    lines = history(other)
    assert steps_events(lines) == [(1, "watch"), (2, "unreadable")]
    assert lines[1]["info"]["unreadable"].startswith(
        "could not be read after 2 tries: CheckpointIncomplete: model.safetensors is cut short")
    broken.unlink()
    broken.write_bytes(good)
    assert watch(other, "--no-baseline", "--stop-at", "2") == 0
    assert steps_events(history(other)) == [(1, "watch"), (2, "unreadable"), (2, "watch")]


# ---- 8. a tracker that fails --------------------------------------------------------------------------------
@pytest.mark.slow
def test_points_a_full_tensorboard_disk_lost_are_listed_and_the_status_says_so(tmp_path, qwen_tok, init, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=6)
    with another_filesystem(tmp_path / "tb", size="4k") as tb:
        rc = watch(run, "--report-to", "tensorboard", "--tensorboard-dir", str(tb), "--no-figure")  # scalars fill it
        out = capsys.readouterr()
        assert rc == 1, out.err
        missed = re.search(r"TensorBoard \(.*\): step\(s\) ([\d, ]+) did not reach it \((.*)\)", out.err)
        assert missed, out.err
        lost = [int(s) for s in missed.group(1).split(", ")]
        assert "No space left on device" in missed.group(2)
        names(out.err, "did not reach a dashboard")
        [events] = list((tb / "moral_probe_scifi").glob("events.out.tfevents*"))
        acc = EventAccumulator(str(events))
        acc.Reload()
        kept = {s.step for s in acc.Scalars("eval/moral_scifi/score")} if "eval/moral_scifi/score" in \
            acc.Tags()["scalars"] else set()
    assert lost == list(range(lost[0], 7))  # from the first write the disk refused on, every point
    assert set(range(lost[0])) <= kept  # the points before it are in the event file (a refused step's may be in part)
    assert [line["step"] for line in history(run)] == list(range(7))  # the history is whole
    # with room again, the advice run as printed: the same command sends the history's lines again
    capsys.readouterr()
    (tmp_path / "roomy").mkdir()  # a folder of its own (one that is not there is refused: a typo creates nothing)
    assert watch(run, "--report-to", "tensorboard", "--tensorboard-dir", str(tmp_path / "roomy")) == 0
    said = capsys.readouterr().err
    assert "7 line(s) an earlier sweep or watch wrote: sent to the dashboards again where they were missing (7 to " \
        "TensorBoard" in said, said
    [events] = list((tmp_path / "roomy" / "moral_probe_scifi").glob("events.out.tfevents*"))
    acc = EventAccumulator(str(events))
    acc.Reload()
    assert {s.step for s in acc.Scalars("eval/moral_scifi/score")} == set(range(7))


# ---- 9. one precision type ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_tf32_history_is_extended_in_tf32_and_the_advice_of_a_refusal_works(tmp_path, qwen_tok, init, capsys):
    run = tmp_path / "run"
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TrainingArguments(tf32=True) on a GPU; its CPU counterpart here
    try:
        train_run(run, qwen_tok, init, max_steps=3, hand_off=False)
    finally:
        torch.set_float32_matmul_precision(before)
    lines = history(run)
    assert {line["compute"] for line in lines} == {"tf32"} and {line["dtype"] for line in lines} == {"float32"}
    cut = run / HISTORY
    cut.write_text("".join(json.dumps(line) + "\n" for line in lines[:2]))  # steps 2 and 3 left to the sweep
    capsys.readouterr()
    rc = sweep(run)  # the run trains in float32 (its record); its history was scored in TF32
    error = one_error_line(rc, capsys.readouterr().err, "holds probes scored in tf32", "this run is scored in "
                           "float32 (the dtype the run trained in", "pass --dtype tf32 to extend it", "--restart")
    advice = re.search(r"pass (--dtype \S+) to extend", error).group(1)
    assert sweep(run, *advice.split()) == 0  # the advice, run as printed
    swept = history(run)
    assert steps_events(swept) == [(0, "train_begin"), (1, "save"), (2, "sweep"), (3, "sweep")]
    assert {line["compute"] for line in swept} == {"tf32"}
    # the other way out it names: start the curve again in the precision asked for
    assert sweep(run, "--dtype", "float32", "--restart") == 0  # every step again, step 0 from the run's record
    assert {line["compute"] for line in history(run)} == {"float32"} and len(history(run)) == 4
    assert sweep(run) == 0  # no --dtype: the run's float32, the history's too now; nothing left to do


@pytest.mark.slow
def test_every_refusal_of_a_sweep_names_options_that_work(tmp_path, qwen_tok, init, capsys):
    """Each guard's advice, read off its one error line and run as printed: the subset, the precision (float32 and an
    autocast one), and the starting model. The history ends as one curve of one probe."""
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=3, hand_off=False)  # --limit 2, Yes/No, float32
    other = start_model(tmp_path / "other", qwen_tok, seed=1)
    base = ["sweep", str(run), "--n-resamples", "0", "--device", "cpu", "--no-progress"]

    def refused_then_advised(given: list[str], advice: str, rerun) -> None:
        capsys.readouterr()
        error = one_error_line(tinymcf([*base, *given]), capsys.readouterr().err)
        found = re.search(advice, error)
        assert found, (given, error)
        assert tinymcf([*base, *rerun(found.group(1))]) == 0, (given, found.group(1))

    def leave_step(n: int) -> None:  # the history cut back to its first n lines: something left to sweep
        (run / HISTORY).write_text("".join(json.dumps(line) + "\n" for line in history(run)[:n]))

    leave_step(3)
    refused_then_advised(["--per-foundation", "1"], r"pass (--limit 2) to extend its curve like with like",
                         lambda options: options.split())
    leave_step(3)
    refused_then_advised(["--limit", "2", "--autocast", "bfloat16"], r"pass (--dtype float32) to extend it",
                         lambda options: ["--limit", "2", *options.split()])
    leave_step(3)
    refused_then_advised(["--limit", "2", "--base-model", str(other)], r"(leave --base-model out) to use",
                         lambda _: ["--limit", "2"])
    assert steps_events(history(run)) == [(0, "train_begin"), (1, "save"), (2, "save"), (3, "sweep")]
    # an autocast curve: its refusal names both options, and they reproduce it
    assert tinymcf([*base, "--limit", "2", "--autocast", "bfloat16", "--restart"]) == 0
    assert {(line["compute"], line["autocast"]) for line in history(run)} == {("bfloat16", "bfloat16")}
    leave_step(3)
    refused_then_advised(["--limit", "2", "--dtype", "float32"], r"pass (--dtype float32 --autocast bfloat16) to",
                         lambda options: ["--limit", "2", *options.split()])
    assert {(line["compute"], line["autocast"]) for line in history(run)} == {("bfloat16", "bfloat16")}
    assert len(history(run)) == 4


# ---- 10. the sweep plans a run as the watcher does -----------------------------------------------------------
@pytest.mark.slow
def test_the_sweep_and_the_watcher_plan_a_hand_off_run_alike(tmp_path, qwen_tok, init):
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=3, save_total_limit=1)
    watched, swept = clone(run, tmp_path / "watched"), clone(run, tmp_path / "swept")
    assert watch(watched) == 0 and sweep(swept) == 0  # neither is told the base model: the record names it
    a, b = history(watched), history(swept)
    assert steps_events(a) == [(0, "train_begin"), (1, "watch"), (2, "watch"), (3, "watch")]
    assert steps_events(b) == [(0, "train_begin"), (1, "sweep"), (2, "sweep"), (3, "sweep")]
    for x, y in zip(a, b, strict=True):
        assert without(x) == without(y)  # the same baseline, precision, fingerprints and numbers


# ---- the newcomer's first watched run --------------------------------------------------------------------------
@pytest.mark.slow
def test_a_watcher_started_before_the_training_waits_for_its_folder(tmp_path, init):
    run, env = tmp_path / "run", env_for(tmp_path)
    watcher = subprocess.Popen([sys.executable, "-m", "tinymcf_callback", "watch", str(run), *PROBE_ARGS, "--device",
                                "cpu", "--poll", "0.2", "--no-progress", "--report-to", "none"], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        subprocess.run([sys.executable, str(RUNS), str(run), str(init), "max_steps=2"], env=env, cwd=tmp_path,
                       check=True, capture_output=True, timeout=600)
        out, _ = watcher.communicate(timeout=300)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, out
    assert out.count(f"waiting for {run}: no such folder yet") == 1  # said once, however long it waits
    assert steps_events(history(run)) == [(0, "train_begin"), (1, "watch"), (2, "watch")]


def test_a_folder_that_is_not_a_run_is_said_within_one_look(tmp_path, capsys):
    runs = tmp_path / "runs"
    (runs / "a" / "checkpoint-1").mkdir(parents=True)
    (runs / "b").mkdir()
    (runs / "b" / "moral_probe_run.json").write_text("{}")
    rc = tinymcf(["watch", str(runs), "--no-progress", "--report-to", "none"])
    one_error_line(rc, capsys.readouterr().err, f"{runs} holds runs rather than being one", str(runs / "a"),
                   str(runs / "b"))
    assert not list(runs.glob(".*lock"))  # no writer lock left behind
    empty = tmp_path / "typo"
    empty.mkdir()
    rc = tinymcf(["watch", str(empty), "--no-progress", "--report-to", "none", "--poll", "0.05", "--idle-timeout",
                  "0.1"])
    out = capsys.readouterr()
    assert rc == 0
    names(out.err, f"waiting for {empty}", "moral_probe_run.json")
    assert "never became a run" in out.out and not list(empty.iterdir())  # nothing written, no lock left


@pytest.mark.slow
def test_a_hand_off_training_says_once_where_its_checkpoints_wait(tmp_path, qwen_tok, init, capsys):
    from helpers.trainer_utils import make_trainer
    from transformers import AutoModelForCausalLM

    from tinymcf_callback import MoralProbeCallback

    model = AutoModelForCausalLM.from_pretrained(init)
    trainer = make_trainer(tmp_path / "run", qwen_tok, max_steps=3, save_steps=1, eval=False, model=model,
                           per_device_train_batch_size=2, save_only_model=True)
    trainer.add_callback(MoralProbeCallback(name="scifi", per_foundation=2, hand_off=True, trainer=trainer))
    trainer.train()
    out = capsys.readouterr().out
    assert out.count("checkpoints are handed off") == 1
    assert f"wait there for `tinymcf watch {tmp_path / 'run'} --name scifi --per-foundation 2`" in out


@pytest.mark.slow
def test_a_failing_link_is_said_once_even_where_mounting_is_not_allowed(tmp_path, qwen_tok, init, caplog,
                                                                        monkeypatch):
    """The hand-off's failure path on any machine (the tmpfs case above needs root): links refused by the kernel's
    cross-device error, said once over four saves, each save recorded with its cause."""
    def refuse(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), src)

    monkeypatch.setattr(queue_module.os, "link", refuse)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        train_run(tmp_path / "run", qwen_tok, init, max_steps=4, save_only_model=True)
    assert len([r for r in caplog.records if "could not be handed off" in r.getMessage()]) == 1
    failures = RunRecord.read(tmp_path / "run").hand_off_failures
    assert sorted(failures) == [1, 2, 3, 4] and all("hard links need the queue" in why for why in failures.values())
    assert not any((tmp_path / "run" / ".moral_probe_queue").glob("checkpoint-*"))  # no half entry left


@pytest.mark.slow
def test_the_watchers_progress_bar_is_labelled_watch(tmp_path, qwen_tok, init, capsys):
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=1, save_only_model=True)
    assert tinymcf(["watch", str(run), *PROBE_ARGS, "--device", "cpu", "--poll", "0.05", "--report-to", "none"]) == 0
    err = capsys.readouterr().err
    assert "watch [scifi]" in err and "sweep [scifi]" not in err
