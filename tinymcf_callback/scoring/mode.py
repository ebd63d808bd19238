"""The probe's mode: eval and inference mode, state restored after (:func:`probe_mode`), and the precision it
computes in (:class:`Precision`): observing a training run must not change it, and a checkpoint scores as ``eval``
scores its saved weights.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

from .model_info import model_device, unwrap_model, weights_dtype, wrapper_chain


@contextlib.contextmanager
def probe_mode(model, *, keep_autocast: bool = False):
    """Eval mode and inference mode for the probe; afterwards every module's flag and RNG state is as before. Yields
    a :class:`Precision`. Unless ``keep_autocast``, accelerate's mixed-precision wrapper and any autocast region are
    lifted, so a checkpoint scores as ``eval`` scores the saved weights.
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
                stack.enter_context(lifted_mixed_precision(model))
                stack.enter_context(autocast_off(device))
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
def lifted_mixed_precision(model):
    """Lift accelerate's autocast wrapper (``model.forward`` over ``model._original_forward``) for the block, then
    put it back exactly as it was."""
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
def autocast_off(device: torch.device):
    """No autocast on ``device`` for the block (an autocast region the probe is called from is switched off)."""
    try:
        ctx = torch.autocast(device_type=device.type, enabled=False)
    except RuntimeError:  # a device type autocast does not know: nothing to switch off
        ctx = contextlib.nullcontext()
    with ctx:
        yield


LOWEST_FIRST = ("bfloat16", "float16", "tf32", "float32", "float64")  # by mantissa bits: what limits an answer


class Precision:
    """What the probe's forward calls compute in: read inside the model, at the matrix products that make the answer.

    ``dtype`` is what most parameters are stored in; a mixed-precision wrapper, autocast or a bfloat16 output layer
    can compute in less. Pre-hooks on the first matrix product and the output layer read what each runs in;
    :attr:`compute` is the lowest (docs/engine.md, "Precision").
    """

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, device
        self.dtype = _dtype_name(weights_dtype(model))
        self.autocast: str | None = None
        self.products: dict[str, str | None] = {}  # "first", "output": the dtype each ran in, once it has run
        self.hooks: set[int] = set()  # the ids of the hooks it has registered (not the model's own)

    @property
    def seen(self) -> str | None:
        """The lowest precision among the products read so far (None before any has run)."""
        found = [p for p in self.products.values() if p]
        return min(found, key=lambda p: LOWEST_FIRST.index(p) if p in LOWEST_FIRST else len(LOWEST_FIRST),
                   default=None)

    @contextlib.contextmanager
    def watch(self, output: bool = True):
        """Read the precision while the block runs; ``output=False``: the first product only (the self-check's
        float32 replay, whose output layer multiplies in float32 slices of its reduced-precision weight)."""
        first, output = first_matmul(self.model), output_layer(self.model) if output else None
        handles = []
        for where, target in (("first", first), ("output", output)):
            if target is not None and (where == "first" or target is not first):
                handles.append(target.register_forward_pre_hook(self._looker(where)))
                self.hooks.add(handles[-1].id)
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _looker(self, where: str):
        def look(module, args):
            if where not in self.products:
                self.products[where] = self._read(module, args)
        return look

    def _read(self, module, args) -> str | None:
        if torch.is_autocast_enabled(self.device.type):
            self.autocast = _dtype_name(torch.get_autocast_dtype(self.device.type))
            return self.autocast
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.is_floating_point():
            return _dtype_name(weight.dtype)
        # a quantised weight: the activations' dtype is what it computes in
        return next((_dtype_name(a.dtype) for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)

    @property
    def compute(self) -> str | None:
        """The precision the matrix products ran in (before any has run: the stored weights'); TF32 for reduced fp32."""
        seen = self.seen or self.dtype
        if seen == "float32" and _reduced_fp32_matmul(self.device):
            return "tf32"
        return seen

    def as_dict(self) -> dict:
        out = {"dtype": self.dtype, "autocast": self.autocast, "device": str(self.device), "compute": self.compute}
        if len({p for p in self.products.values() if p}) > 1:  # the body and the output layer computed apart
            out["products"] = dict(self.products)
        return out


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


def first_matmul(model):
    """The first module (in definition order) that multiplies by a weight matrix: a ``Linear``, GPT-2's ``Conv1D``,
    or any module with a 2-D floating weight that is not an embedding; else the output layer."""
    base = unwrap_model(model)
    for module in base.modules():
        if isinstance(module, torch.nn.Embedding):
            continue
        if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D":
            return module
        weight = module._parameters.get("weight")
        shape = getattr(weight, "ds_shape", getattr(weight, "shape", ()))  # a ZeRO-3 partition keeps its full shape
        if weight is not None and weight.is_floating_point() and len(shape) == 2:
            return module
    return output_layer(model) or next((m for m in unwrap_model(model).modules() if isinstance(m, torch.nn.Linear)),
                                       None)


def output_layer(model):
    """The model's output layer (``get_output_embeddings``), or None when it declares none."""
    base = unwrap_model(model)
    try:
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    except (NotImplementedError, AttributeError):
        head = None
    return head if isinstance(head, torch.nn.Module) else None


def _reduced_fp32_matmul(device: torch.device) -> bool:
    """Are fp32 matrix products on ``device`` allowed a lower internal precision (TF32 on CUDA, bf16 passes on CPU)?"""
    backend = getattr(getattr(torch.backends, "cuda" if device.type == "cuda" else "mkldnn", None), "matmul", None)
    setting = getattr(backend, "fp32_precision", None)  # torch >= 2.9: "ieee", "tf32", "bf16" or "none" (global's)
    if setting not in (None, "none"):
        return setting != "ieee"
    if getattr(torch.backends, "fp32_precision", "none") not in ("none", "ieee"):
        return True
    try:
        if torch.get_float32_matmul_precision() != "highest":
            return True
    except RuntimeError:  # torch refuses to answer when its two ways of setting this were mixed
        return False
    return device.type == "cuda" and bool(torch.backends.cuda.matmul.allow_tf32)
