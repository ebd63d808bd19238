"""The engine checks itself: every probe compares its fast path with each prompt scored alone.

The rules in :mod:`tinymcf_callback.scoring.model_info` pick a starting strategy from what is known
about a model's class and config. Rules only cover the families someone has tried, so on
every probe :func:`score_checked` also scores a few prompts the simplest way
(:func:`tinymcf_callback.scoring.engine.score_alone`: each prompt alone, unpadded, no cache, one full
forward call, the last position) and compares them with what the strategy gives *for the same
prompts, padded as they were in the batches they were really scored in*. The prompts checked
(:func:`check_prompts`) cover what a defect can hit: the most padded prompt, the most padded of the
last batch, on the shared path the most padded scenario seam and question seam, and the least
padded of the padded prompts.

**In the precision researchers train in.** In bfloat16 a prompt in a batch and the same prompt
alone differ by up to 0.07 in P(Yes) on SmolLM2-135M with nothing wrong, as much as a real defect,
so no tolerance separates the two there. The defects the check looks for (a position, a mask, a
cache or a hook that treats a padded or cached row differently) do not depend on the precision,
while bfloat16 and float16 weights are exactly float32 values: so when the forward computes in a
reduced precision (bfloat16, float16, TF32, autocast), the checked prompts are *replayed in
float32* (:mod:`tinymcf_callback.scoring.replay`), the strategy on the rows that set each checked
prompt's padding and each prompt alone, and compared at float32's tolerance. The scores the probe
reports are still checked too, against the float32 reference at their own precision's tolerance
(:data:`TOLERANCES`), which catches a defect of the reduced precision's own kernels when it is
large. Where the replay cannot run (a wrapper that casts activations back, a module that reads
another's weights, out of memory), the check compares in the reduced precision and says so
(``reference``, ``replay_note``); its ``resolution`` says in every case the smallest difference on
a checked prompt that it flags.

When a difference is above its tolerance, the probe moves to the next safer strategy (shared
prefixes -> full prompts -> unpadded prompts), says once why with the measured difference, and
scores again; a strategy that raises moves on the same way. If even the unpadded strategy
disagrees, :class:`EngineMismatchError` names the model class and the difference. A model that
needed a safer strategy starts there at its next probe (and is still checked). The check runs on
every probe, not only on a model's first one, because what it guards against changes without the
model object changing: a steering hook added, a wrapper, new weights that make a path's small error
large.

Under several processes (DDP, FSDP, DeepSpeed) the check and the decision are collective:
every rank scores its share, the shares are gathered, every rank checks (and replays) the same
prompts, and the largest difference over the ranks decides for all of them. Every rank also makes
the same number of forward calls (counted before the first one, the short ranks padded with
one-token calls, also after a replay that failed on one rank), which models with sharded parameters
need: each forward call gathers parameters.
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..errors import EngineMismatchError, UnsupportedModelError
from .batching import layout_setters, padding_per_prompt, seam_padding
from .engine import (
    STRATEGIES,
    STRATEGY_WORDS,
    AnswerScores,
    ModelCall,
    ScoreResult,
    explain_start,
    first_strategy,
    log_once,
    make_strategy,
    pad_calls,
    run_batches,
    score_alone,
    score_prompts,
)
from .model_info import class_name, model_device, pad_token_id
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
N_CHECKED = 4


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
    n_forward: int = 0  # forward calls of the reference and the replay (per process)
    seconds: float = 0.0  # time spent on them

    def as_dict(self) -> dict:
        return asdict(self)

    def passed(self) -> bool:
        held = self.max_diff <= self.tolerance and self.max_mass_diff <= self.tolerance
        if self.scored_diff is not None:
            held = held and self.scored_diff <= self.scored_tolerance and self.scored_mass_diff <= self.scored_tolerance
        return held


def tolerance_for(compute: str | None, override: float | None = None) -> float:
    """The allowed difference for a compute precision (``TOLERANCES``), or ``override`` when given."""
    if override is not None:
        return float(override)
    return TOLERANCES.get(compute or "", UNKNOWN_PRECISION_TOLERANCE)


def check_prompts(encoded: list[list[int]], batches: list[list[int]], strategy: str, plan=None,
                  k: int = N_CHECKED) -> list[int]:
    """The prompts a strategy treats most differently from scoring each alone (at most ``k``, in this order).

    The most padded prompt of all; the most padded of the last batch (another batch size and
    width); on the shared path, the prompt with the most padding before its scenario and the one
    with the most before its question (the two seams inside the cache); the least padded of the
    padded prompts (a defect may need a short stretch of padding, or only a few slots); then the
    most padded of the first batch and the next most padded. Ties go to the lower index, so
    every rank picks the same. Short padded prompts are also the cheapest to score alone, which
    keeps the check to a few percent of a probe.
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


def replay_batches(encoded: list[list[int]], batches: list[list[int]], strategy: str, plan,
                   idx: list[int]) -> list[list[int]]:
    """For each batch holding checked prompts: those prompts and the ones that set the batch's padding, in batch order.

    Scored together, they pad each checked prompt exactly as the whole batch did, with far fewer rows.
    """
    wanted = set(idx)
    out = []
    for batch in batches:
        here = [i for i in batch if i in wanted]
        if here:
            keep = set(here) | set(layout_setters(encoded, batch, strategy, plan))
            out.append([i for i in batch if i in keep])
            wanted -= set(here)
    return out


# ---- the checked scoring loop ---------------------------------------------------------------------
_START: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> the safest strategy it needed so far


def _remembered(model) -> int:
    try:
        return _START.get(model, 0)
    except TypeError:
        return 0


def _remember(model, level: int) -> None:
    with contextlib.suppress(TypeError):  # a model that cannot be weakly referenced starts from the rules each time
        _START[model] = max(level, _START.get(model, 0))


def describe(error: BaseException) -> str:
    """``Type: message`` on one line, cut at 300 characters (compiler errors run over pages)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def score_checked(job, model, *, ranks: Ranks | None = None, precision=None, progress: bool = False,
                  tolerance: float | None = None, check: bool = True) -> ScoreResult:
    """Score every prompt of ``job`` on ``model``, checked against each prompt alone; the same on every rank.

    ``job`` is a :class:`~tinymcf_callback.probe.Probe` (its ``encoded``, ``batches``, ``tok``,
    ``prefix_plan``, ``sample_index``, ``answer_format`` and ``name`` are read). ``precision``: the
    :class:`~tinymcf_callback.scoring.mode.Precision` of the running
    :func:`~tinymcf_callback.scoring.mode.probe_mode`, which gives the tolerance (``tolerance``
    overrides it). The result's ``check`` holds the :class:`SelfCheck` record. Raises
    :class:`EngineMismatchError` when no strategy agrees with each prompt alone, and the last
    strategy's own error when every strategy raised. ``check=False`` scores with the first strategy
    and compares nothing (``res.check`` is None).
    """
    ranks = ranks or Ranks()
    encoded, batches, plan = job.encoded, job.batches, job.prefix_plan
    start, reason = first_strategy(model, encoded, plan)
    level = max(STRATEGIES.index(start), _remembered(model))
    if level == STRATEGIES.index(start):
        explain_start(model, start, reason)
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
        try:
            share = run_batches(model, encoded, mine, job.tok, pad_id=pad_id, sample_index=job.sample_index,
                                progress=progress and ranks.is_main, desc=f"moral probe [{job.name}]",
                                prefix_plan=shared_plan, answer_format=job.answer_format, strategy=strategy,
                                calls=calls)
        except (UnsupportedModelError, torch.OutOfMemoryError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - any fast-path failure (a compiler error, a cache the model rejects)
            error, share = e, None
        errors = ranks.gather(None if error is None else describe(error))
        failed = next((e for e in errors if e), None)
        if failed is not None:
            if level == len(STRATEGIES) - 1:
                if error is not None:
                    raise error
                raise RuntimeError(f"moral probe: {STRATEGY_WORDS[strategy]} failed on another process: {failed}")
            why = f"{STRATEGY_WORDS[strategy]} failed ({failed})"
            level = _fall_back(model, name, strategy, why, fallbacks, level)
            continue
        if ranks.num > 1:
            res = merge_shards(ranks.gather(to_shard(share, [i for b in mine for i in b])), len(encoded))
        else:
            res = share
        res.strategy = strategy
        if not check:
            return res
        compute = precision.compute if precision is not None else None  # known once a forward call has run
        found = _check(job, model, res, strategy, shared_plan, ranks, compute, tolerance, pad_id, fallbacks)
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
        level = _fall_back(model, name, strategy, why, fallbacks, level)


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


def _fall_back(model, name: str, strategy: str, why: str, fallbacks: list[str], level: int) -> int:
    """Record and log (once per model and strategy) why ``strategy`` is left; the next level."""
    fallbacks.append(why)
    nxt = STRATEGIES[level + 1]
    log_once(model, f"{name}: {why}; scoring {STRATEGY_WORDS[nxt]} instead", key=("fallback", strategy))
    _remember(model, level + 1)
    return level + 1


def _check(job, model, res: ScoreResult, strategy: str, plan, ranks: Ranks, compute: str | None,
           override: float | None, pad_id: int, fallbacks: list[str]) -> SelfCheck:
    """Compare the checked prompts with each prompt alone: in a float32 replay when the probe computed in a reduced
    precision and the replay can run on every rank, else in the probe's own precision. The same verdict on every rank.
    """
    idx = check_prompts(job.encoded, job.batches, strategy, plan)
    allowed = tolerance_for(compute, override)
    start = time.perf_counter()
    replay, note, n_forward = None, None, 0
    if compute in REDUCED_PRECISIONS:
        replay, note, n_forward = _replayed(job, model, idx, strategy, plan, pad_id)
        notes = ranks.gather(note)
        note = next((n for n in notes if n), None)  # a replay that failed on any rank is used on none
    if replay is None or note is not None:
        alone, calls = score_alone(model, job.encoded, idx, job.tok, job.answer_format)
        n_forward += calls
        d_p, d_m = ranks_largest(ranks, _diffs(res.p_yes[idx], res.yn_mass[idx], alone))
        return SelfCheck(strategy, [int(i) for i in idx], d_p, d_m, allowed, compute, reference=compute,
                         resolution=allowed, replay_note=note, fallbacks=list(fallbacks), n_forward=n_forward,
                         seconds=time.perf_counter() - start)
    fast, alone = replay
    structural = ranks_largest(ranks, _diffs(fast.p_yes, fast.yn_mass, alone))
    scored = ranks_largest(ranks, _diffs(res.p_yes[idx], res.yn_mass[idx], alone))
    replay_tolerance = tolerance_for(REPLAY_PRECISION, override)
    return SelfCheck(strategy, [int(i) for i in idx], *structural, replay_tolerance, compute,
                     reference=f"{REPLAY_PRECISION} replay", resolution=replay_tolerance, scored_diff=scored[0],
                     scored_mass_diff=scored[1], scored_tolerance=allowed, fallbacks=list(fallbacks),
                     n_forward=n_forward, seconds=time.perf_counter() - start)


def _replayed(job, model, idx: list[int], strategy: str, plan, pad_id: int):
    """The checked prompts in float32: ``((strategy's scores, each alone), None, forward calls)``, or
    ``(None, why not, forward calls)``. Makes the same number of forward calls whatever happens (sharding needs it)."""
    target = without_compile(model)
    device = model_device(model)
    runner = make_strategy(strategy, target, job.encoded, pad_id, device, plan)
    subs = replay_batches(job.encoded, job.batches, strategy, plan, idx)
    planned = runner.planned_calls(subs) + len(idx)
    call: ModelCall = runner.call
    note = None
    fast_p, fast_m = {}, {}
    try:
        with float32_replay(target, device) as (replay, seen):
            for sub in subs:
                scored = score_prompts(runner.logits(sub), job.tok, job.answer_format)
                for row, i in enumerate(sub):
                    fast_p[i], fast_m[i] = scored.p_yes[row], scored.yn_mass[row]
            alone, _ = score_alone(target, job.encoded, idx, job.tok, job.answer_format, call=call)
        if replay.impure is not None:
            note = f"the float32 replay was not pure float32 ({replay.impure})"
        elif seen.seen != REPLAY_PRECISION:
            note = f"the float32 replay computed in {seen.seen or 'an unknown precision'}"
    except (UnsupportedModelError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - a replay that cannot run costs resolution, never the probe
        note = f"the float32 replay failed ({describe(e)})"
    finally:
        if call.n_forward < planned:
            pad_calls(call, planned, job.encoded, device)
    if note is not None:
        return None, note, call.n_forward
    fast = AnswerScores(np.array([fast_p[i] for i in idx]), np.array([fast_m[i] for i in idx]))
    return (fast, alone), None, call.n_forward


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
