"""The scoring engine: prompts in, per-prompt P(Yes) and Yes+No mass out (P(true), true+false with JSON answers).

Only the answer position's logits are computed (``logits_to_keep=1``), on left-padded batches run by one of three
strategies, fastest first (:data:`STRATEGIES`). docs/engine.md.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..errors import UnsupportedModelError
from .answers import AnswerScores, score_prompts
from .batching import PrefixPlan, encode_prompts
from .model_info import (
    NEEDS,
    ForwardArgs,
    class_name,
    forward_params,
    held_ref,
    model_device,
    pad_token_id,
    padding_problem,
    shared_prefix_blocker,
    unwrap_model,
)
from .prompts import DEFAULT_ANSWER_FORMAT, answer_token_ids

logger = logging.getLogger("tinymcf_callback")

STRATEGIES = ("shared", "full", "unpadded")  # fastest first; each one after the first is safer than the one before
# transformers' cache layers that hold a layer's keys and values as two tensors and only concatenate to them: the shared
# root may be handed to a batch as views of its one row (SharedPrefixes._root_rows)
VIEWED_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer")
STRATEGY_WORDS = {"shared": "shared prefixes", "full": "full prompts (left-padded)",
                  "unpadded": "unpadded prompts (one length per forward call)"}


# ---- running the model: three strategies -----------------------------------------------------

class LogOnce:
    """Warnings said once per model and cause, for the probe that holds it (never for the whole process).

    ``key`` (default: the message) names the cause when the message carries a number that changes from probe to probe.
    """

    def __init__(self):
        self._model = None  # the model the causes below were said for (model_info.held_ref: weakly where it can)
        self._said: set = set()

    def __call__(self, model, message: str, key=None) -> None:
        held = held_ref(model)
        if held != self._model:  # another model (a weak reference equals another only while both hold one model)
            self._model, self._said = held, set()
        key = message if key is None else key
        if key not in self._said:
            self._said.add(key)
            if _is_main_process():  # under several processes every rank decides alike: one of them says so
                logger.warning(message)


def _is_main_process() -> bool:
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class ModelCall:
    """Calls the model (the wrapper, so FSDP can gather its parameters) and counts forward calls."""

    def __init__(self, model):
        self.model, self.n_forward = model, 0

    def __call__(self, **kwargs):
        self.n_forward += 1  # counted before the call: a call that raises still ran the model's collectives
        out = self.model(**kwargs)
        logits = getattr(out, "logits", None)
        if logits is None:
            raise UnsupportedModelError(f"{class_name(self.model)} returned no logits; {NEEDS}")
        return logits

    def dummy(self, token: int, device: torch.device, args: ForwardArgs) -> None:
        """One forward call of a single token whose result is dropped (evens out the calls of ranks under sharding)."""
        ids = torch.tensor([[token]])
        self(**_forward_kwargs(ids, torch.ones_like(ids), args, device))


def _left_pad(seqs: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows padded on the left to ``width`` (default: the longest row), and their attention mask.

    Built as one tensor each: row by row was 30% of a probe's tensor operations on a GPU's plan (issue 40)."""
    lengths = [len(q) for q in seqs]
    width = max([*lengths, width or 0])
    if not seqs:
        return torch.zeros((0, width), dtype=torch.long), torch.zeros((0, width), dtype=torch.long)
    ids = torch.tensor([[pad_id] * (width - n) + list(q) for q, n in zip(seqs, lengths, strict=True)],
                       dtype=torch.long).reshape(len(seqs), width)
    mask = (torch.arange(width) >= width - torch.tensor(lengths)[:, None]).long()
    return ids, mask


def _positions(mask: torch.Tensor, offset) -> torch.Tensor:
    """Positions that skip left padding, continuing from ``offset`` (an int or a column)."""
    return offset + (mask.cumsum(-1) - 1).clamp(min=0)


def _forward_kwargs(ids: torch.Tensor, mask: torch.Tensor, args: ForwardArgs, device) -> dict:
    """A forward call's arguments for left-padded rows: position ids that skip the padding, no cache."""
    kwargs = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if args.position_ids:
        kwargs["position_ids"] = _positions(mask, args.position_base).to(device)
    kwargs["use_cache"] = False
    if args.logits_to_keep:
        kwargs["logits_to_keep"] = 1
    return kwargs


def encode_batch(tok, prompts: list[str], model=None, *, device=None) -> dict:
    """The model's inputs for ``prompts``, as the engine builds them: ``logits = model(**batch).logits[:, -1]``.

    - the prompts' own tokens only (``add_special_tokens=False``: :func:`~tinymcf_callback.format_prompts`
      already wrote the chat template's special tokens, a tokenizer's BOS would come twice);
    - left padding whatever the tokenizer's ``padding_side`` (a right-padded row's last position is a pad
      token, not the answer: P(Yes) off by 0.27 on SmolLM2-135M);
    - ``position_ids`` that skip the padding, counted from where ``model`` counts (``padding_idx + 1``
      for RoBERTa-style embeddings), when its forward takes them; ``use_cache=False``.

    Without ``model``: position ids from 0 and a pad id from the tokenizer. ``device``: where the
    tensors go (default: the model's device, else CPU). Score the logits with
    :func:`~tinymcf_callback.score_prompts`.
    """
    seqs = encode_prompts(tok, prompts)
    if model is not None:
        args, pad_id = ForwardArgs.of(model), pad_token_id(model, tok)
        device = model_device(model) if device is None else device
    else:
        args = ForwardArgs(position_ids=True, logits_to_keep=False, cache_kw=None)
        pad_id = next((t for t in (tok.pad_token_id, tok.eos_token_id) if isinstance(t, int)), 0)
    return _forward_kwargs(*_left_pad(seqs, pad_id), replace(args, logits_to_keep=False), device)


class FullPrompts:
    """Strategies ``"full"`` (left-padded rows) and ``"unpadded"`` (``padded=False``: one prompt length per call):
    each prompt whole, so every answer sits in the last column."""

    def __init__(self, call: ModelCall, encoded: list[list[int]], args: ForwardArgs, pad_id: int,
                 device: torch.device, padded: bool = True):
        self.call, self.encoded, self.args, self.pad_id, self.device = call, encoded, args, pad_id, device
        self.padded = padded
        self.name = "full" if padded else "unpadded"

    def planned_calls(self, batches: list[list[int]]) -> int:
        """The forward calls :meth:`logits` makes for ``batches`` (barring out-of-memory splits)."""
        if self.padded:
            return len(batches)
        return sum(len({len(self.encoded[i]) for i in b}) for b in batches)

    def logits(self, idx: list[int], layout: tuple[int, ...] | None = None) -> torch.Tensor:
        """The answer position's logits of ``idx``; ``layout``: ``(width,)``, pad the rows to that width as the batch
        they were scored in did (the self-check's replay of a few of its rows)."""
        if self.padded:
            return self._forward(idx, layout[0] if layout else None)
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

    def _forward(self, idx: list[int], width: int | None = None) -> torch.Tensor:
        ids, mask = _left_pad([self.encoded[i] for i in idx], self.pad_id, width)
        return self.call(**_forward_kwargs(ids, mask, self.args, self.device))[:, -1, :]


class SharedPrefixes:
    """Strategy ``"shared"``: the prefix every prompt shares (``plan.root``) once per call of :func:`run_batches`;
    per batch, each group's scenario (``plan.mid``) once for its two frames, then each question (``plan.tail``)."""

    name = "shared"

    def __init__(self, call: ModelCall, encoded: list[list[int]], plan: PrefixPlan, args: ForwardArgs, config,
                 pad_id: int, device: torch.device):
        self.call, self.encoded, self.plan, self.args, self.config = call, encoded, plan, args, config
        self.pad_id, self.device = pad_id, device
        self.root_cache = None

    def planned_calls(self, batches: list[list[int]]) -> int:
        """The forward calls :meth:`logits` makes for ``batches``: the header once, then scenarios and questions."""
        if not batches:
            return 0
        scenarios = sum(any(self.plan.mid[self.plan.group_of[i]] for i in b) for b in batches)
        return (1 if self.plan.root else 0) + scenarios + len(batches)

    def _new_cache(self):
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.config)
        except TypeError:
            return DynamicCache()

    def _root_rows(self, n: int):
        """The shared root's cache as ``n`` rows, the root's own cache left as it is: ``expand`` views of its one row
        where every layer only concatenates to its tensors (:data:`VIEWED_LAYERS`), else a copy repeated row by row."""
        root = self._root()
        layers = getattr(root, "layers", None)
        if layers is not None and all(type(layer).__name__ in VIEWED_LAYERS for layer in layers):
            cache = copy.copy(root)
            cache.layers = [copy.copy(layer) for layer in layers]
            for layer in cache.layers:
                if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel():
                    layer.keys = layer.keys.expand(n, *layer.keys.shape[1:])
                    layer.values = layer.values.expand(n, *layer.values.shape[1:])
            return cache
        cache = copy.deepcopy(root)
        cache.batch_repeat_interleave(n)
        return cache

    def _root(self):
        """The cache of the prefix every prompt shares: computed once per call of ``run_batches``."""
        if self.root_cache is None:
            cache, r = self._new_cache(), len(self.plan.root)
            if r:
                ids = torch.tensor([self.plan.root], device=self.device)
                positions = self.args.position_base + torch.arange(r, device=self.device)[None]
                self.call(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1,
                          position_ids=positions, **{self.args.cache_kw: cache})
            self.root_cache = cache
        return self.root_cache

    def logits(self, idx: list[int], layout: tuple[int, ...] | None = None) -> torch.Tensor:
        """The answer position's logits of ``idx``; ``layout``: ``(scenario width, question width)``, pad the two
        seams to those widths as the batch they were scored in did (the self-check's replay of a few rows)."""
        plan, r, dev, base = self.plan, len(self.plan.root), self.device, self.args.position_base
        mid_width, tail_width = layout or (None, None)
        gids = list(dict.fromkeys(plan.group_of[i] for i in idx))
        cache = self._root_rows(len(gids))
        mid_ids, mid_mask = _left_pad([plan.mid[g] for g in gids], self.pad_id, mid_width)
        ones = torch.ones((len(gids), r), dtype=torch.long)
        if mid_ids.shape[1]:  # each group's scenario, once for its two frames
            self.call(input_ids=mid_ids.to(dev), attention_mask=torch.cat([ones, mid_mask], 1).to(dev),
                      position_ids=_positions(mid_mask, base + r).to(dev), use_cache=True, logits_to_keep=1,
                      **{self.args.cache_kw: cache})
        where = {g: n for n, g in enumerate(gids)}
        rows = torch.tensor([where[plan.group_of[i]] for i in idx])
        if len(idx) != len(gids):  # each question gets its scenario's row (one row a scenario already: nothing to do)
            cache.batch_select_indices(rows.to(dev))
        tail_ids, tail_mask = _left_pad([plan.tail(self.encoded, i) for i in idx], self.pad_id, tail_width)
        mid_len = mid_mask.sum(-1)[rows][:, None]
        mask = torch.cat([torch.ones((len(idx), r), dtype=torch.long), mid_mask[rows], tail_mask], 1)
        logits = self.call(input_ids=tail_ids.to(dev), attention_mask=mask.to(dev),
                           position_ids=_positions(tail_mask, base + r + mid_len).to(dev), use_cache=True,
                           logits_to_keep=1, **{self.args.cache_kw: cache})
        return logits[:, -1, :]


Strategy = FullPrompts | SharedPrefixes


def first_strategy(model, encoded: list[list[int]], prefix_plan: PrefixPlan | None = None) -> tuple[str, str | None]:
    """The fastest strategy nothing in the model's class or config is known against, and why not a faster one (None:
    nothing to explain). A config the rules cannot read starts at ``"full"`` rather than failing."""
    try:
        args = ForwardArgs.of(model)
        unpadded = padding_problem(model, args)
        if unpadded:
            return "unpadded", unpadded
        if prefix_plan is None:
            return "full", None
        blocker = shared_prefix_blocker(model, args, prefix_plan.cache_slots(encoded))
    except Exception as e:  # noqa: BLE001 - the rules only pick a starting point: a config they cannot read is no crash
        return "full", f"its config could not be read ({type(e).__name__}: {e})"
    return ("full", blocker) if blocker else ("shared", None)


def explain_start(model, strategy: str, reason: str | None, say: LogOnce) -> None:
    """Say (once per model, through the probe's ``say``) why it does not start on the fastest strategy."""
    if reason is None:
        return
    name = class_name(model)
    if strategy == "unpadded":
        say(model, f"{name}: {reason}; scoring prompts in unpadded batches of one length "
                 "(same scores, more forward calls)")
    else:
        say(model, f"{name} cannot take the shared-prefix path: {reason}; scoring full prompts "
                 "(same scores, more compute)")


def make_strategy(name: str, model, encoded: list[list[int]], pad_id: int, device: torch.device,
                  prefix_plan: PrefixPlan | None = None) -> Strategy:
    """The strategy called ``name`` (one of :data:`STRATEGIES`) on ``model``, with a fresh forward-call counter."""
    args, call = ForwardArgs.of(model), ModelCall(model)
    if name == "shared":
        if prefix_plan is None or not (args.cache_kw and args.position_ids and args.logits_to_keep):
            raise ValueError("the shared strategy needs a prefix plan and a forward that takes position_ids, "
                             "logits_to_keep and a key/value cache")
        return SharedPrefixes(call, encoded, prefix_plan, args, unwrap_model(model).config, pad_id, device)
    if name not in ("full", "unpadded"):
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    return FullPrompts(call, encoded, args, pad_id, device, padded=name == "full")


def split_on_oom(logits_of, idx: list[int], device: torch.device):
    """Yield ``(indices, logits)`` for ``idx``, halving the batch until each part fits in memory (a prompt that does
    not fit alone re-raises). The retry runs after the ``except`` block, so the failed attempt's tensors are freed."""
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
    strategy: str | None = None  # the strategy that produced them
    check: dict | None = None  # the self-check's record (SelfCheck.as_dict), when scored through it
    precision: dict | None = None  # what the forward calls computed in (Precision.as_dict)
    model: str | None = None  # the model's name or path (its config's ``name_or_path``), else its class
    backend: dict | None = None  # a served model's server, request form and bounds (None: the local forward pass)
    batch_plan: dict | None = None  # the device's batch plan (BatchPlan.as_dict; None: a served model, or batches=)


def empty_result(n: int) -> ScoreResult:
    return ScoreResult(np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool))


def joined(parts: list[tuple[list[int], ScoreResult]], n: int) -> ScoreResult:
    """Scorings of subsets of one probe's ``n`` prompts (``(rows, result)``) as one result: scores at their rows,
    counts summed, the safest strategy, the first part's precision, model, sample tokens and backend."""
    first = parts[0][1]
    res = empty_result(n)
    for rows, part in parts:
        res.p_yes[rows], res.yn_mass[rows] = part.p_yes[rows], part.yn_mass[rows]
        if len(part.yn_top3):
            res.yn_top3[rows] = part.yn_top3[rows]
    if not all(len(part.yn_top3) for _, part in parts):  # a served form that read no top tokens: unknown
        res.yn_top3 = np.zeros(0, dtype=bool)
    res.n_forward = sum(part.n_forward for _, part in parts)
    rank = {name: level for level, name in enumerate(STRATEGIES)}
    res.strategy = max((part.strategy for _, part in parts if part.strategy), key=lambda s: rank.get(s, -1),
                       default=first.strategy)
    res.top_tokens, res.precision = first.top_tokens, first.precision
    res.model, res.backend = first.model, first.backend
    plans = [part.batch_plan for _, part in parts if part.batch_plan]
    res.batch_plan = {**plans[0], "batches": sum(p["batches"] for p in plans)} if plans else None
    return res


def run_batches(model, encoded: list[list[int]], batches: list[list[int]], tok, *, pad_id: int | None = None,
                sample_index: int | None = None, progress: bool = False, desc: str = "moral probe",
                prefix_plan: PrefixPlan | None = None, answer_format: str = DEFAULT_ANSWER_FORMAT,
                strategy: str | None = None, calls: int | None = None, say: LogOnce | None = None) -> ScoreResult:
    """Score the prompts in ``batches`` (lists of indices into ``encoded``) on ``model`` with one strategy.

    ``strategy``: default :func:`first_strategy` (said through ``say``). ``calls``: make exactly this many forward
    calls, one-token fillers where the batches need fewer (every rank of a sharded model must make the same number).
    """
    res = empty_result(len(encoded))
    if pad_id is None:
        pad_id = pad_token_id(model, tok)
    device = model_device(model)
    if strategy is None:
        strategy, reason = first_strategy(model, encoded, prefix_plan)
        explain_start(model, strategy, reason, say or LogOnce())
    runner = make_strategy(strategy, model, encoded, pad_id, device, prefix_plan)
    yes, no = answer_token_ids(tok, answer_format)
    answer_ids = torch.tensor(sorted(set(yes) | set(no)), device=device)
    from tqdm.auto import tqdm

    total = sum(len(b) for b in batches)
    try:
        with tqdm(total=total, desc=desc, unit="prompt", leave=False, disable=not progress) as bar:
            for batch in batches:
                for idx, logits in split_on_oom(runner.logits, batch, device):
                    _record(res, idx, logits, tok, answer_ids, sample_index, answer_format)
                    bar.update(len(idx))
    finally:
        if calls is not None:  # also after a failure: the other ranks are still making theirs
            pad_calls(runner.call, calls, encoded, device)
    res.n_forward, res.strategy = runner.call.n_forward, strategy
    return res


def pad_calls(call: ModelCall, calls: int, encoded: list[list[int]], device: torch.device) -> None:
    """Make one-token forward calls until ``call`` has made ``calls`` in all (none when it already has)."""
    token = encoded[0][0] if encoded and encoded[0] else 0
    args = ForwardArgs.of(call.model)
    while call.n_forward < calls:
        try:
            call.dummy(token, device, args)
        except Exception as e:  # noqa: BLE001 - a filler call must not hide the error that made it needed
            logger.warning("moral probe: a filler forward call failed (%s: %s)", type(e).__name__, e)


def score_alone(model, encoded: list[list[int]], idx: list[int], tok, answer_format: str = DEFAULT_ANSWER_FORMAT,
                call: ModelCall | None = None) -> tuple[AnswerScores, int]:
    """The simplest reference: each prompt of ``idx`` alone, unpadded, no mask, position ids or cache. Returns the
    scores (in ``idx`` order) and the forward calls made. ``logits_to_keep=1`` where the forward takes it: a long
    prompt's full ``[1, seq, vocab]`` logits could take hundreds of MB of a training run's memory."""
    call = call if call is not None else ModelCall(model)
    before = call.n_forward
    params = forward_params(model)
    device = model_device(model)
    rows = []
    for i in idx:
        kwargs = {"input_ids": torch.tensor([encoded[i]], device=device)}
        if "use_cache" in params:
            kwargs["use_cache"] = False
        if "logits_to_keep" in params:
            kwargs["logits_to_keep"] = 1
        rows.append(call(**kwargs)[0, -1].float())
    return score_prompts(torch.stack(rows), tok, answer_format), call.n_forward - before


def _record(res: ScoreResult, idx: list[int], logits: torch.Tensor, tok, answer_ids: torch.Tensor,
            sample_index: int | None, answer_format: str = DEFAULT_ANSWER_FORMAT) -> None:
    """Write one batch's answer-position logits into ``res`` at the prompts' own indices."""
    # One summing pass instead of isfinite().all() (~15x faster on a 151k vocabulary): the sum is finite
    # exactly when every logit is (a NaN or an infinity anywhere makes it NaN or infinite).
    if not torch.isfinite(torch.sum(logits, dtype=torch.float32)):
        raise FloatingPointError("the model produced NaN or infinite logits at the answer position "
                                 f"(batch of {len(idx)} prompts)")
    scored = score_prompts(logits, tok, answer_format)
    top3 = torch.isin(logits.topk(3, dim=-1).indices, answer_ids).any(-1).cpu().numpy()
    res.p_yes[idx], res.yn_mass[idx], res.yn_top3[idx] = scored.p_yes, scored.yn_mass, top3
    if sample_index is not None and sample_index in idx:
        probs = torch.softmax(logits[idx.index(sample_index)].float(), -1)
        top = probs.topk(10)
        res.top_tokens = [(tok.decode([t]), float(p))
                          for t, p in zip(top.indices.tolist(), top.values.tolist(), strict=True)]
