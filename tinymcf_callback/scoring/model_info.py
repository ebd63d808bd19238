"""What the engine needs to know about a model before running it: the model inside its wrappers
(:func:`unwrap_model`), whether it is a causal LM with its head (:func:`check_causal_lm`), which forward arguments it
takes (:class:`ForwardArgs`), its dtype, pad token, memory cost per token and its device's free memory, what left
padding or padding inside a shared-prefix cache would do to its scores (:func:`padding_problem`,
:func:`shared_prefix_blocker`), and what its forward computes apart from its weights' values
(:func:`forward_signature`), so a probe sees that it changed. It reads classes, configs and the device's allocator
only; nothing here runs the model.
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
    """Is a PEFT prompt-learning adapter (prompt, prefix or p-tuning) active on ``model``?

    Such an adapter adds virtual tokens or its own key/value prefix inside its forward: the
    engine must neither pass a cache (it would replace the adapter's prefix) nor pad (the
    padding would sit between the virtual tokens and the prompt).
    """
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
    """Raise :class:`UnsupportedModelError` for models the probe would score wrongly or crash on.

    Refused before any forward call: encoder-decoder models (T5, BART), masked language
    models (``BertForMaskedLM``), BERT-style LM heads left bidirectional (``is_decoder=False``),
    and base models without an LM head (``LlamaModel``). Decoder-only models with an LM head
    pass, custom (remote-code) ones included; a module that is not a transformers model is
    given the benefit of the doubt (its output must still carry ``.logits``).
    """
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
    """Which optional arguments the model's forward takes (read through any wrappers).

    ``position_base``: the position of a prompt's first token. 0 for almost every model;
    RoBERTa-style embeddings count positions from ``padding_idx + 1`` (:func:`position_base`),
    so position ids the engine passes must start there too.
    """

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
    """Where the model's own position ids start: ``padding_idx + 1`` for RoBERTa-style embeddings, else 0.

    RoBERTa, XLM-R, CamemBERT, Data2VecText, RoBERTa-PreLN, XLM-R XL and X-MOD make their positions
    from the input ids (``create_position_ids_from_input_ids``): pad tokens get ``padding_idx`` and
    real tokens count up from ``padding_idx + 1``. Position ids counted from 0 would shift every
    token's position embedding by ``padding_idx + 1`` (P(Yes) off by up to 0.42 on tiny random models).
    """
    for module in unwrap_model(model).modules():
        padding_idx = getattr(module, "padding_idx", None)
        if callable(getattr(module, "create_position_ids_from_input_ids", None)) and isinstance(padding_idx, int):
            return padding_idx + 1
    return 0


def pad_token_id(model, tok) -> int:
    """A token id to fill padded slots with: the tokenizer's pad token when the model's vocabulary has it.

    Padded slots are masked, so any id the embedding table holds will do; a pad token added to the
    tokenizer without resizing the model (``add_special_tokens({"pad_token": "[PAD]"})``) lies
    outside the table and would raise ``IndexError`` in the embedding lookup. Falls back to the
    model's own pad token, then the tokenizer's end-of-sequence token, then 0.
    """
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
    config; None when the config does not say (no hidden size, layers or heads).

    A token: its keys and values in every layer (the cache a batch holds while its questions run) and one layer's
    working tensors at once (hidden states, queries, keys and values with the copies grouped-query attention makes
    for its heads, the MLP's, and the norms' float32 copies). A row: the answer position's logits and their float32
    copies. An estimate that errs large; the rule that uses it (:func:`~.batching.batch_size_for`) takes a share of
    the free memory only, and a batch that does not fit is halved anyway.
    """
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
    """The model's config, its text decoder's config (multimodal models) and each per-layer config.

    transformers 5 lets a config vary by layer (``per_layer_config``); reading such an attribute from
    the global config raises, so the per-layer configs are read instead.
    """
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
    """Why left padding would change this model's scores, or None when it is harmless.

    With ``position_ids`` that skip the padding, padding at the far left of a row is
    harmless (measured on every architecture in ``tests/test_architectures.py``, sliding
    windows included). Without them, only models whose positions cannot move are safe.
    """
    if prompt_learning(model):
        return "its PEFT prompt-learning adapter puts virtual tokens ahead of any padding"
    if args.position_ids:
        return None
    if any(_read(c, "model_type") in PADDING_PROOF_WITHOUT_POSITIONS for c in _configs(model)):
        return None
    return "its forward takes no position_ids, so left padding would move its positions"


def attention_windows(model) -> dict[str, int] | str:
    """Every attention window the config sets (sliding, chunked, local), or why it cannot tell.

    Conservative on purpose: a window counts even where only some layers use it, and a
    ``sliding_window`` is ignored only when ``use_sliding_window`` is explicitly False.
    """
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
    """Why the shared-prefix path would not give each prompt's own score on this model, or None.

    The shared path leaves each batch's padding *inside* the cache (between the shared
    header and each scenario, and between scenario and question), ``cache_slots`` slots
    at most. Full attention ignores padded slots; a window counted in cache slots
    (transformers counts sliding, chunked and local windows that way) does not, nor does
    a recurrent or convolutional state. So every layer must be attention, and every
    window longer than ``cache_slots``.
    """
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
    """Raise :class:`PromptError` naming the longest prompt when it exceeds the model's context.

    Models whose positions start at ``padding_idx + 1`` (RoBERTa style) have that many
    fewer positions for the prompt.
    """
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
    """What ``model``'s forward computes apart from its weights' values: two signatures are equal (``==``) exactly
    when none of it changed between them.

    Per module (``named_modules``): its name; the module object itself, held by a weak reference (a module swapped
    for another differs, even one of the same class at the same address); its class; the ids of its forward
    pre-hooks and forward hooks, with-kwargs and always-called ones among them (torch numbers every hook's handle
    with a process-wide increasing id, so a hook replaced by another differs, even by the same function
    registered again); a ``forward`` set on the instance (accelerate's hooks, a patched forward, a wrapper's); a
    peft tuner layer's active, disabled and merged adapters. Then the process's global forward hooks, the
    attention implementation in the config, and the device. ``ignore``: hook ids to leave out (the probe's own,
    registered while it scores). Weights changed in place (a training step, ``load_state_dict``, a LoRA scale) leave
    it as it was, and so do the parameters' dtypes (FSDP2 leaves its root's parameters gathered in the forward's
    dtype after a forward call): the self-check's rotation follows those (a new precision starts a new cycle of
    its checks).
    """
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
    """``obj`` as a signature (or :class:`~.engine.LogOnce`) holds it: a weak reference (equal while both live and are
    the same object; never equal to one whose object died), or its id where it cannot be weakly referenced; None
    stays None."""
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
