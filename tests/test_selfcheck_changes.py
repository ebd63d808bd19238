"""A changed model is checked again: the self-check follows what the forward computes, not the model object.

Before (issue 48): the strategy a model "needed so far" was kept per model object in a process-wide dict, and
the rotation's structure counted hooks. After a steering hook at the last position (the check rightly moved
the probe to full prompts) was replaced by one that adds the vector at position 2 of each call, the next
probes kept full left-padded prompts, checked no prompt (the budget was spent) and returned P(Yes) 1.8e-2 away
from each prompt scored alone with this test's hook (5.0e-3 in the issue's run), with no warning. Now each
probe holds its own :class:`~tinymcf_callback.scoring.selfcheck.Memory` of the forward it scored last
(:func:`~tinymcf_callback.scoring.model_info.forward_signature`): a changed forward starts again from the rules'
first strategy and checks at least one prompt, the riskiest first.
"""

import copy
import logging

import numpy as np
import pytest
import torch
import transformers as T

from tinymcf_callback.probe import Probe, make_probe
from tinymcf_callback.scoring.engine import run_batches, score_alone
from tinymcf_callback.scoring.model_info import forward_signature
from tinymcf_callback.scoring.selfcheck import check_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

# P(Yes) of a checked strategy against each prompt scored alone, float32: the same prompts computed twice, in a batch
# and alone, differ by at most 2.7e-7 on this model and these hooks (measured on every prompt of the cases here).
AGREE = 1e-6
LITTLE = 1e-3  # self_check_budget: an unchanged model's later probes cannot pay for a checked prompt for ~100 probes


def llama():
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.125)).eval()


def steering_at(position: int, seed: int = 1):
    """A forward hook adding ``4 v`` to a decoder layer's output at one position of each forward call (``-1``: the
    last, each prompt's answer; ``2``: the third, as activation addition adds its vector at the first positions)."""
    v = torch.randn(64, generator=torch.Generator().manual_seed(seed))

    def add(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden[:, position] += 4.0 * v
        return output
    return add


def alone(model, probe):
    with torch.inference_mode():
        return score_alone(model, probe.encoded, list(range(len(probe))), probe.tok)[0].p_yes


def off(res, reference) -> float:
    return float(np.abs(res.p_yes - reference).max())


def said(caplog) -> list[str]:
    """The fallbacks said in the log."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("LlamaForCausalLM: ")]


def left(res) -> list[str]:
    """The strategies the check left at this probe, in order."""
    return [why.split(" gave ")[0].split(" failed")[0] for why in res.check["fallbacks"]]


# ---- the sequence --------------------------------------------------------------------------------------
def test_a_replaced_steering_hook_is_checked_again_and_caught(qwen_tok, caplog):
    model = llama()
    probe = Probe(qwen_tok, "scifi", limit=4, self_check_budget=LITTLE)
    layer = model.model.layers[0]
    handle = layer.register_forward_hook(steering_at(-1))
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        first = probe.score(model)
        same = probe.score(model)  # the model did not change: the budget may skip the check
    reference = alone(model, probe)
    assert first.strategy == same.strategy == "full" and left(first) == ["shared prefixes"]
    assert off(first, reference) < AGREE and off(same, reference) < AGREE
    assert same.check["checked"] == [] and same.check["waiting"]

    handle.remove()
    layer.register_forward_hook(steering_at(2))  # replaced: as many hooks as before, on the same module
    with torch.inference_mode():
        full = run_batches(model, probe.encoded, probe.batches, probe.tok, strategy="full")
    reference = alone(model, probe)
    assert off(full, reference) > 1e-3  # what the probe returned before: 1.8e-2 away
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        changed = probe.score(model)
        after = probe.score(model)
    check = changed.check
    assert not check["waiting"] and len(check["checked"]) >= 1
    assert left(changed) == ["shared prefixes", "full prompts (left-padded)"]  # from the rules' first strategy again
    assert changed.strategy == after.strategy == "unpadded"
    assert off(changed, reference) < AGREE and off(after, reference) < AGREE
    assert after.check["fallbacks"] == [] and after.check["waiting"]  # unchanged again: starts where it ended
    lines = said(caplog)
    assert len(lines) == 2 and "full prompts (left-padded) gave" in lines[1]  # each cause once for this model


def test_a_fresh_model_with_the_replaced_hook_is_caught(qwen_tok):
    model = llama()
    model.model.layers[0].register_forward_hook(steering_at(2))
    probe = Probe(qwen_tok, "scifi", limit=4, self_check_budget=LITTLE)
    res = probe.score(model)
    assert res.strategy == "unpadded" and left(res) == ["shared prefixes", "full prompts (left-padded)"]
    assert off(res, alone(model, probe)) < AGREE


def test_the_first_check_of_a_changed_forward_is_the_riskiest_prompt(qwen_tok):
    """A position-dependent forward cannot pass on an unpadded prompt: the most left-padded one is checked first."""
    model = llama()
    probe = Probe(qwen_tok, "scifi", limit=4, share_prefix=False, self_check_budget=LITTLE)
    probe.score(model)
    probe.score(model)
    handle = model.model.layers[1].register_forward_hook(lambda m, a, out: None)  # a hook that changes nothing
    res = probe.score(model)
    assert res.strategy == "full" and res.check["checked"][0] == check_prompts(probe.encoded, probe.batches, "full")[0]
    pads = max(len(e) for e in probe.encoded) - min(len(e) for e in probe.encoded)
    assert pads > 0 and len(probe.encoded[res.check["checked"][0]]) == min(len(e) for e in probe.encoded)
    handle.remove()


# ---- every kind of change is seen at the next probe -------------------------------------------------------------
class Wrapper(torch.nn.Module):
    """A wrapper that only passes its arguments on (as DDP does)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _replace_mlp(model):
    model.model.layers[1].mlp = copy.deepcopy(model.model.layers[1].mlp)


CHANGES = {  # what is done to the model between two probes (each leaves every prompt's score as it was)
    "forward hook added": lambda m: m.model.layers[0].register_forward_hook(lambda mod, a, out: None),
    "forward pre-hook added": lambda m: m.model.layers[1].register_forward_pre_hook(lambda mod, a: None),
    "kwargs pre-hook added": lambda m: m.model.norm.register_forward_pre_hook(lambda mod, a, k: None,
                                                                              with_kwargs=True),
    "always-called hook added": lambda m: m.lm_head.register_forward_hook(lambda mod, a, out: None, always_call=True),
    "module swapped": _replace_mlp,
    "forward patched": lambda m: setattr(m.model.layers[0].mlp, "forward", m.model.layers[0].mlp.forward),
    "attention implementation": lambda m: m.set_attn_implementation("eager"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_of_the_forward_is_checked_at_the_next_probe(change, qwen_tok):
    model = llama()
    probe = Probe(qwen_tok, "scifi", limit=1, self_check_budget=LITTLE)
    assert probe.score(model).check["checked"] and probe.score(model).check["waiting"]
    CHANGES[change](model)
    res = probe.score(model)
    assert res.check["checked"] and not res.check["waiting"] and res.check["max_diff"] < AGREE
    assert probe.score(model).check["waiting"]  # then unchanged again


def test_hooks_added_removed_and_replaced_by_the_same_function(qwen_tok):
    """The hooks' ids, not their number: removing a hook and registering the same function again is a change."""
    model = llama()
    probe = Probe(qwen_tok, "scifi", limit=1, self_check_budget=LITTLE)
    hook = steering_at(-1)
    layer = model.model.layers[0]
    seen = [probe.score(model)]
    handle = layer.register_forward_hook(hook)
    seen += [probe.score(model), probe.score(model)]
    handle.remove()
    seen += [probe.score(model), probe.score(model)]
    handle = layer.register_forward_hook(hook)
    seen += [probe.score(model)]
    handle.remove()
    layer.register_forward_hook(hook)
    seen += [probe.score(model), probe.score(model)]
    assert [bool(r.check["checked"]) for r in seen] == [True, True, False, True, False, True, True, False]
    assert [r.strategy for r in seen] == ["shared", "full", "full", "shared", "shared", "full", "full", "full"]
    reference = alone(model, probe)
    assert all(off(r, reference) < AGREE for r in seen[-2:])


def test_a_wrapper_a_training_step_and_a_precision(qwen_tok):
    """A wrapper is another forward; weights changed in place (a training step) are the same one; another
    precision is checked at once."""
    model = llama()
    probe = Probe(qwen_tok, "scifi", limit=1, self_check_budget=LITTLE)
    probe.score(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    assert probe.score(model).check["waiting"]
    wrapped = Wrapper(model)
    res = probe.score(wrapped)
    assert res.check["checked"] and res.check["max_diff"] < AGREE
    assert probe.score(wrapped).check["waiting"]
    model.to(torch.bfloat16)  # another precision starts a new cycle of the rotation: checked at once
    res = probe.score(wrapped)
    assert res.check["checked"] and res.check["reference"] == "float32 replay"


def test_a_peft_adapter_switched_disabled_and_merged(qwen_tok):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)  # random B: scores move
    model = get_peft_model(llama(), lora).eval()
    model.add_adapter("other", lora)
    probe = Probe(qwen_tok, "scifi", limit=1, self_check_budget=LITTLE)
    steps = {"first": lambda: None, "switched": lambda: model.set_adapter("other"),
             "merged": model.merge_adapter, "unmerged": model.unmerge_adapter}
    for name, step in steps.items():
        step()
        res = probe.score(model)
        assert res.check["checked"] and res.check["max_diff"] < AGREE, name
        assert probe.score(model).check["waiting"], name
    with model.disable_adapter():
        assert probe.score(model).check["checked"]
    assert probe.score(model).check["checked"]  # enabled again


# ---- the signature itself ---------------------------------------------------------------------------------------
def test_the_signature_is_exact_and_cheap_to_keep(qwen_tok):
    model = llama()
    before = forward_signature(model)
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert forward_signature(model) == before  # a forward call leaves it as it was
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: None)  # a global hook
    try:
        assert forward_signature(model) != before
    finally:
        handle.remove()
    assert forward_signature(model) == before
    handle = model.model.layers[0].register_forward_hook(lambda m, a, out: None)
    assert forward_signature(model) != before and forward_signature(model, ignore={handle.id}) == before
    handle.remove()
    assert forward_signature(model.to(torch.bfloat16)) == before  # a dtype is a precision: the rotation's (below)
    assert forward_signature(llama()) != before  # another model, even of the same class and weights


# ---- state where it belongs ---------------------------------------------------------------------------------------
def test_each_probe_holds_its_own_memory(qwen_tok, caplog):
    """Nothing is kept in the process: a second probe of the same model starts from the rules and says what it finds
    once; a probe with a precision target says it once for all its looks."""
    model = llama()
    model.model.layers[0].register_forward_hook(steering_at(-1))
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        for _ in range(2):
            probe = Probe(qwen_tok, "scifi", limit=1, self_check_budget=LITTLE)
            assert left(probe.score(model)) == ["shared prefixes"]
            assert probe.score(model).check["fallbacks"] == []
        assert len(said(caplog)) == 2  # once per probe and cause, not once per call
        caplog.clear()
        adaptive = make_probe(qwen_tok, "scifi", until="level", width=1e-6, per_foundation=3)  # 2 looks
        asked = adaptive.score(model)
    assert len(asked.looks) == 2 and asked.result.strategy == "full"
    assert len(said(caplog)) == 1


def test_a_model_whose_forward_cannot_be_read_is_checked_at_every_probe(qwen_tok, monkeypatch):
    """Never a crash: a forward the signature cannot read counts as changed, so every probe checks a prompt."""
    from tinymcf_callback.scoring import selfcheck

    def unreadable(model, ignore=()):
        raise RuntimeError("a module that hides its hooks")

    monkeypatch.setattr(selfcheck, "forward_signature", unreadable)
    model = llama()
    probe = Probe(qwen_tok, "scifi", limit=1, self_check_budget=LITTLE)
    checks = [probe.score(model).check for _ in range(3)]
    assert all(c["checked"] and not c["waiting"] and c["max_diff"] < AGREE for c in checks)
