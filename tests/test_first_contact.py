"""What a researcher meets first: the sweep's precision and subset guards, a wrong tokenizer, a mistyped path.

Each case by its exit status, its one message and the history afterwards (tiny random models: mechanics only).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest
import torch
from helpers.cli_checks import one_error_line
from helpers.reports import made_up_scores
from transformers import LlamaConfig, LlamaForCausalLM

from tinymcf_callback.cli.main import build_parser
from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.errors import PromptError
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir.history import probe_line
from tinymcf_callback.rundir.report import write_report
from tinymcf_callback.views.curves import load_history

HISTORY = "moral_probe_scifi.jsonl"


def fake_line(probe: Probe, step: int, **fields) -> dict:
    report = probe.report(made_up_scores(probe, seed=step), elapsed=1.0)
    report.update(fields)
    return probe_line("scifi", report, step=step, epoch=None, event="train_begin" if step == 0 else "save")


@pytest.fixture
def run(tmp_path, tiny_qwen, qwen_tok) -> Path:
    """A run folder: a bfloat16 starting model (as SmolLM2's offline copy is stored) and a float32 checkpoint-2."""
    base, folder = tmp_path / "base", tmp_path / "run" / "checkpoint-2"
    tiny_qwen.to(torch.bfloat16).save_pretrained(base)
    tiny_qwen.to(torch.float32)
    qwen_tok.save_pretrained(base)
    tiny_qwen.save_pretrained(folder)
    qwen_tok.save_pretrained(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2, "epoch": 1.0}))
    return tmp_path


def sweep(run: Path, *args: str) -> int:
    return tinymcf(["sweep", str(run / "run"), "--base-model", str(run / "base"), "--limit", "2",
                    "--n-resamples", "0", "--device", "cpu", "--no-progress", *args])


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_the_sweep_scores_the_whole_run_in_one_precision_and_a_bad_baseline_can_be_set_aside(run, capsys, qwen_tok):
    # a bfloat16 base and float32 checkpoints: everything in float32, decided before anything loads
    assert sweep(run) == 0
    err = capsys.readouterr().err
    assert "every model is loaded in float32 (the dtype checkpoint-2 was saved in), the step-0 baseline included" in err
    history = run / "run" / HISTORY
    assert [(line["step"], line["dtype"]) for line in lines_of(history)] == [(0, "float32"), (2, "float32")]
    # the trap of old: a history whose step 0 was scored in bfloat16 is refused at once, with the ways out
    probe = Probe(qwen_tok, "scifi", limit=2, n_resamples=0)
    history.write_text(json.dumps(fake_line(probe, 0, dtype="bfloat16", compute="bfloat16")) + "\n")
    (run / "run" / "moral_probe_scifi_baseline.json").write_text("{}")
    before = history.read_bytes()
    rc = sweep(run)
    one_error_line(rc, capsys.readouterr().err, "holds probes scored in bfloat16", "scored in float32",
                   "--restart", "--dtype bfloat16")
    assert history.read_bytes() == before
    # --restart sets the old history and baseline report aside (kept, renamed) and starts again in float32
    assert sweep(run, "--restart") == 0
    assert [(line["step"], line["dtype"]) for line in lines_of(history)] == [(0, "float32"), (2, "float32")]
    kept = sorted(p.name for p in (run / "run").glob("*.set-aside-*"))
    assert len(kept) == 2 and kept[0].startswith(HISTORY) and (run / "run" / kept[0]).read_bytes() == before


def test_the_subset_guard_compares_which_vignettes_and_names_the_option_that_reproduces_them(tmp_path, qwen_tok,
                                                                                            capsys):
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    history = tmp_path / HISTORY
    two = Probe(qwen_tok, "scifi", per_foundation=2, n_resamples=0)
    history.write_text("".join(json.dumps(fake_line(two, s)) + "\n" for s in (0, 1)))
    before = history.read_bytes()
    # --limit 14 asks about as many vignettes, but Care and Fairness only: refused, naming --per-foundation 2
    rc = tinymcf(["sweep", str(tmp_path), "--limit", "14", "--no-baseline", "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "other vignettes", "--per-foundation 2", "--limit 14", "--restart")
    assert history.read_bytes() == before
    # the plot draws a history whose subset changed, and says where
    fourteen = Probe(qwen_tok, "scifi", limit=14, n_resamples=0)
    history.write_text(before.decode() + json.dumps(fake_line(fourteen, 2)) + "\n")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("tinymcf_callback").addHandler(handler)
    try:
        load_history(history)
    finally:
        logging.getLogger("tinymcf_callback").removeHandler(handler)
    assert any("asks about other vignettes from step 2 on" in r.getMessage() for r in records)


def test_a_tokenizer_from_another_model_is_refused_before_any_forward_call(qwen_tok):
    small = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    calls = []
    small.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(PromptError, match=r"token ids up to \d+, but LlamaForCausalLM has only 1000 embedding rows"):
        Probe(qwen_tok, "scifi", limit=1).score(small)
    assert calls == []


def test_a_mistyped_model_path_is_no_such_folder_not_a_hub_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # even with the Hub on, runs/... is a path
    rc = tinymcf(["eval", "--model", "runs/base", "--out", str(tmp_path), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "no such folder runs/base")


def test_compare_of_a_report_with_itself_gives_no_change_with_p_one(tmp_path, qwen_tok, capsys):
    probe = Probe(qwen_tok, "scifi", per_foundation=2)
    path = write_report(tmp_path / "a.json", probe.report(made_up_scores(probe, seed=3), elapsed=1.0))
    assert tinymcf(["compare", str(path), str(path)]) == 0
    score = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("score "))
    assert score.split()[-4:] == ["+0.000", "[+0.000,", "+0.000]", "1.000"]


def help_of(command: str, option: str) -> str:
    """The help ``tinymcf COMMAND --help`` shows for ``option``."""
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return next(a.help for a in commands.choices[command]._actions if option in a.option_strings)


@pytest.mark.parametrize("command, option, says", [
    ("eval", "--no-share-prefix", "score every prompt whole"),
    ("eval", "--share-prefix", "compute shared prompt prefixes once"),
    ("eval", "--no-self-check", "skip the self-check"),
    ("eval", "--answer-prefix", "(default: 'Answer:')"),
    ("eval", "--until", "level: the score's interval is narrower than width; change: the interval of the change since "
                        "the baseline excludes 0 or is narrower than width"),
    ("watch", "--reload", "vllm (a vLLM in VLLM_SERVER_DEV_MODE=1"),
])
def test_the_help_of_an_option_says_what_it_does(command, option, says, capsys):
    assert tinymcf([command, "--help"]) == 0 and option in capsys.readouterr().out
    text = help_of(command, option)
    assert says in text and text.count("(default:") == (option != "--reload")


def test_reload_help_lists_the_routes_of_the_table():
    from tinymcf_callback.served.reload import RELOADS, Route

    assert all(f"{route.name} ({route.summary})" in help_of("sweep", "--reload") for route in RELOADS.values())
    with RELOADS.scoped():  # a route registered is a route the help names
        RELOADS.register("mine", Route("mine", None, None, None, summary="my server's own update route"))
        assert "mine (my server's own update route), or a shell command" in help_of("watch", "--reload")
