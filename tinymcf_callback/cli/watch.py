"""``tinymcf watch RUN_DIR``: score each checkpoint of a run as it is saved, beside the training, into its dashboards.

See :mod:`tinymcf_callback.tools.watch`. Stops by itself when the run is over (exit 0; 1 when some
checkpoints could not be scored, listed; 2 for bad input). Killed and started again, it picks up where
the history says it was.
"""

from __future__ import annotations

from .sweep import add_run_arguments, in_processes, said_failures, settings_of

NAME = "watch"
SUMMARY = "follow a training run: score each checkpoint once it is saved, into the history and the run's dashboards"


def add_arguments(p) -> None:
    add_run_arguments(p, dashboards="auto")
    p.add_argument("--poll", type=float, default=10.0, metavar="S", help="seconds between two looks (default: 10)")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="S",
                   help="stop when no new checkpoint came for S seconds (default: wait for the run's end)")
    p.add_argument("--stop-at", type=int, default=None, metavar="STEP",
                   help="stop once the checkpoint of STEP (or a later one) is scored")


def run(args) -> int:
    from ..errors import ConfigError
    from ..tools.watch import WatchSettings, run_watch

    for option, value in (("--poll", args.poll), ("--idle-timeout", args.idle_timeout)):
        if value is not None and not value > 0:
            raise ConfigError(f"{option} must be a number of seconds above 0, got {value}")
    if args.stop_at is not None and args.stop_at < 0:
        raise ConfigError(f"--stop-at must be a training step >= 0, got {args.stop_at}")
    settings = WatchSettings(settings_of(args), poll=args.poll, idle_timeout=args.idle_timeout, stop_at=args.stop_at)
    result = in_processes(args, lambda: run_watch(settings))
    if result is None or isinstance(result, int):
        return result or 0
    deleted = f", {len(result.deleted)} deleted before they could be scored (gaps)" if result.deleted else ""
    behind = f"; at most {result.most_behind - 1} behind the newest" if result.most_behind > 1 else ""
    print(f"[tinymcf] watch of {settings.sweep.run_dir} stopped: {result.why_stopped}. {len(result.scored)} "
          f"checkpoint(s) scored{deleted}{behind}; history: {result.history}")
    return said_failures(result, "a sweep or a new watch retries them")
