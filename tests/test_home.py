"""One home for user data: ``--home DIR`` / ``TINYMCF_HOME`` decide where everything is written and read back.

The platform's folders (``HOME``, the XDG folders platformdirs reads) point at empty temp
folders in these tests, so that anything written outside the chosen home shows up.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import platformdirs
import pytest
from helpers.cli_checks import one_error_line
from helpers.fake_llm_server import FakeLLM
from helpers.prepare import api

from tinymcf_callback import load_vignettes
from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.data.home import folders, shipped_dir, using_home

KEY = "sk-test-home-123"
ROWS = [
    ("You see a man kicking a stray dog in the park.", "Care (p, a)", "3.2"),
    ("You see a girl cheating at cards against her grandmother.", "Fairness", "2.5"),
    ("You see a soldier mocking his own unit to a rival army.", "Loyalty", "2.9"),
    ("You see a man eating soup with a fork at a diner.", "Social Norms", "0.3"),
]
PLATFORM_VARS = ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME")


@pytest.fixture
def platform(tmp_path, monkeypatch):
    """HOME and the XDG folders at empty temp folders; no TINYMCF_* variable, no key; an empty working folder."""
    base = tmp_path / "platform"
    for var in PLATFORM_VARS:
        (base / var).mkdir(parents=True)
        monkeypatch.setenv(var, str(base / var))
    for var in ("TINYMCF_HOME", "TINYMCF_CACHE_DIR", "OPENROUTER_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    # the default home now lies inside them, so a stray write would be seen
    assert Path(platformdirs.user_data_dir("tinymcf_callback", appauthor=False)).is_relative_to(base)
    assert folders().home.is_relative_to(base)
    return base


def written(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def my_csv(folder: Path) -> Path:
    path = folder / "my.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(("Scenario", "Foundation", "Wrong"))
        w.writerows(ROWS)
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_qwen, qwen_tok):
    d = tmp_path_factory.mktemp("tiny_qwen3_home")
    tiny_qwen.save_pretrained(d)
    qwen_tok.save_pretrained(d)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("how", ["option", "variable"])
def test_one_home_round_trip(how, platform, tmp_path, monkeypatch, capsys, tiny_dir):
    """prepare -> validate -> eval with ``--home X`` (or ``TINYMCF_HOME=X``): everything in X, found again there."""
    home = tmp_path / "X"
    opt = ["--home", str(home)] if how == "option" else []
    if how == "variable":
        monkeypatch.setenv("TINYMCF_HOME", str(home))
    with FakeLLM(KEY) as server:
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        assert tinymcf(["prepare", "--name", "myset", "--source", str(my_csv(tmp_path)), *opt, *api(server)]) == 0
        assert tinymcf(["validate", "--name", "myset", *opt, "--out", str(tmp_path / "val.jsonl"), *api(server)]) == 0
        assert server.count(kind="rewrite") == 12 and server.count(kind="judge") == 16
    out = capsys.readouterr().out
    assert os.environ.get("TINYMCF_HOME") == (None if how == "option" else str(home))  # --home does not leak
    if how == "option":
        assert f"TINYMCF_HOME={home}" in out  # prepare says how to read the set back
    assert written(home) == ["cache/judgements.jsonl", "cache/myset.jsonl", "sets/myset.json", "sets/myset.jsonl"]

    if how == "option":  # the eval CLI reads the same home (with the variable, load_vignettes below shows it)
        assert tinymcf(["eval", "--model", str(tiny_dir), "--name", "myset", *opt, "--limit", "2", "--device", "cpu",
                          "--out", str(tmp_path / "reports"), "--no-progress"]) == 0
        assert (tmp_path / "reports" / f"eval_myset_{tiny_dir.name}.json").is_file()

    monkeypatch.setenv("TINYMCF_HOME", str(home))  # the one setting, nothing else
    vs = load_vignettes("myset")
    assert [v["foundation"] for v in vs] == ["Care (p, a)", "Fairness", "Loyalty", "Social Norms"]
    assert vs[3]["self_uphold"].startswith("You keep to the Social Norms rule")
    assert written(platform) == [] and written(tmp_path / "cwd") == []
    assert written(home) == ["cache/judgements.jsonl", "cache/myset.jsonl", "sets/myset.json", "sets/myset.jsonl"]


def test_eval_cli_without_the_home_names_it(platform, tmp_path, capsys, tiny_dir):
    rc = tinymcf(["eval", "--model", str(tiny_dir), "--name", "myset", "--out", str(tmp_path / "r"), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "unknown vignette set 'myset'", "--home", str(folders().sets))
    assert written(platform) == []


def test_using_home_restores_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYMCF_HOME", "/before")
    with pytest.raises(RuntimeError), using_home(tmp_path / "x"):
        assert folders().home == tmp_path / "x"
        raise RuntimeError
    assert os.environ["TINYMCF_HOME"] == "/before"
    with using_home(None):
        assert folders().home == Path("/before")


def test_rewrites_are_looked_up_in_the_shipped_cache_then_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYMCF_HOME", str(tmp_path / "h"))
    f = folders()
    assert f.rewrite_dirs == [shipped_dir("cache"), tmp_path / "h" / "cache"]  # a later folder's entry wins
