"""What the engine needs to know about a model before running it: its wrappers, forward arguments, dtype, pad token,
memory cost, what padding would do to its scores, and what its forward computes. Nothing here runs the model.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Collection
from dataclasses import dataclass

import torch

from ..errors import PromptError, UnsupportedModelError

_FORWARDING_CHILDREN = ("_fsdp_wrapped_module", "module", "model")
_MAX_WRAPPERS = 16
_ADAPTER_STATE = ("active_adapters", "disable_adapters", "merged_adapters")  # peft's tuner layers (BaseTunerLayer)


def unwrap_model(model):
    """The model inside the wrappers a training run hands over, for reading its signature and config.

    Peels torch.compile (``_orig_mod``), PEFT (``get_base_model()``) and every wrapper whose
    forward only passes ``*args, **kwargs`` on to a child (torch FSDP v1, DDP, DataParallel,
    the DeepSpeed engine), in any nesting. FSDP v2 (``fully_shard``) keeps the model's class
    and needs nothing. Always *call* the wrapper: FSDP gathers the parameters in its forward. (accelerate's
    ``extract_model_from_parallel`` peels part of this; why this is kept: docs/development.md.)
    """
    return wrapper_chain(model)[-1]


def wrapper_chain(model) -> list:
    """``model``, then each model it wraps, down to the innermost one."""
    layers = [model]
    for _ in range(_MAX_WRAPPERS):
        inner = _inner_model(layers[-1])
        if inner is None or inner is layers[-1]:
            break
        layers.append(inner)
    return layers


def _inner_model(model):
    children = getattr(model, "_modules", None) or {}
    if isinstance(children.get("_orig_mod"), torch.nn.Module):  # torch.compile
        return children["_orig_mod"]
    if callable(getattr(model, "get_base_model", None)):  # PEFT
        return model.get_base_model()
    if _only_forwards(model):
        for name in _FORWARDING_CHILDREN:
            if isinstance(children.get(name), torch.nn.Module):
                return children[name]
    return None


def _only_forwards(model) -> bool:
    """Does ``type(model).forward`` take nothing but ``*args`` / ``**kwargs`` (a pure wrapper)?"""
    try:
        params = list(inspect.signature(type(model).forward).parameters.values())[1:]  # without self
    except (TypeError, ValueError):
        return False
    return bool(params) and all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def prompt_learning(model) -> bool:
    """Is a PEFT prompt-learning adapter (prompt, prefix or p-tuning) active on ``model``? Its virtual tokens or
    key/value prefix rule out passing a cache (it would replace the prefix) and padding (it would sit between)."""
    for layer in wrapper_chain(model):
        try:
            peft_config = getattr(layer, "active_peft_config", None)
        except (AttributeError, KeyError, ValueError):
            peft_config = None
        if getattr(peft_config, "is_prompt_learning", False):
            return True
    return False


# ---- is it a causal language model? -----------------------------------------------------------

NEEDS = ("the probe reads the next-token distribution of a causal (decoder-only) language model with its "
         "language-model head: load the checkpoint with AutoModelForCausalLM.from_pretrained(...)")


def check_causal_lm(model) -> None:
    """Raise :class:`UnsupportedModelError` for models the probe would score wrongly or crash on (encoder-decoder,
    masked or bidirectional LMs, no LM head); a module that is not a transformers model is given the benefit of the
    doubt."""
    base = unwrap_model(model)
    name, cfg = type(base).__name__, getattr(base, "config", None)
    lineage = {c.__name__ for c in type(base).__mro__}  # FSDP v2 and user subclasses keep the class as a base
    causal_names, masked_names, masked_types = _registered_lm_classes()
    causal = bool(lineage & causal_names)
    if getattr(cfg, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{name} is an encoder-decoder model; {NEEDS}")
    if lineage & masked_names and not causal:
        raise UnsupportedModelError(f"{name} is a masked language model (it fills in blanks, it does not predict "
                                    f"the next token); {NEEDS}")
    if causal and getattr(cfg, "model_type", None) in masked_types and not (
            getattr(cfg, "is_decoder", False) or getattr(cfg, "causal", False)):
        raise UnsupportedModelError(f"{name} has is_decoder=False, so its attention also sees later tokens; load it "
                                    f"with is_decoder=True (from_pretrained(..., is_decoder=True)); {NEEDS}")
    if not causal and _lacks_lm_head(base, cfg):
        raise UnsupportedModelError(f"{name} has no language-model head (it returns hidden states, not logits); "
                                    f"{NEEDS}")


def _lacks_lm_head(base, cfg) -> bool:
    get_head = getattr(base, "get_output_embeddings", None)
    if not callable(get_head):
        return False  # not a transformers model: nothing to judge by
    try:
        head = get_head()
    except (NotImplementedError, AttributeError):
        head = None
    auto_map = getattr(cfg, "auto_map", None) or {}
    registered = str(auto_map.get("AutoModelForCausalLM", "")).endswith(f".{type(base).__name__}")
    return head is None and not registered


def _registered_lm_classes() -> tuple[set[str], set[str], set[str]]:
    """Class names transformers registers as causal LMs and as masked LMs, and the masked LMs' model types."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    return (set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()), set(MODEL_FOR_MASKED_LM_MAPPING_NAMES.values()),
            set(MODEL_FOR_MASKED_LM_MAPPING_NAMES))


# ---- what the forward takes ------------------------------------------------------------------

@dataclass(frozen=True)
class ForwardArgs:
    """Which optional arguments the model's forward takes (read through any wrappers); ``position_base``: the
    position of a prompt's first token (:func:`position_base`)."""

    position_ids: bool
    logits_to_keep: bool
    cache_kw: str | None  # "cache" (transformers 5.x) or "past_key_values"; None: no key/value cache
    position_base: int = 0

    @classmethod
    def of(cls, model) -> ForwardArgs:
        params = forward_params(model)
        if prompt_learning(model):  # the adapter owns positions and the cache (see prompt_learning)
            params -= {"position_ids", "cache", "past_key_values"}
        cache_kw = next((k for k in ("cache", "past_key_values") if k in params), None)
        return cls("position_ids" in params, "logits_to_keep" in params, cache_kw, position_base(model))


def forward_params(model) -> set[str]:
    """The names the forward of the model inside the wrappers takes (none where its signature cannot be read)."""
    try:
        return set(inspect.signature(type(unwrap_model(model)).forward).parameters)
    except (TypeError, ValueError):
        return set()


def position_base(model) -> int:
    """Where the model's own position ids start: ``padding_idx + 1`` for RoBERTa-style embeddings (positions made by
    ``create_position_ids_from_input_ids``), else 0. Counted from 0 there, P(Yes) was off by up to 0.42."""
    for module in unwrap_model(model).modules():
        padding_idx = getattr(module, "padding_idx", None)
        if callable(getattr(module, "create_position_ids_from_input_ids", None)) and isinstance(padding_idx, int):
            return padding_idx + 1
    return 0


def pad_token_id(model, tok) -> int:
    """A token id to fill (masked) padded slots with: the first of the tokenizer's pad token, the model's, the
    tokenizer's end-of-sequence token and 0 that the embedding table holds (a pad token added to the tokenizer
    without resizing the model lies outside it)."""
    vocab = _embedding_rows(model)
    config = model_config(model)
    for candidate in (tok.pad_token_id, getattr(config, "pad_token_id", None), tok.eos_token_id, 0):
        if isinstance(candidate, int) and not isinstance(candidate, bool) and 0 <= candidate < (vocab or 1 << 62):
            return candidate
    return 0


def _embedding_rows(model) -> int | None:
    base = unwrap_model(model)
    try:
        emb = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    except (NotImplementedError, AttributeError):
        emb = None
    rows = getattr(emb, "num_embeddings", None)
    if isinstance(rows, int) and rows > 0:
        return rows
    size = getattr(model_config(model), "vocab_size", None)
    return size if isinstance(size, int) and size > 0 else None


def weights_dtype(model) -> torch.dtype | None:
    """The floating dtype that holds most of the model's parameters (what its matrix products run in)."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=counts.get) if counts else None


def model_device(model) -> torch.device:
    base = unwrap_model(model)
    emb = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    if emb is not None and getattr(emb, "weight", None) is not None and emb.weight.device.type != "meta":
        return emb.weight.device
    return next(model.parameters()).device


def memory_per_token(model) -> tuple[int, int] | None:
    """What a forward call costs ``model`` in memory: ``(bytes per padded token, bytes per prompt's row)``, from its
    config; None when the config does not say. A token: its keys and values in every layer and one layer's working
    tensors; a row: the answer position's logits and their float32 copies. An estimate that errs large."""
    cfg = model_config(model)
    cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg  # a multimodal model's decoder
    numbers = {k: _read(cfg, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size")}
    hidden, layers, heads = numbers["hidden_size"], numbers["num_hidden_layers"], numbers["num_attention_heads"]
    if not all(isinstance(v, int) and v > 0 for v in (hidden, layers, heads)):
        return None

    def number(key, default):
        value = numbers[key]
        return value if isinstance(value, int) and value > 0 else default
    kv_heads, head_dim = number("num_key_value_heads", heads), number("head_dim", hidden // heads)
    inner, vocab = number("intermediate_size", 4 * hidden), number("vocab_size", _embedding_rows(model) or 0)
    dtype = weights_dtype(model) or torch.float32
    size = torch.empty((), dtype=dtype).element_size() if dtype.is_floating_point else 4
    cache = 2 * layers * kv_heads * head_dim * size
    work = size * (3 * hidden + 5 * heads * head_dim + 3 * kv_heads * head_dim + 3 * inner) + 8 * hidden
    return cache + work, vocab * (size + 12)


def device_memory(device: torch.device) -> int | None:
    """Bytes a probe may allocate on ``device`` now: free on a CUDA device, plus what torch's caching allocator holds
    there unused (a training's freed activations); None elsewhere (a CPU's memory is not what limits a batch)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def model_name(model) -> str:
    """The model's name or path as its config records it (``from_pretrained``'s argument), else its class."""
    name = getattr(model_config(model), "name_or_path", None)
    return str(name) if name else class_name(model)


def class_name(model) -> str:
    """The model's class for messages, through wrappers (FSDP2's ``FSDPLlamaForCausalLM``: ``LlamaForCausalLM``)."""
    cls = type(unwrap_model(model))
    if cls.__name__.startswith("FSDP") and any(c.__name__ == "FSDPModule" for c in cls.__mro__):
        cls = next((c for c in cls.__mro__[1:] if c.__name__ == cls.__name__[4:]), cls)
    return cls.__name__


def model_config(model):
    return getattr(unwrap_model(model), "config", None)


def max_context(model) -> int | None:
    cfg = model_config(model)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        val = _read(cfg, key)
        if isinstance(val, int) and val > 0:
            return val
    return None


# ---- what padding does to it -----------------------------------------------------------------

# Models whose forward takes no position_ids but whose outputs do not move under left padding:
# ALiBi biases come from the attention mask (bloom, mpt), Mamba zeroes padded states.
# Measured in tests/test_architectures.py; any other model without position_ids runs unpadded.
PADDING_PROOF_WITHOUT_POSITIONS = frozenset({"bloom", "mpt", "mamba"})

# Layer kinds that only attend over cache slots ("mlp"/"moe" layers mix no tokens at all).
# Anything else (linear attention, convolutions, recurrent, hybrid or indexed blocks) carries
# a state or a selection that padding inside a prompt would change.
ATTENTION_LAYER_KINDS = frozenset({"full_attention", "attention", "global", "sliding_attention",
                                   "chunked_attention", "local", "mlp", "moe"})
WINDOWED_LAYER_KINDS = frozenset({"sliding_attention", "chunked_attention", "local"})
WINDOW_KEYS = ("sliding_window", "attention_chunk_size", "window_size", "local_attention")
STATEFUL_CONFIG_KEYS = ("layers_block_type", "hybrid_override_pattern", "block_types", "attn_layer_indices",
                        "attn_layer_period", "state_size", "ssm_state_size", "mamba_d_state", "conv_L_cache")


def _configs(model) -> list:
    """The model's config, its text decoder's config (multimodal models) and each per-layer config (transformers 5's
    ``per_layer_config``: such an attribute read from the global config raises)."""
    cfg = model_config(model)
    if cfg is None:
        return []
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    out = [cfg] if text is cfg else [cfg, text]
    for c in list(out):
        if getattr(c, "is_heterogeneous", False):
            out += list(c.per_layer_config)
    return out


def _read(cfg, key: str):
    """``cfg.<key>`` (None when absent); a per-layer attribute read from a global config counts as absent."""
    try:
        return getattr(cfg, key, None)
    except Exception:  # noqa: BLE001 - AmbiguousGlobalPerLayerAttributeError and whatever a custom config raises
        return None


def padding_problem(model, args: ForwardArgs) -> str | None:
    """Why left padding would change this model's scores, or None when it is harmless: with ``position_ids`` that
    skip it (measured in ``tests/test_architectures.py``), or where the positions cannot move."""
    if prompt_learning(model):
        return "its PEFT prompt-learning adapter puts virtual tokens ahead of any padding"
    if args.position_ids:
        return None
    if any(_read(c, "model_type") in PADDING_PROOF_WITHOUT_POSITIONS for c in _configs(model)):
        return None
    return "its forward takes no position_ids, so left padding would move its positions"


def attention_windows(model) -> dict[str, int] | str:
    """Every attention window the config sets (sliding, chunked, local), or why it cannot tell. Conservative: a
    window counts even where only some layers use it."""
    windows = {}
    for cfg in _configs(model):
        for key in WINDOW_KEYS:
            value = _read(cfg, key)
            if value is None or (key == "sliding_window" and _read(cfg, "use_sliding_window") is False):
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                return f"its {key}={value!r} is not a window size the probe understands"
            if value > 0:
                windows[key] = min(value, windows.get(key, value))
        kinds = set(_read(cfg, "layer_types") or []) | set(_read(cfg, "attention_layers") or [])
        if kinds & WINDOWED_LAYER_KINDS and not windows:
            return f"its layer types {sorted(kinds)} use a window but the config gives no window size"
    return windows


def shared_prefix_blocker(model, args: ForwardArgs, cache_slots: int) -> str | None:
    """Why the shared-prefix path would not give each prompt's own score on this model, or None. It leaves padding
    inside the cache, which full attention ignores but a window counted in cache slots or a recurrent state does not:
    every layer must be attention, every window longer than ``cache_slots``."""
    missing = [what for what, ok in (("position_ids", args.position_ids), ("logits_to_keep", args.logits_to_keep),
                                     ("key/value cache", args.cache_kw)) if not ok]
    if missing:
        return f"its forward takes no {' or '.join(missing)}"
    configs = _configs(model)
    if not configs:
        return "it has no config to check its attention layers against"
    for cfg in configs:
        kinds = set(_read(cfg, "layer_types") or []) - ATTENTION_LAYER_KINDS
        if kinds:
            return f"its {', '.join(sorted(kinds))} layers carry a state that padding inside a prompt would change"
        keys = [k for k in STATEFUL_CONFIG_KEYS if _read(cfg, k) is not None]
        if keys:
            return f"its config ({', '.join(keys)}) describes recurrent or convolutional layers"
    windows = attention_windows(model)
    if isinstance(windows, str):
        return windows
    short = {k: w for k, w in windows.items() if w <= cache_slots}
    if short:
        key, w = min(short.items(), key=lambda kv: kv[1])
        return (f"its attention window ({key}={w}) is not longer than the {cache_slots} cache slots the shared "
                "prefixes need, and padding inside the cache would take window slots from real tokens")
    return None


# ---- do the prompts fit the model? ----------------------------------------------------------------
def check_context(model, encoded: list[list[int]], labels: list[str] | None = None) -> None:
    """Raise :class:`PromptError` naming the longest prompt when it exceeds the model's context (less the positions
    before ``position_base``)."""
    limit = max_context(model)
    if limit is None or not encoded:
        return
    limit -= ForwardArgs.of(model).position_base
    longest = max(range(len(encoded)), key=lambda i: len(encoded[i]))
    if len(encoded[longest]) > limit:
        what = labels[longest] if labels else f"prompt {longest}"
        raise PromptError(
            f"{what} is {len(encoded[longest])} tokens long, more than the model's context of {limit} tokens; "
            "shorten the vignette or use a model with a longer context"
        )


def check_vocabulary(model, encoded: list[list[int]], answer_ids: list[int]) -> None:
    """Raise :class:`PromptError` before any forward call when the prompts or the answers use token ids the model has
    no embedding or output row for: a tokenizer from another model (it would end in an ``IndexError`` deep in the
    embedding, after every strategy had been tried)."""
    base = unwrap_model(model)
    modules = [getattr(base, name, lambda: None)() for name in ("get_input_embeddings", "get_output_embeddings")]
    rows = [m.weight.shape[0] for m in modules
            if m is not None and getattr(m, "weight", None) is not None and m.weight.dim() == 2]
    if not rows or not encoded:
        return
    largest = max(max((max(e) for e in encoded if e), default=-1), max(answer_ids, default=-1))
    if largest >= min(rows):
        raise PromptError(f"the tokenizer gives token ids up to {largest}, but {class_name(model)} has only "
                          f"{min(rows)} embedding rows: the tokenizer is another model's; load the model's own "
                          f"(AutoTokenizer.from_pretrained on the model's folder or id)")


def forward_signature(model, ignore: Collection[int] = ()) -> tuple:
    """What ``model``'s forward computes apart from its weights' values and dtypes: two signatures are equal exactly
    when none of it changed. Per module: its name, the module itself (weakly held), its class, its hook ids (torch
    numbers each handle anew), a ``forward`` set on the instance and its peft adapters' state; then the global hooks,
    the attention implementation and the device. ``ignore``: hook ids to leave out (the probe's own)."""
    from torch.nn.modules import module as torch_module

    skip = set(ignore)
    modules = tuple((name, held_ref(m), type(m), _hook_ids(m._forward_pre_hooks, skip),
                     _hook_ids(m._forward_hooks, skip), held_ref(m.__dict__.get("forward")), _adapter_state(m))
                    for name, m in model.named_modules())
    global_hooks = tuple(_hook_ids(getattr(torch_module, name, {}), skip)
                         for name in ("_global_forward_pre_hooks", "_global_forward_hooks"))
    attention = getattr(model_config(model), "_attn_implementation", None)
    return modules, global_hooks, attention, str(model_device(model))


def held_ref(obj):
    """``obj`` held weakly (equal while both live and are the same object), or its id where it cannot be; None stays
    None."""
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return ("id", id(obj))


def _hook_ids(hooks: dict, skip: set[int]) -> tuple[int, ...]:
    return tuple(k for k in hooks if k not in skip)


def _adapter_state(module) -> tuple | None:
    """A peft model's or tuner layer's active adapters, whether they are disabled, which are merged (None: not peft)."""
    if not hasattr(type(module), "active_adapters"):
        return None
    try:
        values = [getattr(module, name, None) for name in _ADAPTER_STATE]
    except Exception as e:  # noqa: BLE001 - an adapter state that cannot be read is read as "unknown", never a crash
        return ("unreadable", type(e).__name__)
    return tuple(tuple(v) if isinstance(v, (list, set)) else v for v in values)
