"""tinymcf_callback.plot: curves read back from the drawn figure, files, bad input, the optional extra."""

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

from tinymcf_callback.plot import HistoryError, load_history, main, plot_histories, save_figure  # noqa: E402

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
    rc = main([str(three_steps), str(other)])
    one_error_line(rc, capsys.readouterr().err, "error: histories of different vignette sets", "'scifi'", "'clifford'",
                   str(three_steps), str(other))


# ---- files ---------------------------------------------------------------------------------------------
def test_cli_writes_png_next_to_a_single_history_and_svg_by_suffix(three_steps, tmp_path, capsys):
    assert main([str(three_steps)]) == 0
    png = three_steps.with_suffix(".png")
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 20_000
    assert str(png) in capsys.readouterr().out

    svg = tmp_path / "figs" / "curves.svg"
    assert main([str(three_steps.parent), "--out", str(svg)]) == 0  # a run folder names its one history
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert "run_a" in svg.read_text(encoding="utf-8")  # the legend's run name is in the drawing
    assert not [p for p in svg.parent.iterdir() if p.name.endswith(".tmp")]  # written atomically

    pdf = save_figure(plot_histories(three_steps), tmp_path / "curves.pdf")
    assert pdf.read_bytes()[:5] == b"%PDF-"


def test_unknown_image_suffix_is_refused_before_drawing(three_steps, tmp_path, capsys):
    rc = main([str(three_steps), "--out", str(tmp_path / "curves.jpeg")])
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
    rc = main([str(arg)])
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
        "from tinymcf_callback import plot\n"
        "h = plot.load_history(sys.argv[1])  # reading needs no matplotlib\n"
        "assert h.steps.tolist() == [0, 10, 20], h.steps\n"
        "try:\n"
        "    plot.plot_histories([sys.argv[1]])\n"
        "except plot.MissingPlotExtraError as e:\n"
        "    print('raised:', e)\n"
        "sys.exit(plot.main([sys.argv[1]]))\n"
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
