"""Which prompts go into which forward call, decided without the model: from token ids and plain numbers alone
(the device's kind, its free memory, what a token costs the model), so every rank plans alike and a test can call
each rule with any device.
"""

from __future__ import annotations

from dataclasses import dataclass

# The CPU's plan (and any device without a rule of its own): on two cores a forward call of 8192 padded tokens runs
# the matrix products at 88-90% of a large product's rate (docs/engine.md), and larger calls gain nothing.
DEFAULT_TOKEN_BUDGET = 8192
DEFAULT_MAX_BATCH = 64
# A GPU's plan: a forward call of a small model is launch-bound (issue 40: Qwen3-0.6B on an H200 spent 0.33 s of a 1 s
# probe on the GPU in 35 calls of 64 prompts), so a call takes as much of the free memory's share as the model's
# tokens and rows need, up to these caps (at the caps the scifi and Clifford sets take one or two batches).
GPU_TOKEN_CAP = 131_072
GPU_BATCH_CAP = 1024
GPU_MEMORY_SHARE = 0.25  # of the memory free on the device when the probe first scores a model there
SIZED_DEVICES = ("cuda",)  # device kinds with a rule of their own; others take the CPU's plan


@dataclass(frozen=True)
class BatchSize:
    """How much one forward call may hold, and why: ``token_budget`` padded tokens, ``max_batch_size`` prompts.

    ``rule``: ``"given"``, ``"cpu"``, or the device's rule with its figures. ``balance``: spread the prompts evenly
    (the device's rule only: in bfloat16 a prompt's P(Yes) moves with its batch, so the CPU's plan keeps its batches).
    """

    token_budget: int
    max_batch_size: int
    rule: str
    balance: bool = False

    def as_dict(self) -> dict:
        return {"token_budget": self.token_budget, "max_batch_size": self.max_batch_size, "rule": self.rule}


def batch_size_for(device_type: str, free_bytes: int | None = None, token_bytes: int | None = None,
                   row_bytes: int = 0, *, token_budget: int | None = None,
                   max_batch_size: int | None = None) -> BatchSize:
    """The size of a forward call on a device of kind ``device_type`` (``"cpu"``, ``"cuda"``, ...): a pure rule.

    ``token_budget`` and ``max_batch_size``, when given, are kept. On a GPU with known free memory and costs
    (:func:`~.model_info.memory_per_token`) the call takes :data:`GPU_MEMORY_SHARE` of the free memory: half of it by
    the prompts' rows, the rest by tokens, within the caps. Anywhere else: the CPU's plan. docs/engine.md.
    """
    if token_budget is not None and max_batch_size is not None:
        return BatchSize(token_budget, max_batch_size, "given")
    sized = device_type in SIZED_DEVICES and free_bytes is not None and token_bytes
    if not sized:
        why = "cpu" if device_type == "cpu" else f"{device_type}: the CPU's plan"
        if device_type in SIZED_DEVICES:
            why = f"{device_type}: the CPU's plan (the free memory or the model's size per token is unknown)"
        return BatchSize(token_budget or DEFAULT_TOKEN_BUDGET, max_batch_size or DEFAULT_MAX_BATCH, why)
    room = GPU_MEMORY_SHARE * max(0, free_bytes)
    rows = max_batch_size or max(1, min(GPU_BATCH_CAP, int(room / (2 * row_bytes)) if row_bytes else GPU_BATCH_CAP))
    tokens = token_budget or max(1, min(GPU_TOKEN_CAP, int((room - rows * row_bytes) / token_bytes)))
    if token_budget is None and tokens > 256:
        tokens -= tokens % 256
    rule = (f"{device_type}: {GPU_MEMORY_SHARE:.0%} of {free_bytes / 2**30:.1f} GiB free, "
            f"{token_bytes / 2**10:.0f} KiB a token, {row_bytes / 2**20:.1f} MiB a prompt's logits")
    return BatchSize(tokens, rows, rule, balance=True)


def encode_prompts(tok, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt; the special tokens are already in the prompt text."""
    return tok(list(prompts), add_special_tokens=False)["input_ids"]


def plan_batches(lengths: list[int], token_budget: int = DEFAULT_TOKEN_BUDGET,
                 max_batch_size: int = DEFAULT_MAX_BATCH, sizes: list[int] | None = None,
                 balance: bool = False) -> list[list[int]]:
    """Group item indices into batches of at most ``token_budget`` padded tokens.

    Sorted longest first: similar lengths share a batch, and running out of memory shows at once. ``sizes``: the rows
    each item brings (a group); an item larger than the budget gets a batch alone. ``balance``: as many batches, with
    the rows spread evenly over them (each still within the budget).
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
    if balance and len(batches) > 1:
        return _evened(order, lengths, sizes, len(batches), token_budget, max_batch_size) or batches
    return batches


def _evened(order: list[int], lengths: list[int], sizes: list[int], k: int, token_budget: int,
            max_batch_size: int) -> list[list[int]] | None:
    """``order`` cut into ``k`` runs of about equal rows; None when a run would break the budget or the size."""
    total, runs, cur, done = sum(sizes), [], [], 0
    for i in order:
        cur.append(i)
        done += sizes[i]
        if len(runs) < k - 1 and done * k >= total * (len(runs) + 1):
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    for run in runs:
        rows = sum(sizes[i] for i in run)
        if len(run) > 1 and (max(lengths[i] for i in run) * rows > token_budget or rows > max_batch_size):
            return None
    return runs if len(runs) == k else None


@dataclass(frozen=True)
class BatchPlan:
    """A probe's batches on one device: which prompts each forward call takes, and the size they were planned to."""

    device: str
    size: BatchSize
    batches: list[list[int]]

    def as_dict(self) -> dict:
        """What a report records (``info.batches``): the device, the size and its rule, and how many batches."""
        return {"device": self.device, **self.size.as_dict(), "batches": len(self.batches)}


def plan_probe_batches(encoded: list[list[int]], groups: list[list[int]] | None, size: BatchSize,
                       device: str = "cpu", rows: list[int] | None = None) -> BatchPlan:
    """A probe's batches at ``size``: whole groups (the frames of one text, which share their scenario) when
    ``groups`` is given, else single prompts. ``rows``: of those prompts only (indices kept; whole groups), batched
    as a probe of them alone batches them."""
    keep = None if rows is None else set(rows)
    if groups is not None:
        groups = groups if keep is None else [g for g in groups if keep.issuperset(g)]
        batches = plan_group_batches(encoded, groups, size.token_budget, size.max_batch_size, size.balance)
    else:
        index = range(len(encoded)) if keep is None else sorted(keep)
        batches = [[index[i] for i in b] for b in plan_batches([len(encoded[i]) for i in index], size.token_budget,
                                                                size.max_batch_size, balance=size.balance)]
    return BatchPlan(device, size, batches)


@dataclass
class PrefixPlan:
    """Token prefixes shared by prompts: ``root`` by every prompt (the chat header), ``mid[group]`` by the two frames
    of one text (the scenario); prompt ``i``'s own part (:meth:`tail`) is never empty."""

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


def plan_group_batches(encoded, groups, token_budget=DEFAULT_TOKEN_BUDGET, max_batch_size=DEFAULT_MAX_BATCH,
                       balance: bool = False):
    """Batches of prompt indices made of whole groups, under the token budget (``balance``: :func:`plan_batches`)."""
    lengths = [max(len(encoded[i]) for i in g) for g in groups]
    gb = plan_batches(lengths, token_budget, max_batch_size, sizes=[len(g) for g in groups], balance=balance)
    return [[i for g in b for i in groups[g]] for b in gb]


def seam_padding(encoded: list[list[int]], batch: list[int], plan: PrefixPlan) -> dict[int, tuple[int, int]]:
    """On the shared path: how many padded cache slots each prompt of ``batch`` gets before its scenario (padded to the
    batch's longest scenario) and before its question (padded to the batch's longest question)."""
    mids = {i: len(plan.mid[plan.group_of[i]]) for i in batch}
    tails = {i: len(plan.tail(encoded, i)) for i in batch}
    widest_mid, widest_tail = max(mids.values()), max(tails.values())
    return {i: (widest_mid - mids[i], widest_tail - tails[i]) for i in batch}


def padding_per_prompt(encoded: list[list[int]], batches: list[list[int]], strategy: str,
                       plan: PrefixPlan | None = None) -> dict[int, int]:
    """How many padded slots each prompt of ``batches`` gets from ``strategy`` (0 everywhere when unpadded; on the
    shared path both seams inside the cache, :func:`seam_padding`)."""
    out: dict[int, int] = {}
    for batch in batches:
        if strategy == "shared" and plan is not None:
            out.update({i: mid + tail for i, (mid, tail) in seam_padding(encoded, batch, plan).items()})
        elif strategy == "full":
            width = max(len(encoded[i]) for i in batch)
            out.update({i: width - len(encoded[i]) for i in batch})
        else:
            out.update(dict.fromkeys(batch, 0))
    return out


def batch_layout(encoded: list[list[int]], batch: list[int], strategy: str,
                 plan: PrefixPlan | None = None) -> tuple[int, ...] | None:
    """The widths a strategy pads ``batch``'s rows to: ``(width,)`` on the full path, ``(scenario width, question
    width)`` on the shared path, None unpadded. Given to a strategy, a few of the batch's rows are padded exactly as
    the whole batch padded them."""
    if strategy == "full":
        return (max(len(encoded[i]) for i in batch),)
    if strategy == "shared" and plan is not None:
        return (max(len(plan.mid[plan.group_of[i]]) for i in batch), max(len(plan.tail(encoded, i)) for i in batch))
    return None
