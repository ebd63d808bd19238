"""MLflow's and trackio's own servers, screenshot by headless Chromium: a followed run's probe where a user looks.

A tiny Trainer run reports to an MLflow sqlite store and to trackio's local store and hands its probes off
(``tests/helpers/watched_run.py``, six steps, a checkpoint at each); ``tinymcf sweep --report-to auto`` then scores
the checkpoints from another process and writes into the training's two runs, as a watcher does. ``mlflow ui`` and
``trackio show`` serve those stores on free ports of 127.0.0.1. Checked in each server's own answers: one run, the
probe's points at the Trainer's steps (MLflow: its metric history; trackio: on its default x axis, its own row
counter, each point on the Trainer's first row of the same ``train/global_step``), the figure where the page shows
it; and in the rendered page (Chromium's DOM): the charts a user sees without setting anything up. With
``TINYMCF_SCREENSHOTS=DIR`` the pictures are kept there (``make test-dashboards``: ``docs/dashboards/``, shown in
docs/dashboards.md).
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

import pytest
from helpers.ports import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.dashboards,
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium: make test-dashboards installs Debian's")]
KEPT = os.environ.get("TINYMCF_SCREENSHOTS")
HELPERS = Path(__file__).resolve().parents[1] / "helpers"
BIN = Path(sys.executable).parent
PROJECT = "followed"
STEPS = list(range(7))  # the starting model and the six checkpoints
FILTER = "moral_scifi/score$|train/loss"  # trackio's metric filter (a regular expression) of the docs' link


@pytest.fixture(scope="module")
def followed(tmp_path_factory) -> dict:
    """The trained run, its stores and the environment that names them."""
    root = tmp_path_factory.mktemp("followed")
    run = root / "run"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlflow.db", "TRACKIO_DIR": str(root / "trackio"),
           "WATCHED_REPORT_TO": "mlflow,trackio", "WATCHED_TRACKIO_PROJECT": PROJECT, "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "MLFLOW_EXPERIMENT_NAME": "followed"}
    subprocess.run([sys.executable, str(HELPERS / "watched_run.py"), str(run), str(root / "init"), "watch"], env=env,
                   cwd=root, check=True, capture_output=True, timeout=900)
    swept = subprocess.run([sys.executable, "-m", "tinymcf_callback", "sweep", str(run), "--report-to", "auto",
                            "--per-foundation", "2", "--n-resamples", "200", "--device", "cpu", "--no-progress"],
                           env=env, cwd=root, capture_output=True, text=True, timeout=900)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    record = json.loads((run / "moral_probe_run.json").read_text())
    return {"root": root, "run": run, "env": env, "record": record["trackers"]}


def serve(command: list[str], url: str, ready: str, env: dict, cwd: Path) -> subprocess.Popen:
    """Start a server and wait (at most two minutes) until ``url + ready`` answers."""
    server = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url + ready, timeout=5).close()
            return server
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise AssertionError(f"{command[0]} never answered at {url}: {server.stderr.read()[-2000:]}")
        time.sleep(0.5)


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def get(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())


def chromium(url: str, *, picture: Path | None = None, size: str = "1500,1100", wait_ms: int = 30000) -> str:
    """The page as Chromium renders it: its DOM after ``wait_ms`` of the page's own time (its scripts run, its data
    fetched), and a screenshot when ``picture`` is given."""
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={size}",
            f"--virtual-time-budget={wait_ms}"]
    if picture is not None:
        subprocess.run([*base, f"--screenshot={picture}", url], check=True, capture_output=True, timeout=300)
    done = subprocess.run([*base, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=300)
    return done.stdout


def keep(picture: Path, name: str) -> None:
    if KEPT:
        Path(KEPT).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(picture, Path(KEPT) / name)


def test_mlflows_run_page_shows_the_probes_charts_and_its_figure_without_setup(followed, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = serve([str(BIN / "mlflow"), "ui", "--backend-store-uri", followed["env"]["MLFLOW_TRACKING_URI"],
                    "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], url, "/health", followed["env"],
                   followed["root"])
    try:
        run_id = followed["record"]["mlflow"]["run_id"]
        runs = get(f"{url}/api/2.0/mlflow/runs/search", {"experiment_ids": [
            e["experiment_id"] for e in get(f"{url}/api/2.0/mlflow/experiments/search", {"max_results": 100})[
                "experiments"]]})["runs"]
        assert [r["info"]["run_id"] for r in runs] == [run_id]  # the training's run, no other
        experiment = runs[0]["info"]["experiment_id"]

        def steps(key: str) -> list[int]:
            history = get(f"{url}/api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key="
                          f"{urllib.request.quote(key, safe='')}")
            return sorted(m["step"] for m in history["metrics"])

        assert steps("eval_moral_scifi/score") == steps("eval_moral_scifi/score_hi") == STEPS  # each once
        assert steps("loss") == STEPS[1:]  # the Trainer's own, at the same steps
        figures = get(f"{url}/api/2.0/mlflow/artifacts/list?run_id={run_id}&path=moral_probe_scifi")["files"]
        assert "moral_probe_scifi/figure.png" in [f["path"] for f in figures]

        # the Model metrics tab: a page as tall as its charts, so that each is drawn (MLflow draws a chart once it is
        # in view); the image card is there with the figure of step 0 under its step slider, without a click
        page = f"{url}/#/experiments/{experiment}/runs/{run_id}/model-metrics"
        dom = chromium(page, picture=tmp_path / "metrics.png", size="1500,6000", wait_ms=120000)
        assert 'title="eval_moral_scifi/figure"' in dom  # the image card, made by MLflow
        assert "get-artifact?path=images%2Feval_moral_scifi~figure%2Bstep%2B0%2B" in dom  # its image, step 0
        for chart in ("score", "score_hi", "social_norms"):
            assert f'title="{chart}"' in dom or f">{chart}<" in dom, chart  # the probe's charts, in its section
        # the card lists the run's parameters above the image: a Trainer run logs some 150 (its TrainingArguments)
        assert "save_on_each_node=" in dom[dom.index('title="eval_moral_scifi/figure"'):]
        # the Artifacts tab: the newest figure, previewed
        artifact = f"{url}/#/experiments/{experiment}/runs/{run_id}/artifacts/moral_probe_scifi/figure.png"
        assert '<img alt="moral_probe_scifi/figure.png" src="blob:' in chromium(artifact,
                                                                                 picture=tmp_path / "artifact.png")
        if KEPT:
            from PIL import Image

            Image.open(tmp_path / "metrics.png").crop((0, 0, 1500, 1500)).save(tmp_path / "metrics_top.png")
        keep(tmp_path / "metrics_top.png", "mlflow_model_metrics.png")
        keep(tmp_path / "artifact.png", "mlflow_artifact_figure.png")
    finally:
        stop(server)


def test_trackios_dashboard_puts_the_followed_probe_on_the_trainers_steps(followed, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**followed["env"], "GRADIO_SERVER_PORT": str(port)}
    server = serve([str(BIN / "trackio"), "show", "--project", PROJECT, "--host", "127.0.0.1"], url, "/version",
                   env, followed["root"])
    try:
        runs = get(f"{url}/api/get_runs_for_project", {"project": PROJECT})["data"]
        name = followed["record"]["trackio"]["name"]
        assert [r["name"] if isinstance(r, dict) else r for r in runs] == [name]  # the training's run, no other
        logs = get(f"{url}/api/get_logs", {"project": PROJECT, "run": name})["data"]
        trainer = {}
        for row in logs:
            if "train/loss" in row:
                trainer.setdefault(row["train/global_step"], []).append(row["step"])
        probe = [(row["train/global_step"], row["step"]) for row in logs if "eval/moral_scifi/score" in row]
        assert sorted(global_step for global_step, _ in probe) == STEPS  # each once
        # trackio's default x axis is its own step: each point on the Trainer's first row of the same global step
        assert dict(probe) == {0: 0, **{s: min(trainer[s]) for s in STEPS[1:]}}, (probe, trainer)
        figures = [row for row in logs if "eval/moral_scifi/figure" in row]
        assert [row["eval/moral_scifi/figure"]["caption"] for row in figures] == [
            f"train/global_step {row['train/global_step']}" for row in figures]

        dom = chromium(f"{url}/?project={PROJECT}")  # as it opens: every chart, smoothed (trackio's default: 10)
        assert ">score<" in dom and ">loss<" in dom  # the probe's charts and the loss (x axis: trackio's step)
        shown = f"{url}/?project={PROJECT}&metric_filter={urllib.request.quote(FILTER)}&smoothing=0"  # the docs' link
        dom = chromium(shown, picture=tmp_path / "metrics.png", size="1500,900")
        assert ">score<" in dom and ">loss<" in dom and ">align_other<" not in dom  # the two charts, side by side
        media = chromium(f"{url}/media?project={PROJECT}", picture=tmp_path / "media.png", size="1500,1100")
        assert "train/global_step 6" in media  # the newest figure, captioned with the Trainer's step
        keep(tmp_path / "metrics.png", "trackio_metrics.png")
        keep(tmp_path / "media.png", "trackio_media.png")
    finally:
        stop(server)
