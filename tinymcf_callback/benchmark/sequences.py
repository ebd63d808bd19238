"""A pair set as the engine runs it: each distinct prompt and (prompt, continuation) sequence once, and which prompts
share a forward call, decided from token counts alone (as :mod:`tinymcf_callback.scoring.batching` decides the
vignettes')."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..scoring.batching import BatchSize
from .encoding import EncodedPairs

# What a forward call costs besides its tokens, in tokens: SmolLM2-135M fp32 on 2 cores took 35 ms for a call of one
# token and 1.15 ms a token in calls of 256-1024 (benchmarks/prefs.py's profile), so a call is worth ~30 tokens.
CALL_TOKENS = 30
LOGITS_BYTES = 2**28  # a forward call returns at most about this many bytes of continuation logits (and their copy)
# On the CPU's plan a call pads a row by at most this share of its widest row, once it holds MIN_CALL_TOKENS padded
# tokens: a padded token costs a real one's compute, while a further forward call of a few hundred tokens costs little
# more than its tokens (SmolLM2-135M, fp32, 2 cores: the test pairs' padded tokens went from 1.65x their real ones to
# 1.2x, benchmarks/prefs.py).
SLACK = 0.25
MIN_CALL_TOKENS = 256


@dataclass(frozen=True)
class Sequences:
    """The distinct (prompt, continuation) sequences of a pair set: each prompt and each continuation scored once."""

    prompts: list[list[int]]  # the distinct prompts
    conts: list[list[int]]  # each sequence's continuation
    prompt_of: list[int]  # each sequence's prompt
    chosen: list[int]  # each pair's chosen sequence
    rejected: list[int]  # each pair's rejected sequence
    root: int  # the leading tokens every prompt shares, computed once (fewer than the shortest prompt's)
    by_prompt: list[list[int]] = field(default_factory=list)  # each prompt's sequences

    def of_prompts(self, batch: list[int]) -> list[int]:
        """The sequences of the prompts in ``batch``, prompt by prompt."""
        return [s for p in batch for s in self.by_prompt[p]]

    def ids(self, s: int) -> list[int]:
        """Sequence ``s`` whole: its prompt, then its continuation."""
        return self.prompts[self.prompt_of[s]] + self.conts[s]


def sequences_of(encoded: EncodedPairs) -> Sequences:
    """Distinct prompts and (prompt, continuation) sequences of ``encoded``, and the start all prompts share."""
    prompt_index: dict[tuple, int] = {}
    seq_index: dict[tuple, int] = {}
    prompts, conts, prompt_of, chosen, rejected = [], [], [], [], []
    for p, c, r in zip(encoded.prompt, encoded.chosen, encoded.rejected, strict=True):
        pi = prompt_index.setdefault(tuple(p), len(prompt_index))
        if pi == len(prompts):
            prompts.append(list(p))
        ids = []
        for cont in (c, r):
            si = seq_index.setdefault((pi, tuple(cont)), len(seq_index))
            if si == len(conts):
                conts.append(list(cont))
                prompt_of.append(pi)
            ids.append(si)
        chosen.append(ids[0])
        rejected.append(ids[1])
    by_prompt: list[list[int]] = [[] for _ in prompts]
    for s, p in enumerate(prompt_of):
        by_prompt[p].append(s)
    return Sequences(prompts, conts, prompt_of, chosen, rejected, _shared_start(prompts), by_prompt)


def _shared_start(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt shares, leaving each prompt at least its last token of its own."""
    n = min(len(p) for p in prompts) - 1
    k = 0
    while k < n and all(p[k] == prompts[0][k] for p in prompts[1:]):
        k += 1
    return k


def plan_pair_batches(seqs: Sequences, size: BatchSize, vocab: int | None) -> list[list[int]]:
    """Which prompts (with all their continuations) share a forward call, longest prompts first: at most the
    engine's token budget (each sequence's row as wide as the call's longest prompt and continuation), its
    ``max_batch_size`` sequences and :data:`LOGITS_BYTES` of continuation logits; on the CPU's plan also no prompt
    shorter than ``1 - SLACK`` of the call's widest once the call holds :data:`MIN_CALL_TOKENS` (a padded token costs
    a real one's compute, and the pairs' prompts vary in length more than the vignettes' do)."""
    rows_of = dict(enumerate(seqs.by_prompt))
    own = {p: len(seqs.prompts[p]) - seqs.root for p in rows_of}
    tails = {p: [len(seqs.conts[s]) - 1 for s in rows_of[p]] for p in rows_of}
    logit_rows = (LOGITS_BYTES // (8 * vocab)) if vocab else None  # continuation positions a call may return
    batches, cur, width, tail, rows, kept = [], [], 0, 0, 0, 0
    for p in sorted(rows_of, key=lambda p: (-own[p], p)):
        w, t, r, k = max(width, own[p]), max(tail, *tails[p]), rows + len(rows_of[p]), kept + sum(tails[p])
        full = r * (w + t) > size.token_budget or r > size.max_batch_size or (logit_rows and k > logit_rows)
        ragged = not size.balance and own[p] < (1 - SLACK) * width and rows * (width + tail) >= MIN_CALL_TOKENS
        if cur and (full or ragged):
            batches.append(cur)
            cur, w, t, r, k = [], own[p], max(tails[p]), len(rows_of[p]), sum(tails[p])
        cur.append(p)
        width, tail, rows, kept = w, t, r, k
    if cur:
        batches.append(cur)
    return batches


def length_runs(items: list[int], lengths: dict[int, int], *, ragged: bool) -> list[list[int]]:
    """``items`` longest first, in runs that share a forward call: with ``ragged``, a new run when an item is shorter
    than ``1 - SLACK`` of its run's longest and the run holds :data:`MIN_CALL_TOKENS` padded tokens; else one run."""
    ordered = sorted(items, key=lambda i: (-lengths[i], i))
    runs: list[list[int]] = []
    for i in ordered:
        if runs and ragged and lengths[i] < (1 - SLACK) * lengths[runs[-1][0]] and \
                lengths[runs[-1][0]] * len(runs[-1]) >= MIN_CALL_TOKENS:
            runs.append([i])
        elif runs:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs
