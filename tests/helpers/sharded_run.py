"""A real Trainer run that saves sharded checkpoints, on CPU under torchrun (2 processes, gloo).

``python -m torch.distributed.run --nproc_per_node 2 sharded_run.py OUT INIT {fsdp|zero3}``:

- ``fsdp``: FSDP2 with ``state_dict_type=SHARDED_STATE_DICT``: each checkpoint's model is
  ``pytorch_model_fsdp_0/`` (a torch distributed checkpoint written by both ranks) and nothing else
  names it (no ``config.json``, no ``model.safetensors``). accelerate turns FSDP on only for accelerator
  backends; the one line below lets its CPU processes take the FSDP branch, and everything after it is
  the Trainer's and torch's own code (gloo, ``fully_shard`` on CPU, DCP's writer).
- ``zero3``: DeepSpeed ZeRO-3 (``DS_ACCELERATOR=cpu``): each checkpoint's float32 weights are only in
  ``global_step<N>/*_optim_states.pt``; ``stage3_gather_16bit_weights_on_model_save`` is off, so no
  ``model.safetensors`` is written.

The callback hands every save off (``save_total_limit=1``: the queue must keep the shard folders).
"""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import AutoTokenizer  # noqa: E402

from helpers.runs import start_model, train_run  # noqa: E402
from tinymcf_callback import testing  # noqa: E402


def allow_fsdp_on_cpu() -> None:
    import accelerate.state as state

    original = state.AcceleratorState.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if kwargs.get("fsdp_plugin") is not None and self.distributed_type == state.DistributedType.MULTI_CPU:
            self.distributed_type, self.fsdp_plugin = state.DistributedType.FSDP, kwargs["fsdp_plugin"]

    state.AcceleratorState.__init__ = init


def processes_known_on_cpu() -> None:
    """accelerate sees one process per rank on a machine without an accelerator unless told ``cpu``, which turns
    DeepSpeed off; here it is told the processes are several CPU ones (gloo), as on GPUs it would find them, so
    that only rank 0 is the Trainer's main process (DeepSpeed runs in the group it finds)."""
    import os

    import accelerate.state as state

    original = state.PartialState._prepare_backend

    def prepare(self, cpu=False, sagemaker_dp=False, backend=None):
        found_backend, found_type = original(self, cpu, sagemaker_dp, backend)
        if found_type == state.DistributedType.NO and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return "gloo", state.DistributedType.MULTI_CPU
        return found_backend, found_type

    state.PartialState._prepare_backend = prepare


def main(out: str, init: str, kind: str) -> None:
    tok = AutoTokenizer.from_pretrained(testing.qwen3_tokenizer_dir())
    start_model(Path(init), tok)
    if kind == "fsdp":
        allow_fsdp_on_cpu()
        kw = {"use_cpu": True, "fsdp": True, "fsdp_config": {
            "version": 2, "state_dict_type": "SHARDED_STATE_DICT",
            "transformer_layer_cls_to_wrap": ["Qwen3DecoderLayer"], "sync_module_states": False,
            "cpu_ram_efficient_loading": False}}
    else:
        processes_known_on_cpu()
        kw = {"use_cpu": False, "deepspeed": {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2,
                                              "gradient_accumulation_steps": 1}}
    train_run(Path(out), tok, Path(init), max_steps=3, hand_off=True, save_total_limit=1, save_only_model=False,
              learning_rate=1e-2, **kw)
    # leave the process group together: a rank that exits while gloo's threads still run can abort at exit
    # ("terminate called without an active exception"), seen once in 10 runs
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
