"""Steering directions: a difference of means on the residual stream, and random ones of the same norm.

    v = residual_direction(model, tok, positive_texts, negative_texts, layer=15)   # at the answer position
    controls = random_directions(v, k=4, seed=0)                                  # [4, d], each of v's norm

The random directions are the control of a dose-response (:mod:`~tinymcf_callback.steering.dose`): any push of
a steering vector's size moves P(Yes) somewhere, so a real direction counts only beyond their spread.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..scoring.engine import encode_batch
from ..scoring.model_info import unwrap_model
from ..scoring.prompts import FRAMES, format_prompt
from .hooks import decoder_layers, hidden_of


def random_directions(vector, k: int, seed: int = 0) -> torch.Tensor:
    """``k`` random directions (uniform on the sphere, seeded) with ``vector``'s norm: shape ``[k, d]``, float32."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ConfigError(f"the number of random directions must be a whole number >= 0, got {k!r}")
    v = torch.as_tensor(vector).detach().flatten().float().cpu()
    g = torch.Generator().manual_seed(int(seed))
    r = torch.randn((k, v.numel()), generator=g)
    return r / r.norm(dim=1, keepdim=True) * v.norm()


def residual_direction(model, tok, positive: list[str], negative: list[str], layer: int, *,
                       question: str = FRAMES["wrong"], batch_size: int = 16) -> torch.Tensor:
    """Mean residual after decoder layer ``layer`` on ``positive`` texts minus that on ``negative`` ones.

    Each text is asked as the probe asks (the chat template, ``question``, the answer prefix) and
    the residual is read at the answer position: a difference-of-means steering direction (float32).
    """
    if not positive or not negative:
        raise ConfigError("residual_direction needs texts on both sides (positive and negative)")
    module = decoder_layers(model)[layer]
    kept: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda m, a, out: kept.append(hidden_of(out)[:, -1].float().cpu()))
    means = []
    was_training = unwrap_model(model).training
    try:
        model.eval()
        with torch.inference_mode():
            for texts in (positive, negative):
                kept.clear()
                prompts = [format_prompt(tok, t, question) for t in texts]
                for start in range(0, len(prompts), batch_size):
                    model(**encode_batch(tok, prompts[start:start + batch_size], model))
                means.append(torch.cat(kept).mean(0))
    finally:
        handle.remove()
        model.train(was_training)
    return means[0] - means[1]
