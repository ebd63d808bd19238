"""The engine checks itself: every probe compares its fast path with each prompt scored alone.

The rules in :mod:`tinymcf_callback.scoring.model_info` pick a starting strategy from what is known
about a model's class and config. Rules only cover the families someone has tried, so on
every probe :func:`score_checked` also scores a few prompts the simplest way
(:func:`tinymcf_callback.scoring.engine.score_alone`: each prompt alone, unpadded, no cache, one full
forward call, the last position) and compares them with what the strategy gave *for the same
prompts, in the batches they were really scored in*. The prompts checked are the ones the
strategy treats most differently from "alone" (:func:`check_prompts`): the most padded one,
and the most padded one of the last batch.

When P(Yes) or the log Yes+No mass of any checked prompt differs by more than the compute
precision's tolerance (:data:`TOLERANCES`, measured), the probe moves to the next safer
strategy (shared prefixes -> full prompts -> unpadded prompts), says once why with the
measured difference, and scores again; a strategy that raises moves on the same way. If even
the unpadded strategy disagrees, :class:`EngineMismatchError` names the model class and the
difference. A model that needed a safer strategy starts there at its next probe (and is still
checked). The check runs on every probe, not only on a model's first one, because what it
guards against changes without the model object changing: a steering hook added, a wrapper,
new weights that make a path's small error large.

Under several processes (DDP, FSDP, DeepSpeed) the check and the decision are collective:
every rank scores its share, the shares are gathered, every rank checks the same prompts, and
the largest difference over the ranks decides for all of them. Every rank also makes the same
number of forward calls (counted before the first one, the short ranks padded with one-token
calls), which models with sharded parameters need: each forward call gathers parameters.
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
from .batching import padding_per_prompt
from .engine import (
    STRATEGIES,
    STRATEGY_WORDS,
    ScoreResult,
    explain_start,
    first_strategy,
    log_once,
    make_strategy,
    run_batches,
    score_alone,
)
from .model_info import class_name, model_device, pad_token_id
from .ranks import Ranks, merge_shards, to_shard

# Largest |P(Yes) difference| and |log Yes+No mass difference| allowed between a strategy and each prompt
# alone, by the precision the matrix products ran in. Measured (shared and full paths against alone):
#   float32: <= 5.4e-7 / 1.5e-6 on 18 tiny random architectures, 3.0e-6 / 2.8e-6 on SmolLM2-135M (28 vignettes);
#   float16: <= 4.0e-4 / 1.2e-3 tiny, 6.9e-3 / 6.0e-3 SmolLM2;   bfloat16: <= 4.4e-3 / 6.9e-3 tiny, 5.3e-2 / 7.1e-2
#   SmolLM2. The tolerances leave 3-7x room above those; the smallest defect found (Dory's shared path, 5e-5 in
#   float32) stays 2.5x above float32's. TF32 keeps 10 mantissa bits, like float16.
TOLERANCES = {"float64": 1e-9, "float32": 2e-5, "tf32": 3e-2, "float16": 3e-2, "bfloat16": 2e-1}
UNKNOWN_PRECISION_TOLERANCE = 2e-1
N_CHECKED = 2


@dataclass
class SelfCheck:
    """One probe's self-check, as recorded in the report's ``info["self_check"]`` and the history line."""

    strategy: str  # the strategy the scores came from
    checked: list[int]  # prompt indices compared with each prompt scored alone
    max_diff: float  # largest |P(Yes) - P(Yes) alone| over the checked prompts
    max_mass_diff: float  # largest |log(Yes+No mass) - log(mass alone)|
    tolerance: float
    precision: str | None  # the compute precision the tolerance is for
    fallbacks: list[str] = field(default_factory=list)  # why each faster strategy was left, in order
    n_forward: int = 0  # forward calls of the reference (per process)
    seconds: float = 0.0  # time spent on the reference

    def as_dict(self) -> dict:
        return asdict(self)


def tolerance_for(compute: str | None, override: float | None = None) -> float:
    """The allowed difference for a compute precision (``TOLERANCES``), or ``override`` when given."""
    if override is not None:
        return float(override)
    return TOLERANCES.get(compute or "", UNKNOWN_PRECISION_TOLERANCE)


def check_prompts(encoded: list[list[int]], batches: list[list[int]], strategy: str, plan=None,
                  k: int = N_CHECKED) -> list[int]:
    """The prompts a strategy treats most differently from scoring each alone (at most ``k``, in this order).

    The most padded prompt of all; then the most padded of the last batch (another batch size
    and width), or of the first batch when that is the same batch, or the next most padded.
    Ties go to the lower index, so every rank picks the same. Short padded prompts are also the
    cheapest to score alone, which keeps the check to a few percent of a probe.
    """
    if not batches:
        return []
    pads = padding_per_prompt(encoded, batches, strategy, plan)
    ranked = sorted(pads, key=lambda i: (-pads[i], i))
    most = lambda idx: min(idx, key=ranked.index)  # noqa: E731
    picks = [ranked[0], most(batches[-1]), most(batches[0]), *ranked[1:]]
    return list(dict.fromkeys(int(i) for i in picks))[:k]


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
        allowed = tolerance_for(compute, tolerance)
        found = _compare_alone(job, model, res, strategy, shared_plan, ranks, allowed, compute, fallbacks)
        if found.max_diff <= allowed and found.max_mass_diff <= allowed:
            res.check = found.as_dict()
            return res
        why = (f"{STRATEGY_WORDS[strategy]} gave P(Yes) {found.max_diff:.1e} and log Yes+No mass "
               f"{found.max_mass_diff:.1e} away from each prompt scored alone ({len(found.checked)} prompts checked), "
               f"above the {compute or 'unknown'}-precision tolerance {allowed:.0e}")
        if level == len(STRATEGIES) - 1:
            raise EngineMismatchError(
                f"{name}: even {why}. The probe cannot score this model right, so it reports nothing rather than a "
                f"wrong number. Something in the model changes a prompt's answer with the batch it is in (a hook or "
                f"a layer that reads other rows); if this is floating-point noise of a large model, raise the "
                f"tolerance (self_check_tolerance) above {max(found.max_diff, found.max_mass_diff):.1e}")
        level = _fall_back(model, name, strategy, why, fallbacks, level)


def _fall_back(model, name: str, strategy: str, why: str, fallbacks: list[str], level: int) -> int:
    """Record and log (once per model and strategy) why ``strategy`` is left; the next level."""
    fallbacks.append(why)
    nxt = STRATEGIES[level + 1]
    log_once(model, f"{name}: {why}; scoring {STRATEGY_WORDS[nxt]} instead", key=("fallback", strategy))
    _remember(model, level + 1)
    return level + 1


def _compare_alone(job, model, res: ScoreResult, strategy: str, plan, ranks: Ranks, allowed: float,
                   compute: str | None, fallbacks: list[str]) -> SelfCheck:
    """Score the checked prompts alone (on every rank) and measure the largest difference over all ranks."""
    idx = check_prompts(job.encoded, job.batches, strategy, plan)
    start = time.perf_counter()
    alone, n_forward = score_alone(model, job.encoded, idx, job.tok, job.answer_format)
    seconds = time.perf_counter() - start
    d_p = _largest(np.abs(res.p_yes[idx] - alone.p_yes))
    with np.errstate(divide="ignore", invalid="ignore"):
        d_m = _largest(np.abs(np.log(res.yn_mass[idx]) - np.log(alone.yn_mass)))
    gathered = ranks.gather((d_p, d_m))
    d_p, d_m = max(g[0] for g in gathered), max(g[1] for g in gathered)
    return SelfCheck(strategy, [int(i) for i in idx], d_p, d_m, allowed, compute, list(fallbacks), n_forward, seconds)


def _largest(diffs: np.ndarray) -> float:
    """The largest difference; infinite when any is NaN (a NaN never passes a check)."""
    if not len(diffs):
        return 0.0
    return math.inf if np.isnan(diffs).any() else float(diffs.max())
