#!/usr/bin/env python
"""Forward calls and kernel launches of one probe, counted by torch.profiler on the CPU: the GPU's work without a GPU.

A probe's time on a GPU is bound by its kernel launches when the model is small (issue 40: 55,688 launches in a
1 s probe of Qwen3-0.6B on an H200). Which operators a forward call launches does not depend on the model's widths,
only on its structure, so a random Qwen3 with Qwen3-0.6B's 28 layers and head ratio but tiny widths makes every
operator the real one makes, in seconds on a CPU. The profiler counts the operators called from Python that each
launch a kernel on a GPU (views and allocations left out; ``gpu.profiled``), by name.

Each batch size is given as ``TOKENSxPROMPTS``; ``gpu`` stands for the GPU's plan as an H200 with 137 GiB free
makes it for Qwen3-0.6B (:func:`~tinymcf_callback.scoring.batching.batch_size_for`; evened-out batches). With
``--ref REF`` the package of that commit is scored instead (``git archive``, run in a subprocess), for a before and
after of the engine under the same counting:

    python -m benchmarks.probe_ops --set clifford --sizes 8192x64,131072x1024,gpu
    python -m benchmarks.probe_ops --set clifford --sizes 8192x64,131072x1024 --ref main
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
STRUCTURE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=28, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)  # Qwen3-0.6B's layers and head ratio
H200_FREE = 137 * 2**30


def count(name: str, sizes: list[str]) -> list[dict]:
    """Each batch size's probe (unchecked, warm) under the profiler: forward calls, launches, the busiest ops."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from benchmarks.gpu import QWEN3, profiled
    from tinymcf_callback import testing
    from tinymcf_callback.probe import Probe

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**QWEN3, **STRUCTURE)).eval()
    tok = AutoTokenizer.from_pretrained(testing.qwen3_tokenizer_dir())
    out = []
    for size in sizes:
        if size == "gpu":
            probe, where = Probe(tok, name, n_resamples=0, self_check=False), seen_as_a_gpu()
        else:
            tokens, prompts = (int(x) for x in size.split("x"))
            probe = Probe(tok, name, n_resamples=0, self_check=False, token_budget=tokens, max_batch_size=prompts)
            where = contextlib.nullcontext()
        with where:
            res = probe.score(model)  # planned, and warm
            record = profiled(lambda p=probe: p.score(model), "cpu")
        out.append({"size": size, "batches": len(probe.batches), "forward_calls": res.n_forward,
                    "kernel_launches": record["kernel_launches"], "top_operators": record["top_operators"],
                    "prompts": len(probe), "plan": getattr(res, "batch_plan", None)})
    return out


@contextlib.contextmanager
def seen_as_a_gpu():
    """The probe plans as on an H200 with 137 GiB free; the model stays on the CPU and runs there. Its size per token
    is the tiny model's, so the plan is at the caps, as Qwen3-0.6B's is on an H200 (docs/engine.md)."""
    import torch

    from tinymcf_callback.probe import fixed as probe_module

    saved = probe_module.model_device, probe_module.device_memory
    probe_module.model_device = lambda model: torch.device("cuda:0")
    probe_module.device_memory = lambda device: H200_FREE
    try:
        yield
    finally:
        probe_module.model_device, probe_module.device_memory = saved


def at_ref(ref: str, name: str, sizes: list[str]) -> list[dict]:
    """:func:`count` with the package of commit ``ref`` (exported with ``git archive``), in a subprocess."""
    with tempfile.TemporaryDirectory(prefix="tinymcf-ops-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "tinymcf_callback",
                                  "configs", "cache"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = Path(tmp) / "out.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(ROOT)])}  # that package, these benchmarks
        subprocess.run([sys.executable, __file__, "--set", name, "--sizes", ",".join(sizes), "--out", str(out),
                        "--_here"], env=env, check=True, cwd=tmp)
        return json.loads(out.read_text())["counts"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="clifford")
    ap.add_argument("--sizes", default="8192x64,gpu", help="comma-separated TOKENSxPROMPTS, or gpu")
    ap.add_argument("--ref", default="", help="count the package of this git commit instead")
    ap.add_argument("--out", default="", help="a JSON file for the counts")
    ap.add_argument("--_here", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._here:  # the exported package (first on PYTHONPATH), said so
        import tinymcf_callback

        print(f"[ops] the package of {tinymcf_callback.__file__}", flush=True)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if args.ref and "gpu" in sizes:
        ap.error("--ref counts given sizes only (an older package has no GPU plan)")
    counts = at_ref(args.ref, args.set, sizes) if args.ref else count(args.set, sizes)
    for c in counts:
        print(f"{args.set} ({c['prompts']} prompts) at {c['size']}{' @ ' + args.ref if args.ref else ''}: "
              f"{c['batches']} batches, {c['forward_calls']} forward calls, {c['kernel_launches']} kernel launches")
        print("    " + ", ".join(f"{k[6:]} {v}" for k, v in c["top_operators"].items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"set": args.set, "ref": args.ref or None, "counts": counts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
