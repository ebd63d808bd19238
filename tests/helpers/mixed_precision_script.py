"""Run by test_precision_wrappers.py under torchrun (2 processes, gloo, CPU): the probe under mixed-precision wrappers.

``mixed_precision_script.py OUT WRAPPER`` with WRAPPER one of ``fsdp2`` (``fully_shard`` per decoder layer and on
the model with ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``: float32 shards, bfloat16 forward), ``fsdp1``
(``FullyShardedDataParallel`` with ``MixedPrecision(param_dtype=torch.bfloat16)``, the Trainer's ``fsdp`` with
``bf16=True``), ``zero3`` and ``zero2`` (DeepSpeed with its ``bf16`` section: the engine holds the model in
bfloat16). For a clean tiny Llama and one with a steering hook at the last position (wrong on the shared path),
every rank writes ``<wrapper>_rank<r>.json``: the precision the probe recorded, the dtype the first matrix
product really saw (read by a hook of this script's own), the strategy and the self-check, and whether a second
probe of the same wrapped model saw its forward change (it must not: the wrappers' hooks are registered once).
"""

import datetime
import json
import sys
from pathlib import Path

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers as T  # noqa: E402

from helpers.defects import added_at_last_position  # noqa: E402
from tinymcf_callback import testing as offline_assets  # noqa: E402
from tinymcf_callback.probe import Probe  # noqa: E402
from tinymcf_callback.scoring.ranks import Ranks  # noqa: E402

out, wrapper = Path(sys.argv[1]), sys.argv[2]
TIMEOUT = datetime.timedelta(seconds=120)


def llama(steered: bool):
    torch.manual_seed(0)  # the same weights on every rank
    model = T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.125)).eval()
    if steered:
        added_at_last_position(model)
    return model


def wrap(model):
    layers = list(model.model.layers)
    if wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model
    if wrapper == "fsdp1":
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={type(layers[0])})
        return FullyShardedDataParallel(model, auto_wrap_policy=policy, use_orig_params=True,
                                        device_id=torch.device("cpu"),
                                        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": int(wrapper[-1])},
              "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
              "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def main():
    if wrapper.startswith("zero"):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo", timeout=TIMEOUT)
    else:
        dist.init_process_group("gloo", timeout=TIMEOUT)
    tok = T.AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
    probe = Probe(tok, "scifi", limit=3, token_budget=600)
    results = {}
    for name in ("clean", "steered"):
        model = wrap(llama(name == "steered"))
        first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        seen: list[str] = []
        handle = first.register_forward_pre_hook(
            lambda m, args, seen=seen: seen.append(str(m.weight.dtype).replace("torch.", "")) if not seen else None)
        res = probe.score(model, ranks=Ranks.current())
        changes = probe.memory.changes
        again = probe.score(model, ranks=Ranks.current())  # the same forward: the wrapper's hooks are not new ones
        handle.remove()
        results[name] = {"precision": res.precision, "seen": seen[0], "strategy": res.strategy, "check": res.check,
                         "wrapper": type(model).__name__, "changed_again": probe.memory.changes != changes,
                         "again": again.strategy}
    (out / f"{wrapper}_rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
