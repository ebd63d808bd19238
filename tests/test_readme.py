"""The README's quick starts run as written: the three code blocks, copied out of the README, in a fresh folder.

They name the model by its Hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``), as a user would. There
is no Hub here, so the test gives them a Hugging Face cache that holds that id (the packaged
SmolLM2 weights, linked into the cache's layout) and runs them with ``HF_HUB_OFFLINE=1``: the
snippets themselves are not changed by a character.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
COMMIT = "0" * 40


def quick_starts() -> dict[str, tuple[str, str]]:
    """``{heading: (language, code)}`` of the first code block under each ``## Quick start`` heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    out = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        heading = section.split("\n", 1)[0]
        if heading.startswith("Quick start"):
            block = re.search(r"```(\w+)\n(.*?)```", section, flags=re.S)
            out[heading] = (block.group(1), block.group(2))
    return out


def fake_hub(home: Path, model_dir: Path) -> None:
    """A Hugging Face cache in ``home`` whose ``HUB_ID`` is ``model_dir`` (the layout ``hf_hub_download`` reads)."""
    repo = home / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for f in model_dir.iterdir():
        (snapshot / f.name).symlink_to(f)


def test_the_readme_has_three_quick_starts():
    starts = quick_starts()
    assert [lang for lang, _ in starts.values()] == ["python", "python", "bash"], list(starts)
    assert all(HUB_ID in code for _, code in starts.values())


@pytest.mark.slow
def test_the_quick_starts_run_as_written(tmp_path, smollm2_path):
    hf_home = tmp_path / "hf"
    fake_hub(hf_home, Path(smollm2_path))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    outputs = {}
    for heading, (lang, code) in quick_starts().items():
        cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-e", "-c", code]
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"{heading}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        outputs[heading] = p.stdout
    run = work / "runs" / "quickstart"
    lines = [json.loads(line) for line in (run / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 2, 4] and lines[0]["event"] == "train_begin"
    assert {line["dtype"] for line in lines} == {"float32"} and lines[-1]["info"]["n_vignettes"] == 14
    assert len(lines[-1]["table"]) == 7  # per_foundation=2: every foundation, the control included
    assert (run / "checkpoint-4" / "moral_probe_scifi.json").exists()
    one_model = outputs["Quick start: one model"].splitlines()
    assert any(line.startswith("[tinymcf] score=") for line in one_model)
    reports = list((work / "reports").glob("eval_scifi_*.json"))
    assert len(reports) == 1 and json.loads(reports[0].read_text())["dtype"] == "float32"
    assert "change B - A" in outputs["Quick start: the command line"]
    assert (run / "curves.png").stat().st_size > 10_000
