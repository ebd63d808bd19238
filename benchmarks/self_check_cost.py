"""What the self-check costs, and how near the engine runs to its floor: SmolLM2-135M on this machine.

For each precision (float32, bfloat16) one worker process loads SmolLM2 once and scores, in turn,
a ``per_foundation=2`` probe (112 prompts) and the whole scifi set (408 prompts), each with the
self-check on and off, alternating the order every round, so both modes see the same machine.
It prints, per precision and probe size:

- the check's share: the checked probe's time over the unchecked one's (best of the rounds and the
  median of the per-round ratios), and the check's own seconds as the probe records them;
- its peak memory: the process's peak resident memory during a checked probe and during an unchecked
  one, each above the resident memory before it (the kernel's peak mark is reset in between), and the
  largest float32 copy of the weights the replay held, against the size of the weights;
- the prompts each probe checked and how far the check's rotation had come.

In the float32 worker it also measures the engine against its floor: the floating-point operations of
an unchecked probe's forward calls (``torch.utils.flop_counter``) at the rate of one large matrix
product on this machine, and where the rest of the time goes (matrix products, attention, the other
tensor operations, and the time outside them: Python, the prefix plan, scoring), from the profiler.

    python benchmarks/self_check_cost.py             # both precisions, both sizes, 3 rounds (~10 min on 2 cores)
    python benchmarks/self_check_cost.py --quick     # per_foundation=2 only, 2 rounds
    python benchmarks/self_check_cost.py --device cuda  # the same on a GPU (memory read from torch.cuda)

Run it on an otherwise idle machine: the ratios compare runs of one process, but other jobs
change how much a probe and its check each suffer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"per_foundation=2": {"per_foundation": 2}, "whole set": {}}
PRECISIONS = ("float32", "bfloat16")


# ---------------------------------------------------------------------------------------------- worker side
def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Peak:
    """The peak memory above the start of a block: resident memory on CPU, the allocator's on CUDA."""

    def __init__(self, device: str):
        self.device, self.extra_mb = device, float("nan")

    def __enter__(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated() / 2**20
        else:
            with open("/proc/self/clear_refs", "w") as f:  # the kernel's peak mark back to the resident memory now
                f.write("5")
            self.start = _rss_mb()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.extra_mb = torch.cuda.max_memory_allocated() / 2**20 - self.start
        else:
            self.extra_mb = _peak_mb() - self.start


def matmul_rate(device: str, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of one large float32 matrix product, best of ``repeats``: the floor's rate."""
    import torch

    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


SPLIT = {  # the profiler's operator names, by kind
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"),
    "attention": ("aten::_scaled_dot_product", "aten::scaled_dot_product"),
}


def time_split(run, device: str) -> dict:
    """Seconds of one run by kind: each top-level operator's time (its children included) by the kind its name
    says, and the run's wall time outside every operator."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        run()
        if device == "cuda":
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = [e for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::")]
    split = {kind: 0.0 for kind in (*SPLIT, "other tensor operations")}
    for event in events:
        kind = next((k for k, names in SPLIT.items() if event.name.startswith(names)), "other tensor operations")
        split[kind] += event.cpu_time_total / 1e6
    split["outside tensor operations"] = max(0.0, wall - sum(split.values()))
    return {"wall_s": wall, "split_s": split}


def worker(precision: str, sizes: list[str], rounds: int, device: str, out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from tinymcf_callback import testing as offline_assets
    from tinymcf_callback.probe import Probe

    hf_logging.disable_progress_bar()
    path = offline_assets.smollm2_dir()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, precision)).to(device).eval()
    weights_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    result = {"precision": precision, "device": device, "threads": torch.get_num_threads(),
              "weights_mb": weights_mb, "sizes": {}}
    for size in sizes:
        probes = {on: Probe(tok, "scifi", self_check=on, **SIZES[size]) for on in (True, False)}
        for on in (True, False):  # warm both paths (first calls allocate, and the check picks its budget)
            probes[on].score(model, batches=[probes[on].batches[0]])
        times = {True: [], False: []}
        peaks = {True: [], False: []}
        checks = []
        for r in range(rounds):
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                with Peak(device) as peak:
                    start = time.perf_counter()
                    res = probes[on].score(model)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    times[on].append(time.perf_counter() - start)
                peaks[on].append(peak.extra_mb)
                if on:
                    checks.append({k: res.check[k] for k in ("seconds", "checked", "copy_bytes", "coverage",
                                                             "strategy", "reference", "resolution")})
        ratios = [c / u for c, u in zip(times[True], times[False], strict=True)]
        result["sizes"][size] = {
            "prompts": len(probes[True]), "checked_s": times[True], "unchecked_s": times[False],
            "ratio_best": min(times[True]) / min(times[False]), "ratio_median": statistics.median(ratios),
            "check_s": [c["seconds"] for c in checks], "checks": checks,
            "peak_checked_mb": max(peaks[True]), "peak_unchecked_mb": max(peaks[False]),
        }
        if precision == "float32":
            from torch.utils.flop_counter import FlopCounterMode

            probe = probes[False]
            with FlopCounterMode(display=False) as counter:
                probe.score(model)
            rate = matmul_rate(device)
            floor = counter.get_total_flops() / rate
            result["sizes"][size]["floor"] = {
                "flops": counter.get_total_flops(), "matmul_flops_per_s": rate, "floor_s": floor,
                "ratio": min(times[False]) / floor, **time_split(lambda: probe.score(model), device)}
    Path(out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------- driver side
def report(results: list[dict]) -> None:
    print("\nThe self-check's price (SmolLM2-135M, scifi; checked against unchecked probes in one process, "
          "alternating)")
    print(f"{'precision':<10} {'probe':<17} {'prompts':>7} {'checked':>8} {'ratio best':>10} {'median':>7} "
          f"{'check s':>8} {'share':>6} {'extra MB on':>11} {'off':>6} {'copy MB':>8} {'of weights':>10}")
    for res in results:
        for size, s in res["sizes"].items():
            share = statistics.median(s["check_s"]) / min(s["checked_s"])
            copy_mb = max(c["copy_bytes"] for c in s["checks"]) / 2**20
            n_checked = statistics.median(len(c["checked"]) for c in s["checks"])
            print(f"{res['precision']:<10} {size:<17} {s['prompts']:>7} {n_checked:>8g} {s['ratio_best']:>9.3f}x "
                  f"{s['ratio_median']:>6.3f}x {statistics.median(s['check_s']):>8.2f} {share:>6.1%} "
                  f"{s['peak_checked_mb']:>11.1f} {s['peak_unchecked_mb']:>6.1f} {copy_mb:>8.1f} "
                  f"{max(0.0, s['peak_checked_mb'] - s['peak_unchecked_mb']) / res['weights_mb']:>10.1%}")
    print("  ratio: checked over unchecked probe time; share: the check's own seconds in a checked probe; extra MB: "
          "peak resident memory above the start of a probe; of weights: the check's extra peak over the weights' "
          "size")
    for res in results:
        for size, s in res["sizes"].items():
            last = s["checks"][-1]["coverage"]
            print(f"  {res['precision']} {size}: after {last['probes']} checked probes the rotation has checked "
                  f"{last['checked_this_cycle']} of {last['prompts']} prompts ({s['checks'][-1]['reference']}, "
                  f"resolution {s['checks'][-1]['resolution']:.0e})")
    for res in results:
        for size, s in res["sizes"].items():
            floor = s.get("floor")
            if not floor:
                continue
            print(f"\nThe engine against its floor ({res['precision']}, {size}, {res['threads']} threads): "
                  f"{floor['flops'] / 1e9:.1f} GFLOP at {floor['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s (one "
                  f"2048x2048 product) = {floor['floor_s']:.2f} s; the unchecked probe took "
                  f"{min(s['unchecked_s']):.2f} s: {floor['ratio']:.2f}x the floor")
            total = sum(floor["split_s"].values())
            print("  where a profiled probe's time went: " + ", ".join(
                f"{kind} {sec:.2f} s ({sec / total:.0%})" for kind, sec in floor["split_s"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="per_foundation=2 only, 2 rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "self_check_cost.json"))
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_sizes", help=argparse.SUPPRESS)
    ap.add_argument("--_result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        worker(args._worker, args._sizes.split("|"), args.rounds, args.device, args._result)
        return 0
    sizes = ["per_foundation=2"] if args.quick else list(SIZES)
    rounds = 2 if args.quick else args.rounds
    results = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precisions.split(","):
            out = Path(tmp) / f"{precision}.json"
            print(f"[self_check_cost] {precision}: {', '.join(sizes)}, {rounds} rounds ...", flush=True)
            subprocess.run([sys.executable, __file__, "--_worker", precision, "--_sizes", "|".join(sizes),
                            "--rounds", str(rounds), "--device", args.device, "--_result", str(out)],
                           check=True, env=env)
            results.append(json.loads(out.read_text()))
    Path(args.out).write_text(json.dumps(results, indent=1))
    report(results)
    print(f"\nfull results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
