"""What the dashboards' figure costs at each probe, against the probe itself, measured in one process.

The figure of the curve so far (:mod:`tinymcf_callback.figures.tracked`) is drawn once per probe and handed to every
tracker that shows images. This loads SmolLM2-135M once (float32, CPU) and, for a ``per_foundation=2`` probe (112
prompts) and the whole scifi set (408 prompts), alternates rounds of:

- the probe: ``Probe.run`` of the model (the self-check and the intervals as the callback runs them);
- the figure alone: :func:`~tinymcf_callback.figures.tracked.probe_figure` of a curve of 10 and of 100 points;
- the figure's whole cost in the trackers: the same point sent through real local trackers (a TensorBoard writer,
  an MLflow sqlite store, trackio's local store, an offline wandb run) with the figure and without it; the
  difference is what the figure adds (drawing, each tracker's PNG encoding and its write).

It prints the medians and each figure cost as a share of the probe measured in the same round, against the target
of at most 5%, and writes ``benchmarks/figure_cost.json``. Also the first figure of a process (matplotlib's import
and font cache), paid once.

    python -m benchmarks.figure_cost            # 3 rounds (~6 min on 2 CPU cores)
    python -m benchmarks.figure_cost --rounds 1 --quick   # per_foundation=2 only

Run it on an otherwise idle machine (``flock /work/.cpu.lock python -m benchmarks.figure_cost`` where machines are
shared): the ratios compare runs of one process, but other jobs change how much each part suffers.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"per_foundation=2": {"per_foundation": 2}, "whole set": {}}
CURVES = (10, 100)  # points on the curve the figure draws


def curve_of(line: dict, n: int) -> list[dict]:
    """``n`` points at steps 0, 10, ... made of one scored line (the figure's cost depends on the points, not their
    values)."""
    out = []
    for k in range(n):
        point = copy.deepcopy(line)
        point["step"], point["event"] = 10 * k, "train_begin" if k == 0 else "watch"
        out.append(point)
    return out


def local_trackers(folder: Path, figure):
    """Real trackers writing locally: TensorBoard, MLflow (sqlite), trackio (local store), wandb (offline)."""
    import mlflow
    import trackio
    import wandb
    from torch.utils.tensorboard import SummaryWriter

    from tinymcf_callback.trackers.mlflow import MlflowTracker
    from tinymcf_callback.trackers.sinks import Sink, Trackers
    from tinymcf_callback.trackers.tensorboard import TensorBoardWriter
    from tinymcf_callback.trackers.trackio import TrackioTracker
    from tinymcf_callback.trackers.wandb import WandbTracker

    client = mlflow.tracking.MlflowClient(f"sqlite:///{folder}/mlflow.db")
    experiment = client.create_experiment("bench", artifact_location=(folder / "mlruns").as_uri())  # not ./mlruns
    run_id = client.create_run(experiment).info.run_id
    trackio_run = trackio.init(project="bench", embed=False, auto_log_cpu=False, auto_log_gpu=False)
    wandb_run = wandb.init(project="bench", dir=str(folder), mode="offline")
    sinks = [Sink("tensorboard", TensorBoardWriter(SummaryWriter(str(folder / "tb"))).send, figure=True),
             MlflowTracker(client, run_id, "bench"), TrackioTracker(trackio_run, "bench", follower=False),
             WandbTracker(wandb_run)]
    return Trackers(sinks, strict=True, figure=figure), (trackio_run, wandb_run)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="per_foundation=2 only")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_SILENT", "true")
    folder = Path(tempfile.mkdtemp(prefix="figure_cost_"))
    os.environ["TRACKIO_DIR"] = str(folder / "trackio")  # before trackio is imported

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinymcf_callback.figures.tracked import probe_figure
    from tinymcf_callback.probe import Probe
    from tinymcf_callback.rundir.history import probe_line
    from tinymcf_callback.testing import smollm2_dir
    from tinymcf_callback.views.rows import vignette_rows, vignette_texts

    torch.set_num_threads(os.cpu_count() or 1)
    history = folder / "moral_probe_scifi.jsonl"
    draw = lambda curve: probe_figure(curve, history)  # noqa: E731
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()
    sizes = {k: v for k, v in SIZES.items() if not args.quick or k == "per_foundation=2"}
    probes = {name: Probe(tok, "scifi", **kw) for name, kw in sizes.items()}
    results: dict[str, dict] = {}
    first = None
    for name, probe in probes.items():
        probe.run(model)  # the model's first probe checks its riskiest prompts: not the steady cost
        report = probe.run(model)
        line = probe_line("scifi", report, step=0, epoch=0.0, event="train_begin")
        if first is None:
            first = timed(lambda line=line: draw([line]))  # matplotlib's import and font cache: once a process
        rows = vignette_rows(report, 0, vignette_texts(probe.vignettes))
        with_figure, trackers_open = local_trackers(folder / name.replace("=", "_").replace(" ", "_"), draw)
        without = copy.copy(with_figure)
        without.figure = None
        times = {"probe": [], **{f"figure, {n} points": [] for n in CURVES},
                 **{f"trackers with the figure, {n} points": [] for n in CURVES},
                 **{f"trackers without it, {n} points": [] for n in CURVES}}
        for r in range(args.rounds):
            times["probe"].append(timed(lambda probe=probe: probe.run(model)))
            for n in CURVES:
                curve = curve_of(line, n)
                times[f"figure, {n} points"].append(timed(lambda curve=curve: draw(curve)))
                for trackers, label in ((with_figure, "with the figure"), (without, "without it")):
                    trackers.seed(curve[:-1])
                    times[f"trackers {label}, {n} points"].append(
                        timed(lambda t=trackers, c=curve, v=rows: t.send(c[-1], rows=v)))
            print(f"[{name}] round {r + 1}: probe {times['probe'][-1]:.2f} s", flush=True)
        with_figure.close()
        for run in trackers_open:
            run.finish()
        med = {k: statistics.median(v) for k, v in times.items()}
        shares = {}
        for n in CURVES:
            shares[f"figure, {n} points"] = med[f"figure, {n} points"] / med["probe"]
            added = med[f"trackers with the figure, {n} points"] - med[f"trackers without it, {n} points"]
            shares[f"what the figure adds to 4 trackers, {n} points"] = added / med["probe"]
            med[f"what the figure adds to 4 trackers, {n} points"] = added
        results[name] = {"prompts": len(probe.prompts), "seconds": med, "share_of_probe": shares, "runs": times}
    print(f"\nSmolLM2-135M-Instruct float32 on {os.cpu_count()} CPU cores, median of {args.rounds} round(s); "
          f"the first figure of a process: {first:.2f} s (once)")
    print(f"{'probe':<18} {'part':<46} {'seconds':>8} {'share of the probe':>19}")
    for name, res in results.items():
        print(f"{name:<18} {'the probe (' + str(res['prompts']) + ' prompts)':<46} {res['seconds']['probe']:>8.3f}")
        for part, share in res["share_of_probe"].items():
            verdict = "ok" if share <= 0.05 else "over 5%"
            print(f"{'':<18} {part:<46} {res['seconds'][part]:>8.3f} {share:>18.1%} {verdict}")
    out = ROOT / "benchmarks" / "figure_cost.json"
    out.write_text(json.dumps({"machine": f"{os.cpu_count()} CPU cores", "rounds": args.rounds,
                               "first_figure_s": first, "results": results}, indent=1) + "\n")
    print(f"\nwritten: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
