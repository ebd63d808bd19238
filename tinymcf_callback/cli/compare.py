"""``tinymcf compare A.json B.json`` or ``tinymcf compare RUN --steps A B``: the paired change B - A of every metric.

Two reports, or two steps of a run's history, the benchmark's changes beside the probe's. No model is loaded.
"""

from __future__ import annotations

import warnings

from ..data.sets import REAL_FOUNDATIONS
from ..stats.bootstrap import DEFAULT_LEVEL, DEFAULT_RESAMPLES, check_level, check_resamples

NAME = "compare"
SUMMARY = "the paired change between two reports, or two steps of a run (--steps), with the benchmark's beside it"


def add_arguments(p) -> None:
    p.add_argument("reports", nargs="+", metavar="REPORT",
                   help="two JSON reports (eval's eval_<name>_<tag>.json, a checkpoint's moral_probe_<name>.json, "
                        "the callback's moral_probe_<name>_baseline.json): A, then B; or, with --steps, one run "
                        "folder (or its moral_probe_<name>.jsonl history)")
    p.add_argument("--steps", nargs=2, type=int, metavar=("A", "B"), default=None,
                   help="compare these two steps of the run's history (any run: the callback's, a sweep's, a "
                        "watcher's), the benchmark's changes beside the probe's")
    p.add_argument("--name", default=None, metavar="KEY",
                   help="with --steps, the probe of a run folder holding several histories (scifi, scifi_json)")
    p.add_argument("--level", type=float, default=DEFAULT_LEVEL,
                   help=f"confidence level of the intervals (default: {DEFAULT_LEVEL})")
    p.add_argument("--n-resamples", type=int, default=DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples (default: {DEFAULT_RESAMPLES})")
    p.add_argument("--target", default=None, choices=REAL_FOUNDATIONS, metavar="FOUNDATION",
                   help="the foundation B's training or steering aims at: adds its selectivity (its align_other change "
                        f"minus the mean change of the other real foundations); one of {', '.join(REAL_FOUNDATIONS)}")
    p.add_argument("--allow-precision-change", action="store_true",
                   help="compare reports scored in different precisions (a warning instead of an error)")


def run(args) -> int:
    from ..errors import ConfigError
    from ..views.comparison import compare, format_comparison, load_report

    level = check_level(args.level, "--level")
    n_resamples = check_resamples(args.n_resamples, "--n-resamples", allow_off=False)
    if args.steps is not None:
        if len(args.reports) != 1:
            raise ConfigError("--steps A B compares two steps of one run: give one run folder (or its history), not "
                              f"{len(args.reports)}")
        if args.target is not None:
            raise ConfigError("--target goes with two reports (tinymcf compare A.json B.json --target ...)")
        from ..benchmark.steps import compare_steps, format_steps

        result = compare_steps(args.reports[0], *args.steps, name=args.name, level=level, n_resamples=n_resamples,
                               allow_precision_change=args.allow_precision_change)
        print(format_steps(result))
        return 0
    if len(args.reports) != 2:
        raise ConfigError(f"compare takes two reports (A B), or one run folder with --steps A B; got "
                          f"{len(args.reports)}")
    labels = tuple(args.reports)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the result carries them; printed with the table
        result = compare(*(load_report(path) for path in args.reports), level=level, n_resamples=n_resamples,
                         labels=labels, allow_precision_change=args.allow_precision_change, target=args.target)
    print(format_comparison(result, labels))
    return 0
