"""Tiny random models of many architecture families, for the engine's tests (mechanics only, never meaning).

Hidden size 64, 2 layers, the real Qwen3 vocabulary (so the Qwen3 tokenizer's ids fit) and
``initializer_range`` 0.125, so that a wrong mask or position moves P(Yes) visibly. Each entry
names the strategy the engine must take for it with ``share_prefix=True``.
"""

from __future__ import annotations

import numpy as np
import torch
import transformers as T

from tinymcf_callback.scoring.prompts import answer_token_ids

VOCAB = 151936  # the Qwen3 tokenizer's ids fit
INIT = 0.125
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




def reference_alone(model, encoded, tok) -> tuple[np.ndarray, np.ndarray]:
    """The simplest reference, apart from the engine: each prompt alone (no padding, mask, position ids or
    cache), P(Yes) and the Yes+No mass by a plain float64 softmax over the model's last logits."""
    yes, no = answer_token_ids(tok)
    p_yes, mass = [], []
    with torch.inference_mode():
        for ids in encoded:
            probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].double(), -1)
            y, n = probs[yes].sum().item(), probs[no].sum().item()
            p_yes.append(y / (y + n))
            mass.append(y + n)
    return np.array(p_yes), np.array(mass)
