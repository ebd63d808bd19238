"""``tinymcf show --name NAME [-n 10]``: the spot check, random vignettes with their four conditions side by side.

See :mod:`tinymcf_callback.prepare.show`. Reads local files only: no key, no network.
"""

from __future__ import annotations

from ..errors import ConfigError
from .options import add_home

NAME = "show"
SUMMARY = "print random vignettes of a prepared set with their four conditions (a spot check)"


def add_arguments(p) -> None:
    p.add_argument("--name", required=True, help="the prepared set")
    p.add_argument("-n", "--count", type=int, default=10, dest="show", metavar="COUNT",
                   help="how many vignettes to print (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="which vignettes are drawn (default: %(default)s)")
    p.add_argument("--judge-model", help="show this judge's verdicts (default: any judge's, where validate has run)")
    p.add_argument("--limit", type=int, help="draw from the first N vignettes only")
    add_home(p)


def run(args) -> int:
    from ..prepare.show import show_set
    from .prepare import Say

    if args.show <= 0:
        raise ConfigError(f"--count must be a positive whole number of vignettes to print, got {args.show}")
    say = Say()
    return show_set(args, say.secrets, say)
