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
Which prompts share a forward call is planned apart, from token counts only
(:func:`~.sequences.plan_pair_batches`, with the engine's token budget and a cap on the logits one call returns).

Two safer strategies follow, as in the vignette engine (:mod:`tinymcf_callback.scoring.engine`): ``"full"`` (each
prompt and continuation as one left-padded row, no cache) and ``"unpadded"`` (each sequence alone).
:mod:`.selfcheck` holds the chosen one to the simplest reference, :func:`score_alone`, and moves on when they
disagree.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys

import numpy as np
import torch

from ..scoring.engine import ModelCall, split_on_oom
from ..scoring.model_info import (
    ForwardArgs,
    model_config,
    model_device,
    padding_problem,
    shared_prefix_blocker,
    unwrap_model,
)
from .sequences import Sequences, length_runs

logger = logging.getLogger(__name__)

STRATEGIES = ("shared", "full", "unpadded")  # fastest first, each safer than the one before
STRATEGY_WORDS = {"shared": "shared prompts (key/value cache)", "full": "full sequences (left-padded)",
                  "unpadded": "each sequence alone"}


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
