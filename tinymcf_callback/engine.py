"""The scoring engine: prompts in, per-prompt P(Yes) and Yes+No mass out (P(true), true+false with JSON answers).

Only the answer position matters, so the engine never builds a ``[batch, seq, vocab]``
tensor: it asks the model for the last position's logits (``logits_to_keep=1``) on
left-padded batches, with ``position_ids`` that skip the padding so every prompt sees
the positions it would see alone (needed for absolute-position models; harmless for
RoPE). Which prompts share a batch is decided apart from running the model
(:func:`plan_batches`), so a distributed caller can hand each rank its own share.

Two strategies run the batches: :class:`FullPrompts` (each prompt whole, padding at the
far left of its row, or no padding at all for models whose positions padding would move)
and :class:`SharedPrefixes` (the chat header once, each scenario once for its two frames,
the questions on top of the key/value cache). :func:`choose_strategy` picks one per model,
in one place, and says in the log (once per model) why a model does not get the faster
one. Every choice gives the scores of each prompt scored alone: the shared path pads
*inside* the cache, which only attention over the whole prompt ignores; sliding-window,
chunked and local attention count cache slots and recurrent or convolutional layers carry
a state, so those models get full prompts (the rules are in ``model_info``; measured on
18 architectures in ``tests/test_architectures.py``). A batch that runs out of memory is
halved (:func:`split_on_oom`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from .model_info import (
    NEEDS,
    ForwardArgs,
    UnsupportedModelError,
    max_context,
    model_device,
    padding_problem,
    shared_prefix_blocker,
    unwrap_model,
)
from .prompts import DEFAULT_ANSWER_FORMAT, answer_token_ids

logger = logging.getLogger("tinymcf_callback")

DEFAULT_TOKEN_BUDGET = 8192
DEFAULT_MAX_BATCH = 64


def encode_prompts(tok, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt; the special tokens are already in the prompt text."""
    return tok(list(prompts), add_special_tokens=False)["input_ids"]


def plan_batches(lengths: list[int], token_budget: int = DEFAULT_TOKEN_BUDGET,
                 max_batch_size: int = DEFAULT_MAX_BATCH, sizes: list[int] | None = None) -> list[list[int]]:
    """Group item indices into batches of at most ``token_budget`` padded tokens.

    Sorted longest first: items of similar length share a batch, so little compute
    goes to padding, and the largest batch runs first, so running out of memory shows
    at once rather than at the end. ``sizes`` gives the rows each item brings (a group
    of prompts sharing a prefix); an item larger than the budget gets a batch alone.
    """
    if token_budget <= 0 or max_batch_size <= 0:
        raise ValueError("token_budget and max_batch_size must be positive")
    sizes = sizes or [1] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, cur, cur_max, cur_rows = [], [], 0, 0
    for i in order:
        width, rows = max(cur_max, lengths[i]), cur_rows + sizes[i]
        if cur and (width * rows > token_budget or rows > max_batch_size):
            batches.append(cur)
            cur, width, rows = [], lengths[i], sizes[i]
        cur.append(i)
        cur_max, cur_rows = width, rows
    if cur:
        batches.append(cur)
    return batches


@dataclass
class PrefixPlan:
    """Token prefixes shared by prompts, computed once instead of once per prompt.

    ``root`` is shared by every prompt (system prompt, chat header); each group (the two
    frames of one text) further shares ``mid[group]`` (the scenario). Prompt ``i``'s own
    part is ``encoded[i][len(root) + len(mid[group_of[i]]):]``, never empty.
    """

    root: list[int]
    group_of: list[int]
    mid: list[list[int]]

    def tail(self, encoded, i: int) -> list[int]:
        return encoded[i][len(self.root) + len(self.mid[self.group_of[i]]):]

    def cache_slots(self, encoded) -> int:
        """The most cache slots a batch can fill: root, then the longest scenario and question, padded."""
        longest_tail = max((len(self.tail(encoded, i)) for i in range(len(encoded))), default=0)
        return len(self.root) + max(map(len, self.mid), default=0) + longest_tail


def _common_prefix_len(seqs: list[list[int]], start: int = 0) -> int:
    n = min(len(s) for s in seqs) - 1  # every prompt keeps at least its last token
    k = start
    while k < n and all(s[k] == seqs[0][k] for s in seqs[1:]):
        k += 1
    return k


def plan_prefixes(encoded: list[list[int]], groups: list[list[int]]) -> PrefixPlan:
    """Shared prefixes on token ids (so tokenisation boundaries cannot change a score)."""
    r = _common_prefix_len(encoded)
    group_of = [0] * len(encoded)
    mid = []
    for g, members in enumerate(groups):
        for i in members:
            group_of[i] = g
        k = _common_prefix_len([encoded[i] for i in members], start=r)
        mid.append(list(encoded[members[0]][r:k]))
    return PrefixPlan(root=list(encoded[0][:r]), group_of=group_of, mid=mid)


def plan_group_batches(encoded, groups, token_budget=DEFAULT_TOKEN_BUDGET, max_batch_size=DEFAULT_MAX_BATCH):
    """Batches of prompt indices made of whole groups, under the token budget."""
    lengths = [max(len(encoded[i]) for i in g) for g in groups]
    gb = plan_batches(lengths, token_budget, max_batch_size, sizes=[len(g) for g in groups])
    return [[i for g in b for i in groups[g]] for b in gb]


def check_context(model, encoded: list[list[int]], labels: list[str] | None = None) -> None:
    """Raise ``ValueError`` naming the longest prompt when it exceeds the model's context."""
    limit = max_context(model)
    if limit is None or not encoded:
        return
    longest = max(range(len(encoded)), key=lambda i: len(encoded[i]))
    if len(encoded[longest]) > limit:
        what = labels[longest] if labels else f"prompt {longest}"
        raise ValueError(
            f"{what} is {len(encoded[longest])} tokens long, more than the model's context of {limit} tokens; "
            "shorten the vignette or use a model with a longer context"
        )


# ---- reading the answer off the logits ---------------------------------------------------------

class AnswerScores(NamedTuple):
    """Per-prompt ``p_yes`` and ``yn_mass`` (numpy arrays), as :func:`score_prompts` returns them.

    A named pair that also reads like a mapping, so both styles work::

        scored = score_prompts(logits, tok); scored["p_yes"], scored.yn_mass, dict(scored)
        p_yes, yn_mass = score_prompts(logits, tok)   # the earlier tuple style

    Iterating gives the two arrays (tuple behaviour); ``keys()``, ``items()``, ``in`` and
    string indexing behave as for a dict with keys ``"p_yes"`` and ``"yn_mass"``.
    """

    p_yes: np.ndarray
    yn_mass: np.ndarray

    def __getitem__(self, key):
        if isinstance(key, str):
            if key not in self._fields:
                raise KeyError(f"{key!r} (score_prompts returns {', '.join(self._fields)})")
            return getattr(self, key)
        return tuple.__getitem__(self, key)

    def __contains__(self, key) -> bool:
        return key in self._fields

    def keys(self) -> tuple[str, ...]:
        return self._fields

    def values(self) -> tuple[np.ndarray, ...]:
        return tuple(self)

    def items(self) -> tuple[tuple[str, np.ndarray], ...]:
        return tuple(zip(self._fields, self, strict=True))

    def get(self, key, default=None):
        return getattr(self, key) if key in self._fields else default


def score_prompts(logits, tok, answer_format: str = DEFAULT_ANSWER_FORMAT) -> AnswerScores:
    """Per-prompt ``p_yes`` (Yes against No only) and ``yn_mass`` (Yes+No over the vocabulary).

    ``logits``: ``[n_prompts, vocab]`` at the answer position (a tensor or an array).
    Every Yes and No variant of the tokenizer counts (see ``answer_token_ids``). With
    ``answer_format="json"`` the answers are true and false: ``p_yes`` is P(true) against
    false and ``yn_mass`` the true+false mass (the names stay, the roles are the same).
    Returns :class:`AnswerScores`: ``scored["p_yes"]`` or ``p_yes, yn_mass = scored``.
    """
    yes, no = answer_token_ids(tok, answer_format)
    logits = torch.as_tensor(logits)
    logp = torch.log_softmax(logits.float(), dim=-1)
    lyes = torch.logsumexp(logp[:, yes], dim=-1)
    lno = torch.logsumexp(logp[:, no], dim=-1)
    p_yes = torch.sigmoid(lyes - lno)
    yn_mass = lyes.exp() + lno.exp()
    return AnswerScores(p_yes.double().cpu().numpy(), yn_mass.double().cpu().numpy())


# ---- running the model: two strategies -------------------------------------------------------

_LOGGED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def log_once(model, message: str) -> None:
    """Log ``message`` (a warning on the ``tinymcf_callback`` logger) once per model object."""
    try:
        seen = _LOGGED.setdefault(model, set())
    except TypeError:  # not weak-referenceable: log every time rather than never
        seen = set()
    if message not in seen:
        seen.add(message)
        logger.warning(message)


class ModelCall:
    """Calls the model (the wrapper, so FSDP can gather its parameters) and counts forward calls."""

    def __init__(self, model):
        self.model, self.n_forward = model, 0

    def __call__(self, **kwargs):
        out = self.model(**kwargs)
        self.n_forward += 1
        logits = getattr(out, "logits", None)
        if logits is None:
            raise UnsupportedModelError(f"{type(unwrap_model(self.model)).__name__} returned no logits; {NEEDS}")
        return logits


def _left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, q in enumerate(seqs):
        if q:
            ids[row, width - len(q):] = torch.tensor(q, dtype=torch.long)
            mask[row, width - len(q):] = 1
    return ids, mask


def _positions(mask: torch.Tensor, offset) -> torch.Tensor:
    """Positions that skip left padding, continuing from ``offset`` (an int or a column)."""
    return offset + (mask.cumsum(-1) - 1).clamp(min=0)


class FullPrompts:
    """Strategy 1: each prompt whole, left-padded, so every answer sits in the last column.

    Padding at the far left of a row changes nothing once ``position_ids`` skip it (or the
    model ignores padded slots by itself, see ``PADDING_PROOF_WITHOUT_POSITIONS``); with
    ``padded=False`` each forward call takes prompts of one length only, with no padding.
    """

    def __init__(self, call: ModelCall, encoded: list[list[int]], args: ForwardArgs, pad_id: int,
                 device: torch.device, padded: bool = True):
        self.call, self.encoded, self.args, self.pad_id, self.device = call, encoded, args, pad_id, device
        self.padded = padded

    def logits(self, idx: list[int]) -> torch.Tensor:
        if self.padded:
            return self._forward(idx)
        by_length: dict[int, list[int]] = {}
        for row, i in enumerate(idx):
            by_length.setdefault(len(self.encoded[i]), []).append(row)
        if len(by_length) == 1:
            return self._forward(idx)
        out = None
        for rows in by_length.values():
            part = self._forward([idx[r] for r in rows])
            if out is None:
                out = part.new_empty((len(idx), part.shape[-1]))
            out[rows] = part
        return out

    def _forward(self, idx: list[int]) -> torch.Tensor:
        ids, mask = _left_pad([self.encoded[i] for i in idx], self.pad_id)
        kwargs = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device), "use_cache": False}
        if self.args.position_ids:
            kwargs["position_ids"] = _positions(mask, 0).to(self.device)
        if self.args.logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.call(**kwargs)[:, -1, :]


class SharedPrefixes:
    """Strategy 2: shared prefixes computed once and reused from the key/value cache.

    Per call: the prefix every prompt shares (``plan.root``: system prompt, chat header)
    once. Per batch: a copy of that cache, each group's scenario (``plan.mid``) once for
    its two frames, then each prompt's own question (``plan.tail``). Same scores as full
    prompts where :func:`shared_prefix_blocker` allows it; a model that rejects the cache
    at run time falls back to ``fallback`` (full prompts), logged once.
    """

    def __init__(self, call: ModelCall, encoded: list[list[int]], plan: PrefixPlan, cache_kw: str, config,
                 pad_id: int, device: torch.device, fallback: FullPrompts):
        self.call, self.encoded, self.plan, self.cache_kw, self.config = call, encoded, plan, cache_kw, config
        self.pad_id, self.device, self.fallback = pad_id, device, fallback
        self.root_cache = None
        self.failed = False

    def logits(self, idx: list[int]) -> torch.Tensor:
        if not self.failed:
            try:
                return self._shared_logits(idx)
            except UnsupportedModelError:
                raise
            except (TypeError, ValueError, AttributeError, NotImplementedError) as e:
                self.failed = True
                name = type(unwrap_model(self.call.model)).__name__
                log_once(self.call.model, f"shared-prefix scoring is not supported by {name} "
                         f"({type(e).__name__}: {e}); scoring full prompts")
        return self.fallback.logits(idx)

    def _new_cache(self):
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.config)
        except TypeError:
            return DynamicCache()

    def _root(self):
        """The cache of the prefix every prompt shares: computed once per call of ``run_batches``."""
        if self.root_cache is None:
            cache, r = self._new_cache(), len(self.plan.root)
            if r:
                ids = torch.tensor([self.plan.root], device=self.device)
                self.call(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1,
                          position_ids=torch.arange(r, device=self.device)[None], **{self.cache_kw: cache})
            self.root_cache = cache
        return self.root_cache

    def _shared_logits(self, idx: list[int]) -> torch.Tensor:
        plan, r, dev = self.plan, len(self.plan.root), self.device
        gids = list(dict.fromkeys(plan.group_of[i] for i in idx))
        cache = copy.deepcopy(self._root())
        cache.batch_repeat_interleave(len(gids))
        mid_ids, mid_mask = _left_pad([plan.mid[g] for g in gids], self.pad_id)
        ones = torch.ones((len(gids), r), dtype=torch.long)
        if mid_ids.shape[1]:  # each group's scenario, once for its two frames
            self.call(input_ids=mid_ids.to(dev), attention_mask=torch.cat([ones, mid_mask], 1).to(dev),
                      position_ids=_positions(mid_mask, r).to(dev), use_cache=True, logits_to_keep=1,
                      **{self.cache_kw: cache})
        rows = torch.tensor([gids.index(plan.group_of[i]) for i in idx])
        cache.batch_select_indices(rows.to(dev))
        tail_ids, tail_mask = _left_pad([plan.tail(self.encoded, i) for i in idx], self.pad_id)
        mid_len = mid_mask.sum(-1)[rows][:, None]
        mask = torch.cat([torch.ones((len(idx), r), dtype=torch.long), mid_mask[rows], tail_mask], 1)
        logits = self.call(input_ids=tail_ids.to(dev), attention_mask=mask.to(dev),
                           position_ids=_positions(tail_mask, r + mid_len).to(dev), use_cache=True,
                           logits_to_keep=1, **{self.cache_kw: cache})
        return logits[:, -1, :]


def choose_strategy(model, encoded: list[list[int]], pad_id: int, device: torch.device,
                    prefix_plan: PrefixPlan | None = None) -> FullPrompts | SharedPrefixes:
    """The one place that decides how batches run on ``model``; says why in the log (once) when not the fastest.

    Shared prefixes when a plan is given and :func:`~.model_info.shared_prefix_blocker` finds
    nothing against it; otherwise full prompts, left-padded unless padding would move the
    model's positions (:func:`~.model_info.padding_problem`), then unpadded.
    """
    name, args, call = type(unwrap_model(model)).__name__, ForwardArgs.of(model), ModelCall(model)
    unpadded = padding_problem(model, args)
    if unpadded:
        log_once(model, f"{name}: {unpadded}; scoring prompts in unpadded batches of one length "
                 "(same scores, more forward calls)")
    full = FullPrompts(call, encoded, args, pad_id, device, padded=unpadded is None)
    if prefix_plan is None or unpadded:
        return full
    blocker = shared_prefix_blocker(model, args, prefix_plan.cache_slots(encoded))
    if blocker:
        log_once(model, f"{name} cannot take the shared-prefix path: {blocker}; scoring full prompts "
                 "(same scores, more compute)")
        return full
    config = unwrap_model(model).config
    return SharedPrefixes(call, encoded, prefix_plan, args.cache_kw, config, pad_id, device, fallback=full)


def split_on_oom(logits_of, idx: list[int], device: torch.device):
    """Yield ``(indices, logits)`` for ``idx``, halving the batch until each part fits in memory.

    A prompt that does not fit alone re-raises. The retry runs after the ``except`` block,
    so the failed attempt's tensors (held by the exception's traceback) are freed first.
    """
    try:
        logits = logits_of(idx)
    except torch.OutOfMemoryError:
        if len(idx) == 1:
            raise
        logits = None
    if logits is not None:
        yield idx, logits
        return
    if device.type == "cuda":
        torch.cuda.empty_cache()
    half = len(idx) // 2
    yield from split_on_oom(logits_of, idx[:half], device)
    yield from split_on_oom(logits_of, idx[half:], device)


# ---- scoring a list of batches ----------------------------------------------------------------

@dataclass
class ScoreResult:
    """Per-prompt outputs, in the prompts' original order (NaN where not scored)."""

    p_yes: np.ndarray
    yn_mass: np.ndarray
    yn_top3: np.ndarray  # does an answer token (Yes/No, or true/false) rank in the top 3 next tokens?
    top_tokens: list = field(default_factory=list)  # [(token, prob)] x 10 for the sample prompt
    n_forward: int = 0


def run_batches(model, encoded: list[list[int]], batches: list[list[int]], tok, *, pad_id: int | None = None,
                sample_index: int | None = None, progress: bool = False, desc: str = "moral probe",
                prefix_plan: PrefixPlan | None = None, answer_format: str = DEFAULT_ANSWER_FORMAT) -> ScoreResult:
    """Score the prompts in ``batches`` (lists of indices into ``encoded``) on ``model``.

    ``answer_format`` names the answer tokens read at the answer position (``prompts.ANSWER_FORMATS``):
    the prompts must have been formatted for it.

    With a ``prefix_plan`` the shared prefixes are run once and their key/value cache is
    reused (fewer FLOPs, same scores) where the model allows it (:func:`choose_strategy`).
    The caller chooses the mode (eval, inference); see :func:`probe_mode`. A batch that
    runs out of memory is split in two and retried; a prompt that does not fit alone
    re-raises. NaN or infinite logits raise ``FloatingPointError``.
    """
    n = len(encoded)
    res = ScoreResult(np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool))
    if pad_id is None:
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    device = model_device(model)
    strategy = choose_strategy(model, encoded, pad_id, device, prefix_plan)
    yes, no = answer_token_ids(tok, answer_format)
    answer_ids = torch.tensor(sorted(set(yes) | set(no)), device=device)
    with _progress_bar(progress, sum(len(b) for b in batches), desc) as bar:
        for batch in batches:
            for idx, logits in split_on_oom(strategy.logits, batch, device):
                _record(res, idx, logits, tok, answer_ids, sample_index, answer_format)
                bar.update(len(idx))
    res.n_forward = strategy.call.n_forward
    return res


def _record(res: ScoreResult, idx: list[int], logits: torch.Tensor, tok, answer_ids: torch.Tensor,
            sample_index: int | None, answer_format: str = DEFAULT_ANSWER_FORMAT) -> None:
    """Write one batch's answer-position logits into ``res`` at the prompts' own indices."""
    # One summing pass instead of isfinite().all() (~15x faster on a 151k vocabulary): the sum is finite
    # exactly when every logit is (a NaN or an infinity anywhere makes it NaN or infinite).
    if not torch.isfinite(torch.sum(logits, dtype=torch.float32)):
        raise FloatingPointError("the model produced NaN or infinite logits at the answer position "
                                 f"(batch of {len(idx)} prompts)")
    p_yes, yn_mass = score_prompts(logits, tok, answer_format)
    top3 = torch.isin(logits.topk(3, dim=-1).indices, answer_ids).any(-1).cpu().numpy()
    res.p_yes[idx], res.yn_mass[idx], res.yn_top3[idx] = p_yes, yn_mass, top3
    if sample_index is not None and sample_index in idx:
        probs = torch.softmax(logits[idx.index(sample_index)].float(), -1)
        top = probs.topk(10)
        res.top_tokens = [(tok.decode([t]), float(p))
                          for t, p in zip(top.indices.tolist(), top.values.tolist(), strict=True)]


class _NoBar:
    def update(self, n: int) -> None:
        pass


@contextlib.contextmanager
def _progress_bar(progress: bool, total: int, desc: str):
    if not progress:
        yield _NoBar()
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit="prompt", leave=False)
    try:
        yield bar
    finally:
        bar.close()


@contextlib.contextmanager
def probe_mode(model):
    """Eval mode and inference mode for the probe; afterwards everything is as before.

    Restores each module's train/eval flag and every RNG state (Python, numpy, torch
    CPU and CUDA), so observing a training run cannot change it.
    """
    training = {m: m.training for m in model.modules()}
    py_state, np_state = random.getstate(), np.random.get_state()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    model.eval()
    try:
        with torch.inference_mode():
            yield model
    finally:
        for m, flag in training.items():
            m.training = flag
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
