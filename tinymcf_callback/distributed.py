"""Scoring one :class:`Probe` across the processes of a distributed training run.

Under DDP, FSDP or DeepSpeed every rank holds the model, so the probe's batches are split
between ranks, each rank scores its share, and the per-prompt results are gathered so that
every rank ends with the whole :class:`ScoreResult` and computes the same metrics (keys
added to the Trainer's ``metrics`` must agree on all ranks, or a checkpoint barrier hangs).
The self-check and the choice of strategy are collective too (:mod:`tinymcf_callback.selfcheck`).

With sharded parameters (FSDP, ZeRO-3) the forward pass itself runs collectives, so every
rank must make the same number of forward calls: every rank gets the same number of batches
(the short ranks repeat their last one, whose results are written twice with the same
values), the ranks count the forward calls their share needs before the first one, and the
ranks that need fewer make one-token filler calls. A batch split on out-of-memory on one
rank only would still make the counts differ: under sharding, size ``token_budget`` so that
a batch fits.
"""

from __future__ import annotations

from .engine import ScoreResult
from .probe import Probe
from .selfcheck import Ranks, Shard, merge_shards, to_shard

__all__ = ["Ranks", "Shard", "merge_shards", "score_across_ranks", "to_shard"]


def score_across_ranks(probe: Probe, model) -> ScoreResult:
    """Score every prompt of ``probe`` once, sharing the batches among all processes (one process: all of them).

    Raises ``RuntimeError`` when a prompt was scored by no rank, rather than reporting metrics
    over a part of the set.
    """
    return probe.score(model, ranks=Ranks.current())
