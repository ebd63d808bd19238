"""Every architecture family scores each prompt as if it were scored alone, prefix sharing or not.

Tiny random models (hidden size 64, 2 layers, ``initializer_range`` 0.125 so that a wrong
mask or position moves P(Yes) visibly) with the real Qwen3 tokenizer, on ``scifi`` limit=3
(24 prompts) in three batches. The reference runs each prompt alone: no padding, no mask,
no position ids, no cache. Each model also checks the path the engine took (shared
prefixes, full prompts, or unpadded prompts) and that a model kept off the faster path
says why once in the log. Run with ``-s`` to see the measured differences.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import transformers as T

from tinymcf_callback.probe import Probe
from tinymcf_callback.scoring.engine import score_prompts

VOCAB = 151936  # the Qwen3 tokenizer's ids fit
INIT = 0.125
TOLERANCE = 1e-4
MASS_REL_TOLERANCE = 1e-3
SHARED, FULL, UNPADDED = "shared", "full", "unpadded"


def _decoder(**extra):
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, initializer_range=INIT, **extra)


SLIDING_FULL = ["sliding_attention", "full_attention"]

# name: (model factory, path the engine must take with share_prefix=True)
ARCHITECTURES = {
    "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512,
                                                    initializer_range=INIT)), SHARED),
    "opt": (lambda: T.OPTForCausalLM(T.OPTConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                                                 num_attention_heads=4, word_embed_proj_dim=64,
                                                 max_position_embeddings=512, init_std=INIT)), SHARED),
    "gpt_neox": (lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**_decoder())), SHARED),
    "bloom": (lambda: T.BloomForCausalLM(T.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4,
                                                       initializer_range=INIT)), FULL),
    "falcon": (lambda: T.FalconForCausalLM(T.FalconConfig(**_decoder())), SHARED),
    "phi3": (lambda: T.Phi3ForCausalLM(T.Phi3Config(pad_token_id=0, **_decoder())), SHARED),
    "mistral_window32": (lambda: T.MistralForCausalLM(T.MistralConfig(sliding_window=32, **_decoder())), FULL),
    "mistral_window4096": (lambda: T.MistralForCausalLM(T.MistralConfig(sliding_window=4096, **_decoder())), SHARED),
    "qwen2_window32": (lambda: T.Qwen2ForCausalLM(T.Qwen2Config(use_sliding_window=True, sliding_window=32,
                                                               max_window_layers=0, **_decoder())), FULL),
    "gemma2_window16": (lambda: T.Gemma2ForCausalLM(T.Gemma2Config(sliding_window=16, layer_types=SLIDING_FULL,
                                                                   head_dim=16, **_decoder())), FULL),
    "gemma3_window16": (lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(sliding_window=16, layer_types=SLIDING_FULL,
                                                                       head_dim=16, **_decoder())), FULL),
    "gpt_neo_local16": (lambda: T.GPTNeoForCausalLM(T.GPTNeoConfig(
        vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
        window_size=16, max_position_embeddings=512, initializer_range=INIT)), FULL),
    "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(**_decoder())), SHARED),
    "qwen3_moe": (lambda: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2,
                                                                 moe_intermediate_size=32, **_decoder())), SHARED),
    "lfm2_conv": (lambda: T.Lfm2ForCausalLM(T.Lfm2Config(layer_types=["conv", "full_attention"], **_decoder())), FULL),
    "mamba": (lambda: T.MambaForCausalLM(T.MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=8,
                                                       num_hidden_layers=2, initializer_range=INIT)), FULL),
    "mpt": (lambda: T.MptForCausalLM(T.MptConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2,
                                                 initializer_range=INIT)), FULL),
    "bart_decoder": (lambda: T.BartForCausalLM(T.BartConfig(
        vocab_size=VOCAB, d_model=64, decoder_layers=2, encoder_layers=2, decoder_attention_heads=4,
        decoder_ffn_dim=128, max_position_embeddings=512, init_std=INIT)), UNPADDED),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and lose a lot when the cores are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def probes(qwen_tok):
    shared = Probe(qwen_tok, "scifi", limit=3, token_budget=600)
    full = Probe(qwen_tok, "scifi", limit=3, token_budget=600, share_prefix=False)
    assert len(shared.batches) >= 2 and len(full.batches) >= 2  # the root cache is reused across batches
    assert max(map(len, shared.encoded)) > 32  # longer than the 16- and 32-token windows
    return shared, full


def score_alone(model, probe, tok):
    """The reference: each prompt alone, no padding, no mask, no position ids, no cache (P(Yes), Yes+No mass)."""
    with torch.inference_mode():
        logits = torch.cat([model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[:, -1]
                            for ids in probe.encoded])
    return score_prompts(logits, tok)


def _expected_forward_calls(path: str, probe: Probe) -> int:
    if path == SHARED:
        return 1 + 2 * len(probe.batches)  # the header once, then scenario + questions per batch
    if path == FULL:
        return len(probe.batches)
    return sum(len({len(probe.encoded[i]) for i in b}) for b in probe.batches)  # one call per length


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_scores_equal_each_prompt_alone(arch, probes, qwen_tok, caplog):
    factory, path = ARCHITECTURES[arch]
    shared, full = probes
    torch.manual_seed(0)
    model = factory().eval()
    reference, reference_mass = score_alone(model, shared, qwen_tok)
    assert reference.std() > 1e-3  # the random weights spread P(Yes): a wrong mask would show
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        a = shared.score(model)
        shared.score(model)  # a second probe of the same model: nothing new in the log
        b = full.score(model)
    shared_diff, full_diff = np.abs(a.p_yes - reference).max(), np.abs(b.p_yes - reference).max()
    print(f"\n| {arch} | {shared_diff:.1e} | {full_diff:.1e} | {path} |", end="")
    assert shared_diff < TOLERANCE and full_diff < TOLERANCE
    for res in (a, b):  # the Yes+No mass is ~1e-4 on random weights: compare it relatively
        assert (np.abs(res.yn_mass - reference_mass) / reference_mass).max() < MASS_REL_TOLERANCE
    assert a.n_forward == _expected_forward_calls(path, shared)
    notes = [r.getMessage() for r in caplog.records if type(model).__name__ in r.getMessage()]
    if path == SHARED:
        assert notes == []
    else:
        assert len(notes) == 1, notes  # said once, not per batch nor per probe
        assert ("shared-prefix path" in notes[0]) == (path == FULL)
        assert ("unpadded" in notes[0]) == (path == UNPADDED)
