"""The slow benchmark's options, shared by ``eval``, ``sweep`` and ``watch``: one option per
:class:`~tinymcf_callback.benchmark.config.BenchmarkConfig` field, and the config built back from them.

The intervals' level, resamples and seed are the probe's own (``--level``, ``--n-resamples``, ``--seed``), so the
probe's numbers and the benchmark's are made alike.
"""

from __future__ import annotations

import argparse

from ..benchmark.schedule import DEFAULT_AT

# a BenchmarkConfig field -> the option that sets it (named in messages)
OPTIONS = {"prefs": "--prefs", "configs": "--config", "split": "--split", "revision": "--prefs-revision",
           "limit": "--prefs-limit", "per_config": "--per-config", "lm_eval": "--lm-eval",
           "lm_eval_include": "--lm-eval-include", "lm_eval_limit": "--lm-eval-limit", "at": "--at",
           "level": "--level", "n_resamples": "--n-resamples", "seed": "--seed", "token_budget": "--token-budget",
           "max_batch_size": "--max-batch-size"}


def add_benchmark_options(parser, *, run: bool = False) -> None:
    """``--prefs`` and ``--lm-eval`` with what goes with them; ``run``: also ``--at`` (a sweep's or a watcher's)."""
    g = parser.add_argument_group("the slow benchmark beside the probe (--prefs, --lm-eval)")
    g.add_argument("--prefs", default=None, metavar="SOURCE",
                   help="preference pairs in TRL's format (prompt, chosen, rejected; plain text or chat messages): a "
                        ".jsonl/.json/.parquet/.csv file, a dataset folder, or a Hugging Face dataset such as "
                        "wassname/ethics_expression_preferences (the [prefs] extra); scored as margin = log "
                        "P(chosen | prompt) - log P(rejected | prompt) and accuracy = share of margins > 0")
    g.add_argument("--config", dest="configs", action="append", default=None, metavar="NAME",
                   help="keep this config of the pairs (a file's config column, a dataset's config); repeat or "
                        "comma-separate for several (default: all)")
    g.add_argument("--split", default="test", help="the dataset's split (default: test; a file is one split)")
    g.add_argument("--prefs-revision", default=None, metavar="REV", help="the Hub dataset's revision")
    g.add_argument("--prefs-limit", type=int, default=None, metavar="N", help="the first N pairs of each config")
    g.add_argument("--per-config", type=int, default=None, metavar="K",
                   help="K pairs drawn from each config (seeded by --seed)")
    g.add_argument("--lm-eval", default=None, metavar="TASKS",
                   help="lm-evaluation-harness tasks, comma-separated (ethics_cm, hendrycks_ethics, a local "
                        "folder's), run through lm-eval on the same loaded model (the [lmeval] extra)")
    g.add_argument("--lm-eval-include", default=None, metavar="DIR",
                   help="a folder of lm-eval task files (lm-eval's include_path): a task whose data is a local file "
                        "runs offline")
    g.add_argument("--lm-eval-limit", type=int, default=None, metavar="N", help="documents per lm-eval task")
    if run:
        g.add_argument("--at", default=DEFAULT_AT, metavar="WHEN",
                       help="which checkpoints the benchmark scores: start (step 0), middle (the save nearest half "
                            "the run), end (the last save), comma-separated; all (every save); or steps such as "
                            f"0,500 (default: {DEFAULT_AT})")


def benchmark_config(args: argparse.Namespace, probe=None):
    """The :class:`~tinymcf_callback.benchmark.config.BenchmarkConfig` of the options, None without ``--prefs`` or
    ``--lm-eval``; the statistics are ``probe``'s (a :class:`~tinymcf_callback.config.ProbeConfig`). A benchmark
    option without either is refused, naming it."""
    from ..benchmark.config import BenchmarkConfig
    from ..errors import ConfigError

    if not args.prefs and not args.lm_eval:
        given = [OPTIONS[f] for f in ("configs", "revision", "limit", "per_config", "lm_eval_include",
                                      "lm_eval_limit") if getattr(args, _dest(f), None) is not None]
        if getattr(args, "at", DEFAULT_AT) != DEFAULT_AT:
            given.append("--at")
        if given:
            raise ConfigError(f"{given[0]} goes with --prefs SOURCE or --lm-eval TASKS (the benchmark to score)")
        return None
    configs = [c for value in (args.configs or []) for c in value.split(",")]
    stats = {"level": probe.level, "n_resamples": probe.n_resamples or 2000, "seed": probe.seed} if probe else {}
    return BenchmarkConfig(prefs=args.prefs, configs=configs, split=args.split, revision=args.prefs_revision,
                           limit=args.prefs_limit, per_config=args.per_config, lm_eval=args.lm_eval,
                           lm_eval_include=args.lm_eval_include, lm_eval_limit=args.lm_eval_limit,
                           at=getattr(args, "at", DEFAULT_AT), names=OPTIONS, **stats)


def _dest(field: str) -> str:
    return {"revision": "prefs_revision", "limit": "prefs_limit"}.get(field, field)
