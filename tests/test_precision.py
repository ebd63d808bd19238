"""One precision, on record: inside a mixed-precision Trainer the probe scores the checkpoint as ``eval`` scores it.

``bf16=True`` (the default of TRL's ``SFTConfig``, even with ``use_cpu=True``) makes accelerate wrap the
model's forward in bf16 autocast. The probe lifts that wrapper for itself, so its number at step N is
``eval --model checkpoint-N`` of the saved (fp32) weights; ``keep_autocast=True`` keeps the trainer's
autocast, and says so. Every report and history line records the precision, and ``compare``, the sweep
and the plot refuse or warn when two precisions meet.
"""

import json
import logging

import numpy as np
import pytest
import torch
from helpers.cli_checks import one_error_line
from helpers.trainer_utils import make_trainer

from tinymcf_callback import MoralProbeCallback, compare
from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.errors import CompareError
from tinymcf_callback.views.curves import load_history

LIMIT = 2
EVAL_AGREES = 1e-4  # the bound; measured: the same fp32 weights in one process and another agree to 3e-7


def eval_report(folder, out, tag):
    assert tinymcf(["eval", "--model", str(folder), "--limit", str(LIMIT), "--device", "cpu", "--out", str(out),
                    "--tag", tag,
                      "--no-progress"]) == 0
    return json.loads((out / f"eval_scifi_{tag}.json").read_text())


def p_yes(report) -> np.ndarray:
    return np.array([p["p_yes"] for p in report["prompts"]])


def assert_precision_on_record(report: dict, dtype="float32", autocast=None):
    assert (report["dtype"], report["autocast"], report["device"]) == (dtype, autocast, "cpu")
    assert report["model"]
    assert report["info"]["precision"] == {"dtype": dtype, "autocast": autocast, "device": "cpu",
                                           "compute": autocast or dtype}
    assert report["info"]["self_check"]["precision"] == (autocast or dtype)


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory, qwen_tok):
    """Two bf16 mixed-precision Trainer runs from the same start: the probe by default, and with keep_autocast."""
    runs = {}
    for keep in (False, True):
        out = tmp_path_factory.mktemp(f"bf16_keep_{keep}")
        cb = MoralProbeCallback(name="scifi", limit=LIMIT, verbose=False, keep_autocast=keep)
        trainer = make_trainer(out, qwen_tok, [cb], max_steps=2, bf16=True)
        trainer.train()
        runs[keep] = out
    return runs


@pytest.mark.slow
def test_a_bf16_trainer_run_scores_the_checkpoint_as_eval_does(bf16_runs, tmp_path):
    run = bf16_runs[False]
    probed = json.loads((run / "checkpoint-2" / "moral_probe_scifi.json").read_text())
    offline = eval_report(run / "checkpoint-2", tmp_path, "ckpt2")
    assert np.abs(p_yes(probed) - p_yes(offline)).max() < EVAL_AGREES
    assert probed["score"] == pytest.approx(offline["score"], abs=EVAL_AGREES)
    assert_precision_on_record(probed)
    assert_precision_on_record(offline)
    lines = [json.loads(line) for line in (run / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [(line["step"], line["dtype"], line["autocast"], line["device"]) for line in lines] == [
        (0, "float32", None, "cpu"), (2, "float32", None, "cpu")]
    assert lines[-1]["info"]["self_check"]["max_diff"] < 1e-5
    result = compare(probed, offline)  # the same precision: compared without a word
    assert result["warnings"] == [] and abs(result["headline"]["score"]["change"]) < EVAL_AGREES


@pytest.mark.slow
def test_keep_autocast_scores_under_the_trainers_bf16_and_says_so(bf16_runs, tmp_path):
    run = bf16_runs[True]
    probed = json.loads((run / "checkpoint-2" / "moral_probe_scifi.json").read_text())
    assert_precision_on_record(probed, autocast="bfloat16")
    offline = eval_report(run / "checkpoint-2", tmp_path, "ckpt2")
    assert np.abs(p_yes(probed) - p_yes(offline)).max() > 1e-6  # bf16 arithmetic: other numbers (not far)
    with pytest.raises(CompareError, match=r"bfloat16 \(autocast\).*float32"):
        compare(probed, offline)
    with pytest.warns(UserWarning, match="the change mixes the model's change with the precision's"):
        compare(probed, offline, allow_precision_change=True)


@pytest.mark.slow
def test_eval_compare_refuses_two_precisions_unless_asked(bf16_runs, tmp_path, capsys):
    a = bf16_runs[True] / "checkpoint-2" / "moral_probe_scifi.json"
    b = bf16_runs[False] / "checkpoint-2" / "moral_probe_scifi.json"
    rc = tinymcf(["compare", str(a), str(b)])
    one_error_line(rc, capsys.readouterr().err, "in bfloat16 (autocast) and", "--allow-precision-change")
    assert tinymcf(["compare", str(a), str(b), "--allow-precision-change"]) == 0
    out = capsys.readouterr().out
    assert "[tinymcf] WARNING: " in out and f"{a} was scored in bfloat16 (autocast)" in out
    rc = tinymcf(["eval", "--model", "x", "--allow-precision-change"])
    one_error_line(rc, capsys.readouterr().err, "unrecognized arguments: --allow-precision-change")


@pytest.mark.slow
def test_the_plot_warns_when_a_curve_mixes_precisions(bf16_runs, tmp_path, caplog):
    lines = (bf16_runs[False] / "moral_probe_scifi.jsonl").read_text().splitlines()
    later = json.loads(lines[1])
    later["autocast"] = later["compute"] = "bfloat16"  # as a bf16 Trainer with keep_autocast records it
    history = tmp_path / "moral_probe_scifi.jsonl"
    history.write_text(lines[0] + "\n" + json.dumps(later) + "\n")
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        load_history(history)
    assert any("float32 (from step 0) and bfloat16 (autocast) (from step 2)" in r.getMessage()
               for r in caplog.records)


@pytest.mark.slow
def test_the_sweep_will_not_extend_a_history_of_another_precision(bf16_runs, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(bf16_runs[False], run)
    history = run / "moral_probe_scifi.jsonl"
    first = history.read_text().splitlines()[0]
    history.write_text(first + "\n")  # step 0 only: the sweep would add step 2
    rc = tinymcf(["sweep", str(run), "--limit", str(LIMIT), "--dtype", "bfloat16", "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "holds probes scored in float32", "this run is scored in bfloat16 "
                   "(--dtype)", "--restart", "pass --dtype float32")  # refused before anything loads
    assert history.read_text() == first + "\n"
    assert tinymcf(["sweep", str(run), "--limit", str(LIMIT), "--no-progress"]) == 0  # --dtype auto: float32
    assert [json.loads(line)["step"] for line in history.read_text().splitlines()] == [0, 2]


@pytest.mark.slow
def test_trl_sft_trainer_scores_the_checkpoint_as_eval_does(tmp_path, qwen_tok):
    """TRL's SFTTrainer turns bf16 on by default, even on the CPU: the probe still scores the saved weights."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    from tinymcf_callback import testing as offline_assets

    data = Dataset.from_list([{"prompt": f"Question {i}: is water wet?", "completion": " Yes."} for i in range(8)])
    config = trl.SFTConfig(output_dir=str(tmp_path), max_steps=2, save_steps=2, use_cpu=True, report_to=[],
                           per_device_train_batch_size=2, logging_steps=1, disable_tqdm=True, learning_rate=1e-3)
    assert config.bf16  # TRL's default
    cb = MoralProbeCallback(name="scifi", limit=LIMIT, verbose=False)
    trainer = trl.SFTTrainer(model=offline_assets.tiny_qwen3(seed=0).train(), args=config, train_dataset=data,
                             processing_class=qwen_tok, callbacks=[cb])
    trainer.train()
    probed = json.loads((tmp_path / "checkpoint-2" / "moral_probe_scifi.json").read_text())
    offline = eval_report(tmp_path / "checkpoint-2", tmp_path, "sft")
    assert np.abs(p_yes(probed) - p_yes(offline)).max() < EVAL_AGREES
    assert_precision_on_record(probed)
    assert torch.get_autocast_dtype("cpu") is not None  # (nothing of the trainer's autocast leaked out of the probe)
