"""``tinymcf plot HISTORY [HISTORY ...]``: draw the probe's curves from one or more histories of the same set.

See :mod:`tinymcf_callback.figures.plot`. Needs matplotlib, the ``[plot]`` extra.
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
                                               "next to a single history, else in the current folder; a paper "
                                               "figure adds _<panels> or _metrics to the name)")
    p.add_argument("--title", default=None, help="figure title (default: the set and the run names; a paper figure "
                                                 "has none, its caption says it)")
    p.add_argument("--panels", default=None, metavar="GROUPS",
                   help="dashboard (default: every panel, for looking at a run), or a paper figure of the groups "
                        "headline (score, Social Norms control, score minus control, self-other gap), foundations "
                        "(align_other per foundation), sanity (Yes+No mass, frame agreement, human correlation); "
                        "several comma-separated")
    p.add_argument("--metrics", default=None, metavar="NAMES",
                   help="a paper figure of these metrics, comma-separated: score, sn, score_minus_sn, gap; a "
                        "foundation (Care: its align_other) or align_other:Care / align_self:Care; yn_mass_mean, "
                        "yn_mass_min, frame_agreement, human_corr")
    p.add_argument("--width", type=float, default=None, metavar="INCHES",
                   help="a paper figure's width in inches (default 3.4, one journal column; about 7 for a page)")
    p.add_argument("--overlay", action="store_true",
                   help="a paper figure of several runs: draw them on one axis per panel (one colour each, lighter "
                        "bands) instead of one column of panels per run")
    p.add_argument("--x", choices=("step", "coefficient"), default="step",
                   help="the x axis: step (a training history, default) or coefficient (a dose-response history, "
                        "moral_probe_<name>_dose.jsonl: the real steering direction against the random ones)")


def _tag(args) -> str | None:
    """The name a paper figure adds to the default file name (None: the dashboard keeps the plain name)."""
    from ..figures.paper import split_names
    from ..figures.plot import is_paper

    if not is_paper(args.panels, args.metrics):
        return None
    return "-".join(split_names(args.panels) + (["metrics"] if split_names(args.metrics) else []))


def run(args) -> int:
    from ..figures.drawing import image_format, save_figure
    from ..figures.paper import PAPER_DPI
    from ..figures.plot import default_out, draw, is_paper
    from ..views.curves import load_histories

    if args.out:
        image_format(args.out)  # a wrong suffix fails before the drawing
    histories = load_histories(args.histories, x=args.x)
    out = Path(args.out) if args.out else default_out(histories, _tag(args))
    fig = draw(histories, title=args.title, panels=args.panels, metrics=args.metrics, width=args.width,
               overlay=args.overlay)
    try:
        save_figure(fig, out, dpi=PAPER_DPI if is_paper(args.panels, args.metrics) else 100)
    except OSError as e:
        raise TinymcfError(f"cannot write the figure {out}: {e.strerror or e}; pass a writable path with "
                           f"--out") from None
    print(f"[tinymcf] curves of {len(histories)} run(s) written to {out}")
    return 0
