"""Checkpoints whose model is not one ``save_pretrained`` folder, read in this one process: FSDP's and torch
distributed checkpoints, DeepSpeed ZeRO, verl's rank shards, and weights without a config (docs/rl.md).

Every weight is checked to have come from the checkpoint (ties excepted); the model is returned in eval mode on the
device. Each loader is the one a :class:`~tinymcf_callback.rundir.checkpoints.Format` record names lazily:
``loader(checkpoint, base_model, *, dtype, device)``.
"""

from __future__ import annotations

import contextlib
import os
import warnings

from ..errors import LoadError
from ..extras import require
from ..loading import load_model, torch_dtype
from ..rundir.checkpoints import Checkpoint
from ..rundir.layouts import verl_shards


def load_full(checkpoint: Checkpoint, base_model: str | None, *, dtype: str, device: str):
    """A ``save_pretrained`` folder (or a Hub id, the starting model); weights without a config into the starting
    model's."""
    if checkpoint.needs_base:
        return load_without_config(checkpoint, base_model, dtype=dtype, device=device)
    return load_model(str(checkpoint.folder), device=device, dtype=dtype)


def load_adapter(checkpoint: Checkpoint, base_model: str | None, *, dtype: str, device: str):
    """The starting model with the checkpoint's PEFT adapter applied."""
    return load_model(base_model, device=device, dtype=dtype, adapter=checkpoint.folder)


def empty_model(config_source: str, dtype: str):
    """The causal LM of ``config_source``'s config, in ``dtype``, without spending time on random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        from transformers.modeling_utils import no_init_weights
    try:
        config = AutoConfig.from_pretrained(config_source)
    except (OSError, ValueError) as e:
        raise LoadError(f"cannot read the model config of {config_source}: {' '.join(str(e).split())}") from None
    dtype = torch_dtype(dtype)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=None if dtype == "auto" else dtype)
    model.tie_weights()  # an output layer tied to the embedding shares it from the start (a checkpoint may omit it)
    return model


def load_fsdp(checkpoint: Checkpoint, config_source: str, *, dtype: str, device: str):
    """The model of an FSDP ``SHARDED_STATE_DICT`` checkpoint (``pytorch_model_fsdp_0/``)."""
    folder = checkpoint.folder
    shards = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("pytorch_model_fsdp_"))[0]
    model = empty_model(config_source, dtype)
    stored = _dcp_names(shards)
    prefix = "model." if any(k.startswith("model.") for k in stored) else ""
    wanted = {k: v for k, v in model.state_dict().items() if f"{prefix}{k}" in stored}
    _check_all_there(model, set(wanted), f"{shards} (FSDP's sharded checkpoint)")
    _dcp_load({"model": wanted} if prefix else dict(wanted), shards)
    model.tie_weights()
    return model.eval().to(device)


def load_verl(checkpoint: Checkpoint, base_model: str | None, *, dtype: str, device: str):
    """The model of a verl FSDP actor folder: its rank shards merged (see the module) into the model of its
    ``huggingface/`` config (``checkpoint.config``)."""
    import torch

    actor, config_source = checkpoint.folder, str(checkpoint.config)
    shards = verl_shards(actor)
    with warnings.catch_warnings():  # "unpickling of DeviceMesh before the process groups were created": no group
        warnings.simplefilter("ignore")
        per_rank = [torch.load(path, map_location="cpu", weights_only=False) for path in shards.values()]
    merged = {name: merge_shards([state[name] for state in per_rank]) for name in per_rank[0]}
    del per_rank
    return _into_model(merged, config_source, dtype, device, f"{actor} (verl's FSDP rank shards)")


def merge_shards(values: list):
    """One weight from its rank shards: DTensor local shards concatenated along their ``Shard`` dimension (replicated
    ones taken once; on a hybrid-sharded mesh the shards of one replica), plain tensors taken once."""
    import torch

    first = values[0]
    if not hasattr(first, "placements"):  # a plain tensor, the same on every rank
        return first
    mesh = first.device_mesh
    placement = first.placements[-1]
    within = mesh.shape[-1]  # the ranks of one replica come first
    local = [v._local_tensor for v in values[:within]]
    if placement.is_shard():
        return torch.cat(local, dim=placement.dim)
    if placement.is_replicate():
        return local[0]
    raise LoadError(f"a verl shard's placement {placement} cannot be merged (only Shard and Replicate can)")


def load_dcp(checkpoint: Checkpoint, config_source: str, *, dtype: str, device: str):
    """The model of a torch distributed checkpoint of a whole model (NeMo-RL, torchtitan; see the module)."""
    folder = checkpoint.folder
    model = empty_model(config_source, dtype)
    own = model.state_dict()
    stored = _dcp_names(folder)
    prefix = "model." if stored and all(k.startswith("model.") for k in stored) and not set(own) & stored else ""
    names = {k: f"{prefix}{k}" for k in own if f"{prefix}{k}" in stored}
    rows = {}
    if len(names) < len([k for k in own if not _tied_to(model, k)]):  # not the model's own names: torchtitan's?
        names, rows = titan_names(model, stored)
    _check_all_there(model, set(names), f"{folder} (a torch distributed checkpoint)")
    _dcp_load({names[k]: own[k] for k in names}, folder)
    for name, heads in rows.items():  # Llama 3's interleaved query and key rows, in Hugging Face's order again
        own[name].copy_(rope_halves(own[name], heads))
    model.tie_weights()
    return model.eval().to(device)


def _dcp_names(folder) -> set[str]:
    """The names a torch distributed checkpoint in ``folder`` stores."""
    import torch.distributed.checkpoint as dcp

    return set(dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata)


def _dcp_load(state: dict, folder) -> None:
    """Read ``state``'s tensors in place from the torch distributed checkpoint in ``folder``, in this one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        dcp.load(state, checkpoint_id=str(folder), planner=DefaultLoadPlanner(allow_partial_load=True))


def load_without_config(checkpoint: Checkpoint, config_source: str, *, dtype: str, device: str):
    """Whole-model safetensors without a config (torchtitan's HF export), read into ``config_source``'s model."""
    from safetensors.torch import load_file

    folder = checkpoint.folder
    state = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(path)))
    return _into_model(state, config_source, dtype, device, f"{folder} (weights without a config)")


def _into_model(state: dict, config_source: str, dtype: str, device: str, what: str):
    model = empty_model(config_source, dtype)
    own = model.state_dict()
    _check_all_there(model, set(state) & set(own), what)
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items() if k in own}, strict=False)
    model.tie_weights()
    return model.eval().to(device)


# torchtitan's names of a Llama 3 or Qwen3 model's weights, from the Hugging Face ones (its state-dict adapters, read
# 2026-12; older ones named Qwen3's feed_forward ``mlp`` and its output ``output``, newer ones its q/k/v
# ``attention.qkv_linear.w*``: every spelling seen is accepted)
TITAN_NAMES = (
    (r"model\.embed_tokens\.weight", ("tok_embeddings.weight",)),
    (r"model\.norm\.weight", ("norm.weight",)),
    (r"lm_head\.weight", ("output.weight", "lm_head.weight")),
    (r"model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.weight",
     ("layers.{0}.attention.w{1}.weight", "layers.{0}.attention.qkv_linear.w{1}.weight")),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", ("layers.{0}.attention.wo.weight",)),
    (r"model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight", ("layers.{0}.attention.{1}_norm.weight",)),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", ("layers.{0}.feed_forward.w1.weight",
                                                        "layers.{0}.mlp.w1.weight")),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", ("layers.{0}.feed_forward.w3.weight", "layers.{0}.mlp.w3.weight")),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", ("layers.{0}.feed_forward.w2.weight",
                                                        "layers.{0}.mlp.w2.weight")),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", ("layers.{0}.attention_norm.weight",)),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", ("layers.{0}.ffn_norm.weight",)),
)
TITAN_FAMILIES = ("llama", "qwen3")


def titan_names(model, stored: set[str]) -> tuple[dict[str, str], dict[str, int]]:
    """The model's weight names -> the stored torchtitan names (a ``model.`` prefix allowed), and the weights whose
    rows are in Llama 3's interleaved rotary order (name -> its heads). :class:`LoadError` for a model torchtitan's
    names do not cover."""
    import re

    family = getattr(model.config, "model_type", "")
    if family not in TITAN_FAMILIES:
        raise LoadError(f"the checkpoint's weight names are not the model's own, and torchtitan's names are read for "
                        f"{' and '.join(TITAN_FAMILIES)} models only, not {family!r}: save it with torchtitan's "
                        "checkpoint.last_save_in_hf, or give the --base-model it was trained from")
    prefix = "model." if stored and all(k.startswith("model.") for k in stored) else ""
    heads = {"q": model.config.num_attention_heads,
             "k": getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads}
    names, rows = {}, {}
    for name in model.state_dict():
        for pattern, spellings in TITAN_NAMES:
            match = re.fullmatch(pattern, name)
            if match is None:
                continue
            found = next((f"{prefix}{s.format(*match.groups())}" for s in spellings
                          if f"{prefix}{s.format(*match.groups())}" in stored), None)
            if found is not None:
                names[name] = found
                if family == "llama" and match.groups()[1:] in (("q",), ("k",)) and "proj" in name:
                    rows[name] = heads[match.group(2)]
            break
    return names, rows


def rope_halves(weight, heads: int):
    """Query or key projection rows from the interleaved pairs of Llama 3's rotary embedding (torchtitan) to the
    halves of Hugging Face's: per head, row 2i goes to i and row 2i+1 to i + head_dim/2."""
    out_dim, in_dim = weight.shape
    head_dim = out_dim // heads
    return weight.reshape(heads, head_dim // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def load_zero(checkpoint: Checkpoint, base_model: str | None, *, dtype: str, device: str):
    """The model of a DeepSpeed ZeRO checkpoint, its float32 weights gathered by DeepSpeed's ``zero_to_fp32`` (its
    config the checkpoint's own, else the starting model's)."""
    folder = checkpoint.folder
    config_source = str(folder) if (folder / "config.json").exists() else base_model
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # reading a checkpoint needs no accelerator
    zero = require("deepspeed.utils.zero_to_fp32")
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        state = zero.get_fp32_state_dict_from_zero_checkpoint(str(folder))  # it prints a line and a bar per step
    return _into_model(state, config_source, dtype, device, f"{folder} (DeepSpeed ZeRO checkpoint)")


def _check_all_there(model, found: set[str], what: str) -> None:
    """Every weight of ``model`` was found in the checkpoint, but those tied to one that was (an output layer
    that shares the embedding)."""
    missing = {name for name in set(model.state_dict()) - found if not _tied_to(model, name, found)}
    if missing:
        shown = ", ".join(sorted(missing)[:5]) + (" ..." if len(missing) > 5 else "")
        raise LoadError(f"{what} does not hold {len(missing)} weight(s) of the model it should be ({shown}): the "
                        f"base model whose config built it is not the one this run trained (pass --base-model)")


def _tied_to(model, name: str, among: set[str] | None = None) -> bool:
    """Whether weight ``name`` shares its storage with another of ``among`` (default: with an earlier weight, as an
    output layer tied to the embedding does)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    if name not in params:
        return False
    ptr = params[name].data_ptr()
    if among is None:
        return next(k for k, v in params.items() if v.data_ptr() == ptr) != name
    return any(params[other].data_ptr() == ptr for other in among if other in params)
