"""The spot check: ``prepare --show N --name SET [--seed S]`` and ``tinymcf_callback.show_rewrites``."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fake_llm_server import FakeLLM
from helpers.prepare import api, cli

import tinymcf_callback
from tinymcf_callback import load_vignettes
from tinymcf_callback._io import read_jsonl
from tinymcf_callback.data.home import folders
from tinymcf_callback.data.sets import CONDITIONS, md5
from tinymcf_callback.prepare.show import GUTTER
from tinymcf_callback.prepare.store import store_set

pytestmark = pytest.mark.usefixtures("clean_env")

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-test-SHOW-1"
MY_ROWS = [("You see a soldier mocking his own unit to a rival army.", "Loyalty"),
           ("You see a man kicking a stray dog in the park.", "Care (p, a)"),
           ("You see a girl cheating at cards against her grandmother.", "Fairness")]


def blocks(out: str) -> list[list[str]]:
    """The printed vignettes: each a list of lines, its heading first."""
    parts = out.split("\n\n")[1:]
    return [p.strip("\n").split("\n") for p in parts]


def cells(block: list[str]) -> dict[str, str]:
    """Read a printed vignette back: condition label -> its text (the wrapped lines of its column, joined)."""
    out: dict[str, str] = {}
    rows: list[list[list[str]]] = []
    for line in block[1:]:
        parts = [p.strip() for p in line[2:].split(GUTTER.strip())]
        if parts[0].startswith("other_violate") or parts[0].startswith("self_violate"):
            rows.append([[p] for p in parts])
        else:
            for col, p in zip(rows[-1], parts, strict=True):
                col.append(p)
    for row in rows:
        for col in row:
            out[col[0].split(" ")[0]] = " ".join(p for p in col[1:] if p)
    return out


@pytest.mark.parametrize("columns,per_row", [(80, 2), (200, 4)])
def test_show_prints_the_sample_side_by_side_within_the_width(capsys, monkeypatch, columns, per_row):
    monkeypatch.setenv("COLUMNS", str(columns))
    rc, out, err = cli(capsys, "show", "-n", "4", "--name", "scifi", "--seed", "3")
    assert rc == 0, err
    assert out.startswith("scifi: 4 of 51 vignettes, drawn with seed 3")
    assert max(len(line) for line in out.splitlines()) <= columns
    expected = tinymcf_callback.show_rewrites("scifi", n=4, seed=3)
    printed = blocks(out)
    assert len(printed) == 4
    for block, (_, v) in zip(printed, expected.iterrows(), strict=True):
        assert block[0].endswith(f"] {v['foundation']} - {v['id'][:8]}")
        assert all(line.count(GUTTER.strip()) == per_row - 1 for line in block[1:])
        assert cells(block) == {c: v[c] for c in CONDITIONS}  # every text whole, under its own label


def test_the_seed_draws_the_sample():
    a, b = tinymcf_callback.show_rewrites("scifi", n=5, seed=0), tinymcf_callback.show_rewrites("scifi", n=5, seed=0)
    c = tinymcf_callback.show_rewrites("scifi", n=5, seed=1)
    assert list(a["id"]) == list(b["id"]) and list(a["id"]) != list(c["id"])
    order = [v["id"] for v in load_vignettes("scifi")]
    assert [order.index(i) for i in a["id"]] == sorted(order.index(i) for i in a["id"])  # stored order
    everything = tinymcf_callback.show_rewrites("scifi", n=500, seed=0)
    assert list(everything["id"]) == order
    assert list(a.columns) == ["id", "foundation", "foundation_coarse", *CONDITIONS] and a.attrs["judge"] is None


def test_show_with_the_judges_verdicts(tmp_path, monkeypatch, capsys):
    """Rewrites made and judged through the fake OpenAI-compatible server; --show prints what --validate stored."""
    src = tmp_path / "mine.csv"
    with open(src, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("Scenario", "Foundation"), *MY_ROWS])
    with FakeLLM(KEY) as llm:
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        rc, out, err = cli(capsys, "prepare", "--name", "mine", "--source", src, *api(llm))
        assert rc == 0, out + err
        assert out.rstrip().endswith("spot-check them before trusting the eval: "
                                     "tinymcf show --name mine -n 10")
        uphold = load_vignettes("mine")[0]["other_uphold"]
        llm.judge_overrides[uphold] = {"foundation": "Loyalty", "valence": "violate"}
        rc, out, err = cli(capsys, "validate", "--name", "mine", "--out", tmp_path / "v.jsonl", *api(llm))
        assert rc in (0, 1), out + err
        rc, out, err = cli(capsys, "prepare", "--name", "mine", "--source", src,
                           *api(llm))  # nothing new: no spot-check line
        assert "nothing to request" in out and "--show" not in out
    monkeypatch.setenv("COLUMNS", "120")
    rc, out, err = cli(capsys, "show", "-n", "10", "--name", "mine")
    assert rc == 0, err
    records = [obj for _, obj in read_jsonl(tmp_path / "v.jsonl")]
    flagged = [r for r in records if r["flagged"]]
    assert len(flagged) == 1 and flagged[0]["text"] == uphold
    assert "judge good-model: 12 of 12 texts judged, 1 rewrites flagged" in out
    shown = {block[0].split(" - ")[-1]: cells(block) for block in blocks(out)}
    assert shown[flagged[0]["id"][:8]]["other_uphold"] == f"{uphold} judge: Loyalty, violate FLAGGED: judged " \
                                                          f"violate, expected uphold"
    for r in records:
        verdict = f"judge: {r['judged_foundation']}, {r['judged_valence']}"
        assert shown[r["id"][:8]][r["condition"]].startswith(f"{r['text']} {verdict}")

    df = tinymcf_callback.show_rewrites("mine", n=10)
    assert df.attrs["judge"] == "good-model" and len(df) == 3
    for r in records:
        shown = df.loc[df["id"] == r["id"], f"{r['condition']}_verdict"].item()
        assert shown.startswith(f"{r['judged_foundation']}, {r['judged_valence']}")
        assert ("FLAGGED" in shown) == r["flagged"]
    assert len(blocks(out)) == 3  # --show 10 of a set of 3: all of it


@pytest.mark.slow
def test_show_needs_no_openai_no_torch_and_no_lexicon(tmp_path):
    """A fresh interpreter in which those packages cannot be imported at all."""
    code = ("import sys\n"
            "for m in ('openai', 'torch', 'transformers', 'vaderSentiment'): sys.modules[m] = None\n"
            "from tinymcf_callback.cli.main import main\n"
            "sys.exit(main(['show', '-n', '2', '--name', 'scifi']))\n")
    env = {**os.environ, "TINYMCF_HOME": str(tmp_path / "home"), "COLUMNS": "100"}
    env.pop("TINYMCF_CACHE_DIR", None)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("scifi: 2 of 51 vignettes") and len(blocks(p.stdout)) == 2


def _row(text: str) -> dict:
    return {"id": md5(text), "foundation": "Care (p, a)", "foundation_coarse": "Care", "text": text}


@pytest.mark.parametrize("argv,needle", [
    (["show", "-n", "3", "--name", "nope"], "unknown vignette set 'nope'; available: bare, clifford, scifi"),
    (["show", "-n", "3", "--name", "clifford"], "vignette set 'clifford' is not prepared on this machine"),
    (["show", "-n", "3", "--name", "bare"], "set 'bare' lacks 6 of its 6 rewrites (first: "),
    (["show", "-n", "0", "--name", "scifi"], "--count must be a positive whole number of vignettes to print"),
    (["show", "-n", "3", "--name", "scifi", "--validate"], "unrecognized arguments: --validate"),  # show reads only
])
def test_show_errors_are_one_line_and_exit_2(capsys, argv, needle):
    store_set("bare", [_row("You see a man kicking a stray dog in the park."),
                       _row("You see a girl cheating at cards against her grandmother.")],
              {"description": "no rewrites yet", "source": "user", "human_ratings": False, "rows": 2,
               "format": "jsonl"})
    rc, out, err = cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith(f"error: {needle}") and err.count("\n") == 1, err
    if "lacks" in needle:
        assert err.rstrip().endswith("make them first: tinymcf prepare --name bare")
    if "not prepared" in needle:
        assert "tinymcf prepare --name clifford" in err


def test_the_command_names_the_spot_check(capsys):
    from tinymcf_callback.cli.main import main as tinymcf

    assert tinymcf(["--help"]) == 0
    assert "show      print random vignettes" in capsys.readouterr().out
    assert tinymcf(["show", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "-n COUNT, --count COUNT" in help_text and "--seed SEED" in help_text


def test_show_a_rated_set_gives_each_vignettes_human_rating(generated_clifford, capsys):
    """Clifford-shaped data (the generated file): the heading carries the mean wrongness rating of each vignette."""
    generated_clifford.install_rewrites(folders().cache)
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--source", generated_clifford.path,
                       "--allow-checksum-change")
    assert rc == 0, err
    rc, out, err = cli(capsys, "show", "-n", "3", "--name", "clifford", "--seed", "7")
    assert rc == 0, err
    df = tinymcf_callback.show_rewrites("clifford", n=3, seed=7)
    headings = [block[0] for block in blocks(out)]
    assert headings == [f"[{i}/3] {v['foundation']} - {v['id'][:8]}, rated {v['wrong']:.1f} wrong (0-4)"
                        for i, (_, v) in enumerate(df.iterrows(), 1)]
