"""TensorBoard's own server, screenshot by headless Chromium: the probe's margin charts draw each value's band.

``make test-dashboards`` installs Debian's ``chromium`` (once) and runs this file; without it every test here is
skipped with that command. A logging folder like a Trainer's is written the way a watcher writes it (the Trainer's
``train/loss`` in its folder, the probe's points through the package's TensorBoard sink in ``moral_probe_scifi/``),
``tensorboard`` serves it on a free port of 127.0.0.1, and Chromium takes the custom-scalars page. The server's own
answers are checked (the merged layout, the margin chart's data), and the band in the picture: the same page of a
probe logged without intervals (plain charts) has far fewer coloured pixels. With ``TINYMCF_SCREENSHOTS=DIR`` the
pictures are kept there (``make test-dashboards`` keeps them in ``docs/dashboards/``, where docs/dashboards.md shows
them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers.ports import free_port
from helpers.reports import made_up_lines

from tinymcf_callback.figures.tracked import probe_figure
from tinymcf_callback.probe import Probe
from tinymcf_callback.trackers.sinks import Trackers
from tinymcf_callback.trackers.tensorboard import TensorBoardTracker

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.dashboards,
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium: make test-dashboards installs Debian's")]
STEPS = (0, 50, 100, 150, 200, 250, 300)
KEPT = os.environ.get("TINYMCF_SCREENSHOTS")


def logging_folder(tmp_path: Path, probe: Probe, name: str) -> Path:
    """``<tmp>/<name>/runs``: a Trainer's logging folder with its loss, and the probe's own folder in it."""
    from torch.utils.tensorboard import SummaryWriter

    out = tmp_path / name
    training_dir = out / "runs" / "Dec01_12-00-00_trainer"
    training = SummaryWriter(str(training_dir))
    for step in range(0, 301, 10):
        training.add_scalar("train/loss", 3.0 * np.exp(-step / 150) + 0.5, step)
    training.close()
    recorded = {"dir": str(training_dir), "output_dir": str(out)}  # as the run's record keeps it
    trackers = Trackers([TensorBoardTracker.reopen(out, recorded, None, "scifi")],
                        figure=lambda curve: probe_figure(curve, out / "moral_probe_scifi.jsonl"))
    for line in made_up_lines(probe, STEPS)[0]:
        trackers.send(line, rows=[])
    trackers.close()
    return out / "runs"


def serve(logdir: Path):
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(logdir), "--host",
                               "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            layout = json.loads(urllib.request.urlopen(f"{url}/data/plugin/custom_scalars/layout", timeout=5).read())
            if layout:
                return server, url, layout
        except OSError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()
        time.sleep(0.5)


def screenshot(url: str, path: Path) -> np.ndarray:
    from PIL import Image

    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1500,1100", "--virtual-time-budget=20000", f"--screenshot={path}", url],
                   check=True, capture_output=True, timeout=180)
    return np.asarray(Image.open(path).convert("RGB"))


def coloured(picture: np.ndarray) -> int:
    """Pixels of a clear colour (not white, grey or black): the curves and, above all, the bands."""
    rgb = picture.astype(float) / 255
    saturation = rgb.max(axis=2) - rgb.min(axis=2)
    return int((saturation > 0.12).sum())


def test_tensorboards_custom_scalars_page_draws_the_probes_bands(tmp_path, qwen_tok):
    with_bands = logging_folder(tmp_path, Probe(qwen_tok, "scifi", per_foundation=2), "bands")
    without = logging_folder(tmp_path, Probe(qwen_tok, "scifi", per_foundation=2, n_resamples=0), "lines")
    pictures = {}
    for name, logdir in (("bands", with_bands), ("lines", without)):
        server, url, layout = serve(logdir)
        try:
            charts = {c["title"]: c for cat in layout["category"] for c in cat["chart"]}
            if name == "bands":  # the server merged the probe's layout: margin charts over the probe's run
                assert charts["score"]["margin"]["series"] == [{"value": "eval/moral_scifi/score",
                                                               "lower": "eval/moral_scifi/score_lo",
                                                               "upper": "eval/moral_scifi/score_hi"}]
                run = "Dec01_12-00-00_trainer/moral_probe_scifi"
                data = json.loads(urllib.request.urlopen(
                    f"{url}/data/plugin/custom_scalars/scalars?run={urllib.request.quote(run, safe='')}&tag="
                    f"{urllib.request.quote('eval/moral_scifi/score_hi', safe='')}", timeout=10).read())
                assert [point[1] for point in data["tag_to_events"]["eval/moral_scifi/score_hi"]] == list(STEPS)
            else:
                assert charts["score"]["multiline"]["tag"] == [r"^eval/moral_scifi/score$"] and \
                    "margin" not in json.dumps(layout)
            pictures[name] = screenshot(f"{url}/?darkMode=false#custom_scalars", tmp_path / f"{name}.png")
            if name == "bands":
                screenshot(f"{url}/?darkMode=false#images", tmp_path / "images.png")
        finally:
            server.terminate()
            server.wait(timeout=30)
    assert pictures["bands"].shape[0] > 500 and pictures["bands"].std() > 10  # a page, not a blank
    assert coloured(pictures["bands"]) > 2 * coloured(pictures["lines"]) + 2000, (
        coloured(pictures["bands"]), coloured(pictures["lines"]))  # the bands fill the charts
    if KEPT:
        kept = Path(KEPT)
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / "bands.png", kept / "tensorboard_custom_scalars.png")
        shutil.copyfile(tmp_path / "images.png", kept / "tensorboard_images.png")
