"""Preference pairs scored by the probe's engine: each prompt once, the continuations' log-probabilities only.

``log P(continuation | prompt)`` is the sum of the continuation's tokens' log-probabilities. A pair's two
sequences share their prompt, and many pairs share a start (a chat template's header and system prompt), so the
fastest strategy, ``"shared"`` (:class:`PairRunner`), runs three kinds of forward call, each through the key/value
cache of the one before:

1. the start every prompt shares (``root``), once per scoring, one row;
2. each distinct prompt once (left-padded, positions that skip the padding), keeping only its last position's
   logits: the distribution of a continuation's first token, the same for both continuations;
3. each distinct continuation but its last token on top (right-padded), keeping the logits at its real positions
   only (a boolean ``logits_to_keep`` where the model takes one): the distributions of its later tokens.

The log-softmax is taken at those positions only (a ``logsumexp`` over the vocabulary and the target's logit), in
float32, and summed per continuation in float64. Nothing ``[batch, sequence, vocabulary]``-sized is ever built.
Which prompts share a forward call is planned apart, from token counts only (:func:`plan_pair_batches`, with the
engine's token budget and a cap on the logits one call returns).

Two safer strategies follow, as in the vignette engine (:mod:`tinymcf_callback.scoring.engine`): ``"full"`` (each
prompt and continuation as one left-padded row, no cache) and ``"unpadded"`` (each sequence alone). The self-check
(:func:`check`) holds the chosen strategy to the simplest reference, each sequence scored alone with no cache, mask
or padding (:func:`score_alone`), on a few sequences a strategy treats most differently from alone (the most
padded prompt, the most padded continuation, one of the last forward call), padded as they were in their call; in
float32, or replayed in float32 when the model computes in a reduced precision (the vignette self-check's
:func:`~tinymcf_callback.scoring.replay.float32_replay`). A strategy that disagrees by more than :data:`TOLERANCE`
a continuation token is left for the next, and the scores come from the one that agrees.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..errors import EngineMismatchError, UnsupportedModelError
from ..scoring.batching import BatchSize
from ..scoring.engine import ModelCall, log_once, split_on_oom
from ..scoring.model_info import (
    ForwardArgs,
    class_name,
    model_config,
    model_device,
    padding_problem,
    shared_prefix_blocker,
    unwrap_model,
)
from ..scoring.replay import float32_replay, without_compile
from ..scoring.selfcheck import REDUCED_PRECISIONS, describe
from .encoding import EncodedPairs

logger = logging.getLogger(__name__)

STRATEGIES = ("shared", "full", "unpadded")  # fastest first, each safer than the one before
STRATEGY_WORDS = {"shared": "shared prompts (key/value cache)", "full": "full sequences (left-padded)",
                  "unpadded": "each sequence alone"}
# Largest |log P(continuation | prompt)| difference per continuation token, in nats, allowed between a strategy and
# each sequence scored alone in float32 (a sum over n tokens is held to n times it). Measured (every sequence of the
# project's test pairs, plain and chat, sums of 1-18 tokens, two token budgets): SmolLM2-135M 1.33e-5 a token (1.4e-4
# on a sum; the reference's unmasked forward computes the same attention another way), tiny random Qwen3 8e-7. A
# position off by one or a continuation seeing its padding moves a sum by 0.05 nats or more.
TOLERANCE = 4e-5
N_CHECKED = 4  # sequences compared with each alone, per scoring, at most ...
CHECK_SHARE = 0.05  # ... and as many as cost about this share of the scoring (at least one)
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


def vocab_size(model) -> int | None:
    """The rows of the output layer: what one position's logits hold."""
    base = unwrap_model(model)
    with contextlib.suppress(AttributeError, NotImplementedError):
        head = base.get_output_embeddings()
        weight = getattr(head, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2:
            return int(weight.shape[0])
    value = getattr(model_config(model), "vocab_size", None)
    return value if isinstance(value, int) else None


# ---- the strategies ------------------------------------------------------------------------------------------
def takes_position_mask(model) -> bool:
    """Whether the model's forward keeps the logits of a boolean ``[batch, sequence]`` ``logits_to_keep`` only
    (transformers' ``slice_logits_to_keep``, which its causal LMs call since 5.x)."""
    module = sys.modules.get(type(unwrap_model(model)).__module__)
    return ForwardArgs.of(model).logits_to_keep and getattr(module, "slice_logits_to_keep", None) is not None


class PairRunner:
    """One strategy over a :class:`Sequences`: :meth:`logps` gives the sequences of a batch of prompts their
    continuations' log-probabilities (float64, in :meth:`Sequences.of_prompts` order).

    ``ragged``: split a batch's continuations (and, on the full path, its sequences) into calls of similar lengths
    (:func:`length_runs`); the CPU's plan does, a GPU's (few large calls) does not.
    """

    def __init__(self, name: str, model, seqs: Sequences, pad_id: int, call: ModelCall | None = None,
                 ragged: bool = True):
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
        self.name, self.model, self.seqs, self.pad_id, self.ragged = name, model, seqs, pad_id, ragged
        self.call = call or ModelCall(model)
        self.args = ForwardArgs.of(model)
        self.masked = takes_position_mask(model)
        self.device = model_device(model)
        self.root_cache = None

    def runs(self, batch: list[int]) -> list[list[int]]:
        """The sequences of ``batch`` by forward call: on the shared path the continuations' calls (after one call of
        the prompts), on the full path the sequences' calls, unpadded one sequence a call."""
        order = self.seqs.of_prompts(batch)
        if self.name == "unpadded":
            return [[s] for s in order]
        if self.name == "shared":
            return length_runs(order, {s: len(self.seqs.conts[s]) - 1 for s in order}, ragged=self.ragged)
        return length_runs(order, {s: len(self.seqs.ids(s)) - 1 for s in order}, ragged=self.ragged)

    def layout(self, batch: list[int]) -> dict[int, tuple[int, int]]:
        """The widths each sequence of ``batch`` was padded to: (prompt width after the shared start, continuation
        width) on the shared path, (row width, 0) on the full path, (0, 0) unpadded."""
        seqs, out = self.seqs, {}
        width = max(len(seqs.prompts[p]) - seqs.root for p in batch)
        for run in self.runs(batch):
            if self.name == "shared":
                tail = max(len(seqs.conts[s]) - 1 for s in run)
                out.update(dict.fromkeys(run, (width, tail)))
            elif self.name == "full":
                out.update(dict.fromkeys(run, (max(len(seqs.ids(s)) - 1 for s in run), 0)))
            else:
                out.update(dict.fromkeys(run, (0, 0)))
        return out

    def logps(self, batch: list[int], widths: tuple[int, int] | None = None,
              only: list[int] | None = None) -> np.ndarray:
        """With ``widths`` and ``only``: those sequences in one call padded to ``widths`` (the self-check's replay of
        a row as its call padded it)."""
        order = self.seqs.of_prompts(batch)
        runs = [only] if only is not None else self.runs(batch)
        if self.name == "shared":
            values = self._shared(batch, runs, widths)
        else:
            values = {}
            for run in runs:
                values.update(zip(run, self._full(run, widths and widths[0]), strict=True))
        return np.array([values[s] for s in (only if only is not None else order)], dtype=np.float64)

    # the shared strategy ---------------------------------------------------------------------------------------
    def _new_cache(self):
        from transformers import DynamicCache

        try:
            return DynamicCache(config=unwrap_model(self.model).config)
        except TypeError:
            return DynamicCache()

    def _root(self):
        """The cache of the start every prompt shares, computed once (one row)."""
        if self.root_cache is None:
            cache, r = self._new_cache(), self.seqs.root
            if r:
                ids = torch.tensor([self.seqs.prompts[0][:r]], device=self.device)
                positions = self.args.position_base + torch.arange(r, device=self.device)[None]
                self.call(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions, use_cache=True,
                          logits_to_keep=1, **{self.args.cache_kw: cache})
            self.root_cache = cache
        return self.root_cache

    def _shared(self, batch: list[int], runs: list[list[int]], widths) -> dict[int, float]:
        """The prompts of ``batch`` in one call on the shared start's cache (keeping their last position's logits:
        each continuation's first token), then each run of continuations on their prompts' cache rows."""
        seqs, r, dev, base = self.seqs, self.seqs.root, self.device, self.args.position_base
        cache = copy.deepcopy(self._root())
        if r:
            cache.batch_repeat_interleave(len(batch))
        mid_ids, mid_mask = left_pad([seqs.prompts[p][r:] for p in batch], self.pad_id, widths and widths[0])
        ones = torch.ones((len(batch), r), dtype=torch.long)
        first = self.call(input_ids=mid_ids.to(dev), attention_mask=torch.cat([ones, mid_mask], 1).to(dev),
                          position_ids=positions_after(mid_mask, base + r).to(dev), use_cache=True, logits_to_keep=1,
                          **{self.args.cache_kw: cache})[:, -1]
        row = {p: n for n, p in enumerate(batch)}
        values = {}
        for n, run in enumerate(runs):
            rows = torch.tensor([row[seqs.prompt_of[s]] for s in run])
            # a continuation's first token: predicted by its prompt's last position (the same row for both of a pair)
            out = token_logps(first[rows.to(dev)], [seqs.conts[s][0] for s in run]).numpy()
            tails = [seqs.conts[s][:-1] for s in run]  # each later token: predicted by the position of the one before
            if any(len(t) for t in tails):
                here = cache if n == len(runs) - 1 else copy.deepcopy(cache)  # the last run may take the prompts' own
                out = out + self._tail(here, run, rows, mid_mask, tails, widths and widths[1])
            values.update(zip(run, out, strict=True))
        return values

    def _tail(self, cache, run: list[int], rows: torch.Tensor, mid_mask: torch.Tensor, tails: list[list[int]],
              width: int | None) -> np.ndarray:
        """A run of continuations (but their last tokens) on their prompts' cache rows, right-padded, the logits at
        their real positions only."""
        seqs, r, dev, base = self.seqs, self.seqs.root, self.device, self.args.position_base
        cache.batch_select_indices(rows.to(dev))
        tail_ids, tail_mask = right_pad(tails, self.pad_id, width)
        mid_len = mid_mask.sum(-1)[rows][:, None]
        mask = torch.cat([torch.ones((len(run), r), dtype=torch.long), mid_mask[rows], tail_mask], 1)
        positions = base + r + mid_len + torch.arange(tail_ids.shape[1])[None]
        keep = tail_mask.bool()
        logits = self._kept(keep, input_ids=tail_ids.to(dev), attention_mask=mask.to(dev),
                            position_ids=positions.to(dev), use_cache=True, **{self.args.cache_kw: cache})
        targets = [t for s in run for t in seqs.conts[s][1:]]
        return scatter_sums(token_logps(logits, targets), row_of_positions(keep), len(run))

    def _kept(self, keep: torch.Tensor, **kwargs) -> torch.Tensor:
        """The logits of the positions ``keep`` marks, ``[kept positions, vocabulary]`` in row-major order: asked of
        the model with a boolean ``logits_to_keep`` where it takes one, else cut from all of them."""
        if self.masked:
            logits = self.call(logits_to_keep=keep.to(self.device), **kwargs)
            if logits.dim() == 2:
                return logits
        else:
            logits = self.call(**kwargs)
        return logits[keep.to(logits.device)]

    # the full and unpadded strategies --------------------------------------------------------------------------
    def _full(self, run: list[int], width: int | None = None) -> np.ndarray:
        """Each sequence of ``run`` as one row, prompt and continuation but its last token, left-padded."""
        seqs, dev = self.seqs, self.device
        ids, mask = left_pad([seqs.ids(s)[:-1] for s in run], self.pad_id, width)
        span = torch.tensor([len(seqs.conts[s]) for s in run])[:, None]
        keep = (torch.arange(ids.shape[1])[None] >= ids.shape[1] - span) & mask.bool()
        kwargs = {"input_ids": ids.to(dev), "attention_mask": mask.to(dev), "use_cache": False}
        if self.args.position_ids:
            kwargs["position_ids"] = positions_after(mask, self.args.position_base).to(dev)
        logits = self._kept(keep, **kwargs)
        targets = [t for s in run for t in seqs.conts[s]]
        return scatter_sums(token_logps(logits, targets), row_of_positions(keep), len(run))


def left_pad(rows: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` padded on the left to ``width`` (default: the longest), and their attention mask."""
    width = max([len(r) for r in rows] + [width or 0])
    ids = [[pad_id] * (width - len(r)) + list(r) for r in rows]
    mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    return _tensor(ids, width), _tensor(mask, width)


def right_pad(rows: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` padded on the right to ``width`` (default: the longest), and their attention mask."""
    width = max([len(r) for r in rows] + [width or 0])
    ids = [list(r) + [pad_id] * (width - len(r)) for r in rows]
    mask = [[1] * len(r) + [0] * (width - len(r)) for r in rows]
    return _tensor(ids, width), _tensor(mask, width)


def _tensor(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long).reshape(len(rows), width)


def positions_after(mask: torch.Tensor, offset) -> torch.Tensor:
    """Positions that skip left padding, counted from ``offset`` (an int or a column)."""
    return offset + (mask.cumsum(-1) - 1).clamp(min=0)


def row_of_positions(keep: torch.Tensor) -> torch.Tensor:
    """For each kept position (row-major), the row it is in."""
    return torch.nonzero(keep, as_tuple=True)[0]


def token_logps(logits: torch.Tensor, targets: list[int]) -> torch.Tensor:
    """``log softmax(logits)[target]`` per row, in float32: a logsumexp over the vocabulary and one gathered logit."""
    if not len(targets):
        return torch.zeros(0, dtype=torch.float64)
    logits = logits.float()
    if not torch.isfinite(torch.sum(logits)):
        raise FloatingPointError(f"the model produced NaN or infinite logits at a continuation position "
                                 f"({len(targets)} positions)")
    index = torch.tensor(targets, device=logits.device)[:, None]
    return (logits.gather(1, index)[:, 0] - torch.logsumexp(logits, dim=-1)).double().cpu()


def scatter_sums(values: torch.Tensor, rows: torch.Tensor, n: int) -> np.ndarray:
    """The sum of ``values`` per row (float64)."""
    out = torch.zeros(n, dtype=torch.float64)
    out.index_add_(0, rows.cpu(), values.double())
    return out.numpy()


# ---- which strategy, and how a batch was padded --------------------------------------------------------------
def first_strategy(model, seqs: Sequences) -> tuple[str, str | None]:
    """The fastest strategy nothing in the model's class or config is known against, and why not a faster one: the
    vignette engine's rules (:func:`~tinymcf_callback.scoring.model_info.padding_problem`,
    :func:`~tinymcf_callback.scoring.model_info.shared_prefix_blocker`), with the cache slots a shared call fills."""
    try:
        args = ForwardArgs.of(model)
        problem = padding_problem(model, args)
        if problem:
            return "unpadded", problem
        slots = seqs.root + max(len(p) for p in seqs.prompts) + max(len(c) for c in seqs.conts)
        blocker = shared_prefix_blocker(model, args, slots)
    except Exception as e:  # noqa: BLE001 - the rules only pick a starting point: a config they cannot read is no crash
        return "full", f"its config could not be read ({type(e).__name__}: {e})"
    return ("full", blocker) if blocker else ("shared", None)


def padding(runner: PairRunner, batches: list[list[int]]) -> dict[int, tuple[int, int]]:
    """Each sequence's padded slots on ``runner``'s strategy: (before its prompt or row, after its continuation)."""
    seqs, out = runner.seqs, {}
    for batch in batches:
        for s, (width, tail) in runner.layout(batch).items():
            if runner.name == "shared":
                out[s] = (width - len(seqs.prompts[seqs.prompt_of[s]]) + seqs.root, tail - len(seqs.conts[s]) + 1)
            elif runner.name == "full":
                out[s] = (width - len(seqs.ids(s)) + 1, 0)
            else:
                out[s] = (0, 0)
    return out


def check_count(runner: PairRunner, batches: list[list[int]]) -> int:
    """How many sequences the check compares: as many of the riskiest as cost about :data:`CHECK_SHARE` of the
    scoring (in padded tokens and :data:`CALL_TOKENS` a call; each alone is a call of its own), one at least,
    :data:`N_CHECKED` at most. A few dozen pairs get one; a benchmark of thousands, four."""
    seqs, cost = runner.seqs, 0
    for batch in batches:
        layout = runner.layout(batch)
        runs = runner.runs(batch)
        if runner.name == "shared":  # the prompts' call, then each run of continuations on the cache
            cost += CALL_TOKENS + len(batch) * max(w for w, _ in layout.values())
            cost += sum(CALL_TOKENS + len(run) * layout[run[0]][1] for run in runs)
        elif runner.name == "full":
            cost += sum(CALL_TOKENS + len(run) * layout[run[0]][0] for run in runs)
        else:
            cost += sum(CALL_TOKENS + len(seqs.ids(run[0])) for run in runs)
    alone = CALL_TOKENS + float(np.mean([len(seqs.ids(s)) for s in range(len(seqs.conts))]))
    return int(min(N_CHECKED, max(1, CHECK_SHARE * cost // alone)))


def checked_sequences(runner: PairRunner, batches: list[list[int]], k: int = N_CHECKED) -> list[int]:
    """The sequences a strategy treats most differently from each alone (at most ``k``): the most padded before its
    prompt, the most padded after its continuation, the most padded of the last batch, and a one-token continuation
    (its score comes from the prompt's call alone); ties to the lower index."""
    if not batches:
        return []
    seqs, pads = runner.seqs, padding(runner, batches)
    ranked = sorted(pads, key=lambda s: (-sum(pads[s]), s))
    picks = [min(pads, key=lambda s: (-pads[s][0], s)), min(pads, key=lambda s: (-pads[s][1], s)),
             min(seqs.of_prompts(batches[-1]), key=lambda s: (-sum(pads[s]), s))]
    picks += [s for s in ranked if len(seqs.conts[s]) == 1][:1]
    return list(dict.fromkeys(picks + ranked))[:k]


# ---- the reference: each sequence alone ----------------------------------------------------------------------
def score_alone(model, seqs: Sequences, idx: list[int], call: ModelCall | None = None) -> np.ndarray:
    """The simplest reference: each sequence of ``idx`` alone, prompt and continuation ids in one forward call with no
    cache, mask, position ids or padding, its continuation's log-probabilities summed (float64)."""
    call = call or ModelCall(model)
    args = ForwardArgs.of(model)
    device = model_device(model)
    out = []
    for s in idx:
        cont = seqs.conts[s]
        kwargs = {"input_ids": torch.tensor([seqs.ids(s)], device=device), "use_cache": False}
        if args.logits_to_keep:
            kwargs["logits_to_keep"] = len(cont) + 1
        logits = call(**kwargs)[0]
        logp = logits[-len(cont) - 1:-1].float().log_softmax(-1)
        out.append(float(logp[torch.arange(len(cont)), torch.tensor(cont, device=logp.device)].double().sum()))
    return np.array(out, dtype=np.float64)


# ---- scoring with the check ----------------------------------------------------------------------------------
@dataclass
class PairCheck:
    """A scoring's self-check: the strategy's continuations against each sequence scored alone."""

    strategy: str
    checked: list[int]  # sequences compared (indices into the distinct sequences)
    max_diff: float  # largest |log P difference| per continuation token over them, in nats, in the reference precision
    tolerance: float  # what max_diff is held to
    precision: str | None  # what the scores were computed in
    reference: str  # "float32", or "float32 replay" for a reduced-precision model
    scored_diff: float | None = None  # with a replay: the scores as computed against the float32 reference
    note: str | None = None  # why no comparison was made (a replay that could not run)
    fallbacks: list[str] = field(default_factory=list)
    n_forward: int = 0
    seconds: float = 0.0

    def passed(self) -> bool:
        return self.note is not None or self.max_diff <= self.tolerance

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class PairScores:
    """Every pair's ``log P(chosen | prompt)`` and ``log P(rejected | prompt)``, in the pairs' order."""

    chosen: np.ndarray
    rejected: np.ndarray
    strategy: str
    n_forward: int
    n_sequences: int
    n_prompts: int
    check: dict | None
    precision: dict
    batches: dict
    seconds: float


def run_batches(runner: PairRunner, batches: list[list[int]], progress: bool = False) -> np.ndarray:
    """Every sequence's continuation log-probability, by running ``batches`` (a batch that runs out of memory is
    halved: :func:`~tinymcf_callback.scoring.engine.split_on_oom`)."""
    from tqdm.auto import tqdm

    out = np.full(len(runner.seqs.conts), np.nan)
    with tqdm(total=len(out), desc="preference pairs", unit="sequence", leave=False, disable=not progress) as bar:
        for batch in batches:
            for part, values in split_on_oom(runner.logps, batch, runner.device):
                order = runner.seqs.of_prompts(part)
                out[order] = values
                bar.update(len(order))
    return out


def check(runner: PairRunner, batches: list[list[int]], scores: np.ndarray, compute: str | None,
          fallbacks: list[str], tolerance: float = TOLERANCE) -> PairCheck:
    """Compare a few sequences (:func:`checked_sequences`) with each scored alone: in float32 as they are, or, for a
    model computing in a reduced precision, each checked sequence as its call padded it and each alone, both replayed
    in float32."""
    started = time.perf_counter()
    model, seqs = runner.model, runner.seqs
    idx = checked_sequences(runner, batches, check_count(runner, batches))
    found = PairCheck(runner.name, idx, 0.0, tolerance, compute, "float32", fallbacks=list(fallbacks))
    tokens = np.array([len(seqs.conts[s]) for s in idx], dtype=float)
    if compute not in REDUCED_PRECISIONS:
        call = ModelCall(model)
        alone = score_alone(model, seqs, idx, call)
        found.max_diff, found.n_forward = _largest((scores[idx] - alone) / tokens), call.n_forward
    else:
        found.reference = "float32 replay"
        target = without_compile(model)
        replayed = PairRunner(runner.name, target, seqs, runner.pad_id, ragged=runner.ragged)
        where = {s: (batch, widths) for batch in batches for s, widths in runner.layout(batch).items()}
        try:
            with float32_replay(target, model_device(model)) as (replay, seen):
                fast = np.array([replayed.logps([seqs.prompt_of[s]], where[s][1], only=[s])[0] for s in idx])
                alone = score_alone(target, seqs, idx, replayed.call)
            if replay.impure is not None or seen.seen != "float32":
                found.note = f"the float32 replay was not pure float32 ({replay.impure or seen.seen})"
        except (UnsupportedModelError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - a replay that cannot run costs the check, never the scores
            found.note = f"the float32 replay failed ({describe(e)})"
        if found.note is None:
            found.max_diff = _largest((fast - alone) / tokens)
            found.scored_diff = _largest((scores[idx] - alone) / tokens)
        else:
            log_once(model, f"preference pairs: {class_name(model)} was not checked against each sequence alone: "
                            f"{found.note}")
        found.n_forward = replayed.call.n_forward
    found.seconds = time.perf_counter() - started
    return found


def _largest(diffs: np.ndarray) -> float:
    if not len(diffs):
        return 0.0
    return float("inf") if np.isnan(diffs).any() else float(np.abs(diffs).max())


def score_sequences(model, seqs: Sequences, batches: list[list[int]], *, pad_id: int, precision=None,
                    self_check: bool = True, progress: bool = False,
                    ragged: bool = True) -> tuple[np.ndarray, str, int, PairCheck | None]:
    """Every distinct sequence scored by the fastest strategy that agrees with each sequence alone; returns the
    scores, the strategy, the forward calls and the check. ``precision``: the running
    :func:`~tinymcf_callback.scoring.mode.probe_mode`'s, whose compute precision (known once a forward call ran)
    decides whether the check replays in float32. A strategy that raises or disagrees is left for the next (said
    once per model); :class:`~tinymcf_callback.errors.EngineMismatchError` when even the last disagrees."""
    start, reason = first_strategy(model, seqs)
    if reason is not None:
        log_once(model, f"preference pairs: {class_name(model)} starts on {STRATEGY_WORDS[start]}: {reason}")
    level, fallbacks, calls = STRATEGIES.index(start), [], 0
    while True:
        strategy = STRATEGIES[level]
        runner = PairRunner(strategy, model, seqs, pad_id, ragged=ragged)
        try:
            scores = run_batches(runner, batches, progress)
        except (UnsupportedModelError, torch.OutOfMemoryError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - a fast path the model does not take: the next strategy
            calls += runner.call.n_forward
            if level == len(STRATEGIES) - 1:
                raise
            fallbacks.append(f"{STRATEGY_WORDS[strategy]} failed ({describe(e)})")
            level += 1
            continue
        calls += runner.call.n_forward
        if not self_check:
            return scores, strategy, calls, None
        compute = precision.compute if precision is not None else None
        found = check(runner, batches, scores, compute, fallbacks)
        calls += found.n_forward
        if found.passed():
            return scores, strategy, calls, found
        why = (f"{STRATEGY_WORDS[strategy]} gave log-probabilities {found.max_diff:.1e} a token away from each "
               f"sequence scored alone ({found.reference}, {len(found.checked)} sequences checked), above the "
               f"tolerance {found.tolerance:.0e}")
        if level == len(STRATEGIES) - 1:
            raise EngineMismatchError(f"{class_name(model)}: even {why}: the pairs cannot be scored right on this "
                                      "model, so nothing is reported rather than a wrong number")
        fallbacks.append(why)
        log_once(model, f"preference pairs: {class_name(model)}: {why}; scoring {STRATEGY_WORDS[STRATEGIES[level + 1]]}"
                        " instead", key=("pairs fallback", strategy))
        level += 1
