"""The processes a sweep or a watcher runs in: one, or all of a ``torchrun`` / ``accelerate launch``.

The main process decides (what to score, whether to stop) and :func:`agree` hands its decision to
every process, so that all take the same branch and no rank waits alone at a collective.
"""

from __future__ import annotations

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, parse_flag_from_env


def process_state(device: str | None) -> PartialState:
    """accelerate's view of the processes this sweep runs in; without an accelerator (or with ``--device cpu``) it
    must be told ``cpu=True``, or under torchrun each process would see itself alone and sweep every checkpoint."""
    # torch >= 2.6 knows every accelerator (CUDA, ROCm, XPU, MPS, ...); before it, CUDA
    accelerator = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    cpu = (device or "").startswith("cpu") or parse_flag_from_env("ACCELERATE_USE_CPU") or not accelerator
    return PartialState(cpu=cpu)


def agree(state: PartialState, value):
    """The main process's ``value`` on every process (so that all take the same branch; no rank waits alone)."""
    return broadcast_object_list([value])[0] if state.num_processes > 1 else value
