"""MoralProbeCallback inside a real Trainer (tiny random Qwen3: mechanics, never moral content)."""

import glob
import json
import logging

import numpy as np
import pytest
import torch

from tinymcf_callback import MoralProbeCallback, ProbeDataError
from tinymcf_callback.callback import metric_names
from trainer_utils import make_trainer

SCORE = "eval_moral_scifi/score"


def read_wandb_records(path):
    """The protobuf records of a wandb run file (a leveldb-style log of 32 KiB blocks)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    block, pos, buf = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk  # FULL/FIRST start a record, MIDDLE/LAST extend it
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            yield rec


def probe_entries(log_history, key=SCORE):
    return [e for e in log_history if key in e]


def test_metrics_reach_tensorboard_wandb_and_log_history(tmp_path, qwen_tok, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "tinymcf-test")
    cb = MoralProbeCallback(name="scifi", limit=3, verbose=False)
    trainer = make_trainer(tmp_path / "out", qwen_tok, [cb], report_to=("tensorboard", "wandb"))
    trainer.train()
    import wandb

    wandb.finish()
    entries = probe_entries(trainer.state.log_history)
    assert [e["step"] for e in entries] == [0, 2, 4]  # baseline + one per step although eval and save both fire
    names = metric_names("scifi")
    for e in entries:
        assert set(names.values()) - {names["human_corr"], names["social_norms"]} <= set(e)  # limit=3: Care only
        assert "eval_moral_scifi/care/align_other" in e and "eval_moral_scifi/care/self_other_gap" in e
        assert not any(k.startswith("train") for k in e)

    # tensorboard: read the event files back
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = glob.glob(str(tmp_path / "out" / "**" / "events.out.tfevents*"), recursive=True)
    assert len(events) == 1
    acc = EventAccumulator(events[0])
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "eval/moral_scifi/score" in tags and "eval/moral_scifi/care/align_other" in tags
    assert not [t for t in tags if t.startswith("train/moral")]
    tb = acc.Scalars("eval/moral_scifi/score")
    assert [s.step for s in tb] == [0, 2, 4]
    assert [s.value for s in tb] == pytest.approx([e[SCORE] for e in entries], abs=1e-6)

    # wandb (offline): read the run file back
    run_files = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "*.wandb"))
    assert len(run_files) == 1
    found, table_logged = {}, False
    for rec in read_wandb_records(run_files[0]):
        if rec.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
            if "eval/moral_scifi/score" in items:
                found[int(float(items["train/global_step"]))] = float(items["eval/moral_scifi/score"])
            table_logged |= any(k.startswith("eval/moral_scifi/table") for k in items)
    assert sorted(found) == [0, 2, 4]
    assert [found[s] for s in (0, 2, 4)] == pytest.approx([e[SCORE] for e in entries], abs=1e-6)
    assert table_logged


def test_checkpoint_reports_and_history(tmp_path, qwen_tok):
    cb = MoralProbeCallback(name="scifi", limit=2, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb])
    trainer.train()
    for step in (2, 4):
        rep = json.loads((tmp_path / f"checkpoint-{step}" / "moral_probe_scifi.json").read_text())
        assert rep["step"] == step and rep["schema_version"] == 1 and rep["table"]
        state = json.loads((tmp_path / f"checkpoint-{step}" / "trainer_state.json").read_text())
        assert [e["step"] for e in probe_entries(state["log_history"])] == [0, 2, 4][: step // 2 + 1]
    lines = [json.loads(l) for l in (tmp_path / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [(l["step"], l["event"]) for l in lines] == [(0, "train_begin"), (2, "evaluate"), (4, "evaluate")]


def test_save_only_and_every(tmp_path, qwen_tok):
    cb = MoralProbeCallback(name="scifi", limit=1, events="save", every=2, baseline=False, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb], max_steps=8, eval=False)
    trainer.train()
    assert [e["step"] for e in probe_entries(trainer.state.log_history)] == [4, 8]


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


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
    msgs = [r.getMessage() for r in caplog.records if "moral probe" in r.getMessage()]
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


def test_two_sets_at_once_do_not_clash(tmp_path, qwen_tok, clifford_csv):
    from tinymcf_callback.prepare import main as prepare_main

    assert prepare_main(["--name", "clifford", "--source", str(clifford_csv)]) == 0
    a = MoralProbeCallback(name="scifi", limit=1, verbose=False)
    b = MoralProbeCallback(name="clifford", limit=2, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [a, b], max_steps=2)
    trainer.train()
    assert [e["step"] for e in probe_entries(trainer.state.log_history)] == [0, 2]
    cl = probe_entries(trainer.state.log_history, "eval_moral_clifford/score")
    assert [e["step"] for e in cl] == [0, 2]
    assert (tmp_path / "moral_probe_clifford.jsonl").exists() and (tmp_path / "checkpoint-2" / "moral_probe_clifford.json").exists()


def test_bad_input(tmp_path, qwen_tok):
    with pytest.raises(ProbeDataError, match="python -m tinymcf_callback.prepare --name clifford"):
        MoralProbeCallback(name="clifford")
    with pytest.raises(ValueError, match="unknown event"):
        MoralProbeCallback(events=("evaluate", "epoch_end"))
    with pytest.raises(ValueError, match="every must be a positive"):
        MoralProbeCallback(every=0)
    trainer = make_trainer(tmp_path, None, [MoralProbeCallback(name="scifi", limit=1)])
    with pytest.raises(ValueError, match="found no tokenizer"):
        trainer.train()


def test_peft_lora_model(tmp_path, qwen_tok):
    from peft import LoraConfig, get_peft_model

    cb = MoralProbeCallback(name="scifi", limit=1, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb], max_steps=2)
    trainer.model = get_peft_model(trainer.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainer.model_wrapped = trainer.model
    trainer.train()
    assert [e["step"] for e in probe_entries(trainer.state.log_history)] == [0, 2]


@pytest.mark.parametrize("options", [
    {"bf16": True},
    {"torch_compile": True, "torch_compile_backend": "eager"},  # dynamo graph capture; inductor codegen is minutes on CPU
])
def test_bf16_and_torch_compile(tmp_path, qwen_tok, options):
    cb = MoralProbeCallback(name="scifi", limit=1, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb], max_steps=2, **options)
    trainer.train()
    entries = probe_entries(trainer.state.log_history)
    assert [e["step"] for e in entries] == [0, 2]
    assert all(np.isfinite(e[SCORE]) for e in entries)


def test_resume_from_checkpoint_adds_no_second_baseline(tmp_path, qwen_tok):
    make_trainer(tmp_path, qwen_tok, [MoralProbeCallback(name="scifi", limit=1, verbose=False)], max_steps=2).train()
    cb = MoralProbeCallback(name="scifi", limit=1, verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [cb], max_steps=4)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [e["step"] for e in probe_entries(trainer.state.log_history)] == [0, 2, 4]
