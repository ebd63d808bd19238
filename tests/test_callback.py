"""MoralProbeCallback inside a real Trainer (tiny random Qwen3: mechanics, never moral content)."""

import glob
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.trackers import probe_scalars, probe_tensorboard, tensorboard_scalars, tensorboard_tags, wandb_run_records
from helpers.trainer_utils import make_trainer
from transformers import TrainerCallback

from tinymcf_callback import MoralProbeCallback, ProbeLogger, compare
from tinymcf_callback.errors import ProbeDataError
from tinymcf_callback.stats.metrics import baseline_record, metric_names
from tinymcf_callback.training.state import record_counters
from tinymcf_callback.views.rows import ROW_COLUMNS

SCORE = "eval_moral_scifi/score"


def probe_entries(log_history, key=SCORE):
    return [e for e in log_history if key in e]


@pytest.mark.slow
@pytest.mark.parametrize("given", [False, True], ids=["add_callback", "trainer="])
def test_metrics_reach_tensorboard_wandb_and_log_history(tmp_path, qwen_tok, monkeypatch, given):
    """Either way the numbers reach each reporter at the Trainer's steps: without trainer= through the table of
    trackers (TensorBoard: the probe's own folder; wandb: the Trainer's run), with it through Trainer.log (the
    Trainer's own TensorBoard folder)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "tinymcf-test")
    trainer = make_trainer(tmp_path / "out", qwen_tok, report_to=("tensorboard", "wandb"))
    cb = MoralProbeCallback(name="scifi", limit=3, verbose=False, trainer=trainer if given else None)
    trainer.add_callback(cb)
    trainer.train()
    import wandb

    wandb.finish()
    entries = probe_entries(trainer.state.log_history)
    assert [e["step"] for e in entries] == [0, 2, 4]  # baseline + one per step although eval and save both fire
    names = metric_names("scifi")
    no_control = {names[k + b] for k in ("social_norms", "score_minus_sn") for b in ("", "_lo", "_hi")}
    for j, e in enumerate(entries):  # j: the change test it is (the baseline at step 0 is none)
        selectivity = {names[k] for k in names if k.startswith("selectivity")}  # logged with a target only
        optional = {names["width_reached"]} | ({names["score_change_p_run"]} if j == 0 else set())  # with until only
        assert set(names.values()) - {names["human_corr"], *no_control, *selectivity, *optional} <= set(e)  # Care
        assert names["width_reached"] not in e
        if j:
            assert e[names["score_change_p_run"]] == min(1.0, e[names["score_change_p"]] * j * (j + 1))
        assert not selectivity & set(e)
        assert "eval_moral_scifi/care/align_other" in e and "eval_moral_scifi/care/self_other_gap" in e
        assert e[names["score_lo"]] <= e[SCORE] <= e[names["score_hi"]]
        assert e[names["gap_lo"]] <= e[names["gap"]] <= e[names["gap_hi"]]
        assert e[names["score_lo"]] <= e[SCORE] <= e[names["score_hi"]]
        care = "eval_moral_scifi/care/align_other"  # its band in every dashboard
        assert e[care + "_lo"] <= e[care] <= e[care + "_hi"]
        assert [k for k in e if "/care/" in k and k.endswith("_lo")] == [care + "_lo"]  # align_self's: tables only
        assert not any(k.startswith("train") for k in e)
    # the change since the step-0 baseline: nothing at step 0, some after training (lr > 0; mechanics only)
    assert entries[0][names["score_change"]] == 0.0 and entries[0][names["score_change_p"]] == 1.0
    assert entries[2][names["score_change"]] != 0.0 and 0.0 <= entries[2][names["score_change_p"]] <= 1.0
    assert entries[2][names["score_change"]] == pytest.approx(entries[2][SCORE] - entries[0][SCORE], abs=1e-12)

    assert cb.trainer is (trainer if given else None)

    # the numbers: in the Trainer's own TensorBoard folder through Trainer.log, else in the probe's own folder
    scalars = tensorboard_scalars if given else probe_scalars
    tb = scalars(tmp_path / "out")
    assert sorted(tb) == [0, 2, 4]
    assert [tb[s] for s in (0, 2, 4)] == pytest.approx([e[SCORE] for e in entries], abs=1e-6)  # float32 storage
    assert scalars(tmp_path / "out", "eval/moral_scifi/care/align_other")
    assert sorted(scalars(tmp_path / "out", "eval/moral_scifi/score_change_p")) == [0, 2, 4]
    assert not scalars(tmp_path / "out", "eval/moral_scifi/care/align_self_lo")
    if not given:  # nothing of the probe's in the Trainer's own folder: one writer per folder
        assert not [tag for tag in tensorboard_tags(tmp_path / "out") if "moral" in tag]
    # the probe's own folder beside the Trainer's: the margin charts' layout and the figure at each probe
    probe_tb = probe_tensorboard(tmp_path / "out")
    assert [i.step for i in probe_tb.Images("eval/moral_scifi/figure")] == [0, 2, 4]
    assert probe_tb.Tags()["tensors"] == ["custom_scalars__config__"]
    assert bool(probe_tb.Tags()["scalars"]) is not given
    assert not tensorboard_scalars(tmp_path / "out", "train/moral_scifi/score")

    # wandb (offline): read the run file back
    rows, metrics, config = wandb_run_records(tmp_path)
    # the probe's precision, once, in the run's config
    assert {k: config[k] for k in config if k.startswith("moral_scifi/")} == {
        "moral_scifi/dtype": "float32", "moral_scifi/autocast": None, "moral_scifi/compute": "float32",
        "moral_scifi/device": "cpu"}
    found = {int(float(r["train/global_step"])): float(r["eval/moral_scifi/score"])
             for r in rows if "eval/moral_scifi/score" in r}
    assert sorted(found) == [0, 2, 4]
    assert [found[s] for s in (0, 2, 4)] == pytest.approx([e[SCORE] for e in entries], abs=1e-6)
    # What the probe adds itself (the Trainer's own wandb callback writes neither): one metric definition
    # binding its keys to the Trainer's step, and at each probe the per-foundation table of that step's report.
    ours = [m for m in metrics if "moral" in m.glob_name + m.name]
    assert len(ours) == 1 and ours[0].glob_name == "eval/moral_scifi/*"
    assert ours[0].step_metric == "train/global_step"
    tables = {int(float(r["train/global_step"])): json.loads(r["eval/moral_scifi/table/path"])
              for r in rows if "eval/moral_scifi/table/path" in r}
    assert sorted(tables) == [0, 2, 4]
    [run_dir] = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    reports = {0: tmp_path / "out" / "moral_probe_scifi_baseline.json",
               **{s: tmp_path / "out" / f"checkpoint-{s}" / "moral_probe_scifi.json" for s in (2, 4)}}
    increments = {int(float(r["train/global_step"])): (json.loads(r["eval/moral_scifi/table/_type"]),
                                                         int(r["eval/moral_scifi/table/increment_num"]))
                  for r in rows if "eval/moral_scifi/table/path" in r}
    assert increments == {0: ("incremental-table-file", 0), 2: ("incremental-table-file", 1),
                          4: ("incremental-table-file", 2)}  # one table whose increments the run keeps, not three
    for step, path in tables.items():
        logged = json.loads((Path(run_dir) / "files" / path).read_text())
        expected = json.loads(reports[step].read_text())["table"]
        assert logged["columns"] == ["step", *expected[0]]
        assert len(logged["data"]) == len(expected) == 1  # limit=3: Care only; each increment holds its step's rows
        for row, want in zip(logged["data"], expected, strict=True):
            assert row[0] == step
            for got, (column, value) in zip(row[1:], want.items(), strict=True):
                if value is None:  # undefined in the report (null), NaN in the wandb table
                    assert got is None or got != got, column
                elif isinstance(value, str):  # the foundation
                    assert got == value
                else:
                    assert got == pytest.approx(value, rel=1e-12, abs=1e-15), column
    # the figure of the curve so far and the per-vignette rows, at each probe's step
    figures = {int(float(r["train/global_step"])): json.loads(r["eval/moral_scifi/figure/path"])
               for r in rows if "eval/moral_scifi/figure/path" in r}
    assert sorted(figures) == [0, 2, 4] and all((Path(run_dir) / "files" / f).stat().st_size for f in figures.values())
    vignettes = {int(float(r["train/global_step"])): json.loads(r["eval/moral_scifi/vignette_rows/path"])
                 for r in rows if "eval/moral_scifi/vignette_rows/path" in r}
    assert sorted(vignettes) == [0, 2, 4]
    for step, path in vignettes.items():
        logged = json.loads((Path(run_dir) / "files" / path).read_text())
        assert logged["columns"] == list(ROW_COLUMNS) and len(logged["data"]) == 3  # limit=3: its three vignettes
        assert {row[0] for row in logged["data"]} == {step}


@pytest.mark.slow
def test_wandb_table_only_when_report_to_asks_for_wandb(tmp_path, qwen_tok, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    run = wandb.init(project="tinymcf-test", dir=str(tmp_path))  # the user's own run, not the Trainer's
    try:
        cb = MoralProbeCallback(name="scifi", limit=1, verbose=False)
        trainer = make_trainer(tmp_path / "out", qwen_tok, [cb], max_steps=2, report_to=("tensorboard",))
        trainer.train()
        run.log({"user/marker": 1.0})
    finally:
        wandb.finish()
    assert [e["step"] for e in probe_entries(trainer.state.log_history)] == [0, 2]
    assert sorted(probe_scalars(tmp_path / "out")) == [0, 2]
    rows, metrics, _ = wandb_run_records(tmp_path)
    assert any("user/marker" in r for r in rows)  # the run file was read
    assert not [k for r in rows for k in r if "moral" in k]
    assert not [m for m in metrics if "moral" in m.glob_name + m.name]


def test_checkpoint_reports_and_history(tmp_path, qwen_tok):
    trainer = make_trainer(tmp_path, qwen_tok, learning_rate=1e-2)
    trainer.add_callback(MoralProbeCallback(name="scifi", limit=3, verbose=False, trainer=trainer))  # the first way
    trainer.train()
    reports = {0: json.loads((tmp_path / "moral_probe_scifi_baseline.json").read_text())}  # step 0: no checkpoint
    for step in (2, 4):
        reports[step] = json.loads((tmp_path / f"checkpoint-{step}" / "moral_probe_scifi.json").read_text())
        state = json.loads((tmp_path / f"checkpoint-{step}" / "trainer_state.json").read_text())
        assert [e["step"] for e in probe_entries(state["log_history"])] == [0, 2, 4][: step // 2 + 1]
    lines = [json.loads(line) for line in (tmp_path / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [(line["step"], line["event"]) for line in lines] == [(0, "train_begin"), (2, "evaluate"), (4, "evaluate")]
    for line in lines:  # the history line carries the full report's numbers and bounds, under the same names
        rep = reports[line["step"]]
        assert rep["step"] == line["step"] and rep["schema_version"] == 2 and rep["level"] == 0.95
        for field in ("score", "score_lo", "score_hi", "gap_lo", "gap_hi", "sn_lo", "score_minus_sn_hi",
                      "level", "n_resamples", "seed", "prompt_digest"):
            assert line[field] == rep[field], field
        assert line["table"][0]["align_other_lo"] == rep["table"][0]["align_other_lo"] is not None
        assert line["score_lo"] <= line["score"] <= line["score_hi"]
    # the logged change since the baseline is the paired comparison of the two full reports
    result = compare(reports[0], reports[4], level=0.95, n_resamples=2000, seed=0)["headline"]["score"]
    assert lines[2]["metrics"]["eval_moral_scifi/score_change"] == pytest.approx(result["change"], abs=1e-12)
    assert lines[2]["metrics"]["eval_moral_scifi/score_change_p"] == pytest.approx(result["p"], abs=1e-12)


@pytest.mark.slow
def test_save_only_and_every(tmp_path, qwen_tok):
    """Saves only (no evaluation): the Trainer writes trainer_state.json *before* on_save, so only the callback's
    refresh puts this step's probe and this save's counters into the checkpoint. Read them back."""
    cb = MoralProbeCallback(name="scifi", limit=1, events="save", every=2, baseline=False, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb], max_steps=8, eval=False)
    trainer.train()
    entries = probe_entries(trainer.state.log_history)
    assert [e["step"] for e in entries] == [4, 8]
    for step, probed, counters in [(2, [], (1, None)), (4, [4], (2, 4)), (6, [4], (3, 4)), (8, [4, 8], (4, 8))]:
        state = json.loads((tmp_path / f"checkpoint-{step}" / "trainer_state.json").read_text())
        saved = probe_entries(state["log_history"])
        assert [e["step"] for e in saved] == probed, step
        assert [e[SCORE] for e in saved] == [e[SCORE] for e in entries[:len(saved)]]
        attributes = state["stateful_callbacks"]["MoralProbeCallback"]["attributes"]
        assert (attributes["event_count"], attributes["last_step"]) == counters, step
        assert (tmp_path / f"checkpoint-{step}" / "moral_probe_scifi.json").exists() == (step in (4, 8))


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_training_is_bit_identical_with_and_without_probe(tmp_path, qwen_tok):
    runs = []
    for with_cb in (False, True):
        cbs = [MoralProbeCallback(name="scifi", limit=2, verbose=False)] if with_cb else []
        trainer = make_trainer(tmp_path / str(with_cb), qwen_tok, cbs, max_steps=6, eval_steps=2, save_steps=3)
        trainer.model.gradient_checkpointing_enable()
        trainer.train()
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        evals = [e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e]
        runs.append((losses, evals, _weights(trainer.model), trainer.model.training,
                     trainer.model.is_gradient_checkpointing, trainer.model.config.use_cache))
        if with_cb:
            assert len(probe_entries(trainer.state.log_history)) == 5  # 0, 2, 3, 4, 6
    (l0, e0, w0, *flags0), (l1, e1, w1, *flags1) = runs
    assert l0 == l1 and e0 == e1 and len(l0) == 6
    assert flags0 == flags1
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


def test_failure_is_a_warning_and_logs_nothing(tmp_path, qwen_tok, monkeypatch, caplog):
    from tinymcf_callback.probe import Probe

    def boom(self, model, **kw):
        raise torch.OutOfMemoryError("simulated out of memory")

    monkeypatch.setattr(Probe, "score", boom)
    cb = MoralProbeCallback(name="scifi", limit=1, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb])
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        trainer.train()
    assert trainer.state.global_step == 4
    assert not any("moral" in k for e in trainer.state.log_history for k in e)
    msgs = [r.getMessage() for r in caplog.records if "moral probe [scifi] failed" in r.getMessage()]
    assert len(msgs) == 3 and "OutOfMemoryError: simulated out of memory" in msgs[0]

    strict = MoralProbeCallback(name="scifi", limit=1, strict=True, verbose=False)
    with pytest.raises(torch.OutOfMemoryError):
        make_trainer(tmp_path / "strict", qwen_tok, [strict]).train()


def test_metric_for_best_model_selects_by_alignment(tmp_path, qwen_tok):
    cb = MoralProbeCallback(name="scifi", limit=2, baseline=False, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb], max_steps=6, metric_for_best_model="moral_scifi/score",
                           greater_is_better=True, load_best_model_at_end=True)
    trainer.train()
    entries = probe_entries(trainer.state.log_history)
    best = max(entries, key=lambda e: e[SCORE])
    assert trainer.state.best_metric == pytest.approx(best[SCORE])
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best['step']}")


@pytest.mark.slow  # a real Trainer run; metric_for_best_model below reads the same metrics in the fast tier
def test_early_stopping_stops_on_the_probe_metric(tmp_path, qwen_tok):
    """EarlyStoppingCallback, placed after the probe, reads the probe's score from the evaluation metrics: with
    the weights frozen (learning rate 0) the score never improves, so patience 2 stops the run at step 3 of 8."""
    from transformers import EarlyStoppingCallback

    cb = MoralProbeCallback(name="scifi", limit=1, baseline=False, verbose=False, n_resamples=0)
    stopper = EarlyStoppingCallback(early_stopping_patience=2)
    trainer = make_trainer(tmp_path, qwen_tok, [cb, stopper], max_steps=8, eval_steps=1, save_steps=1,
                           learning_rate=0.0, metric_for_best_model="moral_scifi/score", greater_is_better=True,
                           load_best_model_at_end=True)
    trainer.train()
    entries = probe_entries(trainer.state.log_history)
    assert trainer.state.global_step == 3 and [e["step"] for e in entries] == [1, 2, 3]
    assert stopper.early_stopping_patience_counter == 2
    assert trainer.state.best_metric == entries[0][SCORE]
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-1")


@pytest.mark.parametrize("clifford_source", ["generated", pytest.param("real", marks=pytest.mark.slow)],
                         indirect=True)
def test_two_sets_at_once_do_not_clash(tmp_path, qwen_tok, clifford_source):
    from tinymcf_callback.cli.main import main as tinymcf

    clifford_source.ready()
    assert tinymcf(["prepare", "--name", "clifford", "--source", str(clifford_source.path),
                    *clifford_source.flags]) == 0
    a = MoralProbeCallback(name="scifi", limit=1, verbose=False)
    b = MoralProbeCallback(name="clifford", limit=2, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [a, b], max_steps=2)
    trainer.train()
    assert [e["step"] for e in probe_entries(trainer.state.log_history)] == [0, 2]
    cl = probe_entries(trainer.state.log_history, "eval_moral_clifford/score")
    assert [e["step"] for e in cl] == [0, 2]
    assert (tmp_path / "moral_probe_clifford.jsonl").exists()
    assert (tmp_path / "checkpoint-2" / "moral_probe_clifford.json").exists()
    saved = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())["stateful_callbacks"]
    for name in ("scifi", "clifford"):  # one list for both callbacks: the newest entry per set is this save's
        entry = [e for e in saved["MoralProbeCallback"] if e["args"]["name"] == name][-1]
        assert entry["attributes"]["attempted_step"] == 2 and entry["attributes"]["event_count"] == 1


def test_bad_input(tmp_path, qwen_tok):
    with pytest.raises(ProbeDataError, match="tinymcf prepare --name clifford"):
        MoralProbeCallback(name="clifford")
    with pytest.raises(ValueError, match="unknown event"):
        MoralProbeCallback(events=("evaluate", "epoch_end"))
    with pytest.raises(ValueError, match="every must be a positive"):
        MoralProbeCallback(every=0)
    with pytest.raises(ValueError, match="limit must be a positive"):
        MoralProbeCallback(limit=True)
    with pytest.raises(ValueError, match="trainer= must be the transformers Trainer"):
        MoralProbeCallback(trainer=qwen_tok)
    trainer = make_trainer(tmp_path, None, [MoralProbeCallback(name="scifi", limit=1)])
    with pytest.raises(ValueError, match="found no tokenizer"):
        trainer.train()


def assert_scores_like_plain(report_path, plain_model, tok, limit, tolerance) -> float:
    """The callback's report at ``report_path`` has the per-prompt P(Yes) and the score of ``Probe`` run on
    ``plain_model`` (a plain fp32 model with the weights the probe saw), within ``tolerance``."""
    from tinymcf_callback.probe import Probe

    report = json.loads(Path(report_path).read_text())
    logged = np.array([p["p_yes"] for p in report["prompts"]])
    plain = Probe(tok, "scifi", limit=limit).run(plain_model)
    difference = np.abs(logged - plain["raw"]["p_yes"].to_numpy()).max()
    assert difference < tolerance and abs(report["score"] - plain["score"]) < tolerance, (report_path, difference)
    return difference


def test_peft_lora_model_scores_like_the_merged_plain_model(tmp_path, qwen_tok):
    """A LoRA model (random adapter weights, so the adapter moves the scores) is probed like the plain model
    that has the adapter merged into its weights, within 1e-5 per prompt, at step 0 and after training."""
    import copy

    from peft import LoraConfig, get_peft_model

    from tinymcf_callback.probe import Probe

    cb = MoralProbeCallback(name="scifi", limit=1, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb], max_steps=2)
    base = copy.deepcopy(trainer.model)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    trainer.model = get_peft_model(trainer.model, lora)
    trainer.model_wrapped = trainer.model
    at_start = copy.deepcopy(trainer.model).merge_and_unload()
    assert type(at_start) is type(base)  # a plain Qwen3 model again
    trainer.train()
    assert [e["step"] for e in probe_entries(trainer.state.log_history)] == [0, 2]
    assert_scores_like_plain(tmp_path / "moral_probe_scifi_baseline.json", at_start, qwen_tok, 1, 1e-5)
    at_end = copy.deepcopy(trainer.model).merge_and_unload()
    assert_scores_like_plain(tmp_path / "checkpoint-2" / "moral_probe_scifi.json", at_end, qwen_tok, 1, 1e-5)
    # the adapter matters: without it the scores are elsewhere
    assert np.abs(Probe(qwen_tok, "scifi", limit=1).score(base).p_yes - Probe(qwen_tok, "scifi", limit=1).score(
        at_end).p_yes).max() > 1e-4


# P(Yes) of the probe inside a bf16 mixed-precision run against the same weights in plain fp32. accelerate runs the
# model's forward under bf16 autocast, which the probe lifts for itself (under it: 1.5e-4 on the tiny random Qwen3).
BF16_RUN_TOLERANCE = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("options, tolerance", [
    ({"bf16": True}, BF16_RUN_TOLERANCE),
    # dynamo graph capture; inductor codegen is minutes on CPU
    ({"torch_compile": True, "torch_compile_backend": "eager"}, 1e-5),
], ids=["bf16", "torch_compile"])
def test_bf16_and_torch_compile_score_like_the_plain_model(tmp_path, qwen_tok, options, tolerance):
    """The probe inside a bf16 or torch.compile run gives the scores of a plain fp32 model with the same weights:
    the model before training (step 0) and the last checkpoint loaded from disk (step 2).

    (transformers 5.24 hands callbacks the uncompiled module, which shares its weights with the compiled one;
    the engine on a compiled module itself: test_engine.py::test_compiled_model_scores_like_eager.)
    """
    import copy

    from transformers import AutoModelForCausalLM

    cb = MoralProbeCallback(name="scifi", limit=1, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb], max_steps=2, **options)
    at_start = copy.deepcopy(trainer.model).eval()
    trainer.train()
    assert [e["step"] for e in probe_entries(trainer.state.log_history)] == [0, 2]
    at_end = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2", dtype=torch.float32).eval()
    differences = [assert_scores_like_plain(tmp_path / "moral_probe_scifi_baseline.json", at_start, qwen_tok, 1,
                                            tolerance),
                   assert_scores_like_plain(tmp_path / "checkpoint-2" / "moral_probe_scifi.json", at_end, qwen_tok, 1,
                                            tolerance)]
    print(f"\n{options}: largest P(Yes) difference from the plain fp32 model {max(differences):.1e}")


class Forwarder(TrainerCallback):
    """A user's callback that drives the probe itself: the Trainer's handler holds only the forwarder."""

    def __init__(self, inner):
        self.inner = inner

    def on_train_begin(self, *args, **kwargs):
        return self.inner.on_train_begin(*args, **kwargs)

    def on_evaluate(self, *args, **kwargs):
        return self.inner.on_evaluate(*args, **kwargs)

    def on_save(self, *args, **kwargs):
        return self.inner.on_save(*args, **kwargs)


class Ledger(TrainerCallback):
    """A reporter the table of trackers does not know (as Comet or Neptune): the rows Trainer.log gives it."""

    rows: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        Ledger.rows.append({"step": state.global_step, **logs})


@pytest.mark.parametrize("given", [True, False], ids=["trainer=", "add_callback"])
def test_the_numbers_reach_the_reporters_either_way_and_an_unknown_one_is_said(tmp_path, qwen_tok, caplog, monkeypatch,
                                                                               given):
    """Driven by another callback (nothing of the Trainer's on the way): with trainer= every reporter gets the numbers
    through Trainer.log; without, TensorBoard gets them through the table (the probe's own folder), and the one
    reporter the table does not know is said once, naming trainer=."""
    from transformers.integrations import integration_utils

    monkeypatch.setitem(integration_utils.INTEGRATION_TO_CALLBACK, "ledger", Ledger)
    monkeypatch.setattr(Ledger, "rows", [])
    trainer = make_trainer(tmp_path, qwen_tok, max_steps=2, report_to=("tensorboard", "ledger"))
    cb = MoralProbeCallback(name="scifi", limit=1, verbose=False, trainer=trainer if given else None)
    trainer.add_callback(Forwarder(cb))
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        trainer.train()
    entries = probe_entries(trainer.state.log_history)
    assert [e["step"] for e in entries] == [0, 2]  # log_history either way
    assert all("epoch" in e for e in entries)  # as Trainer.log keeps a row
    warned = [r.getMessage() for r in caplog.records if "report_to names" in r.getMessage()]
    tb = (tensorboard_scalars if given else probe_scalars)(tmp_path)
    assert sorted(tb) == [0, 2]
    assert [tb[s] for s in (0, 2)] == pytest.approx([e[SCORE] for e in entries], abs=1e-6)  # float32 storage
    ledgered = [row["step"] for row in Ledger.rows if SCORE in row]
    if given:
        assert ledgered == [0, 2] and not warned
    else:
        assert ledgered == [] and len(warned) == 1
        assert "ledger" in warned[0] and "tensorboard" not in warned[0] and "trainer=trainer" in warned[0]


@pytest.mark.slow
@pytest.mark.parametrize("events, restore, probed, at_checkpoint", [
    # evaluation at every step, checkpoints at 3 and 6: probes at 2, 4, 6; three events counted at step 3
    ("evaluate", False, [0, 2, 4, 6], {"event_count": 3, "last_step": 2, "attempted_step": 2}),
    # saves at 3 and 6: a probe at 6. The Trainer stores the counters before on_save, so the save at 3
    # is counted only because the callback refreshes the checkpoint's trainer_state.json.
    ("save", False, [0, 6], {"event_count": 1, "last_step": 0, "attempted_step": 0}),
    # restore_callback_states_from_checkpoint: the Trainer rebuilds the callback from its saved state
    ("save", True, [0, 6], {"event_count": 1, "last_step": 0, "attempted_step": 0}),
], ids=["evaluate", "save", "save-restore-flag"])
@pytest.mark.slow
def test_resume_probes_on_the_uninterrupted_schedule(tmp_path, qwen_tok, events, restore, probed, at_checkpoint):
    def run(out, resume=None):
        cb = MoralProbeCallback(name="scifi", limit=1, events=events, every=2, verbose=False)
        trainer = make_trainer(out, qwen_tok, [cb], max_steps=6, eval=events == "evaluate", eval_steps=1,
                               save_steps=3, restore_callback_states_from_checkpoint=restore,
                               save_only_model=False)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full")
    assert [e["step"] for e in probe_entries(full.state.log_history)] == probed
    saved = json.loads((tmp_path / "full" / "checkpoint-3" / "trainer_state.json").read_text())
    attributes = saved["stateful_callbacks"]["MoralProbeCallback"]["attributes"]
    baseline = attributes.pop("baseline_record")  # the step-0 probe's per-vignette s, for score_change after resuming
    assert attributes == {**at_checkpoint, "baseline_done": True}
    assert baseline["step"] == 0 and len(baseline["id"]) == len(baseline["s"]) == 1 and len(baseline["s"][0]) == 4

    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-3"))
    entries = probe_entries(resumed.state.log_history)
    assert [e["step"] for e in entries] == probed
    lines = [json.loads(line) for line in (tmp_path / "resumed" / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [(line["step"], line["event"]) for line in lines] == [(s, events) for s in probed if s > 3]  # no baseline
    cb = next(c for c in resumed.callback_handler.callbacks if isinstance(c, MoralProbeCallback))
    assert cb.event_count == 2 * at_checkpoint["event_count"] and cb.baseline_done
    # the step-0 baseline came back from the checkpoint (another output folder: no baseline file there), so the
    # resumed run's change is measured from the uninterrupted run's step-0 score
    full_cb = next(c for c in full.callback_handler.callbacks if isinstance(c, MoralProbeCallback))
    assert cb.baseline_record == full_cb.baseline_record and cb.baseline_record["step"] == 0
    assert not (tmp_path / "resumed" / "moral_probe_scifi_baseline.json").exists()
    step0 = probe_entries(full.state.log_history)[0][SCORE]
    for e in entries[-len(lines):]:
        assert e["eval_moral_scifi/score_change"] == pytest.approx(e[SCORE] - step0, abs=1e-12)


def test_a_baseline_of_other_prompts_is_dropped_with_a_warning(qwen_tok, caplog):
    one, two = (MoralProbeCallback(name="scifi", limit=n, tokenizer=qwen_tok, verbose=False) for n in (1, 2))
    scores = np.full(len(one.probe), 0.5)
    from tinymcf_callback.scoring.engine import ScoreResult

    res = ScoreResult(scores, scores, np.ones(len(scores), dtype=bool))
    record = baseline_record(one.probe.report(res, elapsed=0.0), step=0)
    mine, other = ProbeLogger(one.probe), ProbeLogger(two.probe)  # what each callback logs through
    mine.use_baseline(record)
    assert mine.baseline_record is record
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        other.use_baseline(record)
    assert other.baseline_record is None
    assert "baseline is not used" in caplog.text and "score_change is not logged" in caplog.text


def test_saved_state_keeps_one_entry_per_set():
    """The Trainer appends every callback's state at each save; only the newest entry of each set is kept."""
    def entry(name, step):
        return {"args": {"name": name}, "attributes": {"last_step": step}}

    saved = {"MoralProbeCallback": [entry("scifi", 0), entry("clifford", 0), entry("scifi", 2), entry("clifford", 2)]}
    record_counters(saved, "MoralProbeCallback", "scifi", entry("scifi", 3))
    record_counters(saved, "MoralProbeCallback", "clifford", entry("clifford", 3))
    assert saved["MoralProbeCallback"] == [entry("scifi", 3), entry("clifford", 3)]


def test_change_since_baseline_is_paired_and_survives_intervals_off(qwen_tok):
    """``score_change`` is B - A of the scores; its p-value is paired; with n_resamples=0 only the change is logged."""
    from helpers.reports import made_up_scores

    from tinymcf_callback.probe import Probe
    from tinymcf_callback.stats.metrics import change_metrics

    for n_resamples in (2000, 0):
        probe = Probe(qwen_tok, "scifi", n_resamples=n_resamples)
        start, later = (probe.report(made_up_scores(probe, shift=s), elapsed=0.0) for s in (0.0, 0.1))
        logged = change_metrics("scifi", baseline_record(start, step=0), later)
        assert logged["eval_moral_scifi/score_change"] == pytest.approx(later["score"] - start["score"], abs=1e-12)
        if n_resamples:
            assert logged["eval_moral_scifi/score_change_p"] < 0.001  # a 0.1 shift of every vignette: certain
        else:
            assert set(logged) == {"eval_moral_scifi/score_change"}
    assert change_metrics("scifi", None, later) == {}  # baseline=False, or a failed baseline probe


@pytest.mark.parametrize("kind", ["BertForMaskedLM", "LlamaModel"])
def test_a_model_the_probe_cannot_read_stops_at_train_begin(tmp_path, qwen_tok, kind):
    """A wrong model kind is a setup error: refused at step 0, before any forward call, even with strict=False."""
    import transformers
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from tinymcf_callback.errors import UnsupportedModelError

    if kind == "BertForMaskedLM":
        cfg = transformers.BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=64)
    else:
        cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=2, intermediate_size=64)
    model = getattr(transformers, kind)(cfg)
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    cb = MoralProbeCallback(name="scifi", limit=1, tokenizer=qwen_tok, verbose=False)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(UnsupportedModelError, match="AutoModelForCausalLM"):
        cb.on_train_begin(args, TrainerState(), TrainerControl(), model=model)
    assert calls == []


@pytest.mark.slow
def test_a_trl_sfttrainer_takes_the_callback_as_the_docs_show(tmp_path, qwen_tok):
    """The docs' TRL snippet: SFTTrainer is a Trainer, and the probe's lines come at step 0 and every save."""
    from datasets import Dataset
    from helpers.trainer_utils import tiny_model
    from trl import SFTConfig, SFTTrainer

    dataset = Dataset.from_dict({"text": ["Returning a lost wallet is kind.", "Cheating at cards is wrong."] * 8})
    args = SFTConfig(str(tmp_path / "sft"), max_steps=4, save_steps=2, report_to="none", use_cpu=True,
                     per_device_train_batch_size=4, disable_tqdm=True, max_length=32)
    trainer = SFTTrainer(model=tiny_model(0), args=args, train_dataset=dataset, processing_class=qwen_tok)
    trainer.add_callback(MoralProbeCallback(name="scifi", per_foundation=1, n_resamples=0, trainer=trainer,
                                            verbose=False))
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "sft" / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 2, 4]
    assert any("eval_moral_scifi/score" in entry for entry in trainer.state.log_history)
