"""tinymcf plot (tools/plot.py): curves read back from the drawn figure, files, bad input, the optional extra."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from helpers.cli_checks import one_error_line

pytest.importorskip("matplotlib")  # the [plot] extra (in dev); its absence is tested in a subprocess below

from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.errors import HistoryError
from tinymcf_callback.figures.drawing import save_figure
from tinymcf_callback.figures.plot import plot_histories
from tinymcf_callback.views.curves import load_history

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- histories in the callback's line schema --------------------------------------------------------
def probe_line(step, score, gap, sn, *, name="scifi", event="evaluate", care=(0.0, 0.0), yn=(0.9, 0.8), agree=0.5,
               human=None, bounds=None):
    """One history line as MoralProbeCallback writes it (Care + Social Norms rows; ``bounds``: interval fields)."""
    table = [{"foundation": "Care", "n": 9, "s_other_violate": 0.1, "s_other_uphold": -0.1, "s_self_violate": 0.0,
              "s_self_uphold": 0.0, "align_other": care[0], "align_self": care[1], "self_other_gap": care[0] - care[1]}]
    if sn is not None:
        table.append({"foundation": "Social Norms", "n": 7, "align_other": sn, "align_self": sn / 2,
                      "self_other_gap": sn / 2})
    line = {"step": step, "epoch": step / 10, "event": event, "name": name, "score": score, "gap": gap, "sn": sn,
            "metrics": {f"eval_moral_{name}/score": score},
            "info": {"yn_mass_mean": yn[0], "yn_mass_min": yn[1], "frame_agreement": agree, "human_corr": human,
                     "n_prompts": 128, "n_vignettes": 16, "elapsed_s": 0.5},
            "table": table}
    for key, value in (bounds or {}).items():
        if key.startswith("care."):
            table[0][key[len("care."):]] = value
        else:
            line[key] = value
    return line


def write_history(folder: Path, lines, name="scifi", tail: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"moral_probe_{name}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + tail, encoding="utf-8")
    return path


def axes_titled(fig, title):
    found = [ax for ax in fig.axes if ax.get_title() == title]
    assert len(found) == 1, [ax.get_title() for ax in fig.axes]
    return found[0]


def line_labelled(ax, label):
    found = [ln for ln in ax.get_lines() if ln.get_label() == label]
    assert len(found) == 1, [ln.get_label() for ln in ax.get_lines()]
    return found[0]


def xy(line):
    return np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)


SCORE_PANEL = "Score (solid) and Social Norms control (dashed)"
MINUS_PANEL = "Score minus Social Norms control"
GAP_PANEL = "Self-other gap"
MASS_PANEL = "Yes+No mass: mean (solid), min (dashed)"
AGREE_PANEL = "Frame agreement (+1: the two questions agree)"


@pytest.fixture
def three_steps(tmp_path):
    """A run with steps written out of order (20 before 10), one step without Social Norms."""
    lines = [probe_line(0, 0.01, -0.02, 0.03, event="train_begin", care=(0.01, 0.02), yn=(0.70, 0.60), agree=-0.98),
             probe_line(20, 0.59, 0.31, 0.18, care=(0.78, 0.50), yn=(0.99, 0.95), agree=0.86),
             probe_line(10, 0.06, -0.01, None, care=(0.08, 0.07), yn=(1.00, 0.99), agree=-0.50)]
    return write_history(tmp_path / "run_a", lines)


# ---- the figure holds the history's numbers --------------------------------------------------------
def test_headline_foundation_and_sanity_curves_carry_the_history(three_steps):
    fig = plot_histories([three_steps])
    steps = [0, 10, 20]

    x, y = xy(line_labelled(axes_titled(fig, SCORE_PANEL), "run_a · score"))
    assert x.tolist() == steps and y.tolist() == [0.01, 0.06, 0.59]
    x, y = xy(line_labelled(axes_titled(fig, SCORE_PANEL), "run_a · sn"))
    assert y[0] == 0.03 and np.isnan(y[1]) and y[2] == 0.18  # null sn: a gap, never a zero
    _, y = xy(line_labelled(axes_titled(fig, MINUS_PANEL), "run_a · score_minus_sn"))
    assert np.allclose(y[[0, 2]], [0.01 - 0.03, 0.59 - 0.18]) and np.isnan(y[1])
    _, y = xy(line_labelled(axes_titled(fig, GAP_PANEL), "run_a · gap"))
    assert y.tolist() == [-0.02, -0.01, 0.31]

    care = axes_titled(fig, "Care")
    assert xy(line_labelled(care, "run_a · align_other"))[1].tolist() == [0.01, 0.08, 0.78]
    assert xy(line_labelled(care, "run_a · align_self"))[1].tolist() == [0.02, 0.07, 0.50]
    control = axes_titled(fig, "Social Norms (control)")
    _, y = xy(line_labelled(control, "run_a · align_other"))
    assert y[0] == 0.03 and np.isnan(y[1]) and y[2] == 0.18
    assert "Fairness" not in [ax.get_title() for ax in fig.axes]  # only foundations the history has

    mass = axes_titled(fig, MASS_PANEL)
    assert xy(line_labelled(mass, "run_a · yn_mass_mean"))[1].tolist() == [0.70, 1.00, 0.99]
    assert xy(line_labelled(mass, "run_a · yn_mass_min"))[1].tolist() == [0.60, 0.99, 0.95]
    assert xy(line_labelled(axes_titled(fig, AGREE_PANEL), "run_a · frame_agreement"))[1].tolist() == [-0.98, -0.5,
                                                                                                         0.86]
    assert all(ax.get_xlabel() == "training step" for ax in fig.axes if ax.get_title())
    assert not any("human" in ax.get_title().lower() for ax in fig.axes)  # no ratings: no panel


def test_human_correlation_panel_when_the_set_has_ratings(tmp_path):
    path = write_history(tmp_path / "cl", [probe_line(0, 0.0, 0.0, 0.0, name="clifford", human=0.06),
                                           probe_line(50, 1.0, 0.1, 0.7, name="clifford", human=0.23)], "clifford")
    fig = plot_histories(path)
    ax = axes_titled(fig, "Correlation with human wrongness ratings")
    assert xy(line_labelled(ax, "cl · human_corr"))[1].tolist() == [0.06, 0.23]
    assert "'clifford'" in fig.get_suptitle()


def band_edges(ax, label):
    """The (x, y) vertices of the interval band labelled ``label``."""
    bands = [c for c in ax.collections if c.get_label() == label]
    assert len(bands) == 1, [c.get_label() for c in ax.collections]
    return {tuple(np.round(v, 9)) for p in bands[0].get_paths() for v in p.vertices}


def test_interval_bands_drawn_from_the_bounds_when_present(tmp_path):
    lines = [probe_line(0, 0.0, 0.0, 0.02, care=(0.0, 0.1), bounds={
                 "score_lo": -0.1, "score_hi": 0.1, "sn_lo": -0.05, "sn_hi": 0.09, "gap_lo": -0.3, "gap_hi": 0.2,
                 "care.align_other_lo": -0.4, "care.align_other_hi": 0.3, "level": 0.9}),
             probe_line(10, 0.5, 0.1, 0.2, care=(0.6, 0.4), bounds={
                 "score_lo": 0.3, "score_hi": 0.7, "sn_lo": 0.0, "sn_hi": 0.4, "gap_lo": -0.1, "gap_hi": 0.3,
                 "care.align_other_lo": 0.2, "care.align_other_hi": 1.0, "level": 0.9})]
    fig = plot_histories(write_history(tmp_path / "banded", lines))
    edges = band_edges(axes_titled(fig, SCORE_PANEL), "banded · score interval")
    assert {(0, -0.1), (0, 0.1), (10, 0.3), (10, 0.7)} <= edges
    assert {(0, -0.05), (10, 0.4)} <= band_edges(axes_titled(fig, SCORE_PANEL), "banded · sn interval")
    assert {(0, -0.3), (10, 0.3)} <= band_edges(axes_titled(fig, GAP_PANEL), "banded · gap interval")
    assert {(0, -0.4), (10, 1.0)} <= band_edges(axes_titled(fig, "Care"), "banded · align_other interval")
    # No bounds for score - sn in these lines: its curve is drawn, its band is not invented.
    assert not axes_titled(fig, MINUS_PANEL).collections
    legend = [t.get_text() for ax in fig.axes for lg in [ax.get_legend()] if lg for t in lg.get_texts()]
    assert "shaded: 90% interval" in legend


def test_a_lone_interval_is_drawn_as_a_bar(tmp_path):
    # One probe so far (a run just started, or bounds only from an upgraded callback on): no band can be drawn.
    path = write_history(tmp_path / "one", [probe_line(0, 0.2, 0.0, 0.0, bounds={"score_lo": 0.1, "score_hi": 0.35})])
    ax = axes_titled(plot_histories(path), SCORE_PANEL)
    bars = [c for c in ax.collections if c.get_label() == "one · score lone interval"]
    assert len(bars) == 1 and np.allclose(bars[0].get_segments()[0], [[0, 0.1], [0, 0.35]])


def test_no_bands_without_interval_fields(three_steps):
    fig = plot_histories(three_steps)
    assert not any(ax.collections for ax in fig.axes)
    legend = [t.get_text() for ax in fig.axes for lg in [ax.get_legend()] if lg for t in lg.get_texts()]
    assert not any("interval" in t for t in legend)


def test_an_estimate_outside_its_own_interval_is_refused(tmp_path):
    path = write_history(tmp_path / "r", [probe_line(0, 0.5, 0.0, 0.0, bounds={"score_lo": 0.6, "score_hi": 0.9})])
    with pytest.raises(HistoryError, match=r"moral_probe_scifi.jsonl:1: score=\+0.5000 lies outside"):
        load_history(path)


# ---- several runs ---------------------------------------------------------------------------------
def test_two_runs_two_colours_and_folder_names_in_the_legend(tmp_path, three_steps):
    other = write_history(tmp_path / "run_b", [probe_line(0, 0.0, 0.0, 0.0), probe_line(10, 0.2, 0.1, 0.05)])
    fig = plot_histories([three_steps, other])
    ax = axes_titled(fig, SCORE_PANEL)
    a, b = line_labelled(ax, "run_a · score"), line_labelled(ax, "run_b · score")
    assert a.get_color() != b.get_color() and a.get_marker() != b.get_marker()
    assert xy(b)[0].tolist() == [0, 10] and xy(b)[1].tolist() == [0.0, 0.2]
    legends = [lg for a_ in fig.axes for lg in [a_.get_legend()] if lg]
    assert len(legends) == 1
    texts = [t.get_text() for t in legends[0].get_texts()]
    assert texts[:2] == ["run_a", "run_b"]
    colours = [h.get_color() for h in legends[0].legend_handles[:2]]
    assert colours == [a.get_color(), b.get_color()]  # the legend's colours are the curves' colours
    assert line_labelled(axes_titled(fig, "Care"), "run_b · align_other").get_color() == b.get_color()


def test_runs_in_folders_of_the_same_name_get_distinct_labels(tmp_path):
    a = write_history(tmp_path / "seed0" / "demo", [probe_line(0, 0.1, 0.0, 0.0)])
    b = write_history(tmp_path / "seed1" / "demo", [probe_line(0, 0.2, 0.0, 0.0)])
    fig = plot_histories([a, b])
    ax = axes_titled(fig, SCORE_PANEL)
    assert xy(line_labelled(ax, "seed0/demo · score"))[1].tolist() == [0.1]
    assert xy(line_labelled(ax, "seed1/demo · score"))[1].tolist() == [0.2]


def test_histories_of_different_sets_are_refused_naming_both(tmp_path, three_steps, capsys):
    other = write_history(tmp_path / "run_c", [probe_line(0, 0.0, 0.0, 0.0, name="clifford")], "clifford")
    rc = tinymcf(["plot", str(three_steps), str(other)])
    one_error_line(rc, capsys.readouterr().err, "error: histories of different vignette sets", "'scifi'", "'clifford'",
                   str(three_steps), str(other))


# ---- files ---------------------------------------------------------------------------------------------
def test_cli_writes_png_next_to_a_single_history_and_svg_by_suffix(three_steps, tmp_path, capsys):
    assert tinymcf(["plot", str(three_steps)]) == 0
    png = three_steps.with_suffix(".png")
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 20_000
    assert str(png) in capsys.readouterr().out

    svg = tmp_path / "figs" / "curves.svg"
    assert tinymcf(["plot", str(three_steps.parent), "--out", str(svg)]) == 0  # a run folder names its one history
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert "run_a" in svg.read_text(encoding="utf-8")  # the legend's run name is in the drawing
    assert not [p for p in svg.parent.iterdir() if p.name.endswith(".tmp")]  # written atomically

    pdf = save_figure(plot_histories(three_steps), tmp_path / "curves.pdf")
    assert pdf.read_bytes()[:5] == b"%PDF-"


def test_unknown_image_suffix_is_refused_before_drawing(three_steps, tmp_path, capsys):
    rc = tinymcf(["plot", str(three_steps), "--out", str(tmp_path / "curves.jpeg")])
    line = one_error_line(rc, capsys.readouterr().err)
    assert line == (f"error: cannot tell the image format of {tmp_path / 'curves.jpeg'}: end --out with .png, .svg "
                    f"or .pdf")


# ---- bad input -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["missing", "empty", "blank_lines", "not_json", "not_a_probe_line", "folder"])
def test_bad_history_gives_one_error_line_and_exit_2(tmp_path, capsys, case):
    path = tmp_path / "run" / "moral_probe_scifi.jsonl"
    path.parent.mkdir()
    expected = {
        "missing": "no history file", "empty": "is empty", "blank_lines": "is empty",
        "not_json": "moral_probe_scifi.jsonl:2: not valid JSON", "not_a_probe_line": "moral_probe_scifi.jsonl:1: not "
        "a moral-probe history line", "folder": "is a folder without a moral_probe_<name>.jsonl history",
    }[case]
    arg = path
    if case == "empty":
        path.write_text("")
    elif case == "blank_lines":
        path.write_text("\n\n")
    elif case == "not_json":
        path.write_text(json.dumps(probe_line(0, 0, 0, 0)) + "\n{oops\n" + json.dumps(probe_line(1, 0, 0, 0)) + "\n")
    elif case == "not_a_probe_line":
        path.write_text(json.dumps({"step": "ten", "name": "scifi"}) + "\n")
    elif case == "folder":
        arg = path.parent
    rc = tinymcf(["plot", str(arg)])
    one_error_line(rc, capsys.readouterr().err, expected)
    assert not list(path.parent.glob("*.png"))


def test_torn_last_line_is_skipped_with_a_warning(tmp_path, caplog):
    lines = [probe_line(0, 0.0, 0.0, 0.0, event="train_begin"), probe_line(10, 0.3, 0.0, 0.1)]
    path = write_history(tmp_path / "torn", lines, tail='{"step": 20, "epoch": 2.0, "event": "eva')
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        history = load_history(path)
    assert history.steps.tolist() == [0, 10] and history.headline["score"].est.tolist() == [0.0, 0.3]
    assert history.label == "torn" and history.name == "scifi"  # the run folder's name, the set's name
    assert any(f"{path}:3: skipped an unterminated last line" in r.getMessage() for r in caplog.records)


def test_a_complete_history_gives_no_warning(three_steps, caplog):
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        load_history(three_steps)
    assert not caplog.records


def test_a_repeated_step_draws_its_last_line(tmp_path, caplog):
    # Resumed from checkpoint-10 after step 20 had been probed: step 20 is probed again, later in the file.
    lines = [probe_line(0, 0.0, 0.0, 0.0, event="train_begin"), probe_line(10, 0.1, 0.0, 0.0),
             probe_line(20, 0.9, 0.0, 0.0), probe_line(20, 0.4, 0.0, 0.0), probe_line(30, 0.5, 0.0, 0.0)]
    path = write_history(tmp_path / "resumed", lines)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        fig = plot_histories(path)
    x, y = xy(line_labelled(axes_titled(fig, SCORE_PANEL), "resumed · score"))
    assert x.tolist() == [0, 10, 20, 30] and y.tolist() == [0.0, 0.1, 0.4, 0.5]
    assert any("step(s) 20 logged more than once" in r.getMessage() for r in caplog.records)


def test_a_new_run_in_the_same_folder_replaces_the_old_curve(tmp_path, caplog):
    # The same output_dir trained twice: the second baseline starts a new curve; old steps 20, 30 are not mixed in.
    old = [probe_line(s, v, 0.0, 0.0, event="train_begin" if s == 0 else "save")
           for s, v in ((0, 0.0), (10, 0.2), (20, 0.4), (30, 0.6))]
    new = [probe_line(0, 0.01, 0.0, 0.0, event="train_begin"), probe_line(10, 0.05, 0.0, 0.0)]
    path = write_history(tmp_path / "rerun", old + new)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        history = load_history(path)
    assert history.steps.tolist() == [0, 10] and history.headline["score"].est.tolist() == [0.01, 0.05]
    assert any(f"{path}:5: a new run starts here" in r.getMessage() and "4 line(s)" in r.getMessage()
               for r in caplog.records)


def test_a_history_mixing_two_sets_is_refused(tmp_path):
    path = write_history(tmp_path / "m", [probe_line(0, 0, 0, 0), probe_line(1, 0, 0, 0, name="clifford")])
    with pytest.raises(HistoryError, match=r"mixes vignette sets \['clifford', 'scifi'\]"):
        load_history(path)


# ---- matplotlib is optional ---------------------------------------------------------------------------
@pytest.mark.slow
def test_without_matplotlib_the_module_imports_and_the_cli_names_the_extra(three_steps):
    script = (
        "import sys\n"
        "sys.modules['matplotlib'] = None  # as if the [plot] extra were not installed\n"
        "from tinymcf_callback.cli.main import main\n"
        "from tinymcf_callback.errors import MissingExtraError\n"
        "from tinymcf_callback.views.curves import load_history\n"
        "from tinymcf_callback.figures.plot import plot_histories\n"
        "h = load_history(sys.argv[1])  # reading needs no matplotlib\n"
        "assert h.steps.tolist() == [0, 10, 20], h.steps\n"
        "try:\n"
        "    plot_histories([sys.argv[1]])\n"
        "except MissingExtraError as e:\n"
        "    print('raised:', e)\n"
        "sys.exit(main(['plot', sys.argv[1]]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", script, str(three_steps)], capture_output=True, text=True, env=env,
                         timeout=120)
    line = one_error_line(res.returncode, res.stderr)
    assert "raised: drawing the curves needs the matplotlib package" in res.stdout
    assert line == "error: drawing the curves needs the matplotlib package, part of the [plot] extra: pip install " \
                   "'tinymcf_callback[plot]'"
    assert not three_steps.with_suffix(".png").exists()


# ---- a real history, written by the callback in a Trainer run ----------------------------------------------
@pytest.mark.slow
def test_a_history_written_by_the_callback_is_drawn(tmp_path, qwen_tok):
    from helpers.trainer_utils import make_trainer

    from tinymcf_callback import MoralProbeCallback

    cb = MoralProbeCallback(name="scifi", events="evaluate", limit=9, verbose=False)  # the 9 Care vignettes
    make_trainer(tmp_path / "tiny_run", qwen_tok, [cb], max_steps=1, eval_steps=1, save_steps=100).train()
    path = tmp_path / "tiny_run" / "moral_probe_scifi.jsonl"
    written = [json.loads(line) for line in path.read_text().splitlines()]

    fig = plot_histories([path], out=tmp_path / "curves.png")
    x, y = xy(line_labelled(axes_titled(fig, SCORE_PANEL), "tiny_run · score"))
    assert x.tolist() == [0, 1] and y.tolist() == [line["score"] for line in written]
    care = {r["foundation"]: r for r in written[-1]["table"]}["Care"]
    assert xy(line_labelled(axes_titled(fig, "Care"), "tiny_run · align_other"))[1][-1] == care["align_other"]
    panels = [ax.get_title() for ax in fig.axes]
    assert "Care" in panels and "Fairness" not in panels and "Social Norms (control)" not in panels
    assert any("no value at any step" in t.get_text() for t in axes_titled(fig, MINUS_PANEL).texts)  # no control
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG_MAGIC


# ---- paper figures -------------------------------------------------------------------------------------------
from tinymcf_callback.views.curves import PlotOptionError, metric_key  # noqa: E402

PAPER_HEADLINE = ["Score and Social Norms control", "Score minus control", "Self-other gap"]


def banded_line(step, score, sn, *, w=0.1, care=0.0, name="scifi", event="evaluate", **kw):
    """A probe line with intervals on the headline and Care's align_other (``sn=None``: no Social Norms row)."""
    bounds = {"score_lo": score - w, "score_hi": score + w, "gap_lo": -w, "gap_hi": w, "level": 0.95,
              "care.align_other_lo": care - w, "care.align_other_hi": care + w}
    if sn is not None:
        bounds.update(sn_lo=sn - w, sn_hi=sn + w)
    return probe_line(step, score, 0.0, sn, name=name, event=event, care=(care, care / 2), bounds=bounds, **kw)


def paper_axes(fig):
    """The axes that hold curves (a paper figure has no legend axes), in drawing order."""
    return [ax for ax in fig.axes if ax.get_lines()]


def rendered_texts(fig):
    """Every visible text of ``fig`` once drawn (tick labels exist only then)."""
    import io

    import matplotlib.text

    fig.savefig(io.BytesIO(), format="png")
    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]


@pytest.fixture
def banded(tmp_path):
    lines = [banded_line(0, 0.0, 0.02, event="train_begin"), banded_line(10, 0.3, 0.05, care=0.2),
             banded_line(20, 0.6, 0.1, care=0.5)]
    return write_history(tmp_path / "banded", lines)


def test_paper_headline_is_one_column_wide_with_small_fonts_and_labels(banded):
    fig = plot_histories(banded, panels="headline")
    assert [ax.get_title() for ax in paper_axes(fig)] == PAPER_HEADLINE
    assert fig.get_size_inches()[0] == pytest.approx(3.4)
    texts = rendered_texts(fig)
    assert max(t.get_fontsize() for t in texts) <= 8.5 and min(t.get_fontsize() for t in texts) >= 6.5
    axes = paper_axes(fig)
    assert [ax.get_ylabel() for ax in axes] == ["alignment", "score − control", "other − self"]
    assert [ax.get_xlabel() for ax in axes] == ["", "", "training step"]  # shared x: labelled once, at the bottom
    for ax in axes:  # a zero line in every panel
        assert any(ln.get_label() == "_zero" and set(ln.get_ydata()) == {0.0} for ln in ax.get_lines())
    x, y = xy(line_labelled(axes[0], "banded · score"))
    assert x.tolist() == [0, 10, 20] and y.tolist() == [0.0, 0.3, 0.6]
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["estimate, 95% interval",
                                                          "Social Norms control, 95% interval"]
    assert not fig.get_suptitle()  # a paper figure's caption says what it is


def test_paper_score_and_control_bands_differ_in_colour_and_hatching(banded):
    ax = paper_axes(plot_histories(banded, panels="headline"))[0]
    score = next(c for c in ax.collections if c.get_label() == "banded · score interval")
    control = next(c for c in ax.collections if c.get_label() == "banded · sn interval")
    assert score.get_hatch() == "///" and control.get_hatch() == "\\\\\\"
    assert tuple(score.get_facecolor()[0][:3]) != tuple(control.get_facecolor()[0][:3])
    assert line_labelled(ax, "banded · score").get_color() != line_labelled(ax, "banded · sn").get_color()
    assert line_labelled(ax, "banded · sn").get_linestyle() == "--"
    assert {(0, -0.08), (20, 0.2)} <= band_edges(ax, "banded · sn interval")


def test_paper_figure_has_no_empty_panel_for_a_subset_history(tmp_path, caplog):
    # A --limit run: Care only, no Social Norms row and no sn at any step, no human ratings.
    lines = [banded_line(0, 0.0, None, event="train_begin"), banded_line(10, 0.4, None, care=0.4)]
    path = write_history(tmp_path / "subset", lines)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        fig = plot_histories(path, panels="headline,foundations,sanity")
    axes = paper_axes(fig)
    assert [ax.get_title() for ax in axes] == ["Score", "Self-other gap", "Care", "Yes+No mass: mean, min",
                                               "Frame agreement"]
    assert len(fig.axes) == len(axes)  # the odd slot of the two-column grid is removed, not left blank
    for ax in axes:
        assert any(np.isfinite(xy(ln)[1]).any() for ln in ax.get_lines() if not ln.get_label().startswith("_"))
        assert not ax.texts
    note = " ".join(r.getMessage() for r in caplog.records)
    assert "left out of the figure" in note and "sn (" in note and "score_minus_sn" in note and "human_corr" in note


def test_a_history_without_any_chosen_metric_is_an_error(three_steps):
    with pytest.raises(PlotOptionError, match=r"nothing to draw: none of human_corr has a value"):
        plot_histories(three_steps, metrics="human_corr")


def test_metrics_name_panels_in_order_and_pair_score_with_its_control(banded):
    fig = plot_histories(banded, metrics="gap, Care ,sn,score,align_self:care")
    assert [ax.get_title() for ax in paper_axes(fig)] == ["Self-other gap", "Care", "Score and Social Norms control",
                                                          "Care: align_self"]
    assert xy(line_labelled(paper_axes(fig)[3], "banded · align_self:Care"))[1].tolist() == [0.0, 0.1, 0.25]
    assert metric_key("social_norms") == "align_other:Social Norms"
    assert metric_key("ALIGN_SELF:fairness") == "align_self:Fairness" and metric_key("YN_MASS_MIN") == "yn_mass_min"


def test_unknown_metric_or_group_lists_the_known_ones(banded, capsys):
    with pytest.raises(PlotOptionError, match=r"unknown metric 'bogus'.*score, sn, score_minus_sn, gap.*"
                                              r"align_self:<foundation>.*yn_mass_mean"):
        plot_histories(banded, metrics="score,bogus")
    rc = tinymcf(["plot", str(banded), "--metrics", "score,Kindness"])
    one_error_line(rc, capsys.readouterr().err, "error: unknown metric 'Kindness'", "Care, Fairness", "human_corr")
    rc = tinymcf(["plot", str(banded), "--panels", "headlines"])
    one_error_line(rc, capsys.readouterr().err, "unknown panel group 'headlines'", "dashboard, headline, foundations")
    rc = tinymcf(["plot", str(banded), "--panels", "dashboard", "--metrics", "score"])
    one_error_line(rc, capsys.readouterr().err, "--panels dashboard draws every panel")
    assert not list(banded.parent.glob("*.png"))


def test_small_multiples_one_column_per_run_sharing_y_per_row(tmp_path, banded):
    others = [write_history(tmp_path / f"seed{i}", [banded_line(0, 0.1 * i, 0.0), banded_line(10, 0.2 * i, 0.1)])
              for i in (1, 2)]
    fig = plot_histories([banded, *others], panels="headline")
    axes = paper_axes(fig)
    assert len(axes) == 3 * 3 and fig.get_size_inches()[0] == pytest.approx(3.4)
    grid = [[axes[3 * row + col] for col in range(3)] for row in range(3)]  # metrics × runs
    assert [ax.get_title() for ax in grid[0]] == ["banded", "seed1", "seed2"]
    assert [row[0].get_ylabel() for row in grid] == ["score, control", "score − control", "self-other gap"]
    for row in grid:
        assert all(row[0].get_shared_y_axes().joined(row[0], ax) for ax in row[1:])
        assert row[0].get_ylim() == row[2].get_ylim()
    assert not grid[0][0].get_shared_y_axes().joined(grid[0][0], grid[1][0])
    for col, run in enumerate(["banded", "seed1", "seed2"]):  # each column holds its own run only
        labels = {ln.get_label().split(" · ")[0] for ln in grid[0][col].get_lines() if ln.get_label()[0] != "_"}
        assert labels == {run}
        assert grid[0][col].get_label() == f"{run} · Score and Social Norms control"
    assert xy(line_labelled(grid[0][2], "seed2 · score"))[1].tolist() == [0.2, 0.4]


def test_overlay_draws_the_runs_on_one_axis_with_light_unhatched_bands(tmp_path, banded):
    other = write_history(tmp_path / "seed1", [banded_line(0, 0.1, 0.0), banded_line(10, 0.2, 0.1)])
    fig = plot_histories([banded, other], panels="headline", overlay=True)
    ax = paper_axes(fig)[0]
    assert len(paper_axes(fig)) == 3 and ax.get_title() == PAPER_HEADLINE[0]
    a, b = line_labelled(ax, "banded · score"), line_labelled(ax, "seed1 · score")
    assert a.get_color() != b.get_color() and a.get_marker() != b.get_marker()
    bands = [c for c in ax.collections if c.get_label().endswith(" interval")]
    assert len(bands) == 4 and all(not c.get_hatch() for c in bands)
    assert all(c.get_facecolor()[0][3] < 0.1 for c in bands)
    assert [t.get_text() for t in fig.legends[0].get_texts()][:2] == ["banded", "seed1"]


def test_width_option_and_its_limits(banded):
    assert plot_histories(banded, panels="sanity", width=7).get_size_inches()[0] == pytest.approx(7)
    with pytest.raises(PlotOptionError, match=r"--width 0.5: the figure's width in inches, from 1.5 to 20"):
        plot_histories(banded, panels="headline", width=0.5)
    with pytest.raises(PlotOptionError, match=r"--width sets a paper figure's width"):
        plot_histories(banded, width=3.4)  # the dashboard is 15 in wide


def test_cli_paper_figure_options(banded, tmp_path, capsys):
    from PIL import Image

    assert tinymcf(["plot", str(banded), "--panels", "headline", "--width", "5"]) == 0
    png = banded.with_name("moral_probe_scifi_headline.png")  # beside the dashboard's moral_probe_scifi.png
    assert str(png) in capsys.readouterr().out
    assert Image.open(png).size[0] == 5 * 300  # printed: 300 dpi
    svg = tmp_path / "fig.svg"
    assert tinymcf(["plot", str(banded), "--metrics", "score,Care", "--out", str(svg), "--title", "Figure 2"]) == 0
    text = svg.read_text(encoding="utf-8")
    assert "Figure 2" in text and "Care" in text
    assert tinymcf(["plot", str(banded)]) == 0 and banded.with_suffix(".png").exists()  # no option: the dashboard


# ---- dose-response histories (--x coefficient) -------------------------------------------------------------
def dose_line(index, coefficient, direction, score, *, direction_index=0, sn=0.05, answering=None, w=0.1):
    """A dose-response line: a probe line with the steering fields (``step`` is only the sweep's line index)."""
    line = banded_line(index, score, sn, w=w, care=score, event="train_begin" if direction == "none" else "dose")
    line.update(coefficient=coefficient, direction=direction, direction_index=direction_index)
    if answering is not None:
        line["answering"] = answering
    return line


def write_dose(folder: Path, lines, name="scifi") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"moral_probe_{name}_dose.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def dose(tmp_path):
    """c=0 unsteered; the real direction at -2, 2, 4 (written out of order; 4 stops answering); 3 random directions."""
    lines = [dose_line(0, 0.0, "none", 0.3),
             dose_line(1, 2.0, "real", 0.9), dose_line(2, -2.0, "real", -0.2), dose_line(3, 4.0, "real", 1.2,
                                                                                          answering=False)]
    randoms = {0: (0.25, 0.40, 0.35), 1: (0.30, 0.20, 0.10), 2: (0.35, 0.30, 0.50)}  # at -2, 2, 4
    for k, values in randoms.items():
        for c, v in zip((-2.0, 2.0, 4.0), values, strict=True):
            lines.append(dose_line(4, c, "random", v, direction_index=k))  # the same step: never deduped by it
    lines.append(dose_line(9, 2.0, "real", 0.8))  # the real line at c=2 again: the last line wins
    return write_dose(tmp_path / "dose_run", lines)


def test_a_dose_history_is_read_by_direction_and_coefficient(dose, caplog):
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        h = load_history(dose, x="coefficient")
    assert h.x == "coefficient" and h.steps.tolist() == [-2.0, 0.0, 2.0, 4.0]
    assert h.headline["score"].est.tolist() == [-0.2, 0.3, 0.8, 1.2]
    assert h.answering.tolist() == [True, True, True, False]
    assert len(h.random) == 3 and all(r.steps.tolist() == [-2.0, 0.0, 2.0, 4.0] for r in h.random)
    env = h.random_envelope("score")
    assert env.k == 3 and env.x.tolist() == [-2.0, 0.0, 2.0, 4.0]
    assert np.allclose(env.lo, [0.25, 0.3, 0.2, 0.1]) and np.allclose(env.hi, [0.35, 0.3, 0.4, 0.5])
    assert np.allclose(env.median, [0.3, 0.3, 0.3, 0.35])  # at c=0 every random curve is the unsteered line
    assert np.allclose(h.random_envelope("align_other:Care").hi, env.hi)
    assert any("real at c=2 logged more than once" in r.getMessage() for r in caplog.records)


def test_dose_figure_shows_the_real_direction_against_the_random_ones(dose):
    fig = plot_histories(dose, panels="headline", x="coefficient")
    ax = paper_axes(fig)[0]
    assert ax.get_title() == PAPER_HEADLINE[0] and paper_axes(fig)[-1].get_xlabel() == "steering coefficient"
    x, y = xy(line_labelled(ax, "dose_run · score"))
    assert x.tolist() == [-2, 0, 2, 4] and y.tolist() == [-0.2, 0.3, 0.8, 1.2]
    assert {(-2, -0.3), (4, 1.3)} <= band_edges(ax, "dose_run · score interval")
    grey = next(c for c in ax.collections if c.get_label() == "dose_run · score random directions (k=3)")
    assert {(-2, 0.25), (-2, 0.35), (0, 0.3), (4, 0.1), (4, 0.5)} <= {
        tuple(np.round(v, 9)) for p in grey.get_paths() for v in p.vertices}
    assert xy(line_labelled(ax, "dose_run · score random median"))[1].tolist() == pytest.approx([0.3, 0.3, 0.3, 0.35])
    off = line_labelled(ax, "dose_run · score not answering")
    assert xy(off)[0].tolist() == [4] and off.get_marker() == "x"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "random directions (k=3)" in legend and "not answering (Yes+No mass < 0.5)" in legend
    # Random directions have no band of their own per direction: one grey band per panel, never k curves.
    assert not [ln for ln in ax.get_lines() if "random 0" in ln.get_label()]


def test_dose_dashboard_and_foundation_panels(dose):
    fig = plot_histories(dose, x="coefficient")
    ax = axes_titled(fig, SCORE_PANEL)
    assert xy(line_labelled(ax, "dose_run · score"))[0].tolist() == [-2, 0, 2, 4]
    assert [c.get_label() for c in ax.collections if "random" in c.get_label()] == [
        "dose_run · score random directions (k=3)"]
    assert ax.get_xlabel() == "steering coefficient"
    assert "dose response" in fig.get_suptitle()
    care = paper_axes(plot_histories(dose, panels="foundations", x="coefficient"))[0]
    assert care.get_title() == "Care"
    assert xy(line_labelled(care, "dose_run · align_other:Care"))[1].tolist() == [-0.2, 0.3, 0.8, 1.2]


def test_x_axis_and_history_kind_must_agree(dose, three_steps, capsys):
    rc = tinymcf(["plot", str(dose)])
    one_error_line(rc, capsys.readouterr().err, str(dose), "is a dose-response history", "--x coefficient")
    rc = tinymcf(["plot", str(three_steps), "--x", "coefficient"])
    one_error_line(rc, capsys.readouterr().err, str(three_steps), "has no 'coefficient' field", "--x step")


def test_a_run_folder_with_both_histories_gives_the_one_the_x_axis_draws(tmp_path, dose, capsys):
    both = dose.parent
    write_history(both, [probe_line(0, 0.0, 0.0, 0.0)])
    assert load_history(both, x="coefficient").path == dose
    assert load_history(both).path == both / "moral_probe_scifi.jsonl"
    assert tinymcf(["plot", str(both), "--x", "coefficient", "--panels", "headline"]) == 0
    assert (both / "moral_probe_scifi_dose_headline.png").exists()


@pytest.mark.parametrize("field, value, message", [
    ("direction", "sideways", "direction is 'sideways', not one of none, real, random"),
    ("coefficient", "big", "coefficient is 'big', not a finite number"),
    ("direction_index", -1, "direction_index is -1, not a non-negative integer"),
])
def test_a_malformed_dose_line_names_file_and_line(tmp_path, field, value, message):
    bad = dose_line(1, 1.0, "real", 0.5)
    bad[field] = value
    path = write_dose(tmp_path / "bad", [dose_line(0, 0.0, "none", 0.3), bad])
    with pytest.raises(HistoryError, match=f"moral_probe_scifi_dose.jsonl:2: a dose-response history line: "
                                           f"{message}"):
        load_history(path, x="coefficient")


def test_the_figure_says_which_vignettes_and_precision_and_what_two_per_foundation_mean(tmp_path):
    subset = {"limit": None, "per_foundation": 2, "subset_seed": 0, "vignettes": "abc"}
    lines = [probe_line(s, 0.01 * s, 0.0, 0.0, bounds={"care.align_other_lo": -0.5, "care.align_other_hi": 0.9,
                                                      "score_lo": -0.2, "score_hi": 0.6}) for s in (0, 10)]
    for line in lines:
        line["info"].update(subset=subset, n_vignettes=14)
        line.update(dtype="bfloat16", compute="bfloat16", autocast=None)
    fig = plot_histories(write_history(tmp_path / "quick", lines))
    assert "per_foundation=2 (14 vignettes), bfloat16" in fig.get_suptitle()
    notes = [sf._suptitle.get_text() for sf in fig.subfigs if sf._suptitle is not None]
    assert any("per_foundation=2: each foundation's band is a t interval over 2 vignettes (df = 1)" in n and
               "per_foundation=4" in n for n in notes), notes
    # a precision target's points: its subset is the candidates (the whole set); each point asked a prefix of them
    for line, asked in zip(lines, (51, 14), strict=True):
        line["info"].update(subset={**subset, "per_foundation": None}, n_vignettes=asked,
                            adaptive={"until": "change", "vignettes": asked, "of_vignettes": 51})
    fig = plot_histories(write_history(tmp_path / "adaptive", lines))
    assert "until=change: 14-51 of 51 vignettes asked, bfloat16" in fig.get_suptitle()
    assert "the whole set" not in fig.get_suptitle()
    whole = [probe_line(0, 0.1, 0.0, 0.0)]  # an older line: no subset, no precision on record
    fig = plot_histories(write_history(tmp_path / "old", whole))
    assert "vignettes not recorded, precision not recorded" in fig.get_suptitle()
