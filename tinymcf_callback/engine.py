"""The scoring engine: prompts in, per-prompt P(Yes) and Yes+No mass out.

Only the answer position matters, so the engine never builds a ``[batch, seq, vocab]``
tensor: it asks the model for the last position's logits (``logits_to_keep=1``) on
left-padded batches, with ``position_ids`` that skip the padding so every prompt sees
the positions it would see alone (needed for absolute-position models; harmless for
RoPE). Which prompts share a batch is decided apart from running the model
(:func:`plan_batches`), so a distributed caller can hand each rank its own share.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import random
from dataclasses import dataclass, field

import numpy as np
import torch

from .prompts import answer_token_ids

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


def score_prompts(logits, tok) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt ``p_yes`` (Yes against No only) and ``yn_mass`` (Yes+No over the vocabulary).

    ``logits``: ``[n_prompts, vocab]`` at the answer position (a tensor or an array).
    Every Yes and No variant of the tokenizer counts (see ``answer_token_ids``).
    """
    yes, no = answer_token_ids(tok)
    logits = torch.as_tensor(logits)
    logp = torch.log_softmax(logits.float(), dim=-1)
    lyes = torch.logsumexp(logp[:, yes], dim=-1)
    lno = torch.logsumexp(logp[:, no], dim=-1)
    p_yes = torch.sigmoid(lyes - lno)
    yn_mass = lyes.exp() + lno.exp()
    return p_yes.double().cpu().numpy(), yn_mass.double().cpu().numpy()


def model_device(model) -> torch.device:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None and getattr(emb, "weight", None) is not None and emb.weight.device.type != "meta":
        return emb.weight.device
    return next(model.parameters()).device


def _forward_params(model) -> set[str]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT
    base = getattr(base, "_orig_mod", base)  # torch.compile
    return set(inspect.signature(type(base).forward).parameters)


def max_context(model) -> int | None:
    cfg = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        val = getattr(cfg, key, None)
        if isinstance(val, int) and val > 0:
            return val
    return None


@dataclass
class ScoreResult:
    """Per-prompt outputs, in the prompts' original order (NaN where not scored)."""

    p_yes: np.ndarray
    yn_mass: np.ndarray
    yn_top3: np.ndarray  # does a Yes/No token rank in the top 3 next tokens?
    top_tokens: list = field(default_factory=list)  # [(token, prob)] x 10 for the sample prompt
    n_forward: int = 0


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


def run_batches(model, encoded: list[list[int]], batches: list[list[int]], tok, *, pad_id: int | None = None,
                sample_index: int | None = None, progress: bool = False, desc: str = "moral probe",
                prefix_plan: PrefixPlan | None = None) -> ScoreResult:
    """Score the prompts in ``batches`` (lists of indices into ``encoded``) on ``model``.

    With a ``prefix_plan`` the shared prefixes are run once and their key/value cache is
    reused (fewer FLOPs, same scores); models that cannot take a cache fall back to
    plain left-padded batches. The caller chooses the mode (eval, inference); see
    :func:`probe_mode`. A batch that runs out of memory is split in two and retried; a
    prompt that does not fit alone re-raises. NaN or infinite logits raise
    ``FloatingPointError``.
    """
    n = len(encoded)
    res = ScoreResult(np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool))
    if pad_id is None:
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    device = model_device(model)
    params = _forward_params(model)
    takes_positions = "position_ids" in params
    keeps_last = "logits_to_keep" in params
    cache_kw = "cache" if "cache" in params else ("past_key_values" if "past_key_values" in params else None)
    yes, no = answer_token_ids(tok)
    answer_ids = torch.tensor(sorted(set(yes) | set(no)), device=device)
    shared = {"on": prefix_plan is not None and takes_positions and keeps_last and cache_kw is not None, "root": None}

    def plain_logits(idx):
        ids, mask = _left_pad([encoded[i] for i in idx], pad_id)
        kwargs = {"input_ids": ids.to(device), "attention_mask": mask.to(device), "use_cache": False}
        if takes_positions:
            kwargs["position_ids"] = _positions(mask, 0).to(device)
        if keeps_last:
            kwargs["logits_to_keep"] = 1
        res.n_forward += 1
        return model(**kwargs).logits[:, -1, :]

    def new_cache():
        from transformers import DynamicCache

        try:
            return DynamicCache(config=model.config)
        except TypeError:
            return DynamicCache()

    def shared_logits(idx):
        plan, r = prefix_plan, len(prefix_plan.root)
        if shared["root"] is None:  # the prefix every prompt shares: once per call
            root_cache = new_cache()
            if r:
                ids = torch.tensor([plan.root], device=device)
                model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(r, device=device)[None],
                      use_cache=True, logits_to_keep=1, **{cache_kw: root_cache})
                res.n_forward += 1
            shared["root"] = root_cache
        gids = list(dict.fromkeys(plan.group_of[i] for i in idx))
        cache = copy.deepcopy(shared["root"])
        cache.batch_repeat_interleave(len(gids))
        mid_ids, mid_mask = _left_pad([plan.mid[g] for g in gids], pad_id)
        ones = torch.ones((len(gids), r), dtype=torch.long)
        if mid_ids.shape[1]:  # each group's shared middle (the scenario), once per group
            model(input_ids=mid_ids.to(device), attention_mask=torch.cat([ones, mid_mask], 1).to(device),
                  position_ids=_positions(mid_mask, r).to(device), use_cache=True, logits_to_keep=1, **{cache_kw: cache})
            res.n_forward += 1
        rows = torch.tensor([gids.index(plan.group_of[i]) for i in idx])
        cache.batch_select_indices(rows.to(device))
        tail_ids, tail_mask = _left_pad([plan.tail(encoded, i) for i in idx], pad_id)
        mid_len = mid_mask.sum(-1)[rows][:, None]
        mask = torch.cat([torch.ones((len(idx), r), dtype=torch.long), mid_mask[rows], tail_mask], 1)
        out = model(input_ids=tail_ids.to(device), attention_mask=mask.to(device),
                    position_ids=_positions(tail_mask, r + mid_len).to(device), use_cache=True, logits_to_keep=1,
                    **{cache_kw: cache})
        res.n_forward += 1
        return out.logits[:, -1, :]

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(len(b) for b in batches), desc=desc, unit="prompt", leave=False)

    def run(idx: list[int]) -> None:
        try:
            if shared["on"]:
                try:
                    logits = shared_logits(idx)
                except (TypeError, ValueError, AttributeError, NotImplementedError) as e:
                    logger.warning("shared-prefix scoring is not supported by %s (%s: %s); scoring full prompts",
                                   type(model).__name__, type(e).__name__, e)
                    shared["on"] = False
                    logits = plain_logits(idx)
            else:
                logits = plain_logits(idx)
        except torch.OutOfMemoryError:
            if len(idx) == 1:
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
            half = len(idx) // 2
            run(idx[:half])
            run(idx[half:])
            return
        if not torch.isfinite(logits).all():
            raise FloatingPointError(f"the model produced NaN or infinite logits at the answer position (batch of {len(idx)} prompts)")
        p_yes, yn_mass = score_prompts(logits, tok)
        top3 = torch.isin(logits.topk(3, dim=-1).indices, answer_ids).any(-1).cpu().numpy()
        res.p_yes[idx], res.yn_mass[idx], res.yn_top3[idx] = p_yes, yn_mass, top3
        if sample_index is not None and sample_index in idx:
            probs = torch.softmax(logits[idx.index(sample_index)].float(), -1)
            top = probs.topk(10)
            res.top_tokens = [(tok.decode([t]), float(p)) for t, p in zip(top.indices.tolist(), top.values.tolist())]
        if bar is not None:
            bar.update(len(idx))

    try:
        for b in batches:
            run(b)
    finally:
        if bar is not None:
            bar.close()
    return res


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
