"""The precision that is really used: what the probe records is what the forward computed in, under each wrapper.

FSDP2's ``MixedPrecisionPolicy`` and FSDP1's ``MixedPrecision`` keep float32 shards and compute in bfloat16; the
probe used to record float32 (the weights' dtype), hold bfloat16 arithmetic to float32's tolerance and fall back
shared -> full -> unpadded on every probe, blaming the strategies. DeepSpeed's bf16 section holds the model in
bfloat16, accelerate's autocast keeps float32 weights and computes in bfloat16. The compute precision is now read
at the first matrix product, and the self-check's float32 replay runs under each of them: it catches a steering
hook at the last position (wrong on the shared path) there too. 2 processes, gloo, CPU (slow: subprocesses).
DeepSpeed's fp16 section needs an accelerator (``Type fp16 is not supported`` on CPU): a model held in float16 is
tested in one process (test_selfcheck_precision.py).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import transformers as T
from helpers.defects import added_at_last_position
from helpers.ports import torchrun

from tinymcf_callback.probe import Probe
from tinymcf_callback.scoring.selfcheck import TOLERANCES

HERE = Path(__file__).resolve().parent
WRAPPERS = ("fsdp2", "fsdp1", "zero3", "zero2")
STORED = {"fsdp2": "float32", "fsdp1": "float32", "zero3": "bfloat16", "zero2": "bfloat16"}


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_the_recorded_precision_is_the_computed_one_and_the_check_sees_in_it(wrapper, tmp_path):
    if wrapper.startswith("zero"):
        pytest.importorskip("deepspeed")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [*torchrun(2),
           str(HERE / "helpers" / "mixed_precision_script.py"), str(tmp_path), wrapper]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"{wrapper}_rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        for name in ("clean", "steered"):
            got = rank[name]
            assert got["seen"] == "bfloat16"  # what the first matrix product really ran in
            assert got["precision"]["compute"] == got["seen"] and got["precision"]["dtype"] == STORED[wrapper]
            assert got["check"]["precision"] == "bfloat16" and got["check"]["reference"] == "float32 replay"
            assert got["check"]["replay_note"] is None and got["check"]["max_diff"] < 1e-5
            assert got["check"]["scored_tolerance"] == TOLERANCES["bfloat16"]
            assert not got["changed_again"] and got["again"] == got["strategy"]  # a second probe: the same forward
        assert rank["clean"]["strategy"] == "shared" and rank["clean"]["check"]["fallbacks"] == []
        assert rank["steered"]["strategy"] == "full"  # caught in bfloat16, on every rank at once
        assert [why.split(" gave ")[0] for why in rank["steered"]["check"]["fallbacks"]] == ["shared prefixes"]
        assert "in a float32 replay" in rank["steered"]["check"]["fallbacks"][0]
    assert ranks[0]["steered"]["check"]["fallbacks"] == ranks[1]["steered"]["check"]["fallbacks"]


def tiny_llama():
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.125)).eval()


@pytest.fixture
def probe(qwen_tok):
    return Probe(qwen_tok, "scifi", limit=3, token_budget=600, keep_autocast=True)


def test_accelerates_autocast_is_recorded_as_computed_and_checked_through_the_replay(probe):
    """keep_autocast=True under accelerate's bf16 wrapper: float32 weights, bfloat16 arithmetic, a float32 replay."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # another test's Accelerator may hold the process's state
    try:
        for steered in (False, True):
            model = tiny_llama()
            if steered:
                added_at_last_position(model)
            res = probe.score(Accelerator(mixed_precision="bf16", cpu=True).prepare(model))
            check_autocast_probe(res, steered)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def check_autocast_probe(res, steered: bool) -> None:
    assert res.precision == {"dtype": "float32", "autocast": "bfloat16", "device": "cpu", "compute": "bfloat16"}
    assert res.check["reference"] == "float32 replay" and res.check["replay_note"] is None
    assert res.strategy == ("full" if steered else "shared")
    assert bool(res.check["fallbacks"]) == steered


def test_reduced_fp32_matmuls_are_recorded_as_tf32_and_replayed_at_full_precision(probe, monkeypatch):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")  # CPU: float32 products may take bfloat16 passes, like TF32
    try:
        model = tiny_llama()
        added_at_last_position(model)
        res = probe.score(model)
    finally:
        torch.set_float32_matmul_precision(before)
    assert res.precision["compute"] == "tf32" and res.check["reference"] == "float32 replay"
    assert res.check["scored_tolerance"] == TOLERANCES["tf32"] and res.strategy == "full"
