"""The self-check's float32 replay: a reduced-precision model's checked prompts computed again in float32, where a
defect stands out from the noise. Forward hooks swap float32 copies in and the originals back: nothing of the model
is written. docs/engine.md ("Reduced precision: what the replay changed").
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from .mode import Precision, autocast_off, lifted_mixed_precision, output_layer
from .model_info import wrapper_chain

REDUCED = (torch.bfloat16, torch.float16)
REPLAY_DTYPE = torch.float32
BLOCK_SHARE = 0.04  # a block may hold this share of the model's reduced-precision bytes (its float32 copy: twice that)
HEAD_ROWS = 2048  # rows of the output layer multiplied in float32 at a time


def _is_reduced(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in REDUCED


def _reduced_in(value) -> list[torch.Tensor]:
    """The reduced-precision tensors in ``value``: itself, or the items of a tuple or list."""
    return [v for v in (value if isinstance(value, (tuple, list)) else (value,)) if _is_reduced(v)]


def _upcast_value(value):
    """``value`` with every reduced-precision tensor in it (itself, or one level of a tuple or list) in float32."""
    if _is_reduced(value):
        return value.to(REPLAY_DTYPE)
    if isinstance(value, (tuple, list)) and _reduced_in(value):
        return type(value)(v.to(REPLAY_DTYPE) if _is_reduced(v) else v for v in value)
    return value


def _aligned(n: int) -> int:
    """``n`` float32 elements rounded up to a multiple of 16 (64 bytes)."""
    return -(-n // 16) * 16


def _own_reduced(module, head) -> list[torch.Tensor]:
    """``module``'s own reduced-precision parameters and buffers; none for the vocabulary tables."""
    if type(module) is torch.nn.Embedding or module is head:
        return []
    return [t for t in (*module._parameters.values(), *module._buffers.values()) if _is_reduced(t)]


class Float32Replay:
    """A context in which ``model``'s forward calls compute in float32; the model itself is left exactly as it was.

    ``blocks``: put a small module's whole subtree in float32 while it runs (unsharded models), else each module's own
    tensors. After the block, :attr:`impure` says where a reduced-precision input arrived (None: nowhere).
    """

    def __init__(self, model, *, blocks: bool = True):
        self.model, self.blocks = model, blocks
        self.impure: str | None = None
        self.upcast = 0
        self.held = 0  # bytes of float32 copies in place now
        self.largest_copy = 0
        self._marks: dict[int, list[int]] = {}  # id(module) -> where its swaps start, per call in progress
        self._swapped: list[tuple[dict, str, torch.Tensor, int]] = []  # (store, name, original, bytes) to put back
        self._handles: list = []
        self._whole: set[int] = set()  # modules that put their whole subtree in float32
        self._inside_block = 0  # blocks running now (their subtrees are in float32 already)
        self._store_lists: dict[int, list] = {}  # id(module) -> the stores it puts in float32 (blocks only)
        self._arena: torch.Tensor | None = None  # the float32 workspace the copies are views of (blocks only)
        self._capacity = 0  # its elements: the largest block's reduced-precision elements and a module's own
        self._top = 0  # elements of it in use
        self._head = output_layer(model)
        self._head_patched, self._head_before = False, None  # the head's own forward attribute, if it had one
        self._head_chunk = 0
        self._head_weight = None

    def __enter__(self) -> Float32Replay:
        try:
            if self.blocks:
                self._whole = _blocks(self.model, self._head)
                self._capacity = _workspace(self.model, self._head, self._whole)
                if isinstance(self._head, torch.nn.Linear) and _is_reduced(self._head.weight):
                    self._head_before = self._head.__dict__.get("forward")
                    weight, bias = self._head.weight, self._head.bias
                    self._head.forward = _chunked_head(weight, bias)  # the instance's own, undone on exit
                    # code that casts the head's input to its weight's dtype (Mamba) reads float32: a stand-in with
                    # no storage (device "meta") is in its place while the replay runs, the real one multiplies
                    self._head_weight = weight
                    self._head._parameters["weight"] = torch.empty(weight.shape, dtype=REPLAY_DTYPE, device="meta")
                    self._head_patched = True
                    rows, cols = self._head.weight.shape
                    self._head_chunk = min(rows, HEAD_ROWS) * cols * 4  # one slice of it in float32
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
        self._marks.clear()
        self._inside_block = 0
        self._store_lists.clear()
        self._arena, self._top = None, 0
        if self._head_patched:
            self.largest_copy += self._head_chunk  # held beside the workspace while the output layer runs
            self._head._parameters["weight"] = self._head_weight
            if self._head_before is None:
                del self._head.forward
            else:
                self._head.forward = self._head_before
            self._head_patched = False

    # ---- the hooks -------------------------------------------------------------------------------
    def _stores(self, module):
        """The stores whose reduced-precision tensors ``module`` puts in float32 when it runs: with blocks, a block's
        whole subtree (found once: an unsharded model's tensors stay where they are); else its own, looked at each
        call (FSDP1 puts a module's gathered weights in as plain tensor attributes while it runs: ``__dict__``)."""
        if not self.blocks:
            return (module._parameters, module._buffers, module.__dict__)
        found = self._store_lists.get(id(module))
        if found is None:
            owners = module.modules() if id(module) in self._whole else (module,)
            found = [store for owner in owners
                     if not (type(owner) is torch.nn.Embedding or (owner is self._head and self._head_patched))
                     # a lookup is cast after it (see _after); the head multiplies in slices (_chunked_head)
                     for store in (owner._parameters, owner._buffers)
                     if any(_is_reduced(t) for t in store.values())]
            self._store_lists[id(module)] = found
        return found

    def _before(self, module, args, kwargs):
        self._marks.setdefault(id(module), []).append(len(self._swapped))
        if self.blocks and self._inside_block:
            stores = ()  # a block around this module already put its tensors in float32
        else:
            stores = self._stores(module)
        if id(module) in self._whole:
            self._inside_block += 1
        for store in stores:
            for name, tensor in list(store.items()):
                if _is_reduced(tensor):
                    copy, taken = self._copy(tensor)
                    size = copy.numel() * copy.element_size()
                    self.upcast += 1
                    self.held += size
                    self.largest_copy = max(self.largest_copy, self.held, self._capacity * 4 if taken else 0)
                    store[name] = copy
                    self._swapped.append((store, name, tensor, size, taken))
        reduced = [t for v in (*args, *kwargs.values()) for t in _reduced_in(v)]
        if not reduced:
            return None
        if self.impure is None:
            self.impure = f"{type(module).__name__} received a {str(reduced[0].dtype).replace('torch.', '')} input"
        return tuple(_upcast_value(a) for a in args), {k: _upcast_value(v) for k, v in kwargs.items()}

    def _copy(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        """A float32 copy of ``tensor``: a view of the workspace when it fits there (its pages are reused from call to
        call: a fresh allocation of a block's size costs the kernel a page fault per 4 KiB each time), else a new
        tensor. Also the workspace's elements it took (0 for a new tensor)."""
        n = tensor.numel()
        taken = _aligned(n)
        if self._capacity and self._top + taken <= self._capacity:
            if self._arena is None or self._arena.device != tensor.device:
                self._arena = torch.empty(self._capacity, dtype=REPLAY_DTYPE, device=tensor.device)
            view = self._arena[self._top:self._top + n].view(tensor.shape)
            view.copy_(tensor.detach())
            self._top += taken
            return view, taken
        return tensor.detach().to(REPLAY_DTYPE), 0

    def _after(self, module, args, output):
        marks = self._marks.get(id(module))
        if marks:
            self._put_back(marks.pop())
        if id(module) in self._whole and self._inside_block:
            self._inside_block -= 1
        if type(module) is torch.nn.Embedding and _is_reduced(output):
            return output.to(REPLAY_DTYPE)
        return None

    def _put_back(self, mark: int) -> None:
        while len(self._swapped) > mark:
            store, name, original, size, taken = self._swapped.pop()
            store[name] = original
            self.held -= size
            self._top -= taken


def _chunked_head(weight: torch.Tensor, bias: torch.Tensor | None):
    """The output layer's forward in float32, :data:`HEAD_ROWS` rows of its weight converted at a time (the
    vocabulary table is never copied whole)."""

    def forward(x):
        x = x.to(REPLAY_DTYPE)
        out = x.new_empty((*x.shape[:-1], weight.shape[0]))
        for start in range(0, weight.shape[0], HEAD_ROWS):
            rows = slice(start, start + HEAD_ROWS)
            out[..., rows] = torch.nn.functional.linear(
                x, weight[rows].to(REPLAY_DTYPE), None if bias is None else bias[rows].to(REPLAY_DTYPE))
        return out

    return forward


def _blocks(model, head) -> set[int]:
    """The modules that put their whole subtree in float32 while they run: from the top down, the first ones whose
    subtree's reduced-precision tensors fit a block (:data:`BLOCK_SHARE` of the model's, or one repeated layer's if
    that is more), the vocabulary tables (embedding, output layer) left out."""
    def own(module) -> int:
        return sum(t.numel() * t.element_size() for t in _own_reduced(module, head))

    sizes: dict[int, int] = {}

    def subtree(module) -> int:
        sizes[id(module)] = own(module) + sum(subtree(child) for child in module.children())
        return sizes[id(module)]

    total = subtree(model)
    # a repeated layer (a child of a ModuleList: a decoder layer) may always be one block: a layer can read its
    # children's weights itself (Mamba's mixer reads dt_proj.weight), and splitting it would leave those unconverted
    layers = max((sizes[id(child)] for m in model.modules() if isinstance(m, torch.nn.ModuleList)
                  for child in m.children()), default=0)
    budget = max(BLOCK_SHARE * total, layers, max((own(m) for m in model.modules()), default=0))
    chosen: set[int] = set()

    def choose(module) -> None:
        if sizes[id(module)] <= budget:
            chosen.add(id(module))
            return
        for child in module.children():
            choose(child)

    choose(model)
    return chosen


def _workspace(model, head, whole: set[int]) -> int:
    """Elements of float32 workspace the copies need at once, 64-byte aligned: the largest block's, and the largest
    of the own of the modules outside every block (one may be running around a block)."""
    def elements(modules) -> int:
        return sum(_aligned(t.numel()) for m in modules for t in _own_reduced(m, head))

    blocks = [elements(m.modules()) for m in model.modules() if id(m) in whole]
    inside = {id(sub) for m in model.modules() if id(m) in whole for sub in m.modules()}
    others = [elements([m]) for m in model.modules() if id(m) not in inside]
    return max(blocks, default=0) + max(others, default=0)


@contextlib.contextmanager
def strict_float32():
    """Float32 matrix products at full precision (no TF32, no bfloat16 passes) for the block, then as they were."""
    backends = [matmul for matmul in (getattr(getattr(torch.backends, name, None), "matmul", None)
                                      for name in ("cuda", "mkldnn")) if hasattr(matmul, "fp32_precision")]
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


def without_compile(model):
    """The module ``torch.compile`` wrapped (the replay runs it eagerly: new dtypes would recompile the graph)."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else model


@contextlib.contextmanager
def fsdp2_inputs_kept(model):
    """FSDP2's mixed-precision policy without its casts of each unit's inputs and outputs, for the block (they would
    round a float32 replay's activations at each layer); the parameters are still gathered in the policy's dtype."""
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
    """Everything the replay needs around ``model``'s forward calls, undone after; yields ``(replay, precision)``, the
    :class:`~tinymcf_callback.scoring.mode.Precision` watching what the first matrix product really ran in."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(lifted_mixed_precision(model))
        stack.enter_context(autocast_off(device))
        stack.enter_context(strict_float32())
        stack.enter_context(fsdp2_inputs_kept(model))
        replay = stack.enter_context(Float32Replay(model, blocks=unsharded(model)))
        precision = stack.enter_context(Precision(model, device).watch(output=False))  # after the replay's hooks
        yield replay, precision
