"""Run folders laid out as five training libraries' own save code lays them out, from a small HF causal LM.

Each ``*_save`` function builds one step's save inside ``run`` and returns the folder that holds the
model of that step, so that a test can point a follower at ``run`` and check it finds and reads it:

- ``verl_save``: verl's FSDP checkpoint manager. ``global_step_{N}/actor/`` holds one
  ``model_world_size_{W}_rank_{R}.pt`` per rank, each the ``torch.save`` of an FSDP1 model's
  ``SHARDED_STATE_DICT`` (DTensor values, ``Shard(0)`` on a 1-D mesh named ``fsdp``), written for real by
  ``W`` CPU processes over gloo; beside them ``optim_*``/``extra_state_*`` per rank, ``fsdp_config.json`` and
  ``huggingface/`` (config and tokenizer; the weights too with ``hf_weights=True``). The trainer's
  ``latest_checkpointed_iteration.txt`` comes last.
- ``openrlhf_save``: OpenRLHF with ``--save_hf_ckpt``: the DeepSpeed state under ``_actor/`` first, then
  ``global_step{N}_hf/`` (weights, then tokenizer).
- ``nemo_rl_save``: NeMo-RL's checkpoint manager with the DTensor policy: everything is written under
  ``tmp_step_{N}/`` (torch distributed checkpoints under ``policy/weights`` and ``policy/optimizer``) and the
  folder is renamed to ``step_{N}`` at the end (``nemo_rl_unfinished`` stops before the rename).
- ``torchtitan_save``: torchtitan's last-step, weights-only checkpoint: one torch distributed checkpoint at
  ``step-{N}/`` under torchtitan's own parameter names (``TORCHTITAN_NAMES``); ``torchtitan_hf_export`` is the
  ``last_save_in_hf`` alternative (safetensors shards and their index, no config, no tokenizer).
- ``plain_save``: a plain accelerate/PyTorch loop's ``save_pretrained`` of model and tokenizer.

Run as a module (``python -m helpers.rl_folders verl-rank MODEL_DIR ACTOR_DIR``, with ``tests/`` on ``PYTHONPATH``
and the ``torchrun`` environment variables) this file is one rank of ``verl_save``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# --------------------------------------------------------------------------------------------------- verl

_TESTS = Path(__file__).resolve().parents[1]  # what its ranks import the helpers from (the package: its parent)
_PG_TIMEOUT_S = 60  # a rank that waits this long on the others fails instead of hanging
_RANKS_TIMEOUT_S = 300  # all ranks together


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def verl_save(run: Path, step: int, model, tok, *, world_size: int = 2, hf_weights: bool = False,
              tracker: bool = True) -> Path:
    """``run/global_step_{step}/actor/`` as verl's FSDP checkpoint manager writes it from ``world_size`` ranks."""
    run = Path(run)
    actor = run / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="verl-ranks-") as tmp:
        weights = Path(tmp) / "model"
        model.save_pretrained(weights)  # every rank loads these same weights
        _run_ranks(world_size, ["verl-rank", str(weights), str(actor)], Path(tmp))
    hf = actor / "huggingface"  # rank 0, after the shards
    model.config.save_pretrained(hf)
    tok.save_pretrained(hf)
    if hf_weights:  # save_contents with "hf_model": the gathered full weights
        model.save_pretrained(hf)
    if tracker:  # the trainer's, once the checkpoint manager is done
        (run / "latest_checkpointed_iteration.txt").write_text(str(step))
    return actor


def _run_ranks(world_size: int, args: list[str], logs: Path) -> None:
    """``world_size`` processes of this file as ``torchrun`` would start them (env:// rendezvous on a free port)."""
    port = str(_free_port())
    procs = []
    try:
        for rank in range(world_size):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0")
            env.setdefault("OMP_NUM_THREADS", "1")
            env.setdefault("HF_HUB_OFFLINE", "1")
            env["PYTHONPATH"] = os.pathsep.join([str(_TESTS), str(_TESTS.parent), env.get("PYTHONPATH", "")])
            log = open(logs / f"rank{rank}.log", "wb")  # noqa: SIM115 -- closed below, once the rank is done
            procs.append((subprocess.Popen([sys.executable, "-m", "helpers.rl_folders", *args], env=env,
                                           stdout=log, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + _RANKS_TIMEOUT_S
        while any(p.poll() is None for p, _ in procs):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p, _ in procs):
                break
            time.sleep(0.1)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    failed = [r for r, (p, _) in enumerate(procs) if p.returncode != 0]
    if failed:
        tails = "\n".join(f"--- rank {r} (exit {procs[r][0].returncode}):\n"
                          + (logs / f"rank{r}.log").read_text(errors="replace")[-3000:] for r in failed)
        raise RuntimeError(f"verl ranks failed:\n{tails}")


def _verl_rank(weights: str, actor: str) -> None:
    """One rank: the same weights, FSDP1 over a 1-D ``fsdp`` mesh, its sharded state dict ``torch.save``'d."""
    import functools
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardedStateDictConfig, ShardingStrategy, StateDictType
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import AutoModelForCausalLM

    dist.init_process_group("gloo", timeout=timedelta(seconds=_PG_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
    # verl wraps each decoder layer (the model's _no_split_modules) in its own FSDP unit
    layers = {type(m) for m in model.modules() if type(m).__name__ in set(model._no_split_modules or ())}
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layers) if layers else None
    fsdp = FSDP(model, device_mesh=mesh, use_orig_params=True, sharding_strategy=ShardingStrategy.FULL_SHARD,
                device_id=torch.device("cpu"), auto_wrap_policy=policy)  # None: "FSDP needs a non-CPU accelerator"
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=True)):
        state = fsdp.state_dict()
    out = Path(actor)
    torch.save(state, out / f"model_world_size_{world}_rank_{rank}.pt")
    torch.save({"state": {}, "param_groups": [{"lr": 1e-6, "params": []}]},
               out / f"optim_world_size_{world}_rank_{rank}.pt")
    torch.save({"lr_scheduler": None, "rng": None}, out / f"extra_state_world_size_{world}_rank_{rank}.pt")
    dist.barrier()
    if rank == 0:
        (out / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": world}, indent=4))
    dist.barrier()  # leave together: a rank that exits while gloo still talks can abort
    dist.destroy_process_group()


def verl_merge_reference(actor: Path) -> dict[str, torch.Tensor]:
    """The full tensors of a verl actor folder, merged independently of the code under test (checks only)."""
    actor = Path(actor)
    world = json.loads((actor / "fsdp_config.json").read_text())["world_size"]
    ranks = [torch.load(actor / f"model_world_size_{world}_rank_{r}.pt", map_location="cpu", weights_only=False)
             for r in range(world)]
    merged = {}
    for key, first in ranks[0].items():
        if hasattr(first, "_local_tensor"):  # DTensor
            dim = first.placements[0].dim
            merged[key] = torch.cat([ranks[r][key]._local_tensor for r in range(world)], dim=dim)
        elif hasattr(first, "local_shards"):  # ShardedTensor (FSDP without a device mesh)
            merged[key] = torch.cat([ranks[r][key].local_shards()[0].tensor for r in range(world)], dim=0)
        else:
            for r in range(1, world):
                if not torch.equal(ranks[r][key], first):
                    raise ValueError(f"{key}: a plain tensor that differs between ranks 0 and {r}")
            merged[key] = first
    return merged


# ----------------------------------------------------------------------------------------------- OpenRLHF

def openrlhf_save(run: Path, step: int, model, tok) -> Path:
    """OpenRLHF ``--save_hf_ckpt``: DeepSpeed state in ``_actor/`` first, then ``global_step{step}_hf/``."""
    run = Path(run)
    tag = f"global_step{step}"
    state = run / "_actor" / tag
    state.mkdir(parents=True, exist_ok=True)
    torch.save({"module": {}, "global_steps": step}, state / "mp_rank_00_model_states.pt")
    (run / "_actor" / "latest").write_text(tag)
    hf = run / f"{tag}_hf"
    model.save_pretrained(hf)
    tok.save_pretrained(hf)
    return hf


# ------------------------------------------------------------------------------------------------ NeMo-RL

def nemo_rl_unfinished(run: Path, step: int, model, tok) -> Path:
    """NeMo-RL's checkpoint of ``step`` written but not yet renamed: ``run/tmp_step_{step}``."""
    import torch.distributed.checkpoint as dcp

    tmp = Path(run) / f"tmp_step_{step}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "training_info.json").write_text(json.dumps({"step": step}))
    (tmp / "config.yaml").write_text("policy:\n  model_name: tiny-test-model\ncheckpointing:\n  enabled: true\n")
    policy = tmp / "policy"
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(policy / "weights"))
    dcp.save({"optim": {"state": {"step": torch.tensor(float(step))}, "param_groups": [{"lr": 1e-6}]}},
             checkpoint_id=str(policy / "optimizer"))
    tok.save_pretrained(policy / "tokenizer")
    torch.save({}, tmp / "train_dataloader.pt")
    return tmp


def nemo_rl_save(run: Path, step: int, model, tok) -> Path:
    """NeMo-RL's finished checkpoint: ``tmp_step_{step}`` written in full, then renamed ``step_{step}``."""
    tmp = nemo_rl_unfinished(run, step, model, tok)
    final = Path(run) / f"step_{step}"
    os.rename(tmp, final)
    return final


# --------------------------------------------------------------------------------------------- torchtitan

# HF name -> torchtitan name; "{}" is the layer number. lm_head is per family (TORCHTITAN_OUTPUT).
TORCHTITAN_NAMES = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attention.q_norm.weight",  # qwen3 only
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attention.k_norm.weight",  # qwen3 only
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
}
TORCHTITAN_OUTPUT = {"llama": "output.weight", "qwen3": "lm_head.weight"}
_LAYER = re.compile(r"\.(\d+)\.")


def _heads(config) -> tuple[int, int, int]:
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return n_heads, n_kv, head_dim


def _rope_rows(w: torch.Tensor, n_heads: int, head_dim: int, *, to_titan: bool) -> torch.Tensor:
    """HF's rotate-halves row order <-> Llama 3's interleaved pairs (torchtitan), per head."""
    dim = w.shape[-1]
    if to_titan:
        return w.view(n_heads, 2, head_dim // 2, dim).transpose(1, 2).reshape(n_heads * head_dim, dim).contiguous()
    return w.view(n_heads, head_dim // 2, 2, dim).transpose(1, 2).reshape(n_heads * head_dim, dim).contiguous()


def torchtitan_state_dict(model, *, family: str) -> dict[str, torch.Tensor]:
    """The model's weights under torchtitan's names (float32; a tied lm_head dropped; llama's wq/wk permuted)."""
    if family not in TORCHTITAN_OUTPUT:
        raise ValueError(f"family must be one of {sorted(TORCHTITAN_OUTPUT)}, not {family!r}")
    config = model.config
    tied = bool(getattr(config, "tie_word_embeddings", False))
    n_heads, n_kv, head_dim = _heads(config)
    out = {}
    for key, value in model.state_dict().items():
        value = value.detach().to(torch.float32)
        if key == "lm_head.weight":
            if not tied:
                out[TORCHTITAN_OUTPUT[family]] = value.clone()
            continue
        layer = _LAYER.search(key)
        abstract = _LAYER.sub(".{}.", key, count=1) if layer else key
        if abstract not in TORCHTITAN_NAMES:
            raise KeyError(f"no torchtitan name for {key}")
        name = TORCHTITAN_NAMES[abstract].format(layer.group(1) if layer else "")
        if family == "llama" and abstract.endswith("q_proj.weight"):
            value = _rope_rows(value, n_heads, head_dim, to_titan=True)
        elif family == "llama" and abstract.endswith("k_proj.weight"):
            value = _rope_rows(value, n_kv, head_dim, to_titan=True)
        out[name] = value.clone().contiguous()
    return out


def torchtitan_to_hf(state: dict[str, torch.Tensor], config, *, family: str) -> dict[str, torch.Tensor]:
    """The inverse of ``torchtitan_state_dict`` (a tied lm_head comes back as the embedding)."""
    back = {v: k for k, v in TORCHTITAN_NAMES.items()}
    n_heads, n_kv, head_dim = _heads(config)
    out = {}
    for name, value in state.items():
        if name == TORCHTITAN_OUTPUT[family]:
            out["lm_head.weight"] = value
            continue
        layer = _LAYER.search(name)
        abstract = _LAYER.sub(".{}.", name, count=1) if layer else name
        key = back[abstract].format(layer.group(1) if layer else "")
        if family == "llama" and abstract.endswith("attention.wq.weight"):
            value = _rope_rows(value, n_heads, head_dim, to_titan=False)
        elif family == "llama" and abstract.endswith("attention.wk.weight"):
            value = _rope_rows(value, n_kv, head_dim, to_titan=False)
        out[key] = value
    if getattr(config, "tie_word_embeddings", False):
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def torchtitan_save(run: Path, step: int, model, *, family: str) -> Path:
    """torchtitan's last-step weights-only checkpoint: a torch distributed checkpoint at ``run/step-{step}``."""
    import torch.distributed.checkpoint as dcp

    folder = Path(run) / f"step-{step}"
    dcp.save(torchtitan_state_dict(model, family=family), checkpoint_id=str(folder))
    return folder


def torchtitan_hf_export(run: Path, step: int, model) -> Path:
    """torchtitan's ``last_save_in_hf``: ``run/step-{step}/`` with safetensors shards and their index only."""
    folder = Path(run) / f"step-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="titan-hf-") as tmp:
        model.save_pretrained(tmp, max_shard_size="1MB")
        files = sorted(Path(tmp).glob("*.safetensors"))
        index = Path(tmp) / "model.safetensors.index.json"
        if len(files) < 2 or not index.exists():
            raise RuntimeError(f"expected safetensors shards and an index, got {sorted(os.listdir(tmp))}")
        for f in files:
            shutil.copy2(f, folder / f.name)
        shutil.copy2(index, folder / index.name)  # the index last: it names the shards
    return folder


# ----------------------------------------------------------------------------------------------- plain loop

def plain_save(run: Path, step: int, model, tok, *, name: str = "step_{step}", shards: bool = False) -> Path:
    """A plain accelerate/PyTorch loop's ``save_pretrained`` (``shards=True``: 2+ shards and an index)."""
    folder = Path(run) / name.format(step=step)
    if shards:
        model.save_pretrained(folder, max_shard_size="1MB")
        if not (folder / "model.safetensors.index.json").exists():
            raise RuntimeError(f"save_pretrained wrote no index in {folder}: {sorted(os.listdir(folder))}")
    else:
        model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


if __name__ == "__main__" and sys.argv[1:2] == ["verl-rank"]:
    _verl_rank(*sys.argv[2:4])
