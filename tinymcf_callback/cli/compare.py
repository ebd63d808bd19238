"""``tinymcf compare A.json B.json``: the paired change B - A of every metric, with intervals and p-values.

See :func:`tinymcf_callback.results.comparison.compare`. No model is loaded (well under a second).
"""

from __future__ import annotations

import warnings

from ..data.sets import REAL_FOUNDATIONS
from ..results.stats import DEFAULT_LEVEL, DEFAULT_RESAMPLES, check_level, check_resamples

NAME = "compare"
SUMMARY = "the paired change between two JSON reports of the same vignettes"


def add_arguments(p) -> None:
    p.add_argument("reports", nargs=2, metavar="REPORT",
                   help="two JSON reports (eval's eval_<name>_<tag>.json, a checkpoint's moral_probe_<name>.json, "
                        "the callback's moral_probe_<name>_baseline.json): A, then B")
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
    from ..results.comparison import compare, format_comparison, load_report

    level = check_level(args.level, "--level")
    n_resamples = check_resamples(args.n_resamples, "--n-resamples", allow_off=False)
    labels = tuple(args.reports)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the result carries them; printed with the table
        result = compare(*(load_report(path) for path in args.reports), level=level, n_resamples=n_resamples,
                         labels=labels, allow_precision_change=args.allow_precision_change, target=args.target)
    print(format_comparison(result, labels))
    return 0
