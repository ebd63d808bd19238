"""The follower's time per checkpoint in each run-folder layout, beside ``tinymcf eval`` of the same weights.

SmolLM2-135M-Instruct (float32) saved once per layout by the same calls the trainers make
(tests/helpers/rl_folders.py: verl's FSDP rank shards from two processes, OpenRLHF's and a plain loop's
``save_pretrained`` folders, NeMo-RL's and torchtitan's torch distributed checkpoints, torchtitan's safetensors
export), then scored by ``tinymcf sweep`` (finding the layout, reading or merging the weights, the probe, the line)
and, for reference, by ``tinymcf eval`` of a plain folder of the same weights, in this process, one after the
other. The probe is ``scifi`` with ``per_foundation=2`` (112 prompts), intervals off. Prints a table and writes
``benchmarks/follow_layouts.json``; run it on an idle machine (``make bench``).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent

PROBE = ["--per-foundation", "2", "--n-resamples", "0", "--no-progress", "--device", "cpu"]


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers import rl_folders
    from tinymcf_callback.cli.main import main as tinymcf
    from tinymcf_callback.testing import smollm2_dir

    torch.set_num_threads(os.cpu_count() or 1)
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()
    layouts = {
        "plain save_pretrained": lambda run: rl_folders.plain_save(run, 1, model, tok),
        "OpenRLHF global_step_hf": lambda run: rl_folders.openrlhf_save(run, 1, model, tok),
        "verl FSDP rank shards (2)": lambda run: rl_folders.verl_save(run, 1, model, tok),
        "NeMo-RL DCP": lambda run: rl_folders.nemo_rl_save(run, 1, model, tok),
        "torchtitan DCP (its names)": lambda run: rl_folders.torchtitan_save(run, 1, model, family="llama"),
        "torchtitan safetensors export": lambda run: rl_folders.torchtitan_hf_export(run, 1, model),
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="follow-bench-") as tmp:
        tmp = Path(tmp)
        reference = tmp / "reference"
        model.save_pretrained(reference)
        tok.save_pretrained(reference)
        tinymcf(["eval", "--model", str(reference), *PROBE, "--out", str(tmp), "--tag", "warm"])  # warm-up
        start = time.perf_counter()
        assert tinymcf(["eval", "--model", str(reference), *PROBE, "--out", str(tmp), "--tag", "ref"]) == 0
        eval_s = time.perf_counter() - start
        for name, make in layouts.items():
            run = tmp / name.split()[0].lower()
            make(run)
            old = time.time() - 600
            for root, _, files in os.walk(run):
                for f in files:
                    os.utime(Path(root) / f, (old, old))
            start = time.perf_counter()
            rc = tinymcf(["sweep", str(run), *PROBE, "--base-model", str(reference), "--no-baseline",
                          "--report-to", "none"])
            seconds = time.perf_counter() - start
            line = json.loads((run / "moral_probe_scifi.jsonl").read_text().splitlines()[-1])
            ref = json.loads((tmp / "eval_scifi_ref.json").read_text())
            rows.append({"layout": name, "status": rc, "follower_s": round(seconds, 2), "eval_s": round(eval_s, 2),
                         "ratio": round(seconds / eval_s, 2), "score_apart": abs(line["score"] - ref["score"])})
            shutil.rmtree(run)
    print(f"\n[follow-layouts] SmolLM2-135M float32, scifi per_foundation=2 (112 prompts); {platform.processor() or ''}"
          f" {os.cpu_count()} cores")
    print(f"{'layout':32s} {'follower s':>11s} {'eval s':>8s} {'ratio':>6s} {'|score - eval|':>15s}")
    for r in rows:
        print(f"{r['layout']:32s} {r['follower_s']:11.2f} {r['eval_s']:8.2f} {r['ratio']:6.2f} "
              f"{r['score_apart']:15.2e}")
    (HERE / "follow_layouts.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d"),
                                                          "torch": torch.__version__, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
