#!/usr/bin/env python
"""What the probe costs the training process: no probe, the in-process callback, and ``tinymcf watch`` beside it.

The same small fine-tune of SmolLM2-135M-Instruct (the offline asset, float32, CPU) runs three ways in one
run of this script, each training process pinned to core 0 with one thread:

- ``no probe``: the Trainer alone;
- ``callback``: ``MoralProbeCallback`` probing in-process at the step-0 baseline and at every save;
- ``watch``: ``MoralProbeCallback(hand_off=True)`` (it probes nothing, it links each save into the queue)
  and ``tinymcf watch`` in another process pinned to core 1, scoring each checkpoint as it comes.

It prints the training process's wall time for each, the ratio to no probe, and for the watcher its lag:
seconds from a checkpoint's ``trainer_state.json`` being written to its line in the history, and how long
after the training ended the watcher had the last one. The variants run in ``--rounds`` interleaved
rounds, each keeping its best time. Only ratios within one run of the script are meant to be compared.

    python -m benchmarks.watch_cost                     # ~6 min on 2 idle cores
    python -m benchmarks.watch_cost --steps 12 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = {"name": "scifi", "per_foundation": 2, "n_resamples": 0}
VARIANTS = ("no probe", "callback", "watch")


def train(out: str, variant: str, steps: int, save_steps: int) -> None:
    """One training run (a subprocess of this script, pinned to core 0, one thread)."""
    os.sched_setaffinity(0, {0})
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    from tinymcf_callback import MoralProbeCallback
    from tinymcf_callback import testing as offline_assets

    torch.set_num_threads(1)
    path = offline_assets.smollm2_dir()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (steps * 4, 64), generator=g)
    data = [{"input_ids": row, "labels": row.clone()} for row in ids]
    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-5,
                             save_strategy="steps", save_steps=save_steps, logging_steps=steps, report_to=[],
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, save_only_model=True,
                             seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tok)
    if variant != "no probe":
        trainer.add_callback(MoralProbeCallback(**PROBE, events=("save",), hand_off=variant == "watch",
                                                verbose=False, trainer=trainer))
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    Path(out, "bench_train.json").write_text(json.dumps({"seconds": seconds, "ended_at": time.time()}))


def one(variant: str, work: Path, steps: int, save_steps: int) -> dict:
    out = work / variant.replace(" ", "_")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    training = subprocess.Popen([sys.executable, __file__, "--_train", str(out), variant, str(steps), str(save_steps)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    result = {"variant": variant}
    if variant == "watch":
        while not out.exists() and training.poll() is None:
            time.sleep(0.2)
        watcher = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-m", "tinymcf_callback", "watch", str(out),
                                    "--per-foundation", "2", "--n-resamples", "0", "--device", "cpu", "--poll", "1",
                                    "--no-progress", "--report-to", "none"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen: dict[int, float] = {}
        history = out / "moral_probe_scifi.jsonl"
        while watcher.poll() is None:
            if history.exists():
                for raw in history.read_text().splitlines():
                    step = json.loads(raw)["step"]
                    seen.setdefault(step, time.time())
            time.sleep(0.2)
        for raw in history.read_text().splitlines():
            seen.setdefault(json.loads(raw)["step"], time.time())
        assert watcher.returncode == 0, watcher.stdout.read()
        result["watcher_ended_at"] = time.time()
        result["lines"] = sorted(seen)
        result["seen_at"] = seen
    if training.wait() != 0:
        raise SystemExit(f"{variant}: the training failed:\n{training.stderr.read()[-3000:]}")
    result.update(json.loads((out / "bench_train.json").read_text()))
    if variant == "watch":
        saved = json.loads((out / "moral_probe_run.json").read_text())["saves"]
        lags = []
        for step in saved:
            state = out / f"checkpoint-{step}" / "trainer_state.json"
            queued = out / ".moral_probe_queue" / f"checkpoint-{step}"
            written = state.stat().st_mtime if state.exists() else None
            if written is not None and step in result["seen_at"]:
                lags.append(result["seen_at"][step] - written)
        result["lag_s"] = lags
        result["after_end_s"] = result["watcher_ended_at"] - result["ended_at"]
        result["queue_left"] = queued.exists()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--save-steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "watch_cost.json"))
    ap.add_argument("--_train", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._train:
        out, variant, steps, save_steps = args._train
        train(out, variant, int(steps), int(save_steps))
        return
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("this benchmark pins the training and the watcher to two different cores; it needs 2")
    best: dict[str, dict] = {}
    for r in range(args.rounds):
        for variant in VARIANTS:
            with tempfile.TemporaryDirectory() as tmp:
                res = one(variant, Path(tmp), args.steps, args.save_steps)
            print(f"round {r + 1} {variant:9s} training {res['seconds']:7.1f} s", flush=True)
            if variant not in best or res["seconds"] < best[variant]["seconds"]:
                best[variant] = res
    base = best["no probe"]["seconds"]
    print(f"\nSmolLM2-135M, {args.steps} steps, a save every {args.save_steps}, probe {PROBE} "
          f"(best of {args.rounds} round(s), training on core 0, the watcher on core 1)")
    for variant in VARIANTS:
        print(f"  {variant:9s} {best[variant]['seconds']:7.1f} s  x{best[variant]['seconds'] / base:.3f} of no probe")
    w = best["watch"]
    lags = w["lag_s"]
    print(f"  watcher: {len(w['lines'])} lines (steps {w['lines']}); lag from a checkpoint written to its line: "
          f"median {sorted(lags)[len(lags) // 2]:.1f} s, max {max(lags):.1f} s; the last line "
          f"{w['after_end_s']:.1f} s after the training ended")
    Path(args.out).write_text(json.dumps({"steps": args.steps, "save_steps": args.save_steps, "rounds": args.rounds,
                                          "probe": PROBE, "results": {k: {kk: vv for kk, vv in v.items()
                                                                          if kk != "seen_at"}
                                                                      for k, v in best.items()}}, indent=2))


if __name__ == "__main__":
    main()
