"""evaluate() and the eval CLI end to end on real tokenizers (tiny Qwen3 for speed)."""

import json
import os
import subprocess
import sys

import pytest

from tinymcf_callback import FOUNDATIONS, evaluate
from tinymcf_callback.eval import main as eval_main


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
                    "--device", "cpu", "--dtype", "float32", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    data = json.loads((tmp_path / "eval_scifi_step_500.json").read_text())
    assert data["schema_version"] == 1 and data["tag"] == "step_500" and data["name"] == "scifi"
    assert len(data["prompts"]) == 32 and len(data["scenarios"]) == 16
    assert {row["foundation"] for row in data["table"]} == {"Care"}
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left
    out = capsys.readouterr().out
    assert "align_other" in out and "report written to" in out


@pytest.mark.parametrize("args,needle", [
    (["--limit", "0"], "--limit must be a positive"),
    (["--name", "nope"], "unknown vignette set 'nope'"),
    (["--name", "clifford"], "python -m tinymcf_callback.prepare --name clifford"),
    (["--home", " "], "--home needs a folder"),
    (["--base-model", "base"], "--base-model applies only with --run-dir"),
    (["--tokenizer", "tok", "--base-model", "base"], "--base-model, --tokenizer apply only with --run-dir"),
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
