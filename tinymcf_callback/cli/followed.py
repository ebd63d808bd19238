"""A followed run on the command line: what ``tinymcf sweep`` and ``tinymcf watch`` share: the options, the
:class:`~tinymcf_callback.follow.settings.RunSettings` built from them, the command run on every process of a launch,
and what it left undone as its exit status.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ConfigError
from ..trackers.table import requested
from .bench_options import add_benchmark_options, benchmark_config
from .options import (
    EXIT_GAPS,
    EXIT_TRAINING_GONE,
    EXIT_TRAINING_QUIET,
    EXIT_UNSCORED,
    add_dashboards,
    add_home,
    add_loading,
    add_probe_options,
    add_progress,
    add_served,
    named_runs,
    probe_config,
    served_config,
)

PRECISIONS = ("auto", "float32", "tf32", "bfloat16", "float16")


def add_run_arguments(p, *, dashboards: str) -> None:
    """The options of scoring a run's checkpoints: the sweep's, and the watcher's (with ``auto`` dashboards)."""
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a training run's output folder: a Trainer's output_dir (checkpoint-<step>), or where verl, "
                        "OpenRLHF, NeMo-RL, torchtitan or a loop of your own saves its models (docs/rl.md)")
    add_home(p)
    add_progress(p)
    run = p.add_argument_group("the run")
    run.add_argument("--base-model", metavar="PATH", default=None,
                     help="the run's starting weights: scored as the step-0 baseline, and what PEFT adapters and "
                          "sharded checkpoints without a config build on (default: the one the run's "
                          "moral_probe_run.json records, else the one its adapters name)")
    run.add_argument("--force-base-model", action="store_true",
                     help="use --base-model even where the run's record or an adapter names another base (a copy of "
                          "it under another path)")
    run.add_argument("--no-baseline", action="store_true",
                     help="do not score the starting weights as step 0 (no score_change in the lines)")
    run.add_argument("--restart", action="store_true",
                     help="start the run's history again: the history and its baseline report are set aside (renamed "
                          "<file>.set-aside-<time>, kept), e.g. after a baseline scored in the wrong precision")
    run.add_argument("--retries", type=int, default=4, metavar="N",
                     help="a checkpoint that cannot be read (a copy or network filesystem glitch) is tried again N "
                          "times, after 2, 4, 8, ... s (--backoff), before its step is recorded as a gap (default: 4)")
    run.add_argument("--backoff", type=float, default=2.0, metavar="S",
                     help="seconds before the first of those tries, doubling after each (default: 2; a slow network "
                          "filesystem may want more)")
    run.add_argument("--settle", type=float, default=5.0, metavar="S",
                     help="a save without a completion marker (a save_pretrained folder, verl with async_save) counts "
                          "once none of its files changed for S seconds (default 5)")
    model = p.add_argument_group("the model: its tokenizer, device and precision")
    model.add_argument("--tokenizer", metavar="PATH", default=None,
                       help="tokenizer for every checkpoint (default: each checkpoint's own, else the base model's)")
    add_loading(model, device_help="cpu, cuda, cuda:1, ... (default: this process's device; under several processes "
                                   "each process's own, as with a bare --device cuda)", dtypes=PRECISIONS,
                dtype_help="the precision every model of the run is scored in: float32, tf32 (float32 weights, "
                           "TF32 matrix products), bfloat16, float16 (default: the history's own, else what the run "
                           "trains in, else what its checkpoints were saved in)")
    model.add_argument("--autocast", default=None, choices=("bfloat16", "float16"),
                       help="score float32 weights under torch.autocast in this dtype (as the callback does inside a "
                            "bf16=True Trainer with keep_autocast=True)")
    add_probe_options(p, skip=("keep_autocast",))
    add_served(p, run=True)
    add_benchmark_options(p, run=True)
    add_dashboards(p, default=dashboards)


def settings_of(args):
    """The run's settings from the command line (the sweep's and the watcher's)."""
    from ..follow.settings import RunSettings

    config = probe_config(args)
    return RunSettings(Path(args.run_dir), config, base_model=args.base_model,
                       force_base_model=args.force_base_model, tokenizer=args.tokenizer, device=args.device,
                       dtype=args.dtype, autocast=args.autocast, progress=not args.no_progress,
                       baseline=not args.no_baseline, report_to=tuple(requested(args.report_to)),
                       runs=named_runs(args), figure=not args.no_figure, restart=args.restart,
                       served=served_config(args, config, run=True), settle=args.settle,
                       benchmark=benchmark_config(args, config))


def check_retries(args) -> None:
    if args.retries < 0:
        raise ConfigError(f"--retries must be a whole number >= 0, got {args.retries}")
    if not args.backoff >= 0:
        raise ConfigError(f"--backoff must be a number of seconds >= 0, got {args.backoff}")


def counts(result) -> str:
    """What a sweep or watch did, in one phrase."""
    parts = [f"{len(result.scored)} checkpoint(s) scored"]
    if result.replaced:
        parts.append(f"{len(result.replaced)} of them again (saved again with other weights: steps "
                     f"{', '.join(map(str, result.replaced))})")
    if result.settled:
        parts.append(f"{len(result.settled)} already in the history")
    if result.deleted:
        parts.append(f"{len(result.deleted)} deleted before they could be scored (gaps)")
    parts.append(f"{len(result.failures)} unreadable")
    if result.benchmarked:
        parts.append(f"the benchmark scored at step(s) {', '.join(map(str, result.benchmarked))}")
    return ", ".join(parts)


def in_processes(args, score):
    """``score()`` on every process of this command (one, or a torchrun / accelerate launch group): its result on
    the main process; on the others their exit status (2 when the main process says why it failed)."""
    import torch.distributed as dist
    from transformers.utils import logging as hf_logging

    from ..follow.processes import process_state

    had_group = dist.is_available() and dist.is_initialized()
    state = process_state(args.device)
    hf_logging.disable_progress_bar()  # one bar over the checkpoints, not one per weight file loaded
    try:
        result = score()
    except Exception:
        if not state.is_main_process:
            return 2  # the main process says why
        raise
    finally:
        if not had_group:
            state.destroy_process_group()  # the group this command started (torchrun / accelerate launch) ends here
    if not state.is_main_process:
        return 1 if result.failures else 0
    return result


def said_failures(result) -> int:
    """What did not get done, on stderr, then the exit status that says it: the first of ``problems`` that applies
    (docs/cli.md), else 0."""
    unread = {o.step for o in result.failures}
    gaps = [step for step in result.gaps if step not in unread]
    shown = ", ".join(map(str, gaps[:10])) + (", ..." if len(gaps) > 10 else "")
    # (status, why, whether it applies, what is printed, the lines under it), in the order the statuses apply
    problems = [
        (EXIT_UNSCORED, "checkpoints not scored", bool(result.failures), f"{len(result.failures)} checkpoint(s) "
         "could not be scored (each is a gap line; a new sweep or watch tries them again):",
         [f"{o.folder}: {o.error}" for o in result.failures]),
        (EXIT_UNSCORED, "benchmark steps not scored", bool(result.bench_failures), "the benchmark (--prefs, "
         "--lm-eval) could not be scored at some steps (their probe lines stand; a rerun scores the benchmark "
         "again):", result.bench_failures),
        (EXIT_UNSCORED, "points a dashboard did not get", bool(result.undelivered), "some points did not reach a "
         "dashboard (they are in the history; once it works again, run the same command with --report-to naming it: "
         "it sends the history's lines to it again):", result.undelivered),
        (EXIT_TRAINING_GONE, "the training is gone without ending", bool(result.training_gone), "the training "
         f"stopped without ending: {result.training_gone}; resume it and start the watcher again", []),
        (EXIT_TRAINING_QUIET, "the training has gone quiet", bool(result.training_quiet), "the training has gone "
         f"quiet: {result.training_quiet}; if it is still running, start the watcher again (it picks up where it "
         "stopped, or raise --dead-after); if it died, resume it", []),
        (EXIT_GAPS, "saved steps are gaps in the curve", bool(gaps), f"{len(gaps)} saved step(s) are gaps in the "
         f"curve, never scored: {shown} (each a gap line with its cause in {result.history.name}; "
         "MoralProbeCallback(hand_off=True) keeps a run's checkpoints until they are scored)", []),
    ]
    applied = [problem for problem in problems if problem[2]]
    for _, _, _, said, lines in applied:
        print(f"error: {said}", file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)
    if not applied:
        return 0
    status = applied[0][0]
    print(f"[tinymcf] exit status {status}: {'; '.join(problem[1] for problem in applied)} (docs/cli.md)",
          file=sys.stderr)
    return status
