"""Defects injected into a model's forward from outside, the kind a wrapper, a patched attention or a hook brings.

Each function registers hooks on ``model`` and returns their handles (``remove()`` each to undo). Each
makes a padded or cached row compute differently from the same prompt scored alone; none changes a
prompt scored alone (no mask, no position ids, no cache, one row), so "alone" stays the truth. The first
two are the cases of the issue's table; the rest were held out while the float32 replay was built.
"""

from __future__ import annotations

import torch

from tinymcf_callback.steering.hooks import decoder_layers


def _hidden(output):
    return output[0] if isinstance(output, tuple) else output


def _padded_rows(mask) -> torch.Tensor | None:
    return None if mask is None else (mask == 0).any(-1)


def positions_shifted_on_padded_rows(model):
    """Position ids +1 on every row that has padding (a forward pre-hook on the model)."""
    def shift(module, args, kwargs):
        rows, positions = _padded_rows(kwargs.get("attention_mask")), kwargs.get("position_ids")
        if rows is not None and positions is not None:
            kwargs["position_ids"] = positions + rows[:, None].to(positions.dtype)
        return args, kwargs

    return [model.register_forward_pre_hook(shift, with_kwargs=True)]


def added_at_absolute_position(model, position: int = 10, scale: float = 4.0):
    """``scale * v`` added to column ``position`` of every row after the first decoder layer (a hook on the layer)."""
    layer = decoder_layers(model)[0]
    direction = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(1))

    def add(module, args, output):
        hidden = _hidden(output)
        if hidden.shape[1] > position:
            hidden[:, position] += scale * direction.to(hidden.device, hidden.dtype)
        return output

    return [layer.register_forward_hook(add)]


def first_token_masked_on_padded_rows(model):
    """A mask edit: on rows with padding, the first real token is masked out as if it were padding."""
    def mask_first(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        rows = _padded_rows(mask)
        if rows is not None and bool(rows.any()):
            first = mask.argmax(-1)  # the first unmasked column of each row
            mask = mask.clone()
            mask[rows, first[rows]] = 0
            kwargs["attention_mask"] = mask
        return args, kwargs

    return [model.register_forward_pre_hook(mask_first, with_kwargs=True)]


def positions_shifted_with_a_cache(model):
    """Position ids +1 whenever a filled key/value cache is passed in (a wrapper's off-by-one on cached calls)."""
    def shift(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        cached = cache is not None and cache.get_seq_length() > 0
        if cached and kwargs.get("position_ids") is not None:
            kwargs["position_ids"] = kwargs["position_ids"] + 1
        return args, kwargs

    return [model.register_forward_pre_hook(shift, with_kwargs=True)]


def padded_rows_scaled(model, factor: float = 1.05):
    """The residual stream of rows with padding scaled by ``factor`` after the first decoder layer."""
    seen = {}

    def remember(module, args, kwargs):
        seen["rows"] = _padded_rows(kwargs.get("attention_mask"))
        return None

    def scale(module, args, output):
        rows = seen.get("rows")
        if rows is not None and bool(rows.any()):
            hidden = _hidden(output)
            hidden[rows] *= factor
        return output

    return [model.register_forward_pre_hook(remember, with_kwargs=True),
            decoder_layers(model)[0].register_forward_hook(scale)]


def added_at_last_position(model, scale: float = 4.0):
    """A steering hook: ``scale * v`` added at the last position of each forward call after the first layer."""
    direction = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(2))

    def add(module, args, output):
        hidden = _hidden(output)
        hidden[:, -1] += scale * direction.to(hidden.device, hidden.dtype)
        return output

    return [decoder_layers(model)[0].register_forward_hook(add)]


def answer_moved_on_padded_rows(model, shift: float, yes_ids: list[int]):
    """A calibrated defect: ``shift`` added to the logits of the Yes answers (``yes_ids``) on rows with padding.

    P(Yes) of such a row moves by about ``p (1 - p) shift``; rows without padding, and each prompt alone, are
    untouched. Used to measure the check's resolution.
    """
    seen = {}
    yes = torch.tensor(yes_ids)

    def remember(module, args, kwargs):
        seen["rows"] = _padded_rows(kwargs.get("attention_mask"))
        return None

    def move(module, args, output):
        rows = seen.get("rows")
        if rows is not None and bool(rows.any()):
            output = output.clone()
            block = output[rows]
            block[..., yes] += shift
            output[rows] = block
        return output

    return [model.register_forward_pre_hook(remember, with_kwargs=True),
            model.get_output_embeddings().register_forward_hook(move)]


def pad_key_leak(model):
    """On rows with padding, the last pad slot (next to the real tokens after it) is left visible as a key."""
    def leak(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        rows = _padded_rows(mask)
        if rows is not None and bool(rows.any()):
            columns = torch.arange(mask.shape[-1], device=mask.device)
            last = torch.where(mask == 0, columns, -1).max(-1).values
            mask = mask.clone()
            mask[rows, last[rows]] = 1
            kwargs["attention_mask"] = mask
        return args, kwargs

    return [model.register_forward_pre_hook(leak, with_kwargs=True)]


def positions_shifted_on_short_rows(model, pads: int = 4):
    """Position ids +1 only on rows with at least ``pads`` padding slots (the short prompts of a batch)."""
    def shift(module, args, kwargs):
        mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
        if mask is not None and positions is not None:
            short = (mask == 0).sum(-1) >= pads
            kwargs["position_ids"] = positions + short[:, None].to(positions.dtype)
        return args, kwargs

    return [model.register_forward_pre_hook(shift, with_kwargs=True)]


def last_cached_token_dropped(model):
    """With a filled cache, its last token is masked out: a cache that loses the last shared-prefix token."""
    def drop(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        mask = kwargs.get("attention_mask")
        if cache is not None and mask is not None and cache.get_seq_length() > 0:
            mask = mask.clone()
            mask[:, cache.get_seq_length() - 1] = 0
            kwargs["attention_mask"] = mask
        return args, kwargs

    return [model.register_forward_pre_hook(drop, with_kwargs=True)]


def added_at_position_5(model):
    return added_at_absolute_position(model, position=5)


# name: (defect, the strategy the checked probe must end on for a RoPE model such as Llama or SmolLM2)
TABLE = {  # the table
    "positions +1 on padded rows": (positions_shifted_on_padded_rows, "full"),  # RoPE: a whole row's shift is harmless
    "4v at absolute position 10": (added_at_absolute_position, "unpadded"),
}
HELD_OUT = {
    "first real token masked on padded rows": (first_token_masked_on_padded_rows, "unpadded"),
    "positions +1 on cached calls": (positions_shifted_with_a_cache, "full"),
    "padded rows scaled by 1.05": (padded_rows_scaled, "unpadded"),
    "4v at the last position (steering)": (added_at_last_position, "full"),
}

# an outside tester's defects (issue 26), caught in bfloat16 and float16 by the replay: name -> (defect, where it lands)
OUTSIDE = {
    "pad key leak": (pad_key_leak, None),
    "positions +1 on short rows only": (positions_shifted_on_short_rows, None),
    "4v at absolute position 5": (added_at_position_5, None),
    "last shared-prefix token dropped": (last_cached_token_dropped, None),
}
