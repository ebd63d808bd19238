"""The self-check's float32 replay: a reduced-precision model's checked prompts computed again in float32.

Why: in bfloat16 a prompt scored in a batch and the same prompt scored alone differ by up to 0.06
in P(Yes) on SmolLM2-135M with nothing wrong at all (different kernels, shapes and reduction
orders round differently), which is as large as a real defect (a position off by one on padded
rows: 0.066). No tolerance can tell the two apart in bfloat16. But bfloat16 and float16 values are
float32 values, exactly: the very same weights can compute in float32, where that noise is 1e-6.
The defects the check looks for (a position, a mask, a cache or a hook that treats a padded or
cached row differently from the prompt alone) do not depend on the precision, so comparing a
strategy with each prompt alone *in float32* sees them at float32's resolution.

How, without touching the model: while :class:`Float32Replay` is active, a forward pre-hook on
every module puts float32 copies in place of the reduced-precision parameters and buffers that
module holds at that moment, and a forward hook puts the very same objects back when the module
returns (also when it raises, and again when the replay ends). Nothing of the model is written:
its parameters keep their identity, storage, dtype and values, so an optimizer or a sharding
wrapper that holds them never notices. Doing it per module at call time is what works under
sharding: ZeRO-3 and FSDP2 gather a module's parameters just before it runs (their hooks were
registered earlier, so they run first) and release them after (the restore runs first, before
theirs). Without sharding the float32 copies are kept for the whole replay (one copy, not one per
forward call) when they fit in memory; ``nn.Embedding`` lookups are cast after the lookup instead
(the same numbers, without a float32 copy of the vocabulary table).

The replay checks itself too: a module that receives a reduced-precision floating input (a wrapper
that casts activations, FSDP's mixed-precision input cast, code that casts to another module's
dtype) makes it impure, and an impure replay is not used (:attr:`Float32Replay.impure` says where).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

from .mode import Precision, autocast_off, lifted_mixed_precision
from .model_info import wrapper_chain

REDUCED = (torch.bfloat16, torch.float16)
REPLAY_DTYPE = torch.float32


def _is_reduced(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in REDUCED


def _upcast_value(value):
    """``value`` with every reduced-precision floating tensor in it (one level of tuples, lists, dicts) in float32."""
    if _is_reduced(value):
        return value.to(REPLAY_DTYPE)
    if isinstance(value, (tuple, list)) and any(_is_reduced(v) for v in value):
        return type(value)(v.to(REPLAY_DTYPE) if _is_reduced(v) else v for v in value)
    return value


def _holds_reduced(value) -> bool:
    if _is_reduced(value):
        return True
    if isinstance(value, (tuple, list)):
        return any(_is_reduced(v) for v in value)
    return False


def reduced_bytes(model) -> int:
    """Bytes the float32 copies of ``model``'s reduced-precision parameters and buffers would take."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * 4 for t in tensors if _is_reduced(t))


class Float32Replay:
    """A context in which ``model``'s forward calls compute in float32; the model itself is left exactly as it was.

    Args:
        model: the model the probe calls (wrappers included; ``torch.compile`` peeled off by the caller).
        keep_copies: keep each float32 copy for the whole replay (unsharded models with the memory for it);
            otherwise each module's copies live only while it runs.

    After the block: :attr:`impure` is None when every module computed in float32, else where a
    reduced-precision input arrived; :attr:`upcast` counts the tensors put in float32.
    """

    def __init__(self, model, *, keep_copies: bool = True):
        self.model, self.keep_copies = model, keep_copies
        self.impure: str | None = None
        self.upcast = 0
        self._copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (original, its float32 copy)
        self._marks: dict[int, list[int]] = {}  # id(module) -> where its swaps start, per call in progress
        self._swapped: list[tuple[dict, str, torch.Tensor]] = []  # (store, name, original) not yet put back
        self._handles: list = []

    def __enter__(self) -> Float32Replay:
        try:
            for module in self.model.modules():
                self._handles.append(module.register_forward_pre_hook(self._before, with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._after, prepend=True, always_call=True))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._put_back(0)
        self._copies.clear()
        self._marks.clear()

    # ---- the hooks -------------------------------------------------------------------------------
    def _before(self, module, args, kwargs):
        self._marks.setdefault(id(module), []).append(len(self._swapped))
        # With the copies kept, the model's first module puts every one in place for the whole call: a module may
        # use a child's weight itself (Mamba's mixer multiplies by dt_proj.weight). Otherwise each module its own.
        for owner in (module.modules() if self.keep_copies and module is self.model else (module,)):
            if type(owner) is torch.nn.Embedding:
                continue  # a lookup is cast after it instead (see _after)
            # FSDP1 puts a module's gathered weights in as plain tensor attributes while it runs (__dict__)
            for store in (owner._parameters, owner._buffers, owner.__dict__):
                for name, tensor in list(store.items()):
                    if _is_reduced(tensor):
                        store[name] = self._copy_of(tensor)
                        self._swapped.append((store, name, tensor))
        inputs = [*args, *kwargs.values()]
        if not any(_holds_reduced(v) for v in inputs):
            return None
        if self.impure is None:
            dtype = _first_reduced_dtype(inputs)
            self.impure = f"{type(module).__name__} received a {str(dtype).replace('torch.', '')} input"
        return tuple(_upcast_value(a) for a in args), {k: _upcast_value(v) for k, v in kwargs.items()}

    def _after(self, module, args, output):
        marks = self._marks.get(id(module))
        if marks:
            self._put_back(marks.pop())
        if type(module) is torch.nn.Embedding and _is_reduced(output):
            return output.to(REPLAY_DTYPE)
        return None

    def _copy_of(self, tensor: torch.Tensor) -> torch.Tensor:
        self.upcast += 1
        if not self.keep_copies:
            return tensor.detach().to(REPLAY_DTYPE)
        kept = self._copies.get(id(tensor))
        if kept is None:
            kept = self._copies[id(tensor)] = (tensor, tensor.detach().to(REPLAY_DTYPE))
        return kept[1]

    def _put_back(self, mark: int) -> None:
        while len(self._swapped) > mark:
            store, name, original = self._swapped.pop()
            store[name] = original


def _first_reduced_dtype(inputs) -> torch.dtype | None:
    for value in inputs:
        for v in (value if isinstance(value, (tuple, list)) else (value,)):
            if _is_reduced(v):
                return v.dtype
    return None


def _matmul_backends() -> list:
    """The backends whose float32 matrix products may take a lower internal precision (torch >= 2.9's settings)."""
    out = []
    for name in ("cuda", "mkldnn"):
        matmul = getattr(getattr(torch.backends, name, None), "matmul", None)
        if matmul is not None and hasattr(matmul, "fp32_precision"):
            out.append(matmul)
    return out


@contextlib.contextmanager
def strict_float32():
    """Float32 matrix products at full precision (no TF32, no bfloat16 passes) for the block, then as they were."""
    backends = _matmul_backends()
    if backends:  # the per-backend settings (torch.set_float32_matmul_precision writes these too)
        before = [b.fp32_precision for b in backends]
        for b in backends:
            b.fp32_precision = "ieee"
        try:
            yield
        finally:
            for b, value in zip(backends, before, strict=True):
                b.fp32_precision = value
        return
    before_precision, before_tf32 = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before_precision)
        torch.backends.cuda.matmul.allow_tf32 = before_tf32


def unsharded(model) -> bool:
    """Does every process hold all of ``model``'s parameters (no FSDP, no ZeRO-3 partitions)?"""
    if any(type(layer).__name__ == "FullyShardedDataParallel" for layer in wrapper_chain(model)):
        return False
    return not any(hasattr(p, "ds_id") or type(p).__name__ in ("DTensor", "FlatParameter") for p in model.parameters())


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` (CUDA: the driver's figure; CPU: available physical memory), or None when unknown."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        if device.type == "cpu":
            return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (RuntimeError, ValueError, OSError, AttributeError):
        return None
    return None


def keeps_copies(model, device: torch.device) -> bool:
    """Keep the float32 copies for the whole replay: an unsharded model whose copies take under half the free memory."""
    if not unsharded(model):
        return False
    free = free_memory(device)
    return free is not None and reduced_bytes(model) < free // 2


def without_compile(model):
    """The module ``torch.compile`` wrapped (the replay runs it eagerly: new dtypes would recompile the graph)."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else model


@contextlib.contextmanager
def fsdp2_inputs_kept(model):
    """FSDP2's mixed-precision policy without its casts of each unit's inputs and outputs, for the block.

    ``fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))`` casts the floating inputs
    of every sharded unit to bfloat16, so a float32 replay would round its activations at each layer. The
    parameters are still gathered in the policy's dtype (the weights the forward really uses).
    """
    changed = []
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        policy = getattr(get_state(), "_mp_policy", None) if callable(get_state) else None
        if dataclasses.is_dataclass(policy) and (policy.cast_forward_inputs or policy.output_dtype is not None):
            state = get_state()
            changed.append((state, policy))
            state._mp_policy = dataclasses.replace(policy, cast_forward_inputs=False, output_dtype=None)
    try:
        yield
    finally:
        for state, policy in changed:
            state._mp_policy = policy


@contextlib.contextmanager
def float32_replay(model, device: torch.device):
    """Everything the replay needs around ``model``'s forward calls, undone after; yields ``(replay, precision)``.

    Mixed-precision forward wrappers lifted and autocast off (:mod:`~tinymcf_callback.scoring.mode`), float32
    matrix products at full precision, reduced-precision tensors in float32 (:class:`Float32Replay`), and a
    :class:`~tinymcf_callback.scoring.mode.Precision` watching what the first matrix product really ran in.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(lifted_mixed_precision(model))
        stack.enter_context(autocast_off(device))
        stack.enter_context(strict_float32())
        stack.enter_context(fsdp2_inputs_kept(model))
        replay = stack.enter_context(Float32Replay(model, keep_copies=keeps_copies(model, device)))
        precision = stack.enter_context(Precision(model, device).watch())  # after the replay's hooks: sees the copies
        yield replay, precision
