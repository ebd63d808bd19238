"""The slow benchmark inside a Trainer run: ``MoralProbeCallback(name="scifi", prefs=SOURCE, lm_eval=TASKS)``.

When (:mod:`~tinymcf_callback.benchmark.schedule`, ``at=`` of the config, default ``start,middle,end``): at
``on_train_begin`` (step 0, the model before training), at the save nearest half the run's ``max_steps`` (the saves
predicted from ``save_steps``; when the run saves otherwise, the first save past half-way), and at the run's last
save (``max_steps``), or at ``on_train_end`` when that step was not saved. Each result is a line of
``moral_bench_<name>.jsonl`` beside the probe's history, with the fingerprint of the checkpoint just saved, and its
metrics go where the probe's go (``Trainer.log``, or the trackers), at the Trainer's step, beside the probe's.

It scores the live model inside the probe's mode (eval and inference mode, every module flag and RNG state restored
after), so the training it observes goes on unchanged; a benchmark that fails is a warning (``strict``: the error).
One process only (a distributed run hands its checkpoints to ``tinymcf watch --prefs``).
"""

from __future__ import annotations

import logging
import math

from ..benchmark.config import BenchmarkConfig
from ..benchmark.history import append_bench, bench_path, read_bench, result_lines
from ..benchmark.runner import Benchmark
from ..benchmark.schedule import nearest, parse_at, predicted_saves, roles_of
from ..benchmark.text import benchmark_lines
from ..errors import ConfigError
from ..probe.fixed import versions
from ..rundir.history import BASELINE_EVENT
from ..scoring.model_info import model_name

logger = logging.getLogger("tinymcf_callback")


def benchmark_of(prefs=None, lm_eval=None, benchmark=None) -> BenchmarkConfig | None:
    """The callback's benchmark settings: ``benchmark`` (a :class:`BenchmarkConfig` or its fields as a dict, a
    restored callback's), with ``prefs`` and ``lm_eval`` as shortcuts; None when none is asked."""
    given = {k: v for k, v in (("prefs", prefs), ("lm_eval", lm_eval)) if v is not None}
    if isinstance(benchmark, BenchmarkConfig):
        benchmark = benchmark.as_dict()
    if benchmark is not None and not isinstance(benchmark, dict):
        raise ConfigError(f"benchmark= must be a tinymcf_callback.BenchmarkConfig (or a dict of its fields), got "
                          f"{type(benchmark).__name__}")
    if not given and not benchmark:
        return None
    return BenchmarkConfig(**{**(benchmark or {}), **given})


def planned_saves(args, state) -> list[int]:
    """The steps a Trainer run will save at: every ``save_steps`` (a fraction of ``max_steps`` too) and the last;
    at each epoch's end; none for another strategy."""
    strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
    length = state.max_steps
    if strategy == "steps":
        every = args.save_steps if args.save_steps >= 1 else math.ceil(args.save_steps * length)
        return predicted_saves(length, int(every))
    if strategy == "epoch" and state.num_train_epochs:
        epochs = int(math.ceil(state.num_train_epochs))
        return sorted({min(length, round(length * k / state.num_train_epochs)) for k in range(1, epochs + 1)})
    return []


class TrainingBenchmark:
    """The callback's benchmark: built at ``on_train_begin``, it decides at each event whether this step is due."""

    def __init__(self, config: BenchmarkConfig, *, name: str, answer_format: str, strict: bool, verbose: bool):
        self.config, self.name, self.answer_format = config, name, answer_format
        self.strict, self.verbose = strict, verbose
        self.at = parse_at(config.at, "at")
        self.bench: Benchmark | None = None
        self.path = None
        self.scored: dict[int, tuple[str, ...]] = {}  # steps scored in this process, and why
        self.saves: list[int] = []

    def start(self, args, state, tok) -> None:
        """At ``on_train_begin``: one process only; the pairs read and tokenised, the tasks checked (a setup error
        raises here, at step 0, not at the end of the run)."""
        if getattr(args, "world_size", 1) > 1:
            raise ConfigError("MoralProbeCallback(prefs=..., lm_eval=...) scores in one process; under several, pass "
                              "hand_off=True and run `tinymcf watch RUN --prefs ... --lm-eval ...` beside the training")
        if self.bench is None:
            self.bench = Benchmark(tok, self.config)
        self.path = bench_path(args.output_dir, self.name, self.answer_format)
        self.saves = planned_saves(args, state)

    def due(self, state, *, saved: bool, ended: bool = False) -> tuple[str, ...]:
        """Why this step is to be scored (empty: it is not): the schedule over the planned saves; the first save past
        half-way as the middle when the planned one never came; the end at train end when no save scored it."""
        step, length = state.global_step, state.max_steps
        if step in self.scored:
            return ()
        saves = set(self.saves) | ({step} if saved or ended else set())
        why = list(roles_of(self.at, saves, length=length, ended=ended).get(step, ()))
        done = {role for roles in self.scored.values() for role in roles}
        planned = nearest(self.saves, length / 2)
        if saved and "middle" in self.at.roles and "middle" not in done and step >= length / 2 and \
                (planned is None or planned < step):
            why.append("middle")
        return tuple(dict.fromkeys(w for w in why if w == "step" or w not in done))

    def score(self, model, state, *, event: str, why: tuple[str, ...], fingerprint: str | None,
              write: bool) -> list[dict]:
        """Score ``model`` now: its lines into the benchmark history (``write``: on the main process), and returned
        (their metrics for the reporters); ``[]`` when it failed (warned) or this step's result is already there."""
        step = state.global_step
        if self._already(step, fingerprint):
            self.scored[step] = why
            return []
        try:
            result = self.bench.run(model)
        except Exception as e:  # noqa: BLE001 - the benchmark must never stop the training it observes
            if self.strict:
                raise
            logger.warning("benchmark [%s] failed at step %d (%s): %s: %s; training continues", self.name, step,
                           event, type(e).__name__, e)
            return []
        self.scored[step] = why
        event = BASELINE_EVENT if step == 0 else event
        lines = result_lines(result, name=self.name, answer_format=self.answer_format, step=step, epoch=state.epoch,
                             event=event, at=why, model=model_name(model), fingerprint=fingerprint, by="callback",
                             versions=versions())
        if write:
            if self.verbose:
                print(f"[tinymcf] step {step} ({', '.join(why)}): the benchmark")
                print("\n".join(benchmark_lines(result)))
            for line in lines:
                try:
                    append_bench(self.path, line)
                except OSError as e:
                    logger.warning("benchmark [%s]: could not write to %s (%s); step %d's %s result is lost, training "
                                   "goes on", self.name, self.path, e.strerror or e, step, line["kind"])
        return lines

    def _already(self, step: int, fingerprint: str | None) -> bool:
        """A resumed run's step whose every result is in the history, of these weights."""
        if step == 0 or fingerprint is None:
            return False
        try:
            lines = [line for line in read_bench(self.path) if line["step"] == step]
        except Exception:  # noqa: BLE001 - an unreadable history is scored again, not a failure
            return False
        kinds = {line["kind"] for line in lines if line.get("fingerprint") == fingerprint}
        wanted = {k for k, on in (("prefs", self.config.prefs), ("lm_eval", self.config.lm_eval)) if on}
        return bool(wanted) and wanted <= kinds
