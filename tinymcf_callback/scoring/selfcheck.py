"""The engine checks itself: :func:`score_checked` compares a few prompts of its fast path with each prompt scored
alone, padded as they were in their batches, and moves to the next safer strategy above the tolerance (a
reduced-precision probe is replayed in float32 for it). docs/engine.md ("The engine checks itself").
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..errors import EngineMismatchError, UnsupportedModelError, one_line
from .batching import batch_layout, padding_per_prompt, seam_padding
from .engine import (
    STRATEGIES,
    STRATEGY_WORDS,
    AnswerScores,
    LogOnce,
    ModelCall,
    ScoreResult,
    explain_start,
    first_strategy,
    make_strategy,
    pad_calls,
    run_batches,
    score_alone,
    score_prompts,
)
from .model_info import class_name, forward_signature, model_device, pad_token_id
from .ranks import Ranks, merge_shards, to_shard
from .replay import float32_replay, without_compile

# Largest |P(Yes) difference| and |log Yes+No mass difference| allowed between a strategy and each prompt
# alone, by the precision the matrix products ran in. Measured (shared and full paths against alone):
#   float32: <= 5.4e-7 / 1.5e-6 on 18 tiny random architectures, 3.0e-6 / 2.8e-6 on SmolLM2-135M (28 vignettes),
#   3.6e-6 on SmolLM2's bfloat16 weights replayed in float32 (every prompt of 14 vignettes);
#   float16: <= 4.0e-4 / 1.2e-3 tiny, 6.9e-3 / 6.0e-3 SmolLM2;   bfloat16: <= 4.4e-3 / 6.9e-3 tiny, 7.3e-2 SmolLM2
#   (every prompt of 14 vignettes; 0.059 over all 408). The tolerances leave room above those; the smallest defect
#   found (Dory's shared path, 5e-5 in float32) stays 2.5x above float32's. TF32 keeps 10 mantissa bits, like float16.
TOLERANCES = {"float64": 1e-9, "float32": 2e-5, "tf32": 3e-2, "float16": 3e-2, "bfloat16": 2e-1}
UNKNOWN_PRECISION_TOLERANCE = 2e-1
REDUCED_PRECISIONS = ("bfloat16", "float16", "tf32")  # what the float32 replay is for
REPLAY_PRECISION = "float32"
N_CHECKED = 4  # at most this many prompts per probe
CHECK_BUDGET = 0.045  # the check takes about this share of a run's probe time (see Rotation; self_check_budget)
REPLAY_COST = 2.0  # a float32 token against a reduced-precision one (measured on CPU: 1.9-2.2x; a GPU's is larger)


@dataclass
class SelfCheck:
    """One probe's self-check, as recorded in the report's ``info["self_check"]`` and the history line."""

    strategy: str  # the strategy the scores came from
    checked: list[int]  # prompt indices compared with each prompt scored alone
    max_diff: float  # largest |P(Yes) - P(Yes) alone| over the checked prompts, in the reference precision
    max_mass_diff: float  # largest |log(Yes+No mass) - log(mass alone)|, the same
    tolerance: float  # what max_diff and max_mass_diff are held to
    precision: str | None  # the compute precision of the probe's own scores
    reference: str | None = None  # the precision of the comparison: "float32 replay", or the probe's own
    resolution: float | None = None  # the smallest |P(Yes) difference| on a checked prompt the check flags
    scored_diff: float | None = None  # with a replay: the probe's own scores against the float32 reference
    scored_mass_diff: float | None = None
    scored_tolerance: float | None = None  # what scored_diff is held to (the probe's precision's tolerance)
    replay_note: str | None = None  # why a reduced-precision probe was not replayed in float32
    fallbacks: list[str] = field(default_factory=list)  # why each faster strategy was left, in order
    coverage: dict = field(default_factory=dict)  # what the checks of this Probe's probes have covered so far
    waiting: bool = False  # no prompt checked at this probe: the budget had not paid for one (see Rotation)
    copy_bytes: int = 0  # the most bytes of float32 weight copies the replay held at once (per process)
    n_forward: int = 0  # forward calls of the reference and the replay (per process)
    seconds: float = 0.0  # time spent on them

    def as_dict(self) -> dict:
        return asdict(self)

    def passed(self) -> bool:
        held = self.max_diff <= self.tolerance and self.max_mass_diff <= self.tolerance
        if self.scored_diff is not None:
            held = held and self.scored_diff <= self.scored_tolerance and self.scored_mass_diff <= self.scored_tolerance
        return held


def joined_checks(records: list[dict]) -> dict | None:
    """The self-checks of several scorings of one probe's prompts (a precision target's looks) as one record."""
    if not records:
        return None
    out = {**records[0], "strategy": records[-1]["strategy"]}
    out["checked"] = [int(i) for r in records for i in r["checked"]]
    for key in ("max_diff", "max_mass_diff", "scored_diff", "scored_mass_diff", "resolution"):
        values = [r[key] for r in records if r.get(key) is not None]
        out[key] = max(values) if values else None
    out["fallbacks"] = list(dict.fromkeys(f for r in records for f in r.get("fallbacks") or []))
    out["waiting"] = all(r.get("waiting") for r in records)
    out["copy_bytes"] = max(r.get("copy_bytes") or 0 for r in records)
    out["n_forward"] = sum(r.get("n_forward") or 0 for r in records)
    out["seconds"] = sum(r.get("seconds") or 0.0 for r in records)
    for key in ("reference", "replay_note", "scored_tolerance"):
        out[key] = next((r[key] for r in records if r.get(key) is not None), None)
    out["coverage"] = {**(records[-1].get("coverage") or {}),
                       "prompts": sum((r.get("coverage") or {}).get("prompts", 0) for r in records)}
    return out


def tolerance_for(compute: str | None, override: float | None = None) -> float:
    """The allowed difference for a compute precision (``TOLERANCES``), or ``override`` when given."""
    if override is not None:
        return float(override)
    return TOLERANCES.get(compute or "", UNKNOWN_PRECISION_TOLERANCE)


def check_prompts(encoded: list[list[int]], batches: list[list[int]], strategy: str, plan=None,
                  k: int = N_CHECKED) -> list[int]:
    """The prompts a strategy treats most differently from scoring each alone (at most ``k``, riskiest first).

    The least padded of the padded prompts is among them: a defect may need only a few padded slots. Ties go to the
    lower index, so every rank picks the same.
    """
    if not batches:
        return []
    pads = padding_per_prompt(encoded, batches, strategy, plan)
    ranked = sorted(pads, key=lambda i: (-pads[i], i))
    order = {i: n for n, i in enumerate(ranked)}
    most = lambda idx: min(idx, key=order.__getitem__)  # noqa: E731
    picks = [ranked[0], most(batches[-1])]
    if strategy == "shared" and plan is not None:
        seams = {i: pad for b in batches for i, pad in seam_padding(encoded, b, plan).items()}
        picks += [min(seams, key=lambda i: (-seams[i][0], i)), min(seams, key=lambda i: (-seams[i][1], i))]
    padded = [i for i in ranked if pads[i] > 0]
    if padded:
        picks.append(padded[-1])
    picks += [most(batches[0]), *ranked[1:]]
    return list(dict.fromkeys(int(i) for i in picks))[:k]


def replay_rows(encoded: list[list[int]], batches: list[list[int]], strategy: str, plan,
                idx: list[int]) -> list[tuple[list[int], tuple[int, ...] | None]]:
    """The checked prompts grouped by the batch they were scored in, each group with that batch's layout (the widths
    its rows were padded to), so that a replay pads them as the whole batch did."""
    wanted, out = set(idx), []
    for batch in batches:
        here = [i for i in batch if i in wanted]
        if here:
            out.append((here, batch_layout(encoded, batch, strategy, plan)))
            wanted -= set(here)
    return out


@dataclass
class Rotation:
    """Which prompts a probe's self-check compares, probe after probe, and when: the riskiest first, then the rest in
    a seeded order; each probe earns ``budget`` of its scoring time for the check to spend (docs/engine.md)."""

    seed: int = 0
    budget: float = CHECK_BUDGET  # the share of its probes' time the check spends
    checked: set[int] = field(default_factory=set)  # checked in the current cycle
    probes: int = 0  # probes that checked prompts in the current cycle
    cycles: int = 0  # full cycles completed
    signature: tuple | None = None  # the structure the current cycle checks
    credit: float = 0.0  # seconds of checking the probes have earned and the checks not yet spent (may be < 0)
    per_prompt: float | None = None  # the last check's seconds per checked prompt
    last_probe: float = 0.0  # the last probe's scoring time (its check's not included)
    _orders: dict = field(default_factory=dict)

    def how_many(self, probe_seconds: float, estimate: float) -> int:
        """Prompts to check at this probe, which took ``probe_seconds`` to score. ``estimate``: the prompts the
        budget allows by the tokens they run (used before any check of this structure has been timed)."""
        per = self.per_prompt or self.budget * probe_seconds / max(estimate, 1e-9)
        self.credit = min(self.credit + self.budget * probe_seconds, N_CHECKED * per)  # no burst after a long wait
        least = 1 if self.probes == 0 else 0  # a new structure: checked now, whatever it costs
        return int(min(N_CHECKED, max(least, math.floor(self.credit / per))))

    def spent(self, seconds: float, n_checked: int) -> None:
        """A check of ``n_checked`` prompts took ``seconds``."""
        self.credit -= seconds
        if n_checked:
            self.per_prompt = seconds / n_checked

    def start(self, signature: tuple) -> None:
        """The next probe checks a model of ``signature``: another structure than the cycle's starts a new cycle."""
        if signature != self.signature:
            self.signature, self.checked, self.probes, self.cycles = signature, set(), 0, 0
            self.credit, self.per_prompt = 0.0, None

    def order(self, encoded, batches, strategy: str, plan, rows: list[int] | None = None) -> list[int]:
        """The riskiest prompts of ``batches`` first, then the others in the seeded order; ``rows``: of those prompts
        only (default every prompt of ``encoded``)."""
        key = (strategy, len(encoded), tuple(tuple(b) for b in batches), None if rows is None else tuple(rows))
        if key not in self._orders:  # the riskiest prompts depend on the batches
            risky = check_prompts(encoded, batches, strategy, plan, k=2 * N_CHECKED)
            allowed = range(len(encoded)) if rows is None else set(rows)
            rest = [int(i) for i in np.random.default_rng(self.seed).permutation(len(encoded))
                    if int(i) not in risky and int(i) in allowed]
            self._orders[key] = risky + rest
        return self._orders[key]

    def pick(self, encoded, batches, strategy: str, plan, k: int, rows: list[int] | None = None) -> list[int]:
        order = self.order(encoded, batches, strategy, plan, rows)
        fresh = [i for i in order if i not in self.checked]
        if len(fresh) < k:  # the cycle is done: start it again, after the ones it still had
            self.checked.clear()
            self.cycles += 1
            fresh += [i for i in order if i not in fresh]
        return fresh[:k]

    def note(self, idx) -> None:
        """These prompts were checked at this probe."""
        if len(idx):
            self.checked |= {int(i) for i in idx}
            self.probes += 1

    def coverage(self, n_prompts: int) -> dict:
        """How far the cycle has come: prompts checked in it (of ``n_prompts``), its probes, the cycles before it."""
        return {"checked_this_cycle": len(self.checked), "prompts": n_prompts, "cycles_completed": self.cycles,
                "probes": self.probes}


def structure(changes: int, strategy: str, compute: str | None, batches: int | None = None) -> tuple:
    """What a defect of the probe's paths depends on: which forward it is (``changes``, counted by :class:`Memory`),
    the precision, how many batches the prompts were planned in, and the strategy; not the weights."""
    return (changes, compute, batches, strategy)


def check_cost(encoded, batches, strategy: str, plan, idx: list[int], replayed: bool) -> float:
    """Tokens a check of ``idx`` runs (each alone, and with a replay the row in its batch's layout, in float32)."""
    alone = sum(len(encoded[i]) for i in idx)
    if not replayed:
        return alone
    layout = {i: batch_layout(encoded, b, strategy, plan) for b in batches for i in b if i in idx}
    root = len(plan.root) if strategy == "shared" and plan is not None else 0
    rows = sum(sum(layout[i]) if layout[i] else len(encoded[i]) for i in idx)
    return REPLAY_COST * (alone + rows + root)


def probe_cost(encoded, batches, strategy: str, plan) -> float:
    """Tokens a probe's forward calls run on ``strategy`` (padding included)."""
    total = len(plan.root) if strategy == "shared" and plan is not None else 0
    for batch in batches:
        layout = batch_layout(encoded, batch, strategy, plan)
        if strategy == "shared" and plan is not None:
            total += layout[0] * len({plan.group_of[i] for i in batch}) + layout[1] * len(batch)
        elif layout:
            total += layout[0] * len(batch)
        else:
            total += sum(len(encoded[i]) for i in batch)
    return total


# ---- the checked scoring loop ---------------------------------------------------------------------
@dataclass
class Memory:
    """What a probe's scoring carries from one probe to the next, held by the probe, never by the process."""

    forward: tuple | None = None  # the forward_signature of the model scored last
    changes: int = 0  # how often it has changed (the first model counts)
    needed: int = 0  # the safest strategy (index into STRATEGIES) that forward has needed: where its next probe starts
    say: LogOnce = field(default_factory=LogOnce)

    def meet(self, model, ranks: Ranks, ignore=()) -> bool:
        """Is ``model``'s forward another than the one scored last (on any rank)? Then it starts again from the rules'
        first strategy, and its check from the riskiest prompts. ``ignore``: the probe's own hook ids."""
        try:
            signature = forward_signature(model, ignore)
        except Exception:  # noqa: BLE001 - a model it cannot read counts as changed at every probe: checked, no crash
            signature = None
        changed = any(ranks.gather(signature is None or signature != self.forward))
        if changed:
            self.forward, self.changes, self.needed = signature, self.changes + 1, 0
        return changed


def score_checked(job, model, *, batches: list[list[int]] | None = None, ranks: Ranks | None = None, precision=None,
                  progress: bool = False, tolerance: float | None = None, check: bool = True) -> ScoreResult:
    """Score every prompt of ``job`` (a :class:`~tinymcf_callback.probe.Probe`) on ``model``, checked against each
    prompt alone; the same on every rank. ``batches``: only the prompts of these, NaN outside them.

    Raises :class:`EngineMismatchError` when no strategy agrees with each prompt alone, the last strategy's own error
    when every one raised.
    """
    ranks, memory = ranks or Ranks(), job.memory
    rows = None if batches is None else sorted(i for b in batches for i in b)
    encoded, batches, plan = job.encoded, job.batches if batches is None else batches, job.prefix_plan
    memory.meet(model, ranks, precision.hooks if precision is not None else ())
    start, reason = first_strategy(model, encoded, plan)
    level = max(STRATEGIES.index(start), memory.needed)
    if level == STRATEGIES.index(start):
        explain_start(model, start, reason, memory.say)
    name = class_name(model)
    fallbacks: list[str] = []
    pad_id = pad_token_id(model, job.tok)
    while True:
        strategy = STRATEGIES[level]
        shared_plan = plan if strategy == "shared" else None
        mine = [batches[b] for b in ranks.share(len(batches))]
        calls = None
        if ranks.num > 1:  # counted on every rank before the first forward call; the short ranks fill up
            planned = make_strategy(strategy, model, encoded, pad_id, model_device(model), shared_plan)
            calls = max(ranks.gather(planned.planned_calls(mine)))
        error = None
        started = time.perf_counter()
        try:
            share = run_batches(model, encoded, mine, job.tok, pad_id=pad_id, sample_index=job.sample_index,
                                progress=progress and ranks.is_main, desc=f"moral probe [{job.name}]",
                                prefix_plan=shared_plan, answer_format=job.answer_format, strategy=strategy,
                                calls=calls)
        except (UnsupportedModelError, torch.OutOfMemoryError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - any fast-path failure (a compiler error, a cache the model rejects)
            error, share = e, None
        errors = ranks.gather(None if error is None else one_line(error))
        failed = next((e for e in errors if e), None)
        if failed is not None:
            if level == len(STRATEGIES) - 1:
                if error is not None:
                    raise error
                raise RuntimeError(f"moral probe: {STRATEGY_WORDS[strategy]} failed on another process: {failed}")
            why = f"{STRATEGY_WORDS[strategy]} failed ({failed})"
            level = _fall_back(memory, model, name, strategy, why, fallbacks, level)
            continue
        if ranks.num > 1:
            res = merge_shards(ranks.gather(to_shard(share, [i for b in mine for i in b])), len(encoded))
        else:
            res = share
        res.strategy = strategy
        if not check:
            return res
        job.rotation.last_probe = time.perf_counter() - started
        compute = precision.compute if precision is not None else None  # known once a forward call has run
        found = _check(job, model, res, strategy, shared_plan, ranks, compute, tolerance, pad_id, fallbacks, batches,
                       rows)
        if found.passed():
            res.check = found.as_dict()
            return res
        why = _disagreement(found, strategy)
        if level == len(STRATEGIES) - 1:
            largest = max(found.max_diff, found.max_mass_diff)
            raise EngineMismatchError(
                f"{name}: even {why}. The probe cannot score this model right, so it reports nothing rather than a "
                f"wrong number. Something in the model changes a prompt's answer with the batch it is in (a hook or "
                f"a layer that reads other rows); if this is floating-point noise of a large model, raise the "
                f"tolerance (self_check_tolerance) above {largest:.1e}")
        level = _fall_back(memory, model, name, strategy, why, fallbacks, level)


def _disagreement(found: SelfCheck, strategy: str) -> str:
    """Why a strategy failed its check, with the measured difference and the tolerance it broke."""
    words = STRATEGY_WORDS[strategy]
    n = len(found.checked)
    if found.max_diff > found.tolerance or found.max_mass_diff > found.tolerance:
        where = "in a float32 replay " if found.reference == "float32 replay" else ""
        return (f"{words} gave P(Yes) {found.max_diff:.1e} and log Yes+No mass {found.max_mass_diff:.1e} away from "
                f"each prompt scored alone {where}({n} prompts checked), above the "
                f"{found.reference if where else (found.precision or 'unknown') + '-precision'} tolerance "
                f"{found.tolerance:.0e}")
    return (f"{words} gave P(Yes) {found.scored_diff:.1e} and log Yes+No mass {found.scored_mass_diff:.1e} in "
            f"{found.precision} away from each prompt scored alone in float32 ({n} prompts checked), above the "
            f"{found.precision}-precision tolerance {found.scored_tolerance:.0e}")


def _fall_back(memory: Memory, model, name: str, strategy: str, why: str, fallbacks: list[str], level: int) -> int:
    """Record and log (once per model and strategy) why ``strategy`` is left; the next level, where this forward's
    next probe starts."""
    fallbacks.append(why)
    nxt = STRATEGIES[level + 1]
    memory.say(model, f"{name}: {why}; scoring {STRATEGY_WORDS[nxt]} instead", key=("fallback", strategy))
    memory.needed = max(memory.needed, level + 1)
    return level + 1


def _check(job, model, res: ScoreResult, strategy: str, plan, ranks: Ranks, compute: str | None,
           override: float | None, pad_id: int, fallbacks: list[str], batches: list[list[int]],
           rows: list[int] | None) -> SelfCheck:
    """Compare the checked prompts with each prompt alone: in a float32 replay when the probe computed in a reduced
    precision and the replay can run on every rank, else in the probe's own precision."""
    idx = _picked(job, strategy, plan, ranks, compute, batches, rows)
    allowed = tolerance_for(compute, override)
    n_scored = len(job.encoded) if rows is None else len(rows)
    if not idx:  # this probe has not earned a checked prompt yet (see Rotation): the structure was checked before
        return _done(job, SelfCheck(strategy, [], 0.0, 0.0, allowed, compute, reference=None, resolution=None,
                                    fallbacks=list(fallbacks), waiting=True), n_scored)
    start = time.perf_counter()
    replay, note, n_forward, copy_bytes = None, None, 0, 0
    if compute in REDUCED_PRECISIONS:
        replay, note, n_forward, copy_bytes = _replayed(job, model, idx, strategy, plan, pad_id, batches)
        notes = ranks.gather(note)
        note = next((n for n in notes if n), None)  # a replay that failed on any rank is used on none
    if replay is None or note is not None:
        alone, calls = score_alone(model, job.encoded, idx, job.tok, job.answer_format)
        n_forward += calls
        d_p, d_m = ranks_largest(ranks, _diffs(res.p_yes[idx], res.yn_mass[idx], alone))
        return _done(job, SelfCheck(strategy, [int(i) for i in idx], d_p, d_m, allowed, compute, reference=compute,
                                    resolution=allowed, replay_note=note, fallbacks=list(fallbacks),
                                    n_forward=n_forward, seconds=time.perf_counter() - start), n_scored)
    fast, alone = replay
    structural = ranks_largest(ranks, _diffs(fast.p_yes, fast.yn_mass, alone))
    scored = ranks_largest(ranks, _diffs(res.p_yes[idx], res.yn_mass[idx], alone))
    replay_tolerance = tolerance_for(REPLAY_PRECISION, override)
    return _done(job, SelfCheck(strategy, [int(i) for i in idx], *structural, replay_tolerance, compute,
                                reference=f"{REPLAY_PRECISION} replay", resolution=replay_tolerance,
                                scored_diff=scored[0], scored_mass_diff=scored[1], scored_tolerance=allowed,
                                fallbacks=list(fallbacks), copy_bytes=copy_bytes, n_forward=n_forward,
                                seconds=time.perf_counter() - start), n_scored)


def _picked(job, strategy: str, plan, ranks: Ranks, compute: str | None, batches: list[list[int]],
            rows: list[int] | None) -> list[int]:
    """This probe's checked prompts: the rotation's next ones among ``rows``, as many as the budget allows; rank 0's
    on every rank. The structure counts ``job.batches``, so that the looks of one probe share one cycle."""
    rotation, encoded = job.rotation, job.encoded
    rotation.start(ranks.gather(structure(job.memory.changes, strategy, compute, len(job.batches)))[0])
    order = rotation.order(encoded, batches, strategy, plan, rows)
    first = order[:1]
    estimate = rotation.budget * probe_cost(encoded, batches, strategy, plan) / max(
        1.0, check_cost(encoded, batches, strategy, plan, first, compute in REDUCED_PRECISIONS))
    k = rotation.how_many(rotation.last_probe, estimate)
    idx = rotation.pick(encoded, batches, strategy, plan, k, rows) if k else []
    return [int(i) for i in ranks.gather(idx)[0]]


def _done(job, check: SelfCheck, n_prompts: int) -> SelfCheck:
    """Record what this check covered (of ``n_prompts`` scored) and what it cost (the next probe's budget reads it)."""
    rotation = job.rotation
    rotation.note(check.checked)
    rotation.spent(check.seconds, len(check.checked))
    check.coverage = rotation.coverage(n_prompts)
    return check


def _replayed(job, model, idx: list[int], strategy: str, plan, pad_id: int, batches: list[list[int]]):
    """The checked prompts in float32: ``((strategy's scores, each alone) or None, why not, forward calls, copy
    bytes)``. Makes the same number of forward calls whatever happens (sharding needs it)."""
    target = without_compile(model)
    device = model_device(model)
    runner = make_strategy(strategy, target, job.encoded, pad_id, device, plan)
    subs = replay_rows(job.encoded, batches, strategy, plan, idx)
    planned = runner.planned_calls([rows for rows, _ in subs]) + len(idx)
    call: ModelCall = runner.call
    note, replay = None, None
    fast_p, fast_m = {}, {}
    try:
        with float32_replay(target, device) as (replay, seen):
            for rows, layout in subs:
                scored = score_prompts(runner.logits(rows, layout), job.tok, job.answer_format)
                for row, i in enumerate(rows):
                    fast_p[i], fast_m[i] = scored.p_yes[row], scored.yn_mass[row]
            alone, _ = score_alone(target, job.encoded, idx, job.tok, job.answer_format, call=call)
        if replay.impure is not None:
            note = f"the float32 replay was not pure float32 ({replay.impure})"
        elif seen.seen != REPLAY_PRECISION:
            note = f"the float32 replay computed in {seen.seen or 'an unknown precision'}"
    except (UnsupportedModelError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - a replay that cannot run costs resolution, never the probe
        note = f"the float32 replay failed ({one_line(e)})"
    finally:
        if call.n_forward < planned:
            pad_calls(call, planned, job.encoded, device)
    copy_bytes = replay.largest_copy if replay is not None else 0
    if note is not None:
        return None, note, call.n_forward, copy_bytes
    fast = AnswerScores(np.array([fast_p[i] for i in idx]), np.array([fast_m[i] for i in idx]))
    return (fast, alone), None, call.n_forward, copy_bytes


def _diffs(p_yes: np.ndarray, yn_mass: np.ndarray, reference: AnswerScores) -> tuple[float, float]:
    d_p = _largest(np.abs(p_yes - reference.p_yes))
    with np.errstate(divide="ignore", invalid="ignore"):
        d_m = _largest(np.abs(np.log(yn_mass) - np.log(reference.yn_mass)))
    return d_p, d_m


def ranks_largest(ranks: Ranks, diffs: tuple[float, float]) -> tuple[float, float]:
    """The largest of each difference over every rank (every rank then decides alike)."""
    gathered = ranks.gather(diffs)
    return max(g[0] for g in gathered), max(g[1] for g in gathered)


def _largest(diffs: np.ndarray) -> float:
    """The largest difference; infinite when any is NaN (a NaN never passes a check)."""
    if not len(diffs):
        return 0.0
    return math.inf if np.isnan(diffs).any() else float(diffs.max())
