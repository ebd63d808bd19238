"""Checkpoints whose model is sharded across files of the training's ranks, read through the libraries that own them.

- **FSDP** with ``SHARDED_STATE_DICT`` (``checkpoint-<step>/pytorch_model_fsdp_0/``): a torch distributed
  checkpoint (DCP) holding ``model.<name>`` entries, written by every rank. The Trainer saves no
  ``config.json`` beside it; the model is built from the run's starting model's config and the shards are
  read into it by ``torch.distributed.checkpoint.load`` in this one process (no process group needed).
- **DeepSpeed ZeRO** (``checkpoint-<step>/global_step<N>/``): with ZeRO-3 (and ZeRO-1/2) the float32 weights
  live in the optimizer states of each rank; DeepSpeed's own ``zero_to_fp32`` utilities gather them
  (:func:`deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`, the ``[deepspeed]`` extra).

Either way the model is built in the run's dtype, every weight is checked to have come from the checkpoint
(ties to another weight excepted), and the model is returned in eval mode on the device.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

from ..errors import LoadError
from ..extras import require
from ..loading import torch_dtype


def empty_model(config_source: str, dtype: str):
    """The causal LM of ``config_source``'s config, in ``dtype``, without spending time on random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(config_source)
    except (OSError, ValueError) as e:
        raise LoadError(f"cannot read the model config of {config_source}: {' '.join(str(e).split())}") from None
    dtype = torch_dtype(dtype)
    with _no_init():
        return AutoModelForCausalLM.from_config(config, dtype=None if dtype == "auto" else dtype)


@contextlib.contextmanager
def _no_init():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        from transformers.modeling_utils import no_init_weights
    with no_init_weights():
        yield


def load_fsdp(folder: Path, config_source: str, *, dtype: str, device: str):
    """The model of an FSDP ``SHARDED_STATE_DICT`` checkpoint (``pytorch_model_fsdp_0/``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    shards = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("pytorch_model_fsdp_"))[0]
    model = empty_model(config_source, dtype)
    state = model.state_dict()
    stored = set(dcp.FileSystemReader(str(shards)).read_metadata().state_dict_metadata)
    prefix = "model." if any(k.startswith("model.") for k in stored) else ""
    wanted = {k: v for k, v in state.items() if f"{prefix}{k}" in stored}
    _check_all_there(model, set(wanted), f"{shards} (FSDP's sharded checkpoint)")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        dcp.load({"model": wanted} if prefix else dict(wanted), checkpoint_id=str(shards),
                 planner=DefaultLoadPlanner(allow_partial_load=True))
    model.tie_weights()
    return model.eval().to(device)


def load_zero(folder: Path, config_source: str, *, dtype: str, device: str):
    """The model of a DeepSpeed ZeRO checkpoint, its float32 weights gathered by DeepSpeed's ``zero_to_fp32``."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # reading a checkpoint needs no accelerator
    zero = require("deepspeed.utils.zero_to_fp32")
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        state = zero.get_fp32_state_dict_from_zero_checkpoint(str(folder))  # it prints a line and a bar per step
    model = empty_model(config_source, dtype)
    own = model.state_dict()
    _check_all_there(model, set(state) & set(own), f"{folder} (DeepSpeed ZeRO checkpoint)")
    target = own[next(iter(own))].dtype
    model.load_state_dict({k: v.to(own[k].dtype if k in own else target) for k, v in state.items() if k in own},
                          strict=False)
    model.tie_weights()
    del state
    return model.eval().to(device)


def _check_all_there(model, found: set[str], what: str) -> None:
    """Every weight of ``model`` was found in the checkpoint, but those tied to one that was (an output layer
    that shares the embedding)."""
    missing = set(model.state_dict()) - found
    tied = {name for name in missing if _tied_to_found(model, name, found)}
    missing -= tied
    if missing:
        shown = ", ".join(sorted(missing)[:5]) + (" ..." if len(missing) > 5 else "")
        raise LoadError(f"{what} does not hold {len(missing)} weight(s) of the model it should be ({shown}): the "
                        f"base model whose config built it is not the one this run trained (pass --base-model)")


def _tied_to_found(model, name: str, found: set[str]) -> bool:
    params = dict(model.named_parameters(remove_duplicate=False))
    if name not in params:
        return False
    ptr = params[name].data_ptr()
    return any(params[other].data_ptr() == ptr for other in found if other in params)
