"""Every command with every optional extra hidden: it works when it does not need the extra, and otherwise says
in one ``error:`` line which extra to install. Never a ``ModuleNotFoundError`` traceback.

An extra is hidden by putting ``None`` for its modules in ``sys.modules`` (``import`` then fails as
if the package were not installed). Before one helper imported every extra, ``prepare --name
clifford``, which needs none, crashed without python-dotenv: the prepare command read ``.env``
files for secrets to scrub with it, outside of any error handling.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.cli_checks import one_error_line
from helpers.fake_llm_server import FakeLLM
from helpers.prepare import KEY, my_csv
from helpers.reports import made_up_scores

from tinymcf_callback.cli.main import main
from tinymcf_callback.data.home import folders
from tinymcf_callback.extras import EXTRAS, install_hint, require
from tinymcf_callback.follow import sweep  # noqa: F401 - see below
from tinymcf_callback.prepare import rules
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir.report import write_report

# transformers decides once, when first imported, which optional packages it has (peft among them) and
# imports them eagerly then. An install without peft never imports it; here the modules are imported
# with every package present, before one is hidden, which is what such an install looks like to the probe.

pytestmark = pytest.mark.usefixtures("clean_env")
HIDDEN = {"openai": ("openai",), "dotenv": ("dotenv",), "vaderSentiment": ("vaderSentiment",
          "vaderSentiment.vaderSentiment"), "matplotlib": ("matplotlib", "matplotlib.figure", "matplotlib.pyplot"),
          "wandb": ("wandb",), "tensorboard": ("tensorboard",), "peft": ("peft",), "gguf": ("gguf",),
          "mlflow": ("mlflow", "mlflow.tracking", "mlflow.entities"), "trackio": ("trackio",),
          "deepspeed": ("deepspeed", "deepspeed.utils", "deepspeed.utils.zero_to_fp32"),
          "datasets": ("datasets",),
          "lm_eval": ("lm_eval", "lm_eval.tasks", "lm_eval.models", "lm_eval.models.huggingface")}


def hide(monkeypatch, module: str) -> None:
    for name in HIDDEN[module]:
        monkeypatch.setitem(sys.modules, name, None)
    rules.sentiment_analyzer.cache_clear()  # the lexicon, once loaded, is kept for the process: load it again


def test_every_extra_is_hidden_by_the_test():
    assert set(HIDDEN) == set(EXTRAS)


def test_the_openai_client_is_one_extra_that_prepare_and_served_bring():
    import tomllib

    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert EXTRAS["openai"][0] == "api" and [r for r in extras["api"] if r.startswith("openai")]
    for extra in ("prepare", "served"):
        assert "tinymcf_callback[api]" in extras[extra] and not [r for r in extras[extra] if r.startswith("openai")]


@pytest.mark.parametrize("module", sorted(EXTRAS))
def test_require_names_the_extra(module, monkeypatch):
    hide(monkeypatch, module)
    with pytest.raises(ImportError, match=rf"pip install 'tinymcf_callback\[{EXTRAS[module][0]}\]'"):
        require(module)
    assert install_hint(module) == f"pip install 'tinymcf_callback[{EXTRAS[module][0]}]'"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_qwen, qwen_tok):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_qwen.save_pretrained(folder)
    qwen_tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reports(qwen_tok, tmp_path_factory):
    """Two JSON reports of the same vignettes (made-up scores: compare and plot need no model)."""
    probe = Probe(qwen_tok, "scifi", limit=2)
    out = tmp_path_factory.mktemp("reports")
    paths = []
    for seed in (0, 1):
        path = out / f"report_{seed}.json"
        write_report(path, probe.report(made_up_scores(probe, seed=seed), elapsed=1.0))
        paths.append(path)
    return paths


@pytest.fixture
def history(reports, tmp_path):
    """A history of two lines, built from the two reports (for plot)."""
    lines = []
    for step, path in enumerate(reports):
        report = json.loads(path.read_text())
        lines.append({**{k: report[k] for k in ("name", "answer_format", "score", "gap", "sn", "dtype", "autocast")},
                      "step": step, "event": "sweep", "info": report["info"], "table": report["table"],
                      "metrics": {}})
    path = tmp_path / "moral_probe_scifi.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run_hidden(monkeypatch, capsys, module, argv):
    hide(monkeypatch, module)
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_commands_that_need_no_extra_work_with_all_of_them_hidden(monkeypatch, capsys, tiny_dir, reports, history,
                                                                  tmp_path, generated_clifford):
    """Every extra hidden at once (each one hidden alone is a weaker case of this, for these commands)."""
    generated_clifford.install_rewrites(folders().cache)  # the generated texts are not in the shipped cache
    works = {
        "eval": ["eval", "--model", tiny_dir, "--limit", "1", "--device", "cpu", "--out", tmp_path, "--no-progress",
                 "--n-resamples", "0"],
        "compare": ["compare", *reports],
        "show": ["show", "--name", "scifi", "-n", "2"],
        "prepare --name clifford": ["prepare", "--name", "clifford", "--source", generated_clifford.path,
                                    "--allow-checksum-change", "--no-progress"],
    }
    for module in EXTRAS:
        hide(monkeypatch, module)
    for command, argv in works.items():
        rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert rc == 0, (command, err)
        assert "Traceback" not in err


def test_the_plot_needs_only_matplotlib(monkeypatch, capsys, history, tmp_path):
    for module in set(EXTRAS) - {"matplotlib"}:
        hide(monkeypatch, module)
    rc = main(["plot", str(history), "--out", str(tmp_path / "curves.png")])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("command, module, extra", [
    ("plot", "matplotlib", "plot"),
    ("eval --gguf-file", "gguf", "gguf"),
    ("sweep of adapters", "peft", "peft"),
    ("sweep of ZeRO checkpoints", "deepspeed", "deepspeed"),
    ("prepare (rewrites)", "openai", "api"),
    ("prepare (rewrites)", "vaderSentiment", "prepare"),
    ("validate", "openai", "api"),
    ("eval --endpoint", "openai", "api"),
    ("sweep --report-to mlflow", "mlflow", "mlflow"),
    ("sweep --report-to trackio", "trackio", "trackio"),
    ("sweep --report-to tensorboard", "tensorboard", "tensorboard"),
    ("sweep --report-to wandb", "wandb", "wandb"),
    ("eval --lm-eval", "lm_eval", "lmeval"),
    ("eval --prefs a Hub dataset", "datasets", "prefs"),
    ("sweep --prefs a Hub dataset", "datasets", "prefs"),
])
def test_commands_that_need_an_extra_name_it_in_one_line(command, module, extra, monkeypatch, capsys, tiny_dir,
                                                         history, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    (run / "checkpoint-1" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tiny_dir)}))
    (run / "checkpoint-1" / "trainer_state.json").write_text("{}")  # the Trainer's last write: complete
    zero = tmp_path / "zero" / "checkpoint-1"
    (zero / "global_step1").mkdir(parents=True)
    (zero / "latest").write_text("global_step1")
    (zero / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x")
    (zero / "tokenizer_config.json").write_text("{}")
    (zero / "trainer_state.json").write_text("{}")
    with FakeLLM(KEY) as server:
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        llm = ["--base-url", server.base_url, "--model", "good-model", "--no-progress"]
        argv = {
            "plot": ["plot", history, "--out", tmp_path / "curves.png"],
            "eval --gguf-file": ["eval", "--model", tiny_dir, "--gguf-file", "model.gguf", "--device", "cpu"],
            "sweep of adapters": ["sweep", run, "--base-model", tiny_dir, "--limit", "1"],
            "sweep of ZeRO checkpoints": ["sweep", zero.parent, "--base-model", tiny_dir, "--limit", "1"],
            **{f"sweep --report-to {t}": ["sweep", run, "--base-model", tiny_dir, "--limit", "1", "--report-to", t]
               for t in ("mlflow", "trackio", "tensorboard", "wandb")},
            "prepare (rewrites)": ["prepare", "--name", "myset", "--source", my_csv(tmp_path), *llm],
            "validate": ["validate", "--name", "scifi", "--limit", "1", *llm],
            "eval --endpoint": ["eval", "--endpoint", server.base_url, "--model", "m", "--tokenizer", tiny_dir,
                                "--limit", "1"],
            "eval --lm-eval": ["eval", "--model", tiny_dir, "--limit", "1", "--device", "cpu", "--lm-eval",
                               "ethics_cm"],
            "eval --prefs a Hub dataset": ["eval", "--model", tiny_dir, "--limit", "1", "--device", "cpu", "--prefs",
                                           "wassname/ethics_expression_preferences", "--config", "commonsense"],
            "sweep --prefs a Hub dataset": ["sweep", run, "--base-model", tiny_dir, "--limit", "1", "--prefs",
                                            "wassname/ethics_expression_preferences", "--config", "justice"],
        }[command]
        rc, out, err = run_hidden(monkeypatch, capsys, module, argv)
    one_error_line(rc, err, f"pip install 'tinymcf_callback[{extra}]'")
