"""``tinymcf validate``: a judge model's verdict on every text of a set, cached by text and judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli_checks import one_error_line
from helpers.prepare import MY_ROWS, api, cache_lines, cli, my_csv

from tinymcf_callback import load_vignettes
from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.data.home import folders
from tinymcf_callback.data.sets import md5

pytestmark = pytest.mark.usefixtures("clean_env")
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- judge validation


def test_validate(tmp_path, llm, capsys):
    assert cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), *api(llm))[0] == 0
    vs = load_vignettes("myset")
    # the judge gets one rewrite wrong in valence and one in foundation
    llm.judge_overrides[vs[1]["self_uphold"]] = {"foundation": "Fairness", "valence": "violate"}
    llm.judge_overrides[vs[0]["other_uphold"]] = {"foundation": "Authority", "valence": "uphold"}
    # the fake judge calls the Loyalty original "Care": a drift of its rewrite is then not the rewrite's fault
    llm.judge_overrides[vs[2]["self_violate"]] = {"foundation": "Sanctity", "valence": "violate"}
    out_path = tmp_path / "val.jsonl"
    rc, out, err = cli(capsys, "validate", "--name", "myset", "--out", out_path, *api(llm))
    assert rc == 0, err
    recs = cache_lines(out_path)
    assert len(recs) == 16 and {r["condition"] for r in recs} == {"other_violate", "other_uphold", "self_violate",
                                                                  "self_uphold"}
    flagged = {(r["id"], r["condition"]) for r in recs if r["flagged"]}
    assert flagged == {(vs[1]["id"], "self_uphold"), (vs[0]["id"], "other_uphold")}
    assert "foundation confusion" in out and "flagged rewrites: 2" in out and "valence_acc" in out
    judged = cache_lines(folders().cache / "judgements.jsonl")
    assert len(judged) == 16 and judged[0]["judge_model"] == "good-model" and judged[0]["text_md5"] in {
        md5(r["text"]) for r in recs}
    # cached: no new requests; the rewrite cache ignores judgements.jsonl
    n = llm.count(kind="judge")

    assert tinymcf(["validate", "--name", "myset", "--no-progress", "--base-url", llm.base_url,
                          "--judge-model", "good-model"]) == 0
    assert llm.count(kind="judge") == n and (Path.cwd() / "validate_myset.jsonl").exists()
    assert len(load_vignettes("myset")) == 4


def register_without_rewrites(sets: Path, name: str) -> None:
    """A user set as ``prepare`` registers it (``<home>/sets/<name>.jsonl`` and ``.json``), with no rewrites made."""
    sets.mkdir(parents=True)
    rows = [{"id": md5(t), "foundation": f, "foundation_coarse": f.split(" (")[0], "text": t, "wrong": float(w)}
            for t, f, w in MY_ROWS]
    (sets / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (sets / f"{name}.json").write_text(json.dumps({"description": "test", "source": "user", "human_ratings": True,
                                                   "rows": len(rows), "format": "jsonl"}))


@pytest.mark.parametrize("args, needles", [
    (["--name", "nosuchset"], ("unknown vignette set 'nosuchset'", "--home")),
    (["--name", "scifi", "--limit", "0"], ("--limit must be a positive whole number of vignettes",)),
    (["--name", "scifi", "--judge-model", "good-model"], ("no API key", "OPENAI_API_KEY")),
    (["--name", "myset"], ("has no other_uphold rewrite", "tinymcf prepare --name myset")),
])
def test_validate_bad_input_exits_2_with_one_error_line(tmp_path, capsys, args, needles):

    home = tmp_path / "home"
    register_without_rewrites(home / "sets", "myset")
    rc = tinymcf(["validate", *args, "--home", str(home), "--no-progress", "--out", str(tmp_path / "v.jsonl")])
    one_error_line(rc, capsys.readouterr().err, *needles)
    assert not (tmp_path / "v.jsonl").exists()
