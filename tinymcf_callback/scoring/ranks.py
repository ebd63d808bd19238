"""Scoring one :class:`Probe` across the processes of a distributed training run: the batches split between ranks,
the per-prompt results gathered, so that every rank reports the same metrics. docs/engine.md ("Several processes").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .engine import ScoreResult, empty_result

__all__ = ["Ranks", "Shard", "merge_shards", "to_shard"]


class Ranks:
    """This process alone, or every process of the ``torch.distributed`` group, scoring one probe together.

    Read from ``torch.distributed`` itself rather than from accelerate's ``PartialState``: on a machine
    without accelerators a state made without ``cpu=True`` (DeepSpeed's own launcher, say) sees one
    process, and every rank would then score the whole set alone. The split follows accelerate's
    ``split_between_processes(apply_padding=True)``: contiguous blocks, the short ranks repeating
    their last batch, so every rank scores the same number of batches.
    """

    def __init__(self, num: int = 1, index: int = 0):
        self.num, self.index = num, index

    @classmethod
    def current(cls) -> Ranks:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return cls(dist.get_world_size(), dist.get_rank())
        return cls()

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def gather(self, obj) -> list:
        """Every process's ``obj``, in rank order, on every process."""
        if self.num == 1:
            return [obj]
        out = [None] * self.num
        torch.distributed.all_gather_object(out, obj)
        return out

    def share(self, n: int) -> list[int]:
        """This process's item numbers out of ``n``: a contiguous block, padded with its last item to equal length."""
        if self.num == 1:
            return list(range(n))
        per, extra = divmod(n, self.num)
        start = self.index * per + min(self.index, extra)
        mine = list(range(start, start + per + (self.index < extra)))
        size = per + (extra > 0)
        if not mine:  # fewer items than ranks: this rank repeats the last one
            return [n - 1] if n else []
        return mine + [mine[-1]] * (size - len(mine))


@dataclass
class Shard:
    """One rank's scored prompts, as plain Python values for ``all_gather_object``."""

    index: list[int]
    p_yes: list[float]
    yn_mass: list[float]
    yn_top3: list[bool]
    top_tokens: list
    n_forward: int


def to_shard(res: ScoreResult, index: list[int]) -> Shard:
    """The prompts ``index`` of a partly filled result (NaN elsewhere), ready to send."""
    index = sorted(set(index))
    return Shard(index, res.p_yes[index].tolist(), res.yn_mass[index].tolist(), res.yn_top3[index].tolist(),
                 list(res.top_tokens), res.n_forward)


def merge_shards(shards: list[Shard], n_prompts: int) -> ScoreResult:
    """Put every rank's prompts back in their places (the same result on every rank); ``n_forward`` counts every
    rank's calls. Raises ``RuntimeError`` when a prompt was scored by no rank."""
    res = empty_result(n_prompts)
    scored = np.zeros(n_prompts, dtype=bool)
    for shard in shards:
        res.p_yes[shard.index] = shard.p_yes
        res.yn_mass[shard.index] = shard.yn_mass
        res.yn_top3[shard.index] = shard.yn_top3
        scored[shard.index] = True
        res.top_tokens = res.top_tokens or shard.top_tokens
        res.n_forward += shard.n_forward
    if not scored.all():
        missing = np.flatnonzero(~scored)
        raise RuntimeError(f"moral probe: {len(missing)} of {n_prompts} prompts were scored by no process "
                           f"(first: {missing[:5].tolist()}); the batch split between ranks lost them")
    return res


