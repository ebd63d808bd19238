"""The slow benchmark beside a followed run: ``tinymcf sweep RUN --prefs ... --lm-eval ... --at start,middle,end``.

At each look the run's known saves (present, recorded, or predicted from ``max_steps`` and ``save_steps``) decide
which steps are due (:func:`~tinymcf_callback.benchmark.schedule.roles_of`: the sweep looks at a run as over, the
watcher once it knows where it ended, or earlier when its saves can be predicted). A due step is scored on the
weights the probe scores, in the run's one precision: on the model the probe has just loaded when the step is also
the probe's to score, else loaded for the benchmark alone (a run swept before, step 0 from the run's starting
model). A step is done when the benchmark history holds its result for the same weights (fingerprint) and the same
question (the pairs' digest, lm-eval's tasks). Each result is a line of ``moral_bench_<name>.jsonl``
(:mod:`~tinymcf_callback.benchmark.history`) and a point in the run's dashboards at its step, beside the probe's.

One process: the pairs and lm-eval run on one model in one process (``torchrun`` is refused with the command that
works), and on a local model (not with ``--endpoint``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..benchmark.history import append_bench, asked, asked_tasks, bench_path, read_bench, result_lines
from ..benchmark.lmeval import task_manager
from ..benchmark.runner import Benchmark, read_pairs
from ..benchmark.schedule import parse_at, predicted_saves, roles_of
from ..benchmark.text import benchmark_lines
from ..errors import SweepError
from ..loading import release_memory
from ..probe.fixed import versions
from ..rundir.checkpoints import FULL, Checkpoint, fingerprint, tokenizer_fingerprint
from .planner import Plan, tokenizer_source

logger = logging.getLogger(__name__)


class RunBenchmark:
    """A followed run's benchmark: what is due at a look, scoring a model, writing its lines (see the module)."""

    def __init__(self, settings):
        self.settings = config = settings.benchmark
        self.run = settings
        self.at = parse_at(config.at, "--at")
        self.path = bench_path(settings.run_dir, settings.name, settings.probe.answer_format)
        self.pairs = read_pairs(config) if config.prefs else None  # bad data refused before any model loads
        self.manager = task_manager(list(config.lm_eval), config.lm_eval_include) if config.lm_eval else None
        self.kinds = [k for k, on in (("prefs", config.prefs), ("lm_eval", config.lm_eval)) if on]
        self._benches: dict[str, Benchmark] = {}
        self.due: dict[int, tuple[str, ...]] = {}
        self.scored: list[int] = []

    def asked(self, kind: str) -> str:
        """What a result of ``kind`` asks, whatever the tokenizer: the pairs' digest, or lm-eval's tasks."""
        if kind == "prefs":
            return self.pairs.record["digest"]
        return asked_tasks(self.settings.lm_eval, self.settings.lm_eval_limit)

    def done(self, step: int, weights: str | None) -> bool:
        """Whether the history holds every kind's result at ``step``, of these weights and this question."""
        lines = {line["kind"]: line for line in read_bench(self.path) if line["step"] == step}
        return all(kind in lines and _same_weights(lines[kind].get("fingerprint"), weights)
                   and asked(lines[kind]) == self.asked(kind) for kind in self.kinds)

    # ---- what is due ---------------------------------------------------------------------------------------
    def look(self, plan: Plan, fingerprint_of, *, ended: bool) -> dict[int, tuple[str, ...]]:
        """The steps due at this look and not done yet, with why (start, middle, end, step)."""
        length, every = plan.length
        saves = set(plan.saves) | set(predicted_saves(length, every))
        self.due = {}
        for step, why in roles_of(self.at, saves, length=length, ended=ended).items():
            checkpoint = self.checkpoint(plan, step)
            if checkpoint is None:
                continue
            weights = fingerprint_of(checkpoint) if checkpoint.folder.is_dir() and not checkpoint.baseline else None
            if not self.done(step, weights):
                self.due[step] = why
        return self.due

    def checkpoint(self, plan: Plan, step: int) -> Checkpoint | None:
        """The checkpoint of ``step`` now (step 0: its saved folder, else the run's starting model), or None."""
        if step in plan.present:
            return plan.present[step]
        if step == 0 and plan.base_model:
            return Checkpoint(0, Path(plan.base_model), 0.0, FULL, baseline=True)
        if step == 0:
            logger.info("the benchmark's start (step 0) is not scored: the run's starting weights are unknown (pass "
                        "--base-model PATH)")
        return None

    # ---- scoring -------------------------------------------------------------------------------------------
    def score(self, model, tokenizer: str, checkpoint: Checkpoint, weights: str | None, plan: Plan) -> list[dict]:
        """The due step of ``checkpoint`` scored on ``model`` (already loaded, in the run's precision): its lines."""
        bench = self._bench(tokenizer)
        result = bench.run(model)
        event = plan.baseline_event if checkpoint.baseline else plan.event
        return result_lines(result, name=self.run.name, answer_format=self.run.probe.answer_format,
                            step=checkpoint.step, epoch=checkpoint.epoch, event=event, at=self.due[checkpoint.step],
                            model=checkpoint.shown_as or str(checkpoint.folder), fingerprint=weights, by=plan.by,
                            versions=versions())

    def _bench(self, tokenizer: str) -> Benchmark:
        from transformers import AutoTokenizer

        key = tokenizer_fingerprint(tokenizer)
        if key not in self._benches:
            self._benches[key] = Benchmark(AutoTokenizer.from_pretrained(tokenizer), self.settings, pairs=self.pairs,
                                           manager=self.manager)
        return self._benches[key]

    def write(self, lines: list[dict], trackers) -> None:
        """Append ``lines`` to the benchmark history (a write that fails stops the command, naming the file), then
        give them to the run's dashboards at their step, beside the probe's points."""
        for line in lines:
            try:
                append_bench(self.path, line)
            except OSError as e:
                raise SweepError(f"cannot write to {self.path}: {e.strerror or e}; step {line['step']}'s "
                                 f"{line['kind']} result is not written (a rerun scores it again)") from None
            trackers.send(line, label="benchmark")  # no score: beside the curve, not on it
        if lines:
            step = lines[0]["step"]
            self.scored.append(step)
            result = {line["kind"]: line[line["kind"]] for line in lines}
            for text in benchmark_lines(result):
                logger.info("step %d (%s): %s", step, ", ".join(lines[0]["at"]), text.removeprefix("[tinymcf] "))

    def catch_up(self, plan: Plan, scored: set[int], load, trackers) -> list[str]:
        """Score the due steps the probe's round did not load (its line stood already): each loaded for the benchmark
        (``load(checkpoint)`` gives the model in the run's precision, and a context to score it in). Returns why
        each step that failed did (said here too; a rerun tries it again)."""
        failures = []
        for step in sorted(set(self.due) - scored):
            checkpoint = self.checkpoint(plan, step)
            if checkpoint is None:
                continue
            try:
                weights = fingerprint(checkpoint.folder, checkpoint.format) \
                    if checkpoint.folder.is_dir() and not checkpoint.baseline else None
                tokenizer = self.tokenizer(plan, checkpoint)
                model, context = load(checkpoint)
                try:
                    with context:
                        lines = self.score(model, tokenizer, checkpoint, weights, plan)
                finally:
                    model = None
                    release_memory()
            except (KeyboardInterrupt, SweepError):
                raise
            except Exception as e:  # noqa: BLE001 - one step's benchmark must not end the others'
                why = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                failures.append(f"step {step}: {why}")
                logger.error("step %d (%s): the benchmark was not scored: %s (a rerun tries again)", step,
                             checkpoint.folder, why)
                continue
            self.write(lines, trackers)
        return failures

    def tokenizer(self, plan: Plan, checkpoint: Checkpoint) -> str:
        source = tokenizer_source(self.run, checkpoint, plan)
        if source is None:
            raise SweepError(f"{checkpoint.folder} has no tokenizer files for the benchmark: pass --tokenizer PATH")
        return source


def _same_weights(recorded: str | None, now: str | None) -> bool:
    return recorded is None or now is None or recorded == now


def check_followable(settings, processes: int) -> None:
    """Refuse what the benchmark cannot follow: several processes, a served model."""
    if settings.benchmark is None:
        return
    if processes > 1:
        raise SweepError(f"--prefs and --lm-eval score the benchmark in one process, and {processes} were started: "
                         "run the command without torchrun or accelerate launch")
    if settings.served is not None:
        raise SweepError("--prefs and --lm-eval score the checkpoint's weights in this process: they do not go with "
                         "--endpoint (score the benchmark with a sweep of its own, without --endpoint)")
