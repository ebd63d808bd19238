"""Run by test_fsdp.py under torchrun (2 processes, gloo, CPU): the probe on torch FSDP models.

A tiny GPT-2 (learned absolute positions, so a missing ``position_ids`` under left padding
would show) is scored unwrapped, then wrapped in FSDP v1 ``FullyShardedDataParallel``
(FULL_SHARD, ``use_orig_params=True``) and scored through the wrapper on every rank; a
second copy is sharded with FSDP v2 ``fully_shard`` and scored the same way. Each rank
writes ``fsdp_rank<r>.json`` with the scores, forward-call counts, the logits' sequence
lengths seen at the LM head and how many parameters the rank held.
"""

import json
import sys
from pathlib import Path

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy, fully_shard  # noqa: E402
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel  # noqa: E402

from tinymcf_callback import testing as offline_assets  # noqa: E402
from tinymcf_callback.probe import Probe  # noqa: E402

out = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
tok = AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())


def tiny_gpt2():
    torch.manual_seed(0)  # the same weights on every rank and for both copies
    return GPT2LMHeadModel(GPT2Config(vocab_size=151936, n_embd=64, n_layer=2, n_head=4, n_positions=512,
                                      initializer_range=0.125)).eval()


model = tiny_gpt2()
probe = Probe(tok, "scifi", limit=3, token_budget=600)
plain = probe.score(model)
total = sum(p.numel() for p in model.parameters())

seq_lens = []
model.lm_head.register_forward_hook(lambda m, i, o: seq_lens.append(o.shape[1]))
fsdp = FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                                device_id=torch.device("cpu"))
held = sum(p.numel() for p in fsdp.parameters())  # this rank's shard of the flat parameter
wrapped = probe.score(fsdp)

v2 = tiny_gpt2()
for block in v2.transformer.h:
    fully_shard(block, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
fully_shard(v2, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
v2_seq_lens = []
v2.lm_head.register_forward_hook(lambda m, i, o: v2_seq_lens.append(o.shape[1]))
v2_res = probe.score(v2)
(out / f"fsdp_rank{rank}.json").write_text(json.dumps({
    "world": dist.get_world_size(), "wrapper": type(fsdp).__name__, "n_batches": len(probe.batches),
    "plain": plain.p_yes.tolist(), "wrapped": wrapped.p_yes.tolist(), "plain_mass": plain.yn_mass.tolist(),
    "wrapped_mass": wrapped.yn_mass.tolist(), "n_forward": wrapped.n_forward, "plain_n_forward": plain.n_forward,
    "logits_seq_lens": sorted(set(seq_lens)), "held": held, "total": total,
    "v2_class": type(v2).__name__, "v2": v2_res.p_yes.tolist(), "v2_n_forward": v2_res.n_forward,
    "v2_logits_seq_lens": sorted(set(v2_seq_lens)),
}))
dist.barrier()
dist.destroy_process_group()
