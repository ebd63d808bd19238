"""The slow benchmark beside real runs, offline: real lm-eval through the bridge against lm-eval on its own, a run's
start, middle and end from the callback, the sweep and the watcher, into the history and TensorBoard, compared
between two steps and drawn; every refusal one line; SmolLM2's margins against a plain transformers computation.

Tiny random models for the mechanics (never moral content); SmolLM2 where a real model's numbers matter.
"""

from __future__ import annotations

import glob
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.cli_checks import one_error_line
from helpers.runs import env_for, start_model, train_run
from helpers.trackers import probe_scalars, probe_tensorboard
from helpers.trainer_utils import make_trainer

from tinymcf_callback import Benchmark, MoralProbeCallback, compare_steps
from tinymcf_callback.benchmark.history import read_bench
from tinymcf_callback.benchmark.selfcheck import TOLERANCE
from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.rundir.history import read_lines

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
PLAIN = HERE / "data" / "prefs" / "ethics_like.jsonl"
CHAT = HERE / "data" / "prefs" / "ethics_like_chat.jsonl"
TASKS = HERE / "data" / "lm_eval_tasks"
TASK = "tinymcf_ethics_cm_sample"
PROBE = ["--limit", "2", "--n-resamples", "0", "--no-progress", "--device", "cpu"]
BENCH = ["--prefs", str(PLAIN), "--per-config", "3", "--lm-eval", TASK, "--lm-eval-include", str(TASKS)]
BENCH_FILE = "moral_bench_scifi.jsonl"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_qwen, qwen_tok):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_qwen.save_pretrained(folder)
    qwen_tok.save_pretrained(folder)
    return folder


# ---- lm-eval, through the bridge and on its own --------------------------------------------------------------
def test_lm_eval_through_the_bridge_equals_lm_eval_on_its_own(tiny_dir, tiny_qwen, qwen_tok):
    import lm_eval
    from lm_eval.tasks import TaskManager

    ours = Benchmark(qwen_tok, lm_eval=TASK, lm_eval_include=str(TASKS)).run_lm_eval(tiny_qwen)["tasks"][TASK]
    alone = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(tiny_dir), "dtype": "float32",
                                                            "device": "cpu"}, tasks=[TASK], batch_size=16,
                                    task_manager=TaskManager(include_path=str(TASKS)), log_samples=True)
    assert ours["value"] == alone["results"][TASK]["acc,none"]
    assert ours["stderr"] == alone["results"][TASK]["acc_stderr,none"]
    assert ours["docs"]["value"] == [s["acc"] for s in alone["samples"][TASK]]
    assert ours["n"] == 24 and ours["version"] == 1.0


# ---- a run's start, middle and end -----------------------------------------------------------------------------
def test_the_callback_scores_start_middle_and_end_without_changing_the_training(tmp_path, qwen_tok):
    def run(out, given, **bench):
        trainer = make_trainer(out, qwen_tok, max_steps=6, save_steps=2, eval=False, per_device_train_batch_size=2,
                               report_to=("tensorboard",))
        trainer.add_callback(MoralProbeCallback(name="scifi", limit=2, n_resamples=0, events="save", verbose=False,
                                                trainer=trainer if given else None, **bench))
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer

    plain_losses, _ = run(tmp_path / "plain", True)
    losses, trainer = run(tmp_path / "bench", False, prefs=str(PLAIN), lm_eval=TASK,
                          benchmark={"lm_eval_include": str(TASKS), "per_config": 3})
    assert losses == plain_losses  # bit for bit: observing the run changed nothing in it
    lines = read_bench(tmp_path / "bench" / BENCH_FILE)
    assert [(line["step"], line["kind"], line["at"]) for line in lines] == [
        (0, "lm_eval", ["start"]), (0, "prefs", ["start"]), (2, "lm_eval", ["middle"]), (2, "prefs", ["middle"]),
        (6, "lm_eval", ["end"]), (6, "prefs", ["end"])]
    probe = {line["step"]: line for _, line in read_lines(tmp_path / "bench" / "moral_probe_scifi.jsonl")}
    for line in lines:  # the same weights as the probe's line of the step: the checkpoint just saved
        assert line["fingerprint"] == probe[line["step"]]["fingerprint"] and line["by"] == "callback"
    # the dashboards at the Trainer's steps, beside the probe's (no trainer=: in the probe's own TensorBoard folder)
    accuracy = probe_scalars(tmp_path / "bench", "eval/moral_scifi/prefs/accuracy")
    assert sorted(accuracy) == [0, 2, 6]
    assert accuracy[6] == pytest.approx(lines[-1]["prefs"]["accuracy"], abs=1e-6)  # TensorBoard stores float32
    assert sorted(probe_scalars(tmp_path / "bench", f"eval/moral_scifi/lm_eval/{TASK}/acc")) == [0, 2, 6]
    logged = [h["step"] for h in trainer.state.log_history if "eval_moral_scifi/prefs/accuracy" in h]
    assert logged == [0, 2, 6]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory, qwen_tok):
    """A run trained without the callback, from a saved starting model: checkpoint-2, -4, -6."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("plain")
    init = start_model(root / "init", qwen_tok)
    make_trainer(root / "run", qwen_tok, max_steps=6, save_steps=2, eval=False, per_device_train_batch_size=2,
                 model=AutoModelForCausalLM.from_pretrained(init).train()).train()
    return root / "run", init


def test_a_sweep_scores_start_middle_end_then_compares_and_draws(plain_run, tmp_path, capsys):
    run, init = plain_run
    rc = tinymcf(["sweep", run, *PROBE, "--base-model", init, *BENCH, "--report-to", "tensorboard"])
    err = capsys.readouterr().err
    assert rc == 0, err
    lines = read_bench(run / BENCH_FILE)
    assert [(line["step"], line["at"]) for line in lines if line["kind"] == "prefs"] == [
        (0, ["start"]), (2, ["middle"]), (6, ["end"])]
    probe = {line["step"]: line for _, line in read_lines(run / "moral_probe_scifi.jsonl")}
    assert all(line["fingerprint"] == probe[line["step"]]["fingerprint"] for line in lines if line["step"])
    tb = probe_tensorboard(run)
    assert sorted(s.step for s in tb.Scalars("eval/moral_scifi/prefs/accuracy")) == [0, 2, 6]
    # run again, a sweep sends the dashboards no benchmark point they hold, and repairs what they lost
    again = ["sweep", run, *PROBE, "--base-model", init, *BENCH, "--report-to", "tensorboard"]
    assert tinymcf(again) == 0
    assert [s.step for s in probe_tensorboard(run).Scalars("eval/moral_scifi/prefs/accuracy")] == [0, 2, 6]
    events = glob.glob(str(run / "**" / "moral_probe_scifi" / "events*"), recursive=True)
    for folder in {Path(e).parent for e in events}:
        shutil.rmtree(folder)
    assert tinymcf(again) == 0
    assert [s.step for s in probe_tensorboard(run).Scalars("eval/moral_scifi/prefs/accuracy")] == [0, 2, 6]
    # done means done: a second sweep adds nothing; --at all adds the one save left (4)
    assert tinymcf(["sweep", run, *PROBE, "--base-model", init, *BENCH]) == 0
    assert len(read_bench(run / BENCH_FILE)) == len(lines)
    assert tinymcf(["sweep", run, *PROBE, "--base-model", init, *BENCH, "--at", "all"]) == 0
    assert sorted({line["step"] for line in read_bench(run / BENCH_FILE)}) == [0, 2, 4, 6]
    capsys.readouterr()
    # compare two steps of a run no callback wrote a report for
    assert tinymcf(["compare", run, "--steps", "0", "6", "--n-resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "preference accuracy" in out and f"lm-eval {TASK} acc (paired)" in out
    assert "preference margin: " in out and "not a correlation" in out
    result = compare_steps(run, 0, 6, n_resamples=200)
    margins = [np.array([r["margin"] for r in line["prefs"]["pairs"]]) for line in lines
               if line["kind"] == "prefs" and line["step"] in (0, 6)]
    assert result["prefs"]["margin"]["change"] == pytest.approx((margins[1] - margins[0]).mean())
    assert result["probe"]["headline"]["score"]["change"] == pytest.approx(probe[6]["score"] - probe[0]["score"])
    assert tinymcf(["plot", run, "--panels", "headline", "--out", tmp_path / "paper.png"]) == 0
    assert (tmp_path / "paper.png").stat().st_size > 10_000


def test_the_watcher_scores_the_middle_and_end_once_it_knows_them(tmp_path, qwen_tok):
    init = start_model(tmp_path / "init", qwen_tok)
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=4, hand_off=True)  # saves 1..4; the callback hands them off
    p = subprocess.run([sys.executable, "-m", "tinymcf_callback", "watch", str(run), *PROBE, "--poll", "0.2",
                        *BENCH, "--config", "justice"], env=env_for(tmp_path), cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = read_bench(run / BENCH_FILE)
    assert sorted({(line["step"], tuple(line["at"])) for line in lines}) == [(0, ("start",)), (2, ("middle",)),
                                                                           (4, ("end",))]
    assert {line["by"] for line in lines} == {"watch"} and {line["prefs"]["source"]["configs"][0] for line in lines
                                                           if line["kind"] == "prefs"} == {"justice"}


# ---- refusals ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, needles", [
    (["--lm-eval", "no_such_task_xyz", "--lm-eval-include", str(TASKS)], ["no_such_task_xyz", "lm_eval ls tasks"]),
    (["--prefs", "wassname/ethics_expression_preferences", "--config", "commonsense"],
     ["HF_HUB_OFFLINE=1", "local file"]),
    (["--prefs", str(HERE / "no_such_pairs.jsonl")], ["no such file"]),
    (["--prefs", str(PLAIN), "--config", "virtue"], ["no config 'virtue'", "commonsense"]),
    (["--per-config", "3"], ["--per-config goes with --prefs"]),
    (["--prefs", str(PLAIN), "--prefs-limit", "2", "--per-config", "3"], ["--prefs-limit and --per-config"]),
])
def test_bad_benchmark_input_is_one_line(extra, needles, tiny_dir, tmp_path, capsys):
    rc = tinymcf(["eval", "--model", tiny_dir, *PROBE, "--out", tmp_path, *extra])
    one_error_line(rc, capsys.readouterr().err, *needles)


def test_a_dataset_folder_is_read_through_datasets(tmp_path):
    """A folder in the Hub's layout (configs in its README), read by datasets offline, as the Hub dataset would be."""
    from tinymcf_callback.benchmark.pairs import load_pairs

    rows = [json.loads(line) for line in PLAIN.read_text().splitlines()]
    readme = ["---", "configs:"]
    for config in ("commonsense", "justice"):
        folder = tmp_path / "ds" / config
        folder.mkdir(parents=True)
        (folder / "test.jsonl").write_text("".join(json.dumps({k: r[k] for k in ("prompt", "chosen", "rejected")})
                                                   + "\n" for r in rows if r["config"] == config))
        readme += [f"- config_name: {config}", "  data_files:", "  - split: test", f"    path: {config}/test.jsonl"]
    (tmp_path / "ds" / "README.md").write_text("\n".join([*readme, "---", ""]))
    pairs = load_pairs(tmp_path / "ds", split="test")
    assert pairs.configs == ["commonsense", "justice"] and len(pairs) == 18
    assert pairs.record["kind"] == "dataset" and pairs.record["split"] == "test"
    assert pairs.prompt == [r["prompt"] for r in rows if r["config"] in ("commonsense", "justice")]


# ---- a real model --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", [PLAIN, CHAT], ids=["plain", "chat"])
def test_smollm2_margins_equal_a_plain_transformers_computation(source, smollm2):
    model, tok = smollm2
    bench = Benchmark(tok, prefs=str(source), n_resamples=100)
    block = bench.score_prefs(model)
    enc = bench.encoded
    assert block["strategy"] == "shared" and not block["self_check"]["fallbacks"]
    worst = 0.0
    for i, row in enumerate(block["pairs"]):
        for side, ids in (("chosen", enc.chosen[i]), ("rejected", enc.rejected[i])):
            with torch.no_grad():
                logits = model(torch.tensor([enc.prompt[i] + ids])).logits[0]
            logp = torch.log_softmax(logits.double(), -1)
            ref = float(sum(logp[len(enc.prompt[i]) - 1 + j, t] for j, t in enumerate(ids)))
            worst = max(worst, abs(row[f"{side}_logp"] - ref) / len(ids))
    # the float32 spread of SmolLM2-135M a token, measured at 1.33e-5 (selfcheck.TOLERANCE is held to it)
    assert worst <= TOLERANCE
    assert math.isfinite(block["accuracy"]) and 0 <= block["accuracy_lo"] <= block["accuracy"] <= block["accuracy_hi"]


def test_the_eval_report_holds_the_benchmark_beside_the_probe(tiny_dir, tmp_path, capsys):
    from helpers.report_schema import check_report_schema

    from tinymcf_callback.benchmark.analysis import PREFS_FIELDS
    from tinymcf_callback.benchmark.lmeval import LM_EVAL_FIELDS

    out = tmp_path / "report.json"
    assert tinymcf(["eval", "--model", tiny_dir, *PROBE, "--tag", "t", *BENCH, "--json", out]) == 0
    printed = capsys.readouterr().out
    assert "preference pairs" in printed and f"lm-eval 0.4.13 {TASK}" in printed
    data = json.loads(out.read_text())
    check_report_schema(data, extra=("tag", "prefs", "lm_eval"))
    assert list(data["prefs"]) == list(PREFS_FIELDS) and list(data["lm_eval"]) == list(LM_EVAL_FIELDS)
    prefs = data["prefs"]
    assert prefs["n_pairs"] == 12 and [r["config"] for r in prefs["configs"]] == ["commonsense", "deontology",
                                                                                   "justice", "utilitarianism"]
    assert [r["margin"] for r in prefs["pairs"]] == pytest.approx([r["chosen_logp"] - r["rejected_logp"]
                                                                   for r in prefs["pairs"]])
    assert prefs["accuracy_lo"] <= prefs["accuracy"] <= prefs["accuracy_hi"]
    assert prefs["source"]["sha256"] and prefs["source"]["per_config"] == 3
