"""``tinymcf sweep RUN_DIR``: score every checkpoint of a Trainer output folder into its history.

See :mod:`tinymcf_callback.tools.sweep`. Exit status 0 when every pending checkpoint was scored,
1 when some could not be (listed; a rerun retries only those), 2 for bad input.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .options import add_dashboards, add_home, add_loading, add_probe_options, add_progress, probe_config, report_to

NAME = "sweep"
SUMMARY = "score each checkpoint-<step> of a Trainer run into its history (the callback's curve)"


def add_arguments(p) -> None:
    add_run_arguments(p, dashboards="none")


def add_run_arguments(p, *, dashboards: str) -> None:
    """The options of scoring a run's checkpoints: the sweep's, and the watcher's (with ``auto`` dashboards)."""
    p.add_argument("run_dir", metavar="RUN_DIR", help="a Trainer output directory (TrainingArguments.output_dir)")
    p.add_argument("--base-model", metavar="PATH", default=None,
                   help="the run's starting weights: scored as the step-0 baseline (the change since it is logged), "
                        "and the model PEFT adapter checkpoints apply to (default: the local folder an adapter's "
                        "adapter_config.json names)")
    p.add_argument("--no-baseline", action="store_true",
                   help="do not score the starting weights as step 0 (no score_change in the lines)")
    p.add_argument("--restart", action="store_true",
                   help="start the run's history again: the history and its baseline report are set aside (renamed "
                        "<file>.set-aside-<time>, kept), e.g. after a baseline scored in the wrong precision")
    p.add_argument("--tokenizer", metavar="PATH", default=None,
                   help="tokenizer for every checkpoint (default: each checkpoint's own, else --base-model's)")
    add_loading(p, device_help="cpu, cuda, cuda:1, ... (default: this process's device; under several processes "
                               "each process's own, as with a bare --device cuda)")
    add_dashboards(p, default=dashboards)
    add_home(p)
    add_progress(p)
    add_probe_options(p)


def settings_of(args):
    """The sweep's settings from the command line (the watcher's too)."""
    from ..tools.sweep import SweepSettings

    return SweepSettings(Path(args.run_dir), probe_config(args), base_model=args.base_model,
                         tokenizer=args.tokenizer, device=args.device, dtype=args.dtype,
                         progress=not args.no_progress, baseline=not args.no_baseline,
                         report_to=report_to(args.report_to), wandb_run=args.wandb_run,
                         tensorboard_dir=args.tensorboard_dir, restart=args.restart)


def run(args) -> int:
    from ..tools.sweep import run_sweep

    settings = settings_of(args)
    result = in_processes(args, lambda: run_sweep(settings))
    if result is None or isinstance(result, int):
        return result or 0
    skipped = f", {len(result.skipped)} skipped (already in the history)" if result.skipped else ""
    print(f"[tinymcf] sweep of {settings.run_dir}: {len(result.scored)} checkpoint(s) scored{skipped}, "
          f"{len(result.failures)} failed; history: {result.history}")
    return said_failures(result, "the others are in the history; a rerun retries only these")


def in_processes(args, score):
    """``score()`` on every process of this command (one, or a torchrun / accelerate launch group): its result on
    the main process; on the others their exit status (2 when the main process says why it failed)."""
    import torch.distributed as dist
    from transformers.utils import logging as hf_logging

    from ..tools.processes import process_state

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


def said_failures(result, retry: str) -> int:
    """The checkpoints that could not be scored, on stderr: status 1 when there are any, else 0."""
    if not result.failures:
        return 0
    print(f"error: {len(result.failures)} checkpoint(s) could not be scored ({retry}):", file=sys.stderr)
    for o in result.failures:
        print(f"  {o.folder}: {o.error}", file=sys.stderr)
    return 1
