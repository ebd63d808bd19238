"""The probe's mode: eval and inference mode, state restored after, and the precision it computes in.

:func:`probe_mode` puts the model in eval and inference mode for the probe and restores every
module's train/eval flag and every RNG state afterwards, so observing a training run cannot
change it. It also decides the precision: by default the weights' own dtype, with the
mixed-precision wrapper accelerate puts on a model's forward (the Trainer's ``bf16=True``)
lifted for the probe, so a checkpoint scores as ``eval`` scores its saved weights.
:class:`Precision` records what the forward calls really computed in.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

from .model_info import model_device, unwrap_model, weights_dtype, wrapper_chain


@contextlib.contextmanager
def probe_mode(model, *, keep_autocast: bool = False):
    """Eval mode and inference mode for the probe; afterwards everything is as before. Yields a :class:`Precision`.

    Restores each module's train/eval flag and every RNG state (Python, numpy, torch CPU and
    CUDA), so observing a training run cannot change it. Unless ``keep_autocast``, the probe
    computes in the weights' own dtype: the mixed-precision wrapper accelerate puts on a
    model's forward (the Trainer's ``bf16=True`` / ``fp16=True``) is lifted for the probe and
    put back after, and an autocast region the probe is called from is switched off inside it.
    So a checkpoint scores as ``eval`` scores the saved weights. The yielded
    :class:`Precision` says what the forward calls really computed in.
    """
    training = {m: m.training for m in model.modules()}
    py_state, np_state = random.getstate(), np.random.get_state()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    device = model_device(model)
    precision = Precision(model, device)
    model.eval()
    try:
        with contextlib.ExitStack() as stack:
            if not keep_autocast:
                stack.enter_context(_without_mixed_precision_forward(model))
                stack.enter_context(_autocast_off(device))
            stack.enter_context(precision.watch())
            stack.enter_context(torch.inference_mode())
            yield precision
    finally:
        for m, flag in training.items():
            m.training = flag
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


@contextlib.contextmanager
def _without_mixed_precision_forward(model):
    """Lift accelerate's autocast wrapper (``model.forward`` over ``model._original_forward``) for the block.

    accelerate's ``prepare_model`` keeps the model's own forward as ``_original_forward`` and sets an
    autocast-wrapped ``forward`` on the instance; ``unwrap_model(keep_fp32_wrapper=False)`` undoes it for
    good. Here it is undone for the probe only and put back exactly as it was.
    """
    lifted = []
    for layer in wrapper_chain(model):
        own = layer.__dict__
        if "_original_forward" in own and "forward" in own:
            lifted.append((layer, own["forward"]))
            own["forward"] = own["_original_forward"]
    try:
        yield
    finally:
        for layer, forward in lifted:
            layer.__dict__["forward"] = forward


@contextlib.contextmanager
def _autocast_off(device: torch.device):
    try:
        ctx = torch.autocast(device_type=device.type, enabled=False)
    except RuntimeError:  # a device type autocast does not know: nothing to switch off
        ctx = contextlib.nullcontext()
    with ctx:
        yield


class Precision:
    """What the probe's forward calls compute in: the weights' dtype, the autocast dtype seen inside them, the device.

    The autocast state is read inside the model (a forward pre-hook on its output layer), so it
    is what the computation saw, whatever wrappers or regions were around it.
    """

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, device
        dtype = weights_dtype(model)
        self.dtype = str(dtype).replace("torch.", "") if dtype is not None else None
        self.autocast: str | None = None
        self._seen = False

    @contextlib.contextmanager
    def watch(self):
        target = _output_layer(self.model)
        handle = target.register_forward_pre_hook(self._look) if target is not None else None
        try:
            yield self
        finally:
            if handle is not None:
                handle.remove()

    def _look(self, module, args):
        if self._seen:
            return
        self._seen = True
        if torch.is_autocast_enabled(self.device.type):
            self.autocast = str(torch.get_autocast_dtype(self.device.type)).replace("torch.", "")

    @property
    def compute(self) -> str | None:
        """The precision the matrix products ran in: autocast dtype, TF32 for reduced fp32 matmuls, else the weights."""
        if self.autocast is not None:
            return self.autocast
        if self.dtype == "float32" and _reduced_fp32_matmul(self.device):
            return "tf32"
        return self.dtype

    def as_dict(self) -> dict:
        return {"dtype": self.dtype, "autocast": self.autocast, "device": str(self.device), "compute": self.compute}


def _output_layer(model):
    base = unwrap_model(model)
    try:
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    except (NotImplementedError, AttributeError):
        head = None
    if isinstance(head, torch.nn.Module):
        return head
    return next((m for m in base.modules() if isinstance(m, torch.nn.Linear)), None)


def _reduced_fp32_matmul(device: torch.device) -> bool:
    """Are fp32 matrix products allowed a lower internal precision (TF32 on CUDA, bf16 passes with "medium")?"""
    if torch.get_float32_matmul_precision() != "highest":
        return True
    return device.type == "cuda" and bool(torch.backends.cuda.matmul.allow_tf32)
