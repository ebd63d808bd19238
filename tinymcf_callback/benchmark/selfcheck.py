"""The pairs engine checks itself: a few sequences against each scored alone, in float32, and a safer strategy when
they disagree (the vignette self-check's discipline, :mod:`tinymcf_callback.scoring.selfcheck`, for continuations).

The sequences compared are those a strategy treats most differently from each alone (the most padded before its
prompt, the most padded after its continuation, the most padded of the last batch, a one-token continuation), as
many as cost about :data:`CHECK_SHARE` of the scoring. The reference is :func:`~.scoring.score_alone`: the prompt and
the continuation's ids in one forward call with no cache, mask or padding. A model computing in a reduced precision
is compared in a float32 replay (:func:`~tinymcf_callback.scoring.replay.float32_replay`): each checked sequence as
its call padded it, and alone. A difference above :data:`TOLERANCE` a continuation token moves to the next strategy
(shared prompts -> full sequences -> each sequence alone), said once per model.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..errors import EngineMismatchError, UnsupportedModelError, one_line
from ..scoring.engine import LogOnce, ModelCall
from ..scoring.model_info import class_name, model_device
from ..scoring.replay import float32_replay, without_compile
from ..scoring.selfcheck import REDUCED_PRECISIONS
from .scoring import STRATEGIES, STRATEGY_WORDS, PairRunner, first_strategy, run_batches, score_alone
from .sequences import CALL_TOKENS, Sequences

# Largest |log P(continuation | prompt)| difference per continuation token, in nats, allowed between a strategy and
# each sequence scored alone in float32 (a sum over n tokens is held to n times it). Measured (every sequence of the
# project's test pairs, plain and chat, sums of 1-18 tokens, two token budgets): SmolLM2-135M 1.33e-5 a token (1.4e-4
# on a sum; the reference's unmasked forward computes the same attention another way), tiny random Qwen3 8e-7. A
# position off by one or a continuation seeing its padding moves a sum by 0.05 nats or more.
TOLERANCE = 4e-5
N_CHECKED = 4  # sequences compared with each alone, per scoring, at most ...
CHECK_SHARE = 0.05  # ... and as many as cost about this share of the scoring (at least one)


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


def check(runner: PairRunner, batches: list[list[int]], scores: np.ndarray, compute: str | None,
          fallbacks: list[str], say: LogOnce, tolerance: float = TOLERANCE) -> PairCheck:
    """Compare a few sequences (:func:`checked_sequences`) with each scored alone: in float32 as they are, or, for a
    model computing in a reduced precision, each checked sequence as its call padded it and each alone, both replayed
    in float32. ``say``: the caller's warnings, each said once per model and cause."""
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
            found.note = f"the float32 replay failed ({one_line(e)})"
        if found.note is None:
            found.max_diff = _largest((fast - alone) / tokens)
            found.scored_diff = _largest((scores[idx] - alone) / tokens)
        else:
            say(model, f"preference pairs: {class_name(model)} was not checked against each sequence alone: "
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
                    ragged: bool = True, say: LogOnce | None = None) -> tuple[np.ndarray, str, int, PairCheck | None]:
    """Every distinct sequence scored by the fastest strategy that agrees with each sequence alone; returns the
    scores, the strategy, the forward calls and the check. ``precision``: the running
    :func:`~tinymcf_callback.scoring.mode.probe_mode`'s, whose compute precision (known once a forward call ran)
    decides whether the check replays in float32. A strategy that raises or disagrees is left for the next (said
    once per model and cause by ``say``, the caller's); :class:`~tinymcf_callback.errors.EngineMismatchError` when
    even the last disagrees."""
    say = say if say is not None else LogOnce()
    start, reason = first_strategy(model, seqs)
    if reason is not None:
        say(model, f"preference pairs: {class_name(model)} starts on {STRATEGY_WORDS[start]}: {reason}")
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
            fallbacks.append(f"{STRATEGY_WORDS[strategy]} failed ({one_line(e)})")
            level += 1
            continue
        calls += runner.call.n_forward
        if not self_check:
            return scores, strategy, calls, None
        compute = precision.compute if precision is not None else None
        found = check(runner, batches, scores, compute, fallbacks, say)
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
        say(model, f"preference pairs: {class_name(model)}: {why}; scoring {STRATEGY_WORDS[STRATEGIES[level + 1]]}"
                        " instead", key=("pairs fallback", strategy))
        level += 1
