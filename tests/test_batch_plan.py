"""How large a forward call is, by device: the rule (a pure function), the model's cost per token, the even split,
and a probe planned for the device its model is on (again when it moves). A GPU's plan is exercised on the CPU: the
device and its free memory are what the rule reads, so a test can hand it any."""

import logging

import numpy as np
import pytest
import torch
import transformers as T
from helpers.defects import HELD_OUT, TABLE
from helpers.models import reference_alone

from tinymcf_callback import testing as offline_assets
from tinymcf_callback.probe import Probe
from tinymcf_callback.probe import fixed as probe_module
from tinymcf_callback.scoring.batching import (
    DEFAULT_MAX_BATCH,
    DEFAULT_TOKEN_BUDGET,
    GPU_BATCH_CAP,
    GPU_MEMORY_SHARE,
    GPU_TOKEN_CAP,
    batch_size_for,
    plan_batches,
)
from tinymcf_callback.scoring.model_info import memory_per_token
from tinymcf_callback.scoring.ranks import Ranks

GiB = 2**30
KiB, MiB = 2**10, 2**20
H200_FREE = 137 * GiB  # what an H200 has free beside Qwen3-0.6B's weights
# Each prompt alone against the GPU's plan on the CPU (per_foundation=2, two batches of 56), measured over every prompt
# in float32: P(Yes) 3.5e-7 (Qwen3) and 3.8e-7 (Llama), the Yes+No mass 1.6e-6 and 1.2e-6 apart (relative); the
# float32 replay of bfloat16 and float16, 2.4e-7 to 4.8e-7. A wrong mask or position moves P(Yes) by 1e-3 or more here.
ALONE_TOLERANCE = 1e-6
MASS_TOLERANCE = 4e-6


# ---- the rule ----------------------------------------------------------------------------------------------------
def test_the_cpu_plan_is_the_one_it_always_was():
    size = batch_size_for("cpu", free_bytes=H200_FREE, token_bytes=170 * KiB, row_bytes=2 * MiB)
    assert (size.token_budget, size.max_batch_size, size.rule, size.balance) == (
        DEFAULT_TOKEN_BUDGET, DEFAULT_MAX_BATCH, "cpu", False)
    assert batch_size_for("mps").token_budget == DEFAULT_TOKEN_BUDGET  # a device without a rule of its own


def test_a_gpu_plan_follows_the_free_memory_and_the_models_size():
    small = batch_size_for("cuda", H200_FREE, 170 * KiB, 2 * MiB)  # Qwen3-0.6B's shape in bfloat16: the caps
    assert (small.token_budget, small.max_batch_size, small.balance) == (GPU_TOKEN_CAP, GPU_BATCH_CAP, True)
    assert small.rule.startswith("cuda: 25% of 137.0 GiB free, 170 KiB a token")
    large = batch_size_for("cuda", 124 * GiB, 318 * KiB, 2 * MiB)  # Qwen3-8B's shape: fewer tokens fit the share
    assert large.token_budget < GPU_TOKEN_CAP and large.max_batch_size == GPU_BATCH_CAP
    assert large.token_budget * 318 * KiB + large.max_batch_size * 2 * MiB <= GPU_MEMORY_SHARE * 124 * GiB
    assert large.token_budget % 256 == 0
    busy = batch_size_for("cuda", 2 * GiB, 318 * KiB, 2 * MiB)  # a training holding most of the card
    assert busy.token_budget < large.token_budget and busy.max_batch_size < GPU_BATCH_CAP
    assert busy.token_budget * 318 * KiB + busy.max_batch_size * 2 * MiB <= GPU_MEMORY_SHARE * 2 * GiB
    full = batch_size_for("cuda", 0, 318 * KiB, 2 * MiB)
    assert (full.token_budget, full.max_batch_size) == (1, 1)  # one prompt a call, as small as a call can be


def test_given_sizes_are_kept_and_an_unknown_cost_falls_back_to_the_cpu_plan():
    assert batch_size_for("cuda", H200_FREE, 170 * KiB, token_budget=600, max_batch_size=8) == (
        batch_size_for("cpu", token_budget=600, max_batch_size=8))
    one = batch_size_for("cuda", H200_FREE, 170 * KiB, 2 * MiB, token_budget=600)
    assert (one.token_budget, one.max_batch_size) == (600, GPU_BATCH_CAP)  # each setting on its own
    unknown = batch_size_for("cuda", H200_FREE, None)
    assert (unknown.token_budget, unknown.max_batch_size) == (DEFAULT_TOKEN_BUDGET, DEFAULT_MAX_BATCH)
    assert "unknown" in unknown.rule


def test_memory_per_token_holds_the_cache_the_model_really_keeps():
    """The estimate's cache part against a real forward call's key/value cache; no estimate without a config."""
    model = offline_assets.tiny_qwen3(seed=0)
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        cache = T.DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=torch.arange(7)[None] + 100, cache=cache, use_cache=True)
        held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)) / 7
        token, row = memory_per_token(model)
        assert held < token < 4 * held + 16 * 8 * model.config.hidden_size
        assert row >= model.config.vocab_size * (dtype.itemsize + 4)  # the logits row and a float32 copy
    assert memory_per_token(torch.nn.Linear(4, 4)) is None


# ---- the even split ----------------------------------------------------------------------------------------------
def padded(batches, lengths, sizes):
    return sum(max(lengths[i] for i in b) * sum(sizes[i] for i in b) for b in batches)


def test_balance_keeps_the_number_of_batches_and_spreads_the_rows():
    rng = np.random.default_rng(0)
    lengths = rng.integers(12, 32, size=528).tolist()
    sizes = [2] * 528
    greedy = plan_batches(lengths, 131072, 1024, sizes)
    even = plan_batches(lengths, 131072, 1024, sizes, balance=True)
    assert [sum(sizes[i] for i in b) for b in greedy] == [1024, 32]
    assert [sum(sizes[i] for i in b) for b in even] == [528, 528]
    assert sorted(i for b in even for i in b) == list(range(528))
    assert padded(even, lengths, sizes) < padded(greedy, lengths, sizes)
    # rows alone would overflow the budget of the first (widest) batch: the greedy plan stands
    wide = [100] * 10 + [10] * 90
    assert plan_batches(wide, 1000, 100, balance=True) == plan_batches(wide, 1000, 100) == [list(range(10)),
                                                                                             list(range(10, 100))]


# ---- a probe, planned where its model is -------------------------------------------------------------------------
class OnDevice:
    """Makes the probe see ``device`` with ``free`` bytes free (the model itself stays on the CPU and runs there)."""

    def __init__(self, monkeypatch, device: str = "cpu", free: int | None = None):
        self.monkeypatch = monkeypatch
        self.move(device, free)

    def move(self, device: str, free: int | None = None):
        self.monkeypatch.setattr(probe_module, "model_device", lambda model: torch.device(device))
        self.monkeypatch.setattr(probe_module, "device_memory", lambda where: free)


def test_a_model_moved_between_devices_is_planned_again(qwen_tok, tiny_qwen, monkeypatch):
    probe = Probe(qwen_tok, "scifi", n_resamples=0)
    cpu = probe.plan
    assert len(cpu.batches) == 7 and cpu.size.rule == "cpu"
    where = OnDevice(monkeypatch, "cuda:0", H200_FREE)
    gpu = probe.plan_for(tiny_qwen)
    assert gpu.device == "cuda:0" and gpu.size.rule.startswith("cuda") and len(gpu.batches) == 1
    assert probe.batches is gpu.batches
    where.move("cuda:0", 1 * GiB)  # less free memory later: the plan stays (one plan per device for a run's curve)
    assert probe.plan_for(tiny_qwen) is gpu
    where.move("cpu")
    assert probe.plan_for(tiny_qwen) is cpu and probe.batches is cpu.batches
    where.move("cuda:1", 1 * GiB)  # another card, with less free: planned there anew
    other = probe.plan_for(tiny_qwen)
    assert other.device == "cuda:1" and len(other.batches) > len(gpu.batches)
    where.move("cuda:0", H200_FREE)
    assert probe.plan_for(tiny_qwen) is gpu


class TwoRanks(Ranks):
    """Two processes as this one sees them: the other rank is on ``cuda:1`` with ``other_free`` bytes free."""

    def __init__(self, other_free: int):
        super().__init__(2, 0)
        self.other_free = other_free

    def gather(self, obj):
        other = {str: "cuda:1", int: self.other_free}.get(type(obj), obj)
        return [obj, other]


def test_ranks_plan_alike_from_the_least_free_memory(qwen_tok, tiny_qwen, monkeypatch):
    OnDevice(monkeypatch, "cuda:0", H200_FREE)
    alone = Probe(qwen_tok, "scifi", n_resamples=0).plan_for(tiny_qwen)
    shared = Probe(qwen_tok, "scifi", n_resamples=0).plan_for(tiny_qwen, TwoRanks(other_free=1 * GiB))
    assert shared.device == "cuda:0" and "1.0 GiB free" in shared.size.rule
    assert shared.size.token_budget < alone.size.token_budget


def test_the_report_says_how_the_calls_were_sized(qwen_tok, tiny_qwen, monkeypatch):
    report = Probe(qwen_tok, "scifi", limit=2, n_resamples=0).run(tiny_qwen)
    assert report["info"]["batches"] == {"device": "cpu", "token_budget": DEFAULT_TOKEN_BUDGET,
                                         "max_batch_size": DEFAULT_MAX_BATCH, "rule": "cpu", "batches": 1}
    OnDevice(monkeypatch, "cuda:0", H200_FREE)
    report = Probe(qwen_tok, "scifi", per_foundation=2, n_resamples=0, max_batch_size=30).run(tiny_qwen)
    sized = report["info"]["batches"]
    assert (sized["device"], sized["max_batch_size"], sized["token_budget"], sized["batches"]) == (
        "cuda:0", 30, GPU_TOKEN_CAP, 4)  # 112 prompts, 30 a call at most: 4 batches of 28
    assert report["info"]["n_forward"] == 1 + 2 * 4


# ---- scoring at a GPU's plan (on the CPU) ------------------------------------------------------------------------
def tiny_llama(dtype):
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           initializer_range=0.125)
    return T.LlamaForCausalLM(config).eval().to(dtype)


def tiny_qwen3(dtype):
    torch.manual_seed(0)
    model = offline_assets.tiny_qwen3(seed=0)
    for module in model.modules():  # weights as large as the Llama's, so that a wrong mask or position shows
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.125)
    return model.to(dtype)


FAMILIES = {"qwen3": tiny_qwen3, "llama": tiny_llama}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_gpu_plan_gives_each_prompts_own_score(family, dtype, qwen_tok, monkeypatch, caplog):
    """Clifford's shape of plan (few, large batches, the root's cache shared as views): in float32 every prompt
    against itself scored alone; in bfloat16 and float16 the self-check's float32 replay of the riskiest prompts,
    with no false alarm."""
    model = FAMILIES[family](dtype)
    OnDevice(monkeypatch, "cuda:0", H200_FREE)
    probe = Probe(qwen_tok, "scifi", per_foundation=2, n_resamples=0, max_batch_size=64, self_check_budget=1.0)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        res = probe.score(model)
    assert [len(b) for b in probe.batches] == [56, 56] and res.n_forward == 5  # greedy: 64 and 48
    assert res.strategy == "shared" and not res.check["fallbacks"] and not caplog.records
    if dtype == torch.float32:
        p_ref, m_ref = reference_alone(model, probe.encoded, qwen_tok)
        assert np.abs(res.p_yes - p_ref).max() < ALONE_TOLERANCE
        assert (np.abs(res.yn_mass - m_ref) / m_ref).max() < MASS_TOLERANCE
    else:
        assert res.check["reference"] == "float32 replay" and len(res.check["checked"]) == 4
        assert res.check["max_diff"] < ALONE_TOLERANCE


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("defect", ["positions +1 on padded rows", "4v at the last position (steering)"])
def test_a_defect_is_still_caught_on_the_gpu_plan(defect, qwen_tok, monkeypatch):
    """One or two large batches give the check fewer batch edges to look at; the riskiest prompts still show it."""
    inject, lands_on = {**TABLE, **HELD_OUT}[defect]
    model = tiny_llama(torch.bfloat16)
    OnDevice(monkeypatch, "cuda:0", H200_FREE)
    handles = inject(model)
    try:
        res = Probe(qwen_tok, "scifi", per_foundation=2, n_resamples=0, max_batch_size=64).score(model)
    finally:
        for handle in handles:
            handle.remove()
    assert res.strategy == lands_on and res.check["fallbacks"]
