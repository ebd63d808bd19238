"""ProbeLogger: the probe in a training loop of one's own (here a real accelerate loop on the tiny random Qwen3).

Mechanics only (random weights): the files, the baseline, the change and the trackers, and that the
training is bit-identical with and without the probe.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from helpers.trainer_utils import TinyLMData, tiny_model

from tinymcf_callback import Probe, ProbeLogger
from tinymcf_callback.errors import ConfigError
from tinymcf_callback.rundir.history import read_lines

SCORE = "eval/moral_scifi/score"
CHANGE = "eval/moral_scifi/score_change"


def train(tok, out=None, *, steps=4, probe_every=2, to=(), accelerator=None, **logger_kw):
    """A plain accelerate loop: AdamW, 4-row batches of random tokens, dropout on; the probe at every 2nd step."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(0)
    acc = accelerator or Accelerator(cpu=True)
    model = tiny_model(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(TinyLMData(16, seed=0), batch_size=4, shuffle=True)
    model, opt, data = acc.prepare(model, opt, data)
    probe_logger = None
    if out is not None:
        probe_logger = ProbeLogger(Probe(tok, "scifi", per_foundation=2), out, to=to, **logger_kw)
        probe_logger.log(acc.unwrap_model(model), step=0)
    losses, logged, step = [], {}, 0
    while step < steps:
        for batch in data:
            model.train()
            loss = model(**batch).loss
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            step += 1
            losses.append(loss.item())
            if probe_logger is not None and step % probe_every == 0:
                logged[step] = probe_logger.log(acc.unwrap_model(model), step=step, epoch=step / len(data))
            if step == steps:
                break
    weights = {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    return losses, weights, logged, probe_logger, model


@pytest.mark.slow
def test_training_is_bit_identical_with_and_without_the_logger(tmp_path, qwen_tok):
    seen = []
    losses0, weights0, _, _, model0 = train(qwen_tok)
    losses1, weights1, logged, probe_logger, model1 = train(qwen_tok, tmp_path, to=lambda m, s: seen.append((s, m)))
    assert losses0 == losses1 and len(losses0) == 4
    assert all(torch.equal(weights0[k], weights1[k]) for k in weights0)
    assert model1.training == model0.training  # the probe restored the mode it found
    assert sorted(logged) == [2, 4] and [s for s, _ in seen] == [0, 2, 4]
    assert all(SCORE in m and CHANGE in m for _, m in seen)
    assert seen[1][1] == logged[2]


@pytest.mark.slow
def test_history_baseline_and_change_as_the_callback_writes_them(tmp_path, qwen_tok):
    *_, logged, probe_logger, _ = train(qwen_tok, tmp_path, steps=4)
    lines = [line for _, line in read_lines(tmp_path / "moral_probe_scifi.jsonl")]
    assert [(line["step"], line["event"]) for line in lines] == [(0, "train_begin"), (2, "log"), (4, "log")]
    assert lines[2]["epoch"] == 1.0
    baseline = json.loads((tmp_path / "moral_probe_scifi_baseline.json").read_text())
    assert baseline["step"] == 0 and baseline["score"] == lines[0]["score"]
    assert lines[0]["metrics"]["eval_moral_scifi/score_change"] == 0.0
    for step in (2, 4):
        line = lines[step // 2]
        assert logged[step][SCORE] == line["score"]
        assert logged[step][CHANGE] == pytest.approx(line["score"] - lines[0]["score"], abs=1e-12)
        assert 0.0 <= logged[step]["eval/moral_scifi/score_change_p"] <= 1.0
        assert logged[step][CHANGE] != 0.0  # lr > 0 moved something (mechanics only)
    # per_foundation=2 keeps every foundation and the control: all of them logged, the control too
    assert {row["foundation"] for row in lines[0]["table"]} == {
        "Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty", "Social Norms"}
    assert "eval/moral_scifi/score_minus_sn" in logged[2]

    # a loop resumed later in the same folder takes the baseline from its report on disk
    resumed = ProbeLogger(Probe(qwen_tok, "scifi", per_foundation=2), tmp_path)
    again = resumed.log(tiny_model(seed=0).eval(), step=6)
    assert again[CHANGE] == pytest.approx(again[SCORE] - lines[0]["score"], abs=1e-12)
    # ... but not a baseline of other prompts (another subset)
    other = ProbeLogger(Probe(qwen_tok, "scifi", per_foundation=3), tmp_path / "other")
    other.use_baseline(probe_logger.baseline_record)
    assert other.baseline_record is None


def test_metrics_reach_the_accelerator_trackers_and_tensorboard(tmp_path, qwen_tok):
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    class Recorder(GeneralTracker):
        name, requires_logging_directory = "recorder", False

        def __init__(self):
            super().__init__()
            self.rows = []

        @property
        def tracker(self):
            return self.rows

        def store_init_configuration(self, values):
            pass

        def log(self, values, step=None, **kwargs):
            self.rows.append((step, dict(values)))

    recorder = Recorder()
    acc = Accelerator(cpu=True, log_with=[recorder])
    acc.init_trackers("tinymcf-test")
    writer = SummaryWriter(str(tmp_path / "tb"))
    *_, logged, _, _ = train(qwen_tok, tmp_path / "run", accelerator=acc, to=[acc, writer])
    writer.close()
    assert [s for s, _ in recorder.rows] == [0, 2, 4]
    assert recorder.rows[2][1] == logged[4]
    [events] = list((tmp_path / "tb").glob("events.out.tfevents*"))
    ea = EventAccumulator(str(events))
    ea.Reload()
    assert {s.step: s.value for s in ea.Scalars(SCORE)} == pytest.approx(
        {0: recorder.rows[0][1][SCORE], 2: logged[2][SCORE], 4: logged[4][SCORE]}, abs=1e-6)


def test_what_it_cannot_send_to_is_refused_and_a_failing_probe_does_not_stop_the_loop(tmp_path, qwen_tok, caplog,
                                                                                      monkeypatch):
    probe = Probe(qwen_tok, "scifi", per_foundation=1)
    with pytest.raises(ConfigError, match="cannot send metrics to a int"):
        ProbeLogger(probe, tmp_path, to=3)
    with pytest.raises(ConfigError, match="needs a Probe"):
        ProbeLogger("scifi", tmp_path)
    probe_logger = ProbeLogger(probe, tmp_path, to=lambda m, s: 1 / 0)
    with pytest.raises(ConfigError, match="step must be a whole number"):
        probe_logger.log(tiny_model().eval(), step=-1)

    def boom(*a, **k):
        raise torch.OutOfMemoryError("simulated out of memory")

    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        assert SCORE in probe_logger.log(tiny_model().eval(), step=0)  # a failing sink: a warning
        monkeypatch.setattr(Probe, "score", boom)
        assert probe_logger.log(tiny_model().eval(), step=2) == {}
    messages = [r.getMessage() for r in caplog.records]
    assert any("step 0 not sent to <lambda>: ZeroDivisionError" in m for m in messages)
    assert any("failed at step 2 (log): OutOfMemoryError: simulated out of memory" in m for m in messages)
    assert len(read_lines(tmp_path / "moral_probe_scifi.jsonl")) == 1
    strict = ProbeLogger(probe, None, strict=True)
    with pytest.raises(torch.OutOfMemoryError):
        strict.log(tiny_model().eval(), step=0)


def test_a_target_foundation_adds_its_selectivity(tmp_path, qwen_tok):
    from tinymcf_callback.data.sets import REAL_FOUNDATIONS

    probe = Probe(qwen_tok, "scifi", per_foundation=2, target="Care")
    probe_logger = ProbeLogger(probe, tmp_path)
    base = probe_logger.log(tiny_model(seed=0).eval(), step=0)
    moved = probe_logger.log(tiny_model(seed=1).eval(), step=5)  # another model: the change is "training"
    assert base["eval/moral_scifi/selectivity"] == 0.0
    lines = [line for _, line in read_lines(tmp_path / "moral_probe_scifi.jsonl")]
    align = [{row["foundation"]: row["align_other"] for row in line["table"]} for line in lines]
    change = {f: align[1][f] - align[0][f] for f in REAL_FOUNDATIONS}
    expected = change["Care"] - sum(change[f] for f in REAL_FOUNDATIONS if f != "Care") / 5
    assert moved["eval/moral_scifi/selectivity"] == pytest.approx(expected, abs=1e-9)
    lo, hi = moved["eval/moral_scifi/selectivity_lo"], moved["eval/moral_scifi/selectivity_hi"]
    assert lo <= moved["eval/moral_scifi/selectivity"] <= hi and 0.0 <= moved["eval/moral_scifi/selectivity_p"] <= 1


@pytest.mark.slow
def test_metrics_reach_a_wandb_run(tmp_path, qwen_tok, monkeypatch):
    import wandb
    from helpers.trackers import wandb_run_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    run = wandb.init(project="tinymcf-test", dir=str(tmp_path))
    try:
        *_, logged, _, _ = train(qwen_tok, tmp_path / "run", to=run)
    finally:
        wandb.finish()
    rows, metrics, config = wandb_run_records(tmp_path)
    found = {int(float(r["train/global_step"])): float(r[SCORE]) for r in rows if SCORE in r}
    assert sorted(found) == [0, 2, 4] and found[4] == pytest.approx(logged[4][SCORE], abs=1e-9)
    ours = [m for m in metrics if "moral" in m.glob_name + m.name]
    assert len(ours) == 1 and ours[0].step_metric == "train/global_step"  # curves against the loop's step
    assert config["moral_scifi/dtype"] == "float32"
    assert any("eval/moral_scifi/table/path" in r for r in rows)  # the per-foundation table at each probe


def test_a_loop_resumed_from_an_earlier_step_sets_its_abandoned_lines_aside(tmp_path, qwen_tok):
    from tinymcf_callback.views.curves import load_history

    probe_logger = ProbeLogger(Probe(qwen_tok, "scifi", limit=2, n_resamples=0), tmp_path)
    for step, seed in ((0, 0), (2, 1), (4, 2), (6, 3)):
        probe_logger.log(tiny_model(seed=seed).eval(), step=step)
    resumed = ProbeLogger(Probe(qwen_tok, "scifi", limit=2, n_resamples=0), tmp_path)
    assert resumed.resumed_from(2, started=123.0) == [4, 6]
    again = resumed.log(tiny_model(seed=5).eval(), step=4)  # the new branch's step 4
    lines = [line for _, line in read_lines(tmp_path / "moral_probe_scifi.jsonl")]
    assert [(line["step"], line["event"]) for line in lines] == [(0, "train_begin"), (2, "log"), (4, "log"),
                                                                 (6, "log"), (2, "resumed"), (4, "log")]
    assert lines[4]["info"]["resumed"] == {"from_step": 2, "attempt_started": 123.0, "superseded": [4, 6]}
    curve = load_history(tmp_path / "moral_probe_scifi.jsonl")
    assert list(curve.steps) == [0, 2, 4]  # step 6 of the abandoned branch is gone, step 4 is the new one
    assert curve.series("score").est[2] == pytest.approx(again["eval/moral_scifi/score"], abs=1e-12)
    assert "eval/moral_scifi/score_change" in again  # the baseline was read back from its report
    assert resumed.resumed_from(4) == []  # nothing after step 4 on the current branch: nothing written
