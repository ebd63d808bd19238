"""The self-check in the precisions researchers train in: bfloat16 and float16, checked through a float32 replay.

Before the replay, a bfloat16 probe was checked at a tolerance of 0.2 in P(Yes) (its own noise is that
large), so defects injected from outside (a position off by one on padded rows, a hook at an absolute
position: 0.002-0.07 on these models) passed without a word. Now the checked prompts are replayed in
float32 and held to float32's tolerance, in every precision. Tiny random models here (``initializer_range``
0.125, so a defect shows); SmolLM2 in the slow tier (``test_selfcheck_smollm2.py``).
"""

import contextlib
import logging

import numpy as np
import pytest
import torch
import transformers as T
from helpers.defects import HELD_OUT, OUTSIDE, TABLE, added_at_absolute_position, answer_moved_on_padded_rows

from tinymcf_callback.probe import Probe
from tinymcf_callback.scoring import engine, replay, selfcheck
from tinymcf_callback.scoring.prompts import answer_token_ids
from tinymcf_callback.scoring.replay import Float32Replay
from tinymcf_callback.scoring.selfcheck import TOLERANCES

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, INIT = 151936, 0.125
PRECISIONS = ("float32", "bfloat16", "float16")


def llama(dtype: str = "float32"):
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           initializer_range=INIT)
    return T.LlamaForCausalLM(config).eval().to(getattr(torch, dtype))


@pytest.fixture
def probe(qwen_tok):
    """``scifi`` limit 3 (24 prompts) in several batches, prefix sharing on: every path can be taken. Each case its
    own probe, which says in the log what it finds (a probe says each cause once per model)."""
    return Probe(qwen_tok, "scifi", limit=3, token_budget=600)


@pytest.fixture(scope="module")
def models():
    """One tiny Llama per precision, shared by the cases (each adds its hooks and takes them off again)."""
    return {dtype: llama(dtype) for dtype in PRECISIONS}


@contextlib.contextmanager
def injected(model, inject, **kwargs):
    handles = inject(model, **kwargs)
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("dtype", PRECISIONS)
@pytest.mark.parametrize("defect", list(TABLE) + list(HELD_OUT))
def test_every_defect_is_caught_in_every_precision(defect, dtype, probe, models, caplog):
    inject, lands_on = {**TABLE, **HELD_OUT}[defect]
    with injected(models[dtype], inject) as model, caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        res = probe.score(model)
    check = res.check
    assert res.strategy == lands_on and check["fallbacks"], check  # the shared path was left, said why
    assert all(("float32 replay" in why) == (dtype != "float32") for why in check["fallbacks"])
    assert check["reference"] == ("float32" if dtype == "float32" else "float32 replay")
    assert check["max_diff"] < 1e-5 and check["resolution"] == TOLERANCES["float32"]  # the path kept is right
    assert any("instead" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("defect", list(TABLE))
def test_the_defects_pass_a_check_in_the_reduced_precision_itself(defect, dtype, probe, models, monkeypatch):
    """Guard: compared in bfloat16 or float16 (the check before the replay), the same defects pass unseen."""
    monkeypatch.setattr(selfcheck, "REDUCED_PRECISIONS", ())  # no replay
    with injected(models[dtype], TABLE[defect][0]) as model:
        res = probe.score(model)
    assert res.strategy == "shared" and res.check["fallbacks"] == []
    assert res.check["reference"] == dtype and res.check["tolerance"] == TOLERANCES[dtype]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_resolution_is_what_the_check_flags(dtype, probe, models, qwen_tok):
    """The report's resolution is measured as a defect of known size: Yes moved on padded rows only.

    A shift that moves P(Yes) on the checked prompts by about 3x the resolution is caught; one at a tenth of it
    is not (a check that flagged it would flag float32 noise too).
    """
    yes, _ = answer_token_ids(qwen_tok)
    clean = probe.score(models[dtype]).check
    resolution = clean["resolution"]
    assert resolution == TOLERANCES["float32"] < TOLERANCES[dtype] / 1000
    outcomes = {}
    p = 0.5  # a random model's P(Yes) is near 0.5: a logit shift s moves it by about p (1 - p) s
    for factor in (3.0, 0.1):
        shift = factor * resolution / (p * (1 - p))
        with injected(models[dtype], answer_moved_on_padded_rows, shift=shift, yes_ids=yes) as model:
            outcomes[factor] = probe.score(model).check
    caught, missed = outcomes[3.0], outcomes[0.1]
    assert caught["fallbacks"] and "float32 replay" in caught["fallbacks"][0]
    measured = float(caught["fallbacks"][0].split("gave P(Yes) ")[1].split()[0])
    assert resolution < measured < 6 * resolution
    assert missed["fallbacks"] == [] and missed["max_diff"] < resolution


def test_a_replay_that_cannot_be_pure_says_so_and_compares_in_the_precision_itself(probe):
    """A layer that casts its output back to bfloat16 keeps the replay from computing in float32: the check says
    why, compares in bfloat16 and reports bfloat16's resolution (not a float32 one it did not have)."""
    model = llama("bfloat16")
    model.model.layers[0].register_forward_hook(
        lambda m, a, out: (out[0].to(torch.bfloat16), *out[1:]) if isinstance(out, tuple) else out.to(torch.bfloat16))
    check = probe.score(model).check
    assert check["reference"] == "bfloat16" and check["resolution"] == TOLERANCES["bfloat16"]
    assert "not pure float32" in check["replay_note"] and "bfloat16 input" in check["replay_note"]
    assert check["fallbacks"] == [] and check["scored_diff"] is None


def test_a_replay_that_fails_says_why(probe, monkeypatch):
    model = llama("bfloat16")
    real = Float32Replay._before

    def broken(self, module, args, kwargs):
        if module is model.lm_head:
            raise RuntimeError("no room for the float32 copies")
        return real(self, module, args, kwargs)

    monkeypatch.setattr(Float32Replay, "_before", broken)
    check = probe.score(model).check
    assert check["reference"] == "bfloat16"
    assert check["replay_note"] == "the float32 replay failed (RuntimeError: no room for the float32 copies)"


def _snapshot(model):
    return {"params": [(n, p, p.dtype, p.data_ptr(), p.detach().clone(), p.requires_grad)
                       for n, p in model.named_parameters()],
            "buffers": [(n, b, b.dtype, b.detach().clone()) for n, b in model.named_buffers()],
            "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
            "training": [m.training for m in model.modules()]}


def _assert_untouched(model, before):
    after = _snapshot(model)
    for (n, p, dtype, ptr, value, grad), (n2, p2, dtype2, ptr2, _, grad2) in zip(before["params"], after["params"],
                                                                                 strict=True):
        assert n == n2 and p is p2 and dtype == dtype2 and ptr == ptr2 and grad == grad2  # the same objects
        assert torch.equal(p2.detach(), value)  # bit for bit
    for (n, b, dtype, value), (n2, b2, dtype2, _) in zip(before["buffers"], after["buffers"], strict=True):
        assert n == n2 and b is b2 and dtype == dtype2 and torch.equal(b2, value)
    assert after["hooks"] == before["hooks"] and after["training"] == before["training"]


@pytest.mark.parametrize("blocks", [True, False])
def test_the_replay_leaves_the_model_exactly_as_it_was(blocks, qwen_tok):
    model = llama("bfloat16").train()
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untie: both kinds of weight
    before = _snapshot(model)
    ids = torch.tensor([qwen_tok("a moral question")["input_ids"]])
    with torch.inference_mode(), Float32Replay(model, blocks=blocks) as replay:
        logits = model(input_ids=ids).logits
    assert logits.dtype == torch.float32 and replay.impure is None and replay.upcast > 0
    _assert_untouched(model, before)
    assert "forward" not in vars(model.lm_head)  # the chunked output layer was the instance's own, and is gone


def test_the_replay_leaves_the_model_as_it_was_when_the_forward_raises(qwen_tok):
    model = llama("bfloat16")
    before = _snapshot(model)
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *a: (_ for _ in ()).throw(ValueError("boom")))
    before["hooks"] += 1
    with pytest.raises(ValueError, match="boom"), torch.inference_mode(), Float32Replay(model):
        model(input_ids=torch.tensor([[1, 2, 3]]))
    _assert_untouched(model, before)
    handle.remove()


def test_a_reduced_precision_probe_scores_as_before_its_check(probe):
    """The replay is a check only: the scores the probe reports are the model's own, in its own precision."""
    model = llama("bfloat16")
    checked = probe.score(model)
    unchecked = Probe(probe.tok, "scifi", limit=3, token_budget=600, self_check=False).score(model)
    assert np.array_equal(checked.p_yes, unchecked.p_yes) and checked.strategy == unchecked.strategy


def test_a_defect_on_a_few_prompts_is_caught_over_a_runs_probes(qwen_tok):
    """The issue's case: a small hook at absolute position 5 moves a few prompts just above the resolution, none of
    them among the riskiest that a first probe checks. Each probe checks other prompts, as its time pays for them
    (the rotation): the defect is found within one cycle of the prompts, and the report says what was covered."""
    model = llama("float32")
    with injected(model, added_at_absolute_position, position=5, scale=0.0002):
        unchecked = Probe(qwen_tok, "scifi", limit=3, token_budget=600, self_check=False)
        with torch.inference_mode():
            alone, _ = engine.score_alone(model, unchecked.encoded, list(range(len(unchecked))), qwen_tok,
                                          unchecked.answer_format)
        scored = unchecked.score(model)
        moved = np.maximum(np.abs(scored.p_yes - alone.p_yes), np.abs(np.log(scored.yn_mass / alone.yn_mass)))
        affected = set(np.flatnonzero(moved > TOLERANCES["float32"]).tolist())
        assert 0 < len(affected) <= len(unchecked) // 4  # a few prompts, just above the resolution
        probe = Probe(qwen_tok, "scifi", limit=3, token_budget=600)
        first = probe.score(model).check
        assert first["fallbacks"] == [] and not affected & set(first["checked"])  # missed by the riskiest prompts
        checks = [first]
        while not checks[-1]["fallbacks"] and len(checks) < 400:
            checks.append(probe.score(model).check)
    caught, before = checks[-1], checks[-2]["coverage"]
    assert caught["fallbacks"] and "shared prefixes gave" in caught["fallbacks"][0], f"not caught in {len(checks)}"
    assert len(checks) > 1 and before["cycles_completed"] == 0  # by a later probe, within the first cycle
    assert any(c["waiting"] for c in checks)  # at the budget's price: not every probe checked a prompt
    assert caught["coverage"]["checked_this_cycle"] == len(caught["checked"])  # the new strategy's cycle starts


@pytest.mark.parametrize("dtype", PRECISIONS)
@pytest.mark.parametrize("defect", list(OUTSIDE))
def test_an_outside_testers_defects_are_caught_at_the_first_probe(defect, dtype, probe, models, qwen_tok):
    """Defects an outside tester held out (a pad key leak, a rotary offset on short rows only, a hook at absolute
    position 5, a cache that drops the last shared-prefix token): each moves the unchecked scores, and the first
    probe of the model so hooked checks the riskiest prompts, leaves the path it breaks and keeps a right one."""
    inject, _ = OUTSIDE[defect]
    with injected(models[dtype], inject) as model:
        unchecked = Probe(qwen_tok, "scifi", limit=3, token_budget=600, self_check=False).score(model)
        res = probe.score(model)
        with torch.inference_mode():
            alone, _ = engine.score_alone(model, probe.encoded, list(range(len(probe))), qwen_tok, probe.answer_format)
    check = res.check
    assert check["fallbacks"] and not check["waiting"], check
    if dtype == "float32":  # the defect is real; the path kept gives each prompt its own number
        assert np.abs(unchecked.p_yes - alone.p_yes).max() > 10 * TOLERANCES["float32"]
        assert np.abs(res.p_yes - alone.p_yes).max() < 1e-5
    assert check["max_diff"] < 1e-5 and check["resolution"] == TOLERANCES["float32"]


def test_the_precision_on_record_is_the_lowest_of_the_products_that_make_the_answer(probe):
    """A float32 body with a bfloat16 output layer computes the answer's logits in bfloat16: that is the precision
    on record and the one the check's tolerance is chosen by, with both products named."""
    model = llama("float32")
    model.lm_head.to(torch.bfloat16)
    model.lm_head.register_forward_pre_hook(lambda module, args: (args[0].to(torch.bfloat16),))
    report = probe.run(model)
    precision = report["info"]["precision"]
    assert precision["compute"] == "bfloat16" and precision["dtype"] == "float32"
    assert precision["products"] == {"first": "float32", "output": "bfloat16"}
    assert report["info"]["self_check"]["precision"] == "bfloat16"
    same = probe.run(llama("float32"))["info"]["precision"]  # one precision throughout: nothing more on record
    assert same["compute"] == "float32" and "products" not in same


def test_the_replay_holds_a_block_of_float32_copies_never_the_model(probe):
    """The float32 copies the replay holds at once are a block's (a decoder layer's or less) and one slice of the
    output layer: within a tenth of the weights, where a copy of the whole model would be twice their size."""
    model = llama("bfloat16")
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    check = Probe(probe.tok, "scifi", limit=3, token_budget=600).score(model).check
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    layer = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    assert check["reference"] == "float32 replay" and check["checked"]
    assert 0 < check["copy_bytes"] <= layer + replay.HEAD_ROWS * model.config.hidden_size * 4 <= 0.1 * weights
