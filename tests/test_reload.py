"""A run followed through a server that reloads each checkpoint (``--reload``): what is sent to the server, what a
reload is trusted with, and what stays small when a checkpoint or the server fails (the fake server of
``helpers/fake_served.py``, with the float32 forward pass of tiny random models: mechanics only)."""

from __future__ import annotations

import json
import logging
import zipfile

import pytest
import torch
from helpers.cli_checks import names
from helpers.fake_served import FakeServed
from helpers.runs import assert_same_numbers, clone, history
from helpers.served_runs import numbers, saved_run

from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.rundir.checkpoints import cut_short, fingerprint
from tinymcf_callback.served.reload import RESTART
from tinymcf_callback.testing import tiny_qwen3

PROBE = ["--limit", "2", "--n-resamples", "0", "--no-progress", "--report-to", "none"]


def reloads(server: FakeServed) -> list[str]:
    """The folders the fake was asked to reload, in order (vLLM's reload_weights)."""
    return [b["kwargs"]["weights_path"] for route, b in server.requests if route == "/collective_rpc"]


def completions(server: FakeServed) -> int:
    return sum(route == "/v1/completions" for route, _ in server.requests)


# ---- the weight files, read before anything loads or sends them ---------------------------------------------------
def test_a_weight_file_cut_short_or_half_written_is_named_with_what_is_missing(tmp_path):
    model = tiny_qwen3(seed=0)
    model.save_pretrained(tmp_path / "whole")
    assert cut_short(tmp_path / "whole") is None
    data = (tmp_path / "whole" / "model.safetensors").read_bytes()
    for name, cut in (("short", len(data) - 1000), ("header", 30)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text((tmp_path / "whole" / "config.json").read_text())
        (folder / "model.safetensors").write_bytes(data[:cut])
    assert cut_short(tmp_path / "short") == (f"model.safetensors is cut short: it holds {len(data) - 1000:,} of the "
                                             f"{len(data):,} bytes its header names")
    assert "model.safetensors" in cut_short(tmp_path / "header") and "cut short" in cut_short(tmp_path / "header")
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="20MB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and cut_short(sharded) is None
    shards[-1].unlink()
    assert cut_short(sharded) == f"model.safetensors.index.json lists {shards[-1].name}, which is not there"
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    torch.save({"w": torch.zeros(1000)}, legacy / "pytorch_model.bin")
    assert zipfile.is_zipfile(legacy / "pytorch_model.bin") and cut_short(legacy) is None
    whole = (legacy / "pytorch_model.bin").read_bytes()
    (legacy / "pytorch_model.bin").write_bytes(whole[:len(whole) // 2])
    assert cut_short(legacy).startswith("pytorch_model.bin is cut short: a zip archive")


def cut_checkpoint(run, step: int) -> str:
    path = run / f"checkpoint-{step}" / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return str(path)


@pytest.mark.slow  # two runs followed end to end: make test; the fast tier reads a cut file in the test above
@pytest.mark.parametrize("served", [True, False], ids=["through a server", "loaded here"])
def test_a_checkpoint_cut_short_is_one_line_never_sent_and_the_next_is_scored_exactly(tmp_path, qwen_tok, caplog,
                                                                                     capsys, served):
    run, _ = saved_run(tmp_path, qwen_tok, steps=(1, 2, 3))
    local = clone(run, tmp_path / "local")
    assert tinymcf(["sweep", str(local), *PROBE]) == 0
    cut_checkpoint(run, 2)
    caplog.set_level(logging.INFO, logger="tinymcf_callback")
    caplog.clear()  # the local sweep's lines
    with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind="vllm", dev=True) as server:
        where = ["--endpoint", server.url, "--reload", "vllm"] if served else []
        rc = tinymcf(["sweep", str(run), *where, "--retries", "2", "--backoff", "30", *PROBE])
        sent = reloads(server)
    assert rc == 1
    assert not any("checkpoint-2" in path for path in sent)  # never handed to the server
    said = [r.getMessage() for r in caplog.records if "checkpoint-2" in r.getMessage() and r.levelno >= logging.INFO]
    assert len(said) == 1 and "model.safetensors is cut short" in said[0], said  # one line, naming the file
    assert "not loaded or sent to a server" in said[0] and "after" not in said[0]  # a complete save's file: no retry
    lines = history(run)
    # the sweep does not wait 30 s for a file that will not grow: step 2's gap comes in step order
    assert [(x["step"], x["event"]) for x in lines][1:] == [(1, "sweep"), (2, "unreadable"), (3, "sweep")]
    assert "model.safetensors is cut short" in lines[2]["info"]["unreadable"]
    for mine in (lines[1], lines[3]):
        theirs = next(x for x in history(local) if x["step"] == mine["step"])
        assert_same_numbers(numbers(mine), numbers(theirs), where=f"step {mine['step']}")
    assert "checkpoint-2" in capsys.readouterr().err


def test_a_weight_update_route_is_asked_at_most_twice_for_one_checkpoint(tmp_path, qwen_tok, caplog):
    run, _ = saved_run(tmp_path, qwen_tok, steps=(1,))
    with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind="vllm", dev=True) as server:
        server.failing["/collective_rpc"] = 500
        rc = tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", "vllm", "--no-baseline",
                      "--retries", "4", "--backoff", "0.2", *PROBE])
        sent = reloads(server)
    assert rc == 1 and len(sent) == 2 and completions(server) == 0
    [line] = history(run)
    assert line["event"] == "unreadable" and "2 times" in line["info"]["unreadable"]  # SENDS, then given up


# ---- what a reload is trusted with ------------------------------------------------------------------------------
@pytest.mark.slow  # a run followed end to end through a server: make test (the fast tier keeps one)
def test_each_reload_is_checked_on_the_scores_and_the_line_says_how_close(tmp_path, qwen_tok):
    run, init = saved_run(tmp_path, qwen_tok)
    local = clone(run, tmp_path / "local")
    assert tinymcf(["sweep", str(local), *PROBE]) == 0
    with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind="vllm", dev=True) as server:
        assert tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", "vllm", *PROBE]) == 0
    for line, theirs in zip(history(run), history(local), strict=True):
        check = line["info"]["backend"]["reload_check"]
        folder = init if line["step"] == 0 else run / f"checkpoint-{line['step']}"
        assert line["info"]["backend"]["weight_version"] == fingerprint(folder)
        assert (check["tolerance"], check["mass_tolerance"]) == (1e-5, 3e-5)
        assert check["held_to"] == "a fresh float32 server's spread"
        assert len(check["prompts"]) == 4 and check["p_yes_diff"] < 1e-6 and check["log_mass_diff"] < 1e-6
        assert check["reference"] == f"{folder}, float32 on cpu" and check["route"] == "--reload vllm"
        assert_same_numbers(numbers(line), numbers(theirs), where=f"step {line['step']}")


def test_a_reload_that_keeps_the_old_output_layer_is_caught_and_the_step_left_unscored(tmp_path, qwen_tok, caplog):
    """What vLLM on the CPU does to a tied output layer, on a server that does not say it (a GPU one here): the
    version names the new checkpoint, the scores are partly the old weights'; the check sees it, in one line."""
    run, init = saved_run(tmp_path, qwen_tok)
    with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind="vllm", dev=True, stale_head=True) as server:
        rc = tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", "vllm", *PROBE])
        sent = reloads(server)
    assert rc == 1
    lines = history(run)
    assert [(x["step"], x["event"]) for x in lines] == [(0, "train_begin"), (1, "unreadable"), (2, "unreadable")]
    assert lines[0]["info"]["backend"]["reload_check"]["p_yes_diff"] < 1e-6  # the starting weights: the same head
    why = lines[1]["info"]["unreadable"]
    assert "does not compute step 1 after --reload vllm" in why and "partly old weights" in why
    assert sent.count(str(run / "checkpoint-1")) == 1  # a failed check is final: not sent again
    said = [r for r in caplog.records if "checkpoint-1" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(said) == 1


@pytest.mark.slow  # a run followed end to end through a server: make test (the fast tier keeps one)
def test_without_the_reload_check_nothing_is_loaded_here(tmp_path, qwen_tok, monkeypatch):
    from tinymcf_callback.follow import scoring

    run, _ = saved_run(tmp_path, qwen_tok, steps=(1,))
    monkeypatch.setattr(scoring, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a reference"))
    with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind="vllm", dev=True) as server:
        assert tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", "vllm", "--no-reload-check",
                        *PROBE]) == 0
    assert [x["info"]["backend"]["reload_check"] for x in history(run)] == [None, None]


def test_a_tied_model_on_a_vllm_on_the_cpu_is_refused_before_anything_is_scored(tmp_path, qwen_tok, capsys):
    run, _ = saved_run(tmp_path, qwen_tok)  # tiny Qwen3 ties its output layer to its embeddings
    capsys.readouterr()  # the saves' own output (progress bars, where another test has not turned them off)
    with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind="vllm", dev=True, device="cpu") as server:
        rc = tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", "vllm", *PROBE])
        asked = [route for route, _ in server.requests]
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("[tinymcf]")]
    assert rc == 2 and len(err) == 1, err
    names(err[0], "--reload vllm")
    assert RESTART in err[0] and "tie_word_embeddings" in err[0]
    assert "/collective_rpc" not in asked and "/v1/completions" not in asked
    assert not (run / "moral_probe_scifi.jsonl").exists() or history(run) == []


@pytest.mark.slow  # a run followed end to end through a server: make test (the fast tier keeps one)
def test_adapters_that_train_the_output_layer_on_a_vllm_on_the_cpu_are_refused(tmp_path, qwen_tok, capsys):
    """vLLM-CPU answers requests for the base with other numbers while such an adapter is loaded (1.4e-2 in P(Yes),
    measured): the LoRA run's step 0 would be wrong. Refused before anything is scored; adapters of the attention
    and MLP only are followed."""
    for targets, status in ((("q_proj", "lm_head"), 2), (("q_proj", "v_proj"), 0)):
        run, init = saved_run(tmp_path / targets[-1], qwen_tok, adapters=True, steps=(1,), targets=targets)
        capsys.readouterr()  # the saves' own output: only the sweep's is read below
        with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind="vllm", dev=True, lora="policy", device="cpu") as server:
            rc = tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", "lora", "--served-model", "policy",
                          *PROBE])
            asked = [route for route, _ in server.requests]
        err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("[tinymcf]")]
        assert rc == status, err
        if status:
            assert len(err) == 1 and "--reload lora" in err[0] and "lm_head" in err[0]
            assert RESTART in err[0] and "/v1/load_lora_adapter" not in asked
        else:
            lines = history(run)
            assert [x["step"] for x in lines] == [0, 1]
            assert all(x["info"]["backend"]["reload_check"]["p_yes_diff"] < 1e-6 for x in lines)  # step 0 too


@pytest.mark.slow  # a run followed end to end through a server: make test (the fast tier keeps one)
def test_an_untied_model_on_a_vllm_on_the_cpu_is_reloaded(tmp_path, qwen_tok):
    untied = tiny_qwen3(seed=0)
    untied.config.tie_word_embeddings = False
    untied.lm_head.weight = torch.nn.Parameter(untied.model.embed_tokens.weight.detach().clone())
    run, _ = saved_run(tmp_path, qwen_tok, steps=(1,), model=untied)
    assert json.loads((run / "checkpoint-1" / "config.json").read_text())["tie_word_embeddings"] is False
    with FakeServed(untied, qwen_tok, kind="vllm", dev=True, device="cpu") as server:
        assert tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", "vllm", *PROBE]) == 0
    assert [x["step"] for x in history(run)] == [0, 1]


@pytest.mark.slow  # a run followed end to end through a server: make test (the fast tier keeps one)
def test_a_server_that_dies_after_a_reload_is_not_blamed_on_the_probe_alone(tmp_path, qwen_tok, capsys):
    run, _ = saved_run(tmp_path, qwen_tok, steps=(1,))
    with FakeServed(tiny_qwen3(seed=0), qwen_tok, kind="vllm", dev=True) as server:
        server.completion_faults.extend(["ok"] * 3 + ["die"])
        rc = tinymcf(["sweep", str(run), "--endpoint", server.url, "--reload", "vllm", "--retries", "0",
                      "--request-retries", "0", *PROBE])
    err = capsys.readouterr().err
    assert rc == 1
    names(err, "step 0 (", "by --reload vllm")  # the step the server had just been given, and by which route
