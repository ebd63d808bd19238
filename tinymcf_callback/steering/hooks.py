"""Steering hooks: add ``c * v`` to a causal LM's residual stream, at every position or at the answer's.

    steer = ResidualSteering(model, layer=15, vector=v)   # intervene(c): a context manager per coefficient
    with steer(4.0):
        model.generate(...)                               # or a probe: dose_response(probe, model, steer, ...)
"""

from __future__ import annotations

import contextlib

import torch

from ..errors import ConfigError, UnsupportedModelError
from ..scoring.model_info import class_name, unwrap_model

POSITIONS = ("every", "answer")


def decoder_layers(model) -> torch.nn.ModuleList:
    """The model's list of decoder layers (through any wrappers): ``model.model.layers`` and its kin, else the longest
    ``ModuleList`` of identical blocks; :class:`UnsupportedModelError` when there is none."""
    base = unwrap_model(model)
    roots = [base]
    get_decoder = getattr(base, "get_decoder", None)
    if callable(get_decoder):
        with contextlib.suppress(Exception):
            roots.insert(0, get_decoder())
    for root in roots:
        for path in ("layers", "h", "blocks", "block", "decoder.layers", "model.layers", "transformer.h"):
            obj = root
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if isinstance(obj, torch.nn.ModuleList) and len(obj):
                return obj
    lists = [m for m in base.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1
             and len({type(x) for x in m}) == 1]
    if lists:
        return max(lists, key=len)
    raise UnsupportedModelError(f"{class_name(model)} has no list of decoder layers to steer (looked for "
                                f"model.layers, transformer.h, ...); write your own intervene(c) context manager")


def hidden_size(model) -> int:
    """The width of the residual stream (``config.hidden_size``, else the input embeddings')."""
    base = unwrap_model(model)
    size = getattr(getattr(base, "config", None), "hidden_size", None)
    if isinstance(size, int):
        return size
    return int(base.get_input_embeddings().weight.shape[-1])


def hidden_of(output):
    """The hidden states in a decoder layer's output (a tensor, or the first item of a tuple / ModelOutput)."""
    return output if torch.is_tensor(output) else output[0]


def _with_hidden(output, hidden):
    if torch.is_tensor(output):
        return hidden
    if isinstance(output, tuple):
        return (hidden, *output[1:])
    output[0] = hidden  # a ModelOutput
    return output


class ResidualSteering:
    """``intervene(c)``: add ``c * vector`` to the residual stream after decoder layer ``layer``.

    ``at="every"``: at every position (the common activation-addition recipe); ``"answer"``: at
    the last position of each forward call only, which in the probe is each prompt's answer
    position (the probe then scores each prompt whole: ``needs_full_prompts``). ``vector`` is
    moved to the layer's device and dtype at each call. Usable alone too: ``with steer(4.0):
    model.generate(...)``.
    """

    def __init__(self, model, layer: int, vector, *, at: str = "every", label: str = "real"):
        if at not in POSITIONS:
            raise ConfigError(f"at must be one of {', '.join(POSITIONS)} (where c * v is added), got {at!r}")
        layers = decoder_layers(model)
        if isinstance(layer, bool) or not isinstance(layer, int) or not -len(layers) <= layer < len(layers):
            raise ConfigError(f"layer must be a decoder layer index of {class_name(model)} (0 to {len(layers) - 1}, "
                              f"or negative from the end), got {layer!r}")
        vector = torch.as_tensor(vector).detach().flatten()
        if vector.numel() != hidden_size(model):
            raise ConfigError(f"the steering vector has {vector.numel()} values; {class_name(model)}'s residual "
                              f"stream has {hidden_size(model)}")
        if not torch.isfinite(vector).all():
            raise ConfigError("the steering vector holds NaN or infinite values")
        self.model, self.layer, self.vector, self.at, self.label = model, layer % len(layers), vector, at, label
        self.module = layers[self.layer]

    @property
    def needs_full_prompts(self) -> bool:
        return self.at == "answer"

    @property
    def norm(self) -> float:
        return float(self.vector.float().norm())

    def along(self, vector, label: str) -> ResidualSteering:
        """The same intervention (model, layer, positions) along another direction."""
        return ResidualSteering(self.model, self.layer, vector, at=self.at, label=label)

    @contextlib.contextmanager
    def __call__(self, c: float):
        c = float(c)
        if c == 0.0:
            yield self
            return

        def hook(module, args, output):
            h = hidden_of(output)
            push = (c * self.vector).to(device=h.device, dtype=h.dtype)
            if self.at == "every":
                h = h + push
            else:
                h = h.clone()
                h[:, -1] = h[:, -1] + push
            return _with_hidden(output, h)

        handle = self.module.register_forward_hook(hook)
        try:
            yield self
        finally:
            handle.remove()

    def __repr__(self) -> str:
        return f"ResidualSteering(layer={self.layer}, norm={self.norm:.3g}, at={self.at!r}, label={self.label!r})"
