"""evaluate() and the eval CLI end to end on real tokenizers (tiny Qwen3 for speed)."""

import json
import os
import subprocess
import sys

import pytest

from tinymcf_callback import FOUNDATIONS, evaluate
from tinymcf_callback.eval import main as eval_main
from tinymcf_callback.probe import HEADLINE_FIELDS, report_to_json


def test_evaluate_report_and_sanity_lines(tiny_qwen, qwen_tok, capsys):
    r = evaluate(tiny_qwen, qwen_tok, "scifi", progress=False)
    assert set(r) >= {"table", "score", "gap", "sn", "info", "raw", "scenarios"}
    assert list(r["table"].index) == list(FOUNDATIONS)
    assert len(r["raw"]) == 51 * 8 and r["raw"]["p_yes"].between(0, 1).all()
    assert isinstance(r["score"], float) and isinstance(r["sn"], float)
    out = capsys.readouterr().out
    assert "top-10 next tokens" in out and "yn_mass mean=" in out and "inter-frame agreement" in out
    # random weights put ~no mass on Yes/No: the probe must say so
    assert "WARNING: mean Yes+No probability mass" in out and r["info"]["yn_mass_mean"] < 0.5
    assert len(r["info"]["top_tokens"]) == 10


def test_evaluate_limit(tiny_qwen, qwen_tok):
    r = evaluate(tiny_qwen, qwen_tok, "scifi", limit=3, verbose=False)
    assert r["info"]["n_vignettes"] == 3 and r["info"]["n_prompts"] == 24
    with pytest.raises(ValueError, match="positive"):
        evaluate(tiny_qwen, qwen_tok, "scifi", limit=0, verbose=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_qwen, qwen_tok):
    d = tmp_path_factory.mktemp("tiny_qwen3")
    tiny_qwen.save_pretrained(d)
    qwen_tok.save_pretrained(d)
    return d


def test_cli_writes_json_report(tiny_dir, tmp_path, capsys):
    rc = eval_main(["--model", str(tiny_dir), "--name", "scifi", "--tag", "step_500", "--limit", "4",
                    "--device", "cpu", "--dtype", "float32", "--out", str(tmp_path), "--no-progress",
                    "--level", "0.9", "--n-resamples", "500"])
    assert rc == 0
    data = json.loads((tmp_path / "eval_scifi_step_500.json").read_text())
    assert data["schema_version"] == 2 and data["tag"] == "step_500" and data["name"] == "scifi"
    assert data["level"] == 0.9 and data["n_resamples"] == 500 and data["seed"] == 0 and data["prompt_digest"]
    assert set(HEADLINE_FIELDS) <= set(data)
    assert data["score_lo"] <= data["score"] <= data["score_hi"] and data["sn"] is None and data["sn_lo"] is None
    assert len(data["prompts"]) == 32 and len(data["scenarios"]) == 16
    assert {row["foundation"] for row in data["table"]} == {"Care"}
    care = data["table"][0]
    assert care["align_other_lo"] <= care["align_other"] <= care["align_other_hi"]
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left
    out = capsys.readouterr().out
    assert "align_other" in out and "report written to" in out
    assert "90% intervals (vignettes resampled 500 times" in out


@pytest.mark.parametrize("args,needle", [
    (["--limit", "0"], "--limit must be a positive"),
    (["--name", "nope"], "unknown vignette set 'nope'"),
    (["--name", "clifford"], "python -m tinymcf_callback.prepare --name clifford"),
    (["--home", " "], "--home needs a folder"),
    (["--base-model", "base"], "--base-model applies only with --run-dir"),
    (["--tokenizer", "tok", "--base-model", "base"], "--base-model, --tokenizer apply only with --run-dir"),
    (["--level", "95"], "--level must be between 0 and 1"),
    (["--n-resamples", "50"], "--n-resamples must be at least 100"),
])
def test_cli_bad_input(tiny_dir, tmp_path, capsys, args, needle):
    rc = eval_main(["--model", str(tiny_dir), "--out", str(tmp_path), "--no-progress", *args])
    assert rc == 2
    assert needle in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cli_needs_a_model_or_a_run_dir(tiny_dir, tmp_path, capsys):
    for args in ([], ["--model", str(tiny_dir), "--run-dir", str(tmp_path)]):
        with pytest.raises(SystemExit) as e:
            eval_main(args)
        assert e.value.code == 2
        assert "--model" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cli_unwritable_out(tiny_dir, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    rc = eval_main(["--model", str(tiny_dir), "--out", str(blocker / "sub"), "--limit", "1", "--no-progress"])
    assert rc == 2
    assert "cannot create the output folder" in capsys.readouterr().err


def test_cli_as_module_subprocess(tiny_dir, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "tinymcf_callback.eval", "--model", str(tiny_dir), "--limit", "2",
                        "--out", str(tmp_path), "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / f"eval_scifi_{tiny_dir.name}.json").exists()


# ---- --compare --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reports(tmp_path_factory, tiny_qwen, qwen_tok):
    """JSON reports of the first 3 vignettes: the tiny model ("a"), another one ("b"); of 4 vignettes; with "A:"."""
    import offline_assets

    folder = tmp_path_factory.mktemp("reports")
    other = offline_assets.tiny_qwen3(seed=1)
    paths = {}
    for key, model, kwargs in (("a", tiny_qwen, {}), ("b", other, {}), ("four", tiny_qwen, {"limit": 4}),
                               ("short", tiny_qwen, {"answer_prefix": "A:"})):
        report = evaluate(model, qwen_tok, "scifi", **{"limit": 3, **kwargs}, verbose=False)
        paths[key] = folder / f"{key}.json"
        paths[key].write_text(json.dumps(report_to_json(report)))
    return paths


def test_cli_compare_prints_the_change_table(reports, capsys):
    assert eval_main(["--compare", str(reports["a"]), str(reports["b"])]) == 0
    out = capsys.readouterr().out
    assert f"A = {reports['a']}, B = {reports['b']}" in out and "3 vignettes" in out
    assert "95% interval" in out and "paired bootstrap" in out
    score = next(line for line in out.splitlines() if line.startswith("score "))
    assert len(score.split()) == 7 and score.split()[4].startswith("[")  # score, A, B, change, [lo, hi], p
    care = [line for line in out.splitlines() if "align_other" in line]
    assert len(care) == 1 and care[0].split()[0] == "Care"
    assert eval_main(["--compare", str(reports["a"]), str(reports["a"]), "--level", "0.9",
                      "--n-resamples", "300"]) == 0
    out = capsys.readouterr().out
    assert "90% interval" in out and "300 resamples" in out
    assert next(line for line in out.splitlines() if line.startswith("score ")).split()[-1] == "1.000"


@pytest.mark.parametrize("case, needle", [
    ("four", "different vignettes"),
    ("short", "different prompt texts"),
    ("missing", "no such report"),
    ("not_json", "is not valid JSON"),
    ("limit", "--limit cannot be used with --compare"),
    ("resamples", "--compare needs --n-resamples of at least 100"),
])
def test_cli_compare_bad_input_exits_2_with_one_error_line(reports, tmp_path, capsys, case, needle):
    other = {"missing": tmp_path / "nope.json", "not_json": tmp_path / "bad.json"}.get(case, reports.get(case))
    (tmp_path / "bad.json").write_text("{not json")
    extra = {"limit": ["--limit", "3"], "resamples": ["--n-resamples", "0"]}.get(case, [])
    rc = eval_main(["--compare", str(reports["a"]), str(other or reports["b"]), *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1 and "Traceback" not in err
