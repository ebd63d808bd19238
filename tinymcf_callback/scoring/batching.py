"""Which prompts go into which forward call, decided without the model.

Batches are planned from token ids alone (:func:`plan_batches`, :func:`plan_group_batches`),
so a distributed caller can hand each rank its own share and results are written back by
index. :func:`plan_prefixes` finds the token prefixes the shared-prefix strategy computes once
(the chat header for all prompts, the scenario for its two frames), and
:func:`padding_per_prompt` says how much padding each strategy gives each prompt (the
self-check looks at the most padded ones).
"""

from __future__ import annotations

from dataclasses import dataclass

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


def seam_padding(encoded: list[list[int]], batch: list[int], plan: PrefixPlan) -> dict[int, tuple[int, int]]:
    """On the shared path: how many padded cache slots each prompt of ``batch`` gets before its scenario (padded to the
    batch's longest scenario) and before its question (padded to the batch's longest question)."""
    mids = {i: len(plan.mid[plan.group_of[i]]) for i in batch}
    tails = {i: len(plan.tail(encoded, i)) for i in batch}
    widest_mid, widest_tail = max(mids.values()), max(tails.values())
    return {i: (widest_mid - mids[i], widest_tail - tails[i]) for i in batch}


def padding_per_prompt(encoded: list[list[int]], batches: list[list[int]], strategy: str,
                       plan: PrefixPlan | None = None) -> dict[int, int]:
    """How many padded slots each prompt of ``batches`` gets from ``strategy`` (0 everywhere when unpadded).

    The full path pads each row to the batch's longest prompt; the shared path pads each
    scenario to the batch's longest scenario and each question to its longest question, inside
    the key/value cache (:func:`seam_padding`).
    """
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


def layout_setters(encoded: list[list[int]], batch: list[int], strategy: str,
                   plan: PrefixPlan | None = None) -> list[int]:
    """The prompts of ``batch`` that set its padding: with them, a smaller batch pads every other row as ``batch`` did.

    Full path: the longest prompt (every row is padded to its length). Shared path: the prompt with the
    longest scenario and the one with the longest question (each seam is padded to its longest). Unpadded:
    none. Ties go to the first in the batch.
    """
    if strategy == "full":
        return [max(batch, key=lambda i: len(encoded[i]))]
    if strategy == "shared" and plan is not None:
        return [max(batch, key=lambda i: len(plan.mid[plan.group_of[i]])),
                max(batch, key=lambda i: len(plan.tail(encoded, i)))]
    return []
