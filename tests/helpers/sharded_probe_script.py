"""Run by test_sharding.py under torchrun (2 processes, gloo, CPU): the probe on models with sharded parameters.

``sharded_probe_script.py OUT WRAPPER`` with WRAPPER one of ``fsdp1`` (``FullyShardedDataParallel`` with
an auto-wrap policy: one shard unit per decoder layer), ``fsdp2`` (``fully_shard`` on each decoder
layer, then on the model) or ``zero3`` (a DeepSpeed ZeRO-3 engine). For one tiny random model of each
engine strategy (shared prefixes, full prompts, unpadded prompts), and a Llama with a steering hook at
the last position that the shared path gets wrong (its self-check falls back on every rank), every
rank scores the probe on the plain model alone, then on the sharded model through
``probe.score(model, ranks=Ranks.current())``, and writes
``<wrapper>_rank<r>.json``: both scores, the forward calls the sharded model received in the probe
(counted by a hook), the calls each rank's share needed before filling up, and what the rank held.

Every forward call of a sharded model gathers parameters from all ranks, so a rank making one call
more than the others waits for ever: the process group gets a short timeout, so a hang fails fast.
"""

import datetime
import json
import os
import sys
from pathlib import Path

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers as T  # noqa: E402

from tinymcf_callback import testing as offline_assets  # noqa: E402
from tinymcf_callback.probe import Probe  # noqa: E402
from tinymcf_callback.scoring import selfcheck  # noqa: E402
from tinymcf_callback.scoring.ranks import Ranks  # noqa: E402

out, wrapper = Path(sys.argv[1]), sys.argv[2]
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("PROBE_PG_TIMEOUT", "60")))
VOCAB, INIT = 151936, 0.125


def decoder(**extra):
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, initializer_range=INIT, **extra)


def steered_llama():
    """A Llama with a steering hook that adds to the last position only: wrong on the shared path, by no rule."""
    model = T.LlamaForCausalLM(T.LlamaConfig(**decoder()))
    direction = torch.randn(model.config.hidden_size)

    def add_at_last_position(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden[:, -1] += 4.0 * direction
        return output

    model.model.layers[0].register_forward_hook(add_at_last_position)
    return model


# name: (factory, the decoder-layer class to shard by, limit, token_budget): a limit and budget that split the
# batches unevenly between the two ranks (an odd number of batches; on the unpadded path, unequal forward calls)
MODELS = {
    "shared": (lambda: T.LlamaForCausalLM(T.LlamaConfig(**decoder())), "LlamaDecoderLayer", 3, 600),
    "full": (lambda: T.MistralForCausalLM(T.MistralConfig(sliding_window=32, **decoder())), "MistralDecoderLayer",
             3, 600),
    "unpadded": (lambda: T.BartForCausalLM(T.BartConfig(
        vocab_size=VOCAB, d_model=64, decoder_layers=2, encoder_layers=2, decoder_attention_heads=4,
        decoder_ffn_dim=128, max_position_embeddings=512, init_std=INIT)), "BartDecoderLayer", 4, 600),
    "steered": (steered_llama, "LlamaDecoderLayer", 3, 600),  # the self-check's fallback, taken by all ranks at once
}


def build(factory):
    torch.manual_seed(0)  # the same weights on every rank and for the plain copy
    return factory().eval()


def _local(p):
    """The part of a parameter this rank holds: an FSDP2 DTensor's local shard, a ZeRO-3 partition, or itself."""
    if hasattr(p, "to_local"):
        return p.to_local()
    return getattr(p, "ds_tensor", p)


def layers_of(model, class_name):
    return [m for m in model.modules() if type(m).__name__ == class_name]


def shard(model, class_name):
    if wrapper == "fsdp1":
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        layer_class = type(layers_of(model, class_name)[0])
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_class})
        return FullyShardedDataParallel(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy.FULL_SHARD,
                                        use_orig_params=True, device_id=torch.device("cpu"))
    if wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in layers_of(model, class_name):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if wrapper == "zero3":
        import deepspeed

        config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "bf16": {"enabled": False}}
        engine, *_ = deepspeed.initialize(model=model, config=config)
        return engine
    raise SystemExit(f"unknown wrapper {wrapper!r}")


def main():
    if wrapper == "zero3":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo", timeout=TIMEOUT)
    else:
        dist.init_process_group("gloo", timeout=TIMEOUT)
    rank = dist.get_rank()
    tok = T.AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
    planned = []  # the calls each share needed, per probe, as the ranks counted them before the first call
    real_run_batches = selfcheck.run_batches

    def counting_run_batches(model, encoded, batches, tok, **kwargs):
        strategy = selfcheck.make_strategy(kwargs["strategy"], model, encoded, 0, torch.device("cpu"),
                                           kwargs.get("prefix_plan"))
        planned.append({"strategy": kwargs["strategy"], "share_calls": strategy.planned_calls(batches),
                        "calls": kwargs.get("calls"), "n_batches": len(batches)})
        return real_run_batches(model, encoded, batches, tok, **kwargs)

    selfcheck.run_batches = counting_run_batches
    results = {}
    for name, (factory, layer_class, limit, budget) in MODELS.items():
        probe = Probe(tok, "scifi", limit=limit, token_budget=budget)
        plain = probe.score(build(factory))
        model = build(factory)
        total = sum(p.numel() for p in model.parameters())
        sharded = shard(model, layer_class)
        held = sum(_local(p).numel() for p in sharded.parameters())
        seen = []
        handle = sharded.register_forward_pre_hook(lambda *_, seen=seen: seen.append(1))
        planned.clear()
        res = probe.score(sharded, ranks=Ranks.current())
        handle.remove()
        results[name] = {
            "plain": plain.p_yes.tolist(), "plain_strategy": plain.strategy, "sharded": res.p_yes.tolist(),
            "plain_mass": plain.yn_mass.tolist(), "sharded_mass": res.yn_mass.tolist(),
            "strategy": res.strategy, "check": res.check, "forward_calls": len(seen), "planned": list(planned),
            "n_batches": len(probe.batches), "held": held, "total": total, "wrapper": type(sharded).__name__,
        }
    (out / f"{wrapper}_rank{rank}.json").write_text(json.dumps({"world": dist.get_world_size(), "models": results}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
