"""``tinymcf watch RUN_DIR``: score each checkpoint of a run as it is saved, beside the training, into its dashboards.

See :mod:`tinymcf_callback.follow.watch`. Its exit status says what it left undone (docs/cli.md).
"""

from __future__ import annotations

from .followed import add_run_arguments, check_retries, counts, in_processes, said_failures, settings_of

NAME = "watch"
SUMMARY = "follow a training run: score each checkpoint once it is saved, into the history and the run's dashboards"
USAGE = "%(prog)s RUN_DIR [options, by group below]"


def add_arguments(p) -> None:
    add_run_arguments(p, dashboards="auto")
    stop = p.add_argument_group("when to look, and when to stop")
    stop.add_argument("--poll", type=float, default=10.0, metavar="S", help="seconds between two looks (default: 10)")
    stop.add_argument("--idle-timeout", type=float, default=None, metavar="S",
                      help="stop when no new checkpoint came for S seconds (default: wait for the run's end)")
    stop.add_argument("--stop-at", type=int, default=None, metavar="STEP",
                      help="stop once the checkpoint of STEP (or a later one) is scored")
    stop.add_argument("--dead-after", type=float, default=900.0, metavar="S",
                      help="a training on another machine that gave no sign of life (its heartbeat in "
                           "moral_probe_run.json) for S seconds is taken for dead (default: 900; on the same machine "
                           "its process is asked)")


def run(args) -> int:
    from ..errors import ConfigError
    from ..follow.settings import WatchSettings
    from ..follow.watch import run_watch

    for option, value in (("--poll", args.poll), ("--idle-timeout", args.idle_timeout),
                          ("--dead-after", args.dead_after)):
        if value is not None and not value > 0:
            raise ConfigError(f"{option} must be a number of seconds above 0, got {value}")
    if args.stop_at is not None and args.stop_at < 0:
        raise ConfigError(f"--stop-at must be a training step >= 0, got {args.stop_at}")
    check_retries(args)
    settings = WatchSettings(settings_of(args), poll=args.poll, idle_timeout=args.idle_timeout, stop_at=args.stop_at,
                             dead_after=args.dead_after, retries=args.retries, backoff=args.backoff)
    result = in_processes(args, lambda: run_watch(settings))
    if result is None or isinstance(result, int):
        return result or 0
    behind = f"; at most {result.most_behind - 1} behind the newest" if result.most_behind > 1 else ""
    print(f"[tinymcf] watch of {settings.run.run_dir} stopped: {result.why_stopped}. {counts(result)}{behind}; "
          f"history: {result.history}")
    return said_failures(result)
