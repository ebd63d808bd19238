"""``tinymcf plot HISTORY [HISTORY ...]``: draw the probe's curves from one or more histories of the same set.

See :mod:`tinymcf_callback.tools.plot`. Needs matplotlib, the ``[plot]`` extra.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import TinymcfError

NAME = "plot"
SUMMARY = "draw the curves of one or more moral_probe_<name>.jsonl histories"


def add_arguments(p) -> None:
    p.add_argument("histories", nargs="+", metavar="HISTORY",
                   help="moral_probe_<name>.jsonl files (or run folders holding one), all of the same vignette set")
    p.add_argument("--out", default=None, help="image to write, .png, .svg or .pdf (default: moral_probe_<name>.png "
                                               "next to a single history, else in the current folder)")
    p.add_argument("--title", default=None, help="figure title (default: the set and the run names)")


def run(args) -> int:
    from ..results.curves import load_histories
    from ..tools.plot import default_out, draw, image_format, save_figure

    if args.out:
        image_format(args.out)  # a wrong suffix fails before the drawing
    histories = load_histories(args.histories)
    out = Path(args.out) if args.out else default_out(histories)
    fig = draw(histories, title=args.title)
    try:
        save_figure(fig, out)
    except OSError as e:
        raise TinymcfError(f"cannot write the figure {out}: {e.strerror or e}; pass a writable path with "
                           f"--out") from None
    print(f"[tinymcf] curves of {len(histories)} run(s) written to {out}")
    return 0
