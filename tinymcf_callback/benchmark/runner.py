"""``evaluate_benchmark``: the slow benchmark beside the probe on one model; :class:`Benchmark` behind it.

:class:`Benchmark` holds what does not change between checkpoints: the preference pairs read, checked and tokenised
once for a tokenizer, and the lm-eval tasks checked once. ``Benchmark.run(model)`` scores the pairs with the
probe's engine (:mod:`.scoring`) and runs the tasks through lm-eval (:mod:`.lmeval`), on the model as it is: its
weights, its precision, its device. ``tinymcf eval --prefs``, the sweep, the watcher and the callback all go
through it.
"""

from __future__ import annotations

import logging
import time

from ..scoring.batching import batch_size_for
from ..scoring.engine import LogOnce
from ..scoring.mode import probe_mode
from ..scoring.model_info import (
    check_causal_lm,
    check_context,
    check_vocabulary,
    device_memory,
    memory_per_token,
    model_device,
    pad_token_id,
)
from .analysis import pair_rows, summarise
from .config import BenchmarkConfig
from .encoding import encode_pairs
from .lmeval import run_tasks, task_manager
from .pairs import load_pairs
from .scoring import vocab_size
from .selfcheck import score_sequences
from .sequences import plan_pair_batches, sequences_of
from .text import benchmark_lines

logger = logging.getLogger(__name__)


class Benchmark:
    """Preference pairs and lm-eval tasks, ready to score models of one tokenizer.

    Args:
        tok: the model's tokenizer (its chat template renders conversational pairs).
        config: the settings (:class:`~.config.BenchmarkConfig`); or its fields as keyword arguments.

    ``pairs`` and ``manager``: the pairs already read (:func:`read_pairs`) and lm-eval's task manager, shared by the
    benchmarks of several tokenizers (a followed run's checkpoints).

    Example::

        bench = Benchmark(tok, prefs="pairs.jsonl", lm_eval="ethics_cm")   # read, checked, tokenised once
        result = bench.run(model)          # {"prefs": {...accuracy, margin, per config, per pair}, "lm_eval": {...}}

    Raises :class:`~tinymcf_callback.errors.ProbeDataError` for pairs that cannot be read or used,
    :class:`~tinymcf_callback.errors.BenchmarkError` for an unknown lm-eval task, and
    :class:`~tinymcf_callback.errors.MissingExtraError` naming the extra a source or lm-eval needs.
    """

    def __init__(self, tok, config: BenchmarkConfig | None = None, *, pairs=None, manager=None, **settings):
        self.config = config = config if config is not None else BenchmarkConfig(**settings)
        self.tok = tok
        self.pairs = self.encoded = self.seqs = self.manager = None
        self.say = LogOnce()  # the pairs engine's warnings, once per model and cause
        if config.prefs:
            self.pairs = pairs if pairs is not None else read_pairs(config)
            self.encoded = encode_pairs(tok, self.pairs)
            self.seqs = sequences_of(self.encoded)
        if config.lm_eval:
            self.manager = manager or task_manager(list(config.lm_eval), config.lm_eval_include)

    @property
    def source(self) -> dict | None:
        """What the pairs were read from (their record), or None without pairs."""
        return self.pairs.record if self.pairs is not None else None

    def run(self, model, *, progress: bool = False) -> dict:
        """``{"prefs": block or None, "lm_eval": block or None}`` for ``model`` (see :meth:`score_prefs`,
        :meth:`run_lm_eval`)."""
        return {"prefs": self.score_prefs(model, progress=progress) if self.pairs is not None else None,
                "lm_eval": self.run_lm_eval(model) if self.manager is not None else None}

    def score_prefs(self, model, *, progress: bool = False) -> dict:
        """The ``prefs`` block: accuracy and margin with intervals, per config, one row per pair, and how they were
        scored (strategy, self-check, precision). Checks the model first (a causal LM, a vocabulary the tokenizer
        fits, a context the longest sequence fits)."""
        check_causal_lm(model)
        seqs = self.seqs
        whole = [seqs.ids(s) for s in range(len(seqs.conts))]
        check_vocabulary(model, whole, [])
        check_context(model, whole, [f"a sequence of {len(x)} tokens (prompt and continuation)" for x in whole])
        device = model_device(model)
        cost = memory_per_token(model) or (None, 0)
        size = batch_size_for(device.type, device_memory(device), *cost, token_budget=self.config.token_budget,
                              max_batch_size=self.config.max_batch_size)
        batches = plan_pair_batches(seqs, size, vocab_size(model))
        started = time.perf_counter()
        with probe_mode(model) as precision:
            scores, strategy, calls, found = score_sequences(model, seqs, batches, pad_id=pad_token_id(model, self.tok),
                                                             precision=precision, self_check=self.config.self_check,
                                                             progress=progress, ragged=not size.balance,
                                                             say=self.say)
        elapsed = time.perf_counter() - started
        chosen, rejected = scores[seqs.chosen], scores[seqs.rejected]
        pairs, config = self.pairs, self.config
        return {"source": pairs.record,
                **summarise(chosen, rejected, pairs.config, level=config.level, n_resamples=config.n_resamples,
                            seed=config.seed),
                "pairs": pair_rows(chosen, rejected, pairs.config, pairs.row),
                "token_digest": self.encoded.digest, "template": self.encoded.template, "strategy": strategy,
                "self_check": found.as_dict() if found is not None else None, "precision": precision.as_dict(),
                "n_forward": calls,
                "sequences": {"prompts": len(seqs.prompts), "sequences": len(seqs.conts), "shared_start": seqs.root},
                "batches": {"device": str(device), **size.as_dict(), "batches": len(batches)}, "elapsed_s": elapsed}

    def run_lm_eval(self, model) -> dict:
        """The ``lm_eval`` block: lm-eval's results of the tasks on ``model`` (:func:`~.lmeval.run_tasks`)."""
        config = self.config
        return run_tasks(model, self.tok, list(config.lm_eval), include=config.lm_eval_include,
                         limit=config.lm_eval_limit, manager=self.manager)


def read_pairs(config: BenchmarkConfig):
    """The pairs ``config`` names, read and checked (:func:`~.pairs.load_pairs`)."""
    return load_pairs(config.prefs, configs=config.configs, split=config.split, revision=config.revision,
                      limit=config.limit, per_config=config.per_config, seed=config.seed)


def evaluate_benchmark(model, tok, prefs: str | None = None, lm_eval=None, *, config: BenchmarkConfig | None = None,
                       verbose: bool = True, progress: bool | None = None, **settings) -> dict:
    """Score ``model`` on preference pairs and lm-eval tasks, the slow benchmark beside the probe.

    ``prefs``: the pairs' source (a local file, a dataset folder or a Hub dataset); ``lm_eval``: lm-eval task names
    (a list or a comma-separated string); ``config`` and ``settings`` are :class:`~.config.BenchmarkConfig`'s
    (``configs``, ``split``, ``limit``, ``per_config``, ``lm_eval_include``, ...). Returns ``{"prefs": {...},
    "lm_eval": {...}}`` (None for the one not asked): ``prefs`` holds ``accuracy``, ``accuracy_lo``,
    ``accuracy_hi``, ``margin``, ``margin_lo``, ``margin_hi``, ``configs`` (one row per config) and ``pairs`` (one
    row per pair in the data's order: ``chosen_logp``, ``rejected_logp``, ``margin``); ``lm_eval`` lm-eval's
    results per task. Prints what it found unless ``verbose=False``.
    """
    if config is None:
        given = {k: v for k, v in (("prefs", prefs), ("lm_eval", lm_eval)) if v is not None}
        config = BenchmarkConfig(**given, **settings)
    result = Benchmark(tok, config).run(model, progress=verbose if progress is None else progress)
    if verbose:
        print("\n".join(benchmark_lines(result)))
    return result
