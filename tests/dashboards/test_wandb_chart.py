"""The W&B band chart's Vega-Lite spec, drawn by the real Vega-Lite: a band and a line per value, one panel each.

W&B draws a custom chart from the entity's preset (``tinymcf-interval-band``, :data:`BAND_SPEC`) over the table the
run logs (:func:`~tinymcf_callback.trackers.bands.band_rows`); no W&B server can be reached here, so the spec is
rendered the way W&B's front end does, by vega-lite and vega (``make dashboard-tools`` installs them from the npm
registry, once), with W&B's ``${field:...}`` placeholders filled as ``BAND_FIELDS`` maps them and the table inline.
Checked in the SVG: one panel per value of the curve, each with its band (an area at the spec's opacity) and its
line; Chromium turns it into the picture docs/dashboards.md shows (``TINYMCF_SCREENSHOTS``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.reports import made_up_lines

from tinymcf_callback.probe import Probe
from tinymcf_callback.trackers.bands import band_rows
from tinymcf_callback.trackers.wandb import BAND_FIELDS, BAND_SPEC

TOOLS = Path(os.environ.get("TINYMCF_DASHBOARD_TOOLS", Path.home() / ".cache" / "tinymcf-dashboards"))
NODE, CHROMIUM = shutil.which("node"), shutil.which("chromium")
pytestmark = [pytest.mark.dashboards,
              pytest.mark.skipif(NODE is None or not (TOOLS / "node_modules" / "vega-lite").is_dir(),
                                 reason=f"no vega-lite in {TOOLS}: make dashboard-tools")]
KEPT = os.environ.get("TINYMCF_SCREENSHOTS")


def test_the_band_charts_spec_draws_a_band_and_a_line_per_value(tmp_path, qwen_tok):
    lines, _ = made_up_lines(Probe(qwen_tok, "scifi"), (0, 50, 100, 150, 200, 250, 300))
    rows = band_rows(lines)
    text = json.dumps(BAND_SPEC)
    for field, column in BAND_FIELDS.items():
        text = text.replace(f"${{field:{field}}}", column)  # what W&B does with the panel's field settings
    assert "${" not in text
    spec = {**json.loads(text), "data": {"values": rows}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([NODE, str(Path(__file__).with_name("render_vega.js")), str(tmp_path / "spec.json"),
                           str(tmp_path / "chart.svg")], env={**os.environ, "NODE_PATH": str(TOOLS / "node_modules")},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    svg = (tmp_path / "chart.svg").read_text()
    metrics = {row["metric"] for row in rows}
    assert len(metrics) == 12  # the headline's 4, the change since step 0, 7 foundations
    assert len(re.findall(r'<g class="mark-area', svg)) == len(metrics)  # a band in each panel
    assert len(re.findall(r'<g class="mark-line', svg)) == len(metrics)
    assert svg.count('opacity="0.25"') == len(metrics)
    for metric in metrics:
        assert f">{metric}<" in svg, metric  # each panel's title
    if KEPT and CHROMIUM:
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1200,700", f"--screenshot={tmp_path / 'chart.png'}",
                        (tmp_path / "chart.svg").as_uri()], check=True, capture_output=True, timeout=120)
        Path(KEPT).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / "chart.png", Path(KEPT) / "wandb_interval_chart.png")
