"""Scoring one :class:`Probe` across the processes of a distributed training run.

Under DDP, FSDP or DeepSpeed every rank holds the model, so the probe's batches are split
between ranks, each rank scores its share, and the per-prompt results are gathered so that
every rank ends with the whole :class:`ScoreResult` and computes the same metrics (keys
added to the Trainer's ``metrics`` must agree on all ranks, or a checkpoint barrier hangs).

With sharded parameters (FSDP, ZeRO-3) the forward pass itself runs collectives, so every
rank must make the same number of forward calls: ``split_between_processes(apply_padding=True)``
gives every rank the same number of batches (the short ranks get a copy of the last batch,
whose results are written twice with the same values). A batch split on out-of-memory on one
rank only would still make the counts differ. Uses accelerate, as the Trainer does, rather
than hand-written ``torch.distributed`` calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from accelerate import PartialState
from accelerate.utils import gather_object

from .engine import ScoreResult
from .probe import Probe


@dataclass
class Shard:
    """One rank's scored prompts, as plain Python values for ``gather_object``."""

    index: list[int]
    p_yes: list[float]
    yn_mass: list[float]
    yn_top3: list[bool]
    top_tokens: list
    n_forward: int


def score_across_ranks(probe: Probe, model) -> ScoreResult:
    """Score every prompt of ``probe`` once, sharing the batches among all processes.

    One process: ``probe.score(model)``. Several: each scores an equal share of the
    batches (padded), then every rank receives every rank's share. Raises ``RuntimeError``
    when a prompt was scored by no rank, rather than reporting metrics over a part of the set.
    """
    dist = PartialState()
    if dist.num_processes == 1:
        return probe.score(model)
    batches = probe.batches
    with dist.split_between_processes(list(range(len(batches))), apply_padding=True) as mine:
        share = probe.score(model, batches=[batches[b] for b in mine])
    return merge_shards(gather_object([to_shard(share, [i for b in mine for i in batches[b]])]), len(probe))


def to_shard(res: ScoreResult, index: list[int]) -> Shard:
    """The prompts ``index`` of a partly filled result (NaN elsewhere), ready to send."""
    index = sorted(set(index))
    return Shard(index, res.p_yes[index].tolist(), res.yn_mass[index].tolist(), res.yn_top3[index].tolist(),
                 list(res.top_tokens), res.n_forward)


def merge_shards(shards: list[Shard], n_prompts: int) -> ScoreResult:
    """Put every rank's prompts back in their places (the same result on every rank).

    ``top_tokens`` (the sample prompt's next tokens) come from the first rank that scored
    the sample; ``n_forward`` counts the forward calls of all ranks, padding included.
    """
    res = ScoreResult(np.full(n_prompts, np.nan), np.full(n_prompts, np.nan), np.zeros(n_prompts, dtype=bool))
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
