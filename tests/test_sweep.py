"""The checkpoint sweep on real tiny Trainer runs: the callback's history schema, the numbers of each checkpoint
scored alone, resuming, failures, PEFT adapters, and two processes (torchrun, gloo) writing the one-process history
once. Random weights: mechanics only. (A run's whole life, resumed and sharded runs among it: test_run_life.py.)"""

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from helpers.cli_checks import one_error_line
from helpers.ports import torchrun
from helpers.runs import assert_same_numbers, clone, same_line
from helpers.trainer_utils import make_trainer, tiny_model
from transformers import AutoModelForCausalLM

from tinymcf_callback import MoralProbeCallback
from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.config import ProbeConfig
from tinymcf_callback.follow.scoring import ProbeCache
from tinymcf_callback.follow.settings import RunSettings
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir.checkpoints import checkpoint_folders, tokenizer_fingerprint
from tinymcf_callback.rundir.curve import Curve
from tinymcf_callback.rundir.layouts import TRAINER, read_save

LIMIT = 2
HISTORY = "moral_probe_scifi.jsonl"


# ---- runs and helpers ----------------------------------------------------------------------------
def train(out, tok, callbacks=(), *, peft=False, **kw) -> Path:
    """A tiny Trainer run saving a checkpoint at every step (model weights only: small and quick)."""
    trainer = make_trainer(out, tok, callbacks, eval=False, save_steps=1, save_only_model=True,
                           per_device_train_batch_size=2, **kw)
    if peft:
        from peft import LoraConfig, get_peft_model

        trainer.model = trainer.model_wrapped = get_peft_model(
            trainer.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainer.train()
    return Path(out)


def sweep(run: Path, home: Path, *extra, capsys=None):
    rc = tinymcf(["sweep", str(run), "--limit", str(LIMIT), "--home", str(home), "--no-progress", "--retries", "0",
                  *extra])
    out = capsys.readouterr() if capsys else None
    return rc, out


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / HISTORY).read_text().splitlines()]


def keys(line: dict) -> dict:
    """The schema of a history line: its keys, and those of its info, metrics and table rows."""
    return {"top": set(line), "info": set(line["info"]), "metrics": set(line["metrics"]),
            "table": [set(row) for row in line["table"]]}


@pytest.fixture(scope="module")
def reference_probe(qwen_tok):
    """The simplest reference: ``Probe.run`` of the training tokenizer on a checkpoint loaded directly."""
    return Probe(qwen_tok, "scifi", LIMIT)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("sweep_home")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory, qwen_tok):
    """Trained without the callback: checkpoint-1, -2, -3 and no history."""
    return train(tmp_path_factory.mktemp("plain"), qwen_tok, max_steps=3)


@pytest.fixture(scope="module")
def swept(tmp_path_factory, plain_run, home):
    """A copy of the plain run, swept by one process."""
    run = clone(plain_run, tmp_path_factory.mktemp("swept") / "run", keep_history=False)
    rc, _ = sweep(run, home)
    assert rc == 0
    return run


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, qwen_tok):
    """A LoRA run (adapter-only checkpoint-1 and -2) with the callback probing at each save, no baseline.

    Returns ``(run, base)``: ``base`` is the saved model the adapters were trained on.
    """
    base = tmp_path_factory.mktemp("base")
    tiny_model(seed=0).save_pretrained(base)  # the model make_trainer starts from
    qwen_tok.save_pretrained(base)
    cb = MoralProbeCallback(name="scifi", limit=LIMIT, events="save", baseline=False, verbose=False)
    run = train(tmp_path_factory.mktemp("lora"), qwen_tok, [cb], peft=True, max_steps=2, learning_rate=1e-2)
    return run, base


# ---- tests ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_scores_each_checkpoint_as_if_alone(swept, reference_probe):
    lines = history(swept)
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert {line["event"] for line in lines} == {"sweep"} and {line["name"] for line in lines} == {"scifi"}
    for line in lines:
        folder = swept / f"checkpoint-{line['step']}"
        assert line["epoch"] == json.loads((folder / "trainer_state.json").read_text())["epoch"]
        ref = reference_probe.run(AutoModelForCausalLM.from_pretrained(folder))
        for field in ("score", "gap", "sn"):
            assert (line[field] is None and ref[field] is None) or abs(line[field] - ref[field]) <= 1e-6, field
        for field in ("yn_mass_mean", "yn_mass_min", "frame_agreement", "n_prompts", "n_vignettes"):
            assert line["info"][field] == pytest.approx(ref["info"][field], abs=1e-6), field
        table = ref["table"].reset_index().to_dict(orient="records")
        assert_same_numbers([{k: v for k, v in r.items() if v is not None} for r in line["table"]],
                            [{k: v for k, v in r.items() if not (isinstance(v, float) and math.isnan(v))}
                             for r in table])
    # training moved the weights: each line is its own checkpoint, not one model scored three times
    assert len({line["info"]["yn_mass_mean"] for line in lines}) == 3


@pytest.mark.slow
def test_schema_is_the_callbacks(swept, lora_run):
    written_by_callback = history(lora_run[0])[0]
    assert written_by_callback["event"] == "save" and written_by_callback["step"] == 1
    for line in history(swept):
        assert line.pop("by") == "sweep"  # the one field a line made outside the training adds (OUTSIDE_LINE_FIELDS)
        assert keys(line) == keys(written_by_callback)
        assert line["fingerprint"] and written_by_callback["fingerprint"]  # both name the checkpoint they scored


@pytest.mark.slow
def test_rerun_appends_nothing(swept, home, capsys):
    before = (swept / HISTORY).read_bytes()
    rc, out = sweep(swept, home, capsys=capsys)
    assert rc == 0
    assert (swept / HISTORY).read_bytes() == before
    assert "0 checkpoint(s) scored, 3 already in the history" in out.out


@pytest.mark.slow
def test_lora_run_resumed_from_a_callback_line(lora_run, tmp_path, home, capsys):
    """Adapter checkpoints need --base-model; a step the callback logged is skipped and its line kept."""
    callback_run, base = lora_run
    run = clone(callback_run, tmp_path / "run", keep_history=False)
    assert (run / "checkpoint-1" / "adapter_config.json").exists()
    assert not (run / "checkpoint-1" / "model.safetensors").exists()
    callback_lines = (callback_run / HISTORY).read_bytes().splitlines(keepends=True)
    assert len(callback_lines) == 2
    (run / HISTORY).write_bytes(callback_lines[0])  # the callback's step-1 line only

    (run / "moral_probe_run.json").unlink()  # nothing names the base but the adapters: a folder moved away
    for step in (1, 2):
        config = run / f"checkpoint-{step}" / "adapter_config.json"
        text = json.loads(config.read_text())
        config.unlink()  # a hard link: replace, do not edit
        config.write_text(json.dumps({**text, "base_model_name_or_path": str(tmp_path / "moved-away")}))
    rc, out = sweep(run, home, capsys=capsys)
    one_error_line(rc, out.err, "checkpoint-2 is a PEFT adapter", "which is not here", "pass --base-model PATH")
    assert (run / HISTORY).read_bytes() == callback_lines[0]

    rc, _ = sweep(run, home, "--base-model", str(base), "--force-base-model", "--no-baseline")  # as the callback
    assert rc == 0
    assert (run / HISTORY).read_bytes().startswith(callback_lines[0])  # untouched, byte for byte
    lines = history(run)
    assert [(line["step"], line["event"]) for line in lines] == [(1, "save"), (2, "sweep")]
    # The callback scored the live LoRA model at step 2; the sweep, base + the adapter saved there.
    same_line(lines[1], json.loads(callback_lines[1]))
    assert lines[1]["info"]["yn_mass_mean"] != lines[0]["info"]["yn_mass_mean"]  # the adapter moved the model


@pytest.mark.slow
def test_corrupt_checkpoint_is_reported_and_the_others_scored(plain_run, swept, tmp_path, home, capsys):
    run = clone(plain_run, tmp_path / "run", keep_history=False)
    (run / HISTORY).write_text(json.dumps(history(swept)[0]) + "\n")  # step 1 done: only 2 and 3 to score
    weights = run / "checkpoint-2" / "model.safetensors"
    data = weights.read_bytes()
    weights.unlink()  # a hard link: write a new, truncated file instead of truncating the shared one
    weights.write_bytes(data[: len(data) // 3])
    rc, out = sweep(run, home, capsys=capsys)
    assert rc == 1
    assert "checkpoint-2: not scored: CheckpointIncomplete: model.safetensors is cut short" in out.err
    assert "1 checkpoint(s) could not be scored" in out.err
    assert "\n  checkpoint-2: CheckpointIncomplete: model.safetensors is cut short" in out.err
    lines = history(run)
    assert [(line["step"], line["event"]) for line in lines] == [(1, "sweep"), (2, "unreadable"), (3, "sweep")]
    assert "model.safetensors is cut short" in lines[1]["info"]["unreadable"]  # a gap, with its cause
    assert lines[1]["score"] is None
    same_line(lines[2], history(swept)[2])  # the sweep went on after the failure
    # a rerun tries the unreadable checkpoint again, and writes its gap once
    before = (run / HISTORY).read_bytes()
    rc, out = sweep(run, home, capsys=capsys)
    assert rc == 1 and "2 already in the history" in out.out and (run / HISTORY).read_bytes() == before
    weights.unlink()
    weights.write_bytes(data)  # readable again (a copy that finished): the next sweep scores it
    rc, out = sweep(run, home, capsys=capsys)
    assert rc == 0 and "1 checkpoint(s) scored" in out.out
    assert [(line["step"], line["event"]) for line in history(run)][-1] == (2, "sweep")
    same_line(history(run)[-1], history(swept)[1])


@pytest.mark.slow
def test_two_processes_write_the_single_process_history(swept, plain_run, tmp_path, home):
    run = clone(plain_run, tmp_path / "run", keep_history=False)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([*torchrun(2), "-m", "tinymcf_callback", "sweep", str(run),
                        "--limit", str(LIMIT), "--home", str(home), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # the work was split: each process scored checkpoints (3 checkpoints: rounds [1, 2] and [3])
    assert "checkpoint-1 on process 1 of 2" in p.stderr and "checkpoint-2 on process 2 of 2" in p.stderr
    assert p.stdout.count("checkpoint(s) scored") == 1  # the summary from the main process only
    two, one = history(run), history(swept)
    assert [line["step"] for line in two] == [1, 2, 3]  # written once, in step order
    assert len(two) == len(one)
    for a, b in zip(two, one, strict=True):
        same_line(a, b)


@pytest.mark.slow
def test_two_processes_watch_a_run_into_the_single_process_history(swept, plain_run, tmp_path, home):
    """``tinymcf watch`` under torchrun: the main process looks, every process scores its share of what it found,
    the lines are written once, in step order, with the one-process sweep's numbers."""
    run = clone(plain_run, tmp_path / "run", keep_history=False)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([*torchrun(2), "-m", "tinymcf_callback", "watch", str(run),
                        "--limit", str(LIMIT), "--home", str(home), "--no-progress", "--poll", "0.2",
                        "--stop-at", "3", "--report-to", "none"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "on process 2 of 2" in p.stderr, p.stderr  # the second process scored a share
    two, one = history(run), history(swept)
    assert [line["step"] for line in two] == [1, 2, 3] and {line["by"] for line in two} == {"watch"}
    for a, b in zip(two, one, strict=True):
        same_line(a, b)  # every number; "by" (watch / sweep) is the one field apart


# ---- bad input and the pieces --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("case,needle", [
    ("missing", "no such folder"),
    ("empty", "holds no saved model of a layout tinymcf reads"),
    ("unknown_set", "unknown vignette set 'nope'"),
    ("tag", "unrecognized arguments: --tag x"),  # eval's option: the sweep is a subcommand of its own
    ("other_limit", "pass --limit 2 to extend its curve like with like"),
])
def test_bad_input_exits_2_with_one_error_line(case, needle, swept, tmp_path, home, capsys):
    before = (swept / HISTORY).read_bytes()
    args = {
        "missing": [str(tmp_path / "nope")],
        "empty": [str(tmp_path)],
        "unknown_set": [str(swept), "--name", "nope"],
        "tag": [str(swept), "--tag", "x"],
        "other_limit": [str(swept), "--limit", "3"],
    }[case]
    rc = tinymcf(["sweep", *args, "--home", str(home), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, needle)
    assert (swept / HISTORY).read_bytes() == before


def test_checkpoints_in_numeric_step_order(tmp_path):
    for name in ("checkpoint-10", "checkpoint-9", "checkpoint-100", "checkpoint-x", "tmp-checkpoint-5"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"")
    (tmp_path / "checkpoint-7").write_text("a file, not a checkpoint")
    (tmp_path / "checkpoint-9" / "trainer_state.json").write_text('{"epoch": 1.5}')
    found = [read_save(TRAINER, step, folder, tmp_path, settle=0, expect_state=False) for step, folder in
             checkpoint_folders(tmp_path).items()]
    assert [c.step for c in found] == [9, 10, 100]  # lexicographic order would put 10 and 100 before 9
    assert [c.epoch for c in found] == [1.5, None, None]


def test_a_new_run_in_the_same_folder_starts_the_steps_done_afresh(tmp_path):
    path = tmp_path / HISTORY
    line = lambda step, event: {"step": step, "event": event, "name": "scifi", "info": {}, "table": [],  # noqa: E731
                                "metrics": {}}
    old_run = [line(s, e) for s, e in ((0, "train_begin"), (1, "save"), (2, "save"))]
    path.write_text("".join(json.dumps(x) + "\n" for x in [*old_run, line(0, "train_begin")]))
    assert set(Curve(tmp_path, "scifi", "yesno").read().newest()) == {0}  # steps 1 and 2 of the earlier run: not done
    path.write_text("".join(json.dumps(x) + "\n" for x in old_run) + '{"step": 3, "eve')  # torn last line
    assert set(Curve(tmp_path, "scifi", "yesno").read().newest()) == {0, 1, 2}


@pytest.mark.slow
def test_one_probe_per_tokenizer(plain_run, tmp_path):
    run = clone(plain_run, tmp_path / "run", keep_history=False)
    checkpoints = [read_save(TRAINER, s, f, run) for s, f in checkpoint_folders(run).items()]
    prints = [tokenizer_fingerprint(str(c.folder)) for c in checkpoints]
    assert prints[0] == prints[1] == prints[2]
    config = run / "checkpoint-3" / "tokenizer_config.json"
    text = json.loads(config.read_text())
    config.unlink()  # a hard link: replace, do not edit
    config.write_text(json.dumps({**text, "model_max_length": 12345}))
    assert tokenizer_fingerprint(str(checkpoints[2].folder)) != prints[0]
    probes = ProbeCache(RunSettings(run, ProbeConfig(name="scifi", limit=LIMIT)))
    assert probes.get(str(checkpoints[0].folder)) is probes.get(str(checkpoints[1].folder)) and len(probes) == 1
    assert probes.get(str(checkpoints[2].folder)) is not probes.get(str(checkpoints[0].folder)) and len(probes) == 2


@pytest.mark.slow
def test_sweep_from_step_0_writes_the_callbacks_history(tmp_path, qwen_tok, home, capsys):
    """With the starting weights, a sweep's history is the callback's: the baseline line and the change since it."""
    base = tmp_path / "base"
    tiny_model(seed=0).save_pretrained(base)  # the weights make_trainer starts from
    qwen_tok.save_pretrained(base)
    cb = MoralProbeCallback(name="scifi", limit=LIMIT, events="save", verbose=False)
    run = train(tmp_path / "callback", qwen_tok, [cb], max_steps=2, learning_rate=1e-2)
    by_callback = history(run)
    assert [(line["step"], line["event"]) for line in by_callback] == [(0, "train_begin"), (1, "save"), (2, "save")]

    swept = clone(run, tmp_path / "swept", keep_history=False)
    (swept / "moral_probe_scifi_baseline.json").unlink()
    rc, out = sweep(swept, home, "--base-model", str(base), capsys=capsys)
    assert rc == 0 and "step 0: the starting weights" in out.err and "change since step 0=" in out.err
    lines = history(swept)
    assert [(line["step"], line["event"]) for line in lines] == [(0, "train_begin"), (1, "sweep"), (2, "sweep")]
    for ours, theirs in zip(lines, by_callback, strict=True):
        same_line(ours, theirs)  # every number, score_change and score_change_p included
    change = lines[2]["metrics"]["eval_moral_scifi/score_change"]
    assert change == pytest.approx(lines[2]["score"] - lines[0]["score"], abs=1e-9) and change != 0.0
    baseline = json.loads((swept / "moral_probe_scifi_baseline.json").read_text())
    assert baseline["step"] == 0 and baseline["score"] == lines[0]["score"]

    # a history with step 0 already in it (the callback's): the change comes from its baseline report
    resumed = clone(run, tmp_path / "resumed", keep_history=False)
    (resumed / HISTORY).write_text("".join(json.dumps(line) + "\n" for line in by_callback[:2]))
    assert sweep(resumed, home)[0] == 0
    same_line(history(resumed)[2], by_callback[2])

    # no starting weights known: no step 0, and a note that says how to get it
    plain = clone(run, tmp_path / "plain", keep_history=False)
    (plain / "moral_probe_run.json").unlink()  # the callback recorded them there
    rc, out = sweep(plain, home, capsys=capsys)
    assert rc == 0 and "pass --base-model PATH" in out.err
    assert [line["step"] for line in history(plain)] == [1, 2]
    assert "eval_moral_scifi/score_change" not in history(plain)[0]["metrics"]
    rc, out = sweep(clone(run, tmp_path / "off", keep_history=False), home, "--base-model", str(base), "--no-baseline",
                    capsys=capsys)
    assert rc == 0 and [line["step"] for line in history(tmp_path / "off")] == [1, 2]


def test_the_starting_weights_come_from_base_model_the_record_or_an_adapters_config(tmp_path):
    from tinymcf_callback.follow.planner import Planner
    from tinymcf_callback.rundir.record import RunRecord

    def base(**kw):
        return Planner(RunSettings(run, ProbeConfig(name="scifi"), **kw)).look().base_model

    run, local = tmp_path / "run", tmp_path / "base"
    (run / "checkpoint-1").mkdir(parents=True)
    (run / "checkpoint-1" / "tokenizer_config.json").write_text("{}")
    (run / "checkpoint-1" / "trainer_state.json").write_text("{}")  # the Trainer's last write: complete
    local.mkdir()
    (local / "config.json").write_text("{}")
    assert base() is None
    (run / "checkpoint-1" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(local)}))
    assert base() == str(local)  # the adapter names a folder that is here
    RunRecord(base_model=str(local)).write(run)
    assert base() == str(local)  # the record and the adapter agree
    assert base(base_model=str(local)) == str(local)


def test_a_baseline_of_other_prompts_is_said_not_silently_dropped(tmp_path, qwen_tok, tiny_qwen, caplog):
    """The step-0 baseline beside the history asked other prompts (another subset): the sweep's line carries no
    change since it, and says why once, as the callback's logger does."""
    import logging

    from helpers.fake_runs import line, write_history
    from helpers.reports import made_up_scores

    from tinymcf_callback.follow.sweep import run_sweep
    from tinymcf_callback.rundir.history import read_lines

    run = tmp_path / "run"
    folder = run / "checkpoint-1"
    tiny_qwen.save_pretrained(folder)
    qwen_tok.save_pretrained(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 1, "epoch": 0.5}))
    other = Probe(qwen_tok, "scifi", limit=3, n_resamples=0)  # the baseline of another subset
    curve = Curve(run, "scifi", "yesno")
    curve.append(line(0, event="train_begin"), baseline=(other.report(made_up_scores(other)), 0, 0.0))
    write_history(run, [line(0, event="train_begin")])
    settings = RunSettings(run, ProbeConfig(name="scifi", limit=LIMIT, n_resamples=0), progress=False)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        result = run_sweep(settings)
    assert result.scored == [1]
    [_, swept] = [x for _, x in read_lines(curve.path)]
    assert not any(k.endswith("/score_change") for k in swept["metrics"])
    said = [r.getMessage() for r in caplog.records if "is not used for checkpoint-1" in r.getMessage()]
    assert len(said) == 1 and "its prompts differ from this probe's" in said[0]
