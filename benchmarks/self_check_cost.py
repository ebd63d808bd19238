"""What the self-check costs, and how near the engine runs to its floor: SmolLM2-135M on this machine.

For each precision (float32, bfloat16) one worker process loads SmolLM2 once and scores, in turn,
a ``per_foundation=2`` probe (112 prompts) and the whole scifi set (408 prompts), each with the
self-check on and off, alternating the order every round, so both modes see the same machine.
It prints, per precision and probe size:

- the check's share: its own seconds (as each probe records them) over the checked probes' time, for the
  run and for the model's first probe (the one whose check decides the path); the checked probes' time
  over the unchecked ones' as a second, noisier measure;
- its peak memory: the process's peak resident memory during a checked probe and during an unchecked
  one, each above the resident memory before it (the kernel's peak mark is reset in between); the same
  for a model's first ``per_foundation=2`` probe, each in a fresh process (memory an earlier probe freed
  is not there to reuse); and the most float32 the replay held at once, against the size of the weights;
- the prompts the probes checked and how far the check's rotation had come.

In the float32 worker it also measures the engine against its floor: the floating-point operations of
an unchecked probe's forward calls (``torch.utils.flop_counter``) at the rate of one large matrix
product on this machine, and where the rest of the time goes (matrix products, attention, the other
tensor operations, and the time outside them: Python, the prefix plan, scoring), from the profiler.

    python -m benchmarks.self_check_cost             # both precisions, both sizes, 1 + 4 rounds (~20 min, 2 cores)
    python -m benchmarks.self_check_cost --quick     # per_foundation=2 only, 2 rounds
    python -m benchmarks.self_check_cost --device cuda  # the same on a GPU (memory read from torch.cuda)

Run it on an otherwise idle machine: the ratios compare runs of one process, but other jobs
change how much a probe and its check each suffer.
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
        probes[False].score(model, batches=[probes[False].batches[0]])  # warm the kernels, unchecked
        times = {True: [], False: []}
        peaks = {True: [], False: []}
        checks = []
        for r in range(rounds + 1):  # round 0: the checked probe is the model's first (its check decides the path)
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
            "ratio_first": ratios[0], "ratio_later": sum(times[True][1:]) / sum(times[False][1:]),
            "ratio_run": sum(times[True]) / sum(times[False]), "ratios": ratios,
            "check_s": [c["seconds"] for c in checks], "checks": checks,
            "peak_checked_mb": max(peaks[True]), "peak_unchecked_mb": max(peaks[False]),
        }
        result["sizes"][size]["unchecked_best_s"] = min(times[False])
        if precision == "float32":
            from torch.utils.flop_counter import FlopCounterMode

            probe = probes[False]
            with FlopCounterMode(display=False) as counter:
                probe.score(model)
            rate = matmul_rate(device)
            floor = counter.get_total_flops() / rate
            result["sizes"][size]["floor"] = {
                "flops": counter.get_total_flops(), "matmul_flops_per_s": rate, "floor_s": floor,
                "ratio": min(times[False]) / floor, **time_split(lambda p=probe: p.score(model), device)}
    Path(out).write_text(json.dumps(result))


def memory_worker(precision: str, check: bool, device: str, out: str) -> None:
    """One probe (``per_foundation=2``, the model's first) in a fresh process: its peak memory above the loaded
    model's, the way a user sees it (separate processes: nothing freed earlier is reused)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from tinymcf_callback import testing as offline_assets
    from tinymcf_callback.probe import Probe

    hf_logging.disable_progress_bar()
    path = offline_assets.smollm2_dir()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, precision)).to(device).eval()
    probe = Probe(tok, "scifi", self_check=check, **SIZES["per_foundation=2"])
    with Peak(device) as peak:
        probe.score(model)
    Path(out).write_text(json.dumps({"extra_mb": peak.extra_mb}))


# ---------------------------------------------------------------------------------------------- driver side
def report(results: list[dict]) -> None:
    print("\nThe self-check's price (SmolLM2-135M, scifi; checked and unchecked probes of one process, alternating)")
    print(f"{'precision':<10} {'probe':<17} {'prompts':>7} {'share':>6} {'first':>6} {'ratio':>7} {'first':>7} "
          f"{'checks':>7} {'extra MB on':>11} {'off':>6} {'copy MB':>8} {'of weights':>10}")
    for res in results:
        for size, s in res["sizes"].items():
            done = [c for c in s["checks"] if c["checked"]]
            copy_mb = max(c["copy_bytes"] for c in s["checks"]) / 2**20
            share = sum(s["check_s"]) / sum(s["checked_s"])
            first = s["check_s"][0] / s["checked_s"][0]
            print(f"{res['precision']:<10} {size:<17} {s['prompts']:>7} {share:>6.1%} {first:>6.1%} "
                  f"{s['ratio_run']:>6.3f}x {s['ratio_first']:>6.3f}x {len(done):>3}/{len(s['checks']):<3} "
                  f"{s['peak_checked_mb']:>11.1f} {s['peak_unchecked_mb']:>6.1f} {copy_mb:>8.1f} "
                  f"{copy_mb / res['weights_mb']:>10.1%}")
    print("  share: the check's own seconds over the checked probes' time, over the run (first: in the model's first "
          "probe, whose check decides the path whatever it costs); ratio: the checked probes' time over the unchecked "
          "ones' (the run, and the first pair: noisier, the two differ by more than the check on a shared machine); "
          "checks: probes that checked a prompt; extra MB: peak resident memory above the start of a probe (checked, "
          "unchecked); copy MB: the most float32 the replay held at once (a block and a slice of the output layer); "
          "of weights: that over the weights' size")
    for res in results:
        if "fresh_extra_mb_on" in res:
            on, off = res["fresh_extra_mb_on"], res["fresh_extra_mb_off"]
            print(f"  {res['precision']}: a model's first per_foundation=2 probe in a fresh process peaks {on:.1f} MB "
                  f"above the loaded model with the check, {off:.1f} MB without: the check's extra peak is "
                  f"{on - off:+.1f} MB, {(on - off) / res['weights_mb']:.1%} of the weights "
                  f"({res['weights_mb']:.0f} MB)")
    for res in results:
        for size, s in res["sizes"].items():
            last = s["checks"][-1]
            print(f"  {res['precision']} {size}: the check compared {sum(len(c['checked']) for c in s['checks'])} "
                  f"prompts over {len(s['checks'])} probes, {last['coverage']['checked_this_cycle']} of "
                  f"{last['coverage']['prompts']} so far in this cycle")
    for res in results:
        for size, s in res["sizes"].items():
            floor = s.get("floor")
            if not floor:
                continue
            print(f"\nThe engine against its floor ({res['precision']}, {size}, {res['threads']} threads): "
                  f"{floor['flops'] / 1e9:.1f} GFLOP at {floor['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s (one "
                  f"2048x2048 product) = {floor['floor_s']:.2f} s; the best unchecked probe took "
                  f"{s['unchecked_best_s']:.2f} s: {floor['ratio']:.2f}x the floor, "
                  f"{floor['ratio'] / (1 - sum(s['check_s']) / sum(s['checked_s'])):.2f}x with the check at its "
                  f"share of the run")
            total = sum(floor["split_s"].values())
            print("  where a profiled probe's time went: " + ", ".join(
                f"{kind} {sec:.2f} s ({sec / total:.0%})" for kind, sec in floor["split_s"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="per_foundation=2 only, 2 rounds")
    ap.add_argument("--rounds", type=int, default=4, help="rounds after the first checked probe")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "self_check_cost.json"))
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_memory", help=argparse.SUPPRESS)
    ap.add_argument("--_sizes", help=argparse.SUPPRESS)
    ap.add_argument("--_result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        worker(args._worker, args._sizes.split("|"), args.rounds, args.device, args._result)
        return 0
    if args._memory:
        precision, on = args._memory.split(":")
        memory_worker(precision, on == "on", args.device, args._result)
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
            for on in ("on", "off"):  # the first probe's peak, each in a fresh process
                subprocess.run([sys.executable, __file__, "--_memory", f"{precision}:{on}", "--device", args.device,
                                "--_result", str(out)], check=True, env=env)
                results[-1][f"fresh_extra_mb_{on}"] = json.loads(out.read_text())["extra_mb"]
    Path(args.out).write_text(json.dumps(results, indent=1))
    report(results)
    print(f"\nfull results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
