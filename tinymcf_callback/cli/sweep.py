"""``tinymcf sweep RUN_DIR``: score every checkpoint of a Trainer output folder into its history.

See :mod:`tinymcf_callback.follow.sweep`. Its exit status says what it left undone (docs/cli.md).
"""

from __future__ import annotations

from .followed import add_run_arguments, check_retries, counts, in_processes, said_failures, settings_of

NAME = "sweep"
SUMMARY = "score each checkpoint-<step> of a Trainer run into its history (the callback's curve)"
USAGE = "%(prog)s RUN_DIR [options, by group below]"


def add_arguments(p) -> None:
    add_run_arguments(p, dashboards="none")


def run(args) -> int:
    from ..follow.sweep import run_sweep

    settings = settings_of(args)
    check_retries(args)
    result = in_processes(args, lambda: run_sweep(settings, retries=args.retries, backoff=args.backoff))
    if result is None or isinstance(result, int):
        return result or 0
    print(f"[tinymcf] sweep of {settings.run_dir}: {counts(result)}; history: {result.history}")
    return said_failures(result)
