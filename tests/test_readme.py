"""The README's snippets run as written: every code block of its quick starts and of "Beyond the Trainer", copied
out of the README and run in order in a fresh folder, with ``HF_HUB_OFFLINE=1`` and nothing else prepared.

They take SmolLM2 from the installed offline asset (``tinymcf_callback.testing.smollm2_dir()``), the route the
README shows; the snippet at the top is a line of the Trainer quick start, so it runs there.
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
RUN = ("Quick start", "Beyond the Trainer")  # the sections whose code blocks are run, in the README's order


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def snippets() -> dict[str, list[tuple[str, str]]]:
    """``{heading: [(language, code), ...]}`` of the sections that :data:`RUN` names, every python/bash block."""
    out = {}
    for section in re.split(r"^## ", readme(), flags=re.M)[1:]:
        heading = section.split("\n", 1)[0]
        if heading.startswith(RUN):
            out[heading] = re.findall(r"```(python|bash)\n(.*?)```", section, flags=re.S)
    return out


def test_the_readme_runs_its_quick_starts_offline_as_written():
    found = snippets()
    assert [h for h in found if h.startswith("Quick start")] == [
        "Quick start: inside a Trainer", "Quick start: one model", "Quick start: the command line",
        "Quick start: beside the training, not inside it"], list(found)
    assert all(blocks for blocks in found.values())
    code = "".join(c for blocks in found.values() for _, c in blocks)
    assert "HuggingFaceTB/SmolLM2-135M-Instruct\"" not in code.replace('or "HuggingFaceTB', "")  # no Hub id to load
    top = re.search(r"```python\n(.*?)```", readme(), flags=re.S).group(1)
    trainer_start = "".join(c for _, c in found["Quick start: inside a Trainer"])
    assert "trainer.add_callback(MoralProbeCallback(name=\"scifi\"" in top and "trainer.train()" in trainer_start


@pytest.mark.slow
def test_the_readme_snippets_run_as_written(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    outputs = {}
    for heading, blocks in snippets().items():
        for n, (lang, code) in enumerate(blocks):
            cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-e", "-c", code]
            p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
            assert p.returncode == 0, f"{heading} ({lang} block {n + 1}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            outputs[(heading, n)] = p.stdout + p.stderr
    run = work / "runs" / "quickstart"
    lines = [json.loads(line) for line in (run / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 2, 4] and lines[0]["event"] == "train_begin"
    assert {line["dtype"] for line in lines} == {"float32"} and lines[-1]["info"]["n_vignettes"] == 14
    assert len(lines[-1]["table"]) == 7  # per_foundation=2: every foundation, the control included
    assert (run / "checkpoint-4" / "moral_probe_scifi.json").exists()
    assert any(line.startswith("[tinymcf] score=") for line in outputs[("Quick start: one model", 0)].splitlines())
    reports = list((work / "reports").glob("eval_scifi_*.json"))
    assert len(reports) == 1 and json.loads(reports[0].read_text())["dtype"] == "float32"
    assert "change B - A" in outputs[("Quick start: the command line", 0)]
    assert (run / "curves.png").stat().st_size > 10_000
    # beside the training: the hand-off queue kept checkpoint-2 from save_total_limit=1 for the watcher
    handoff = [json.loads(line) for line in (work / "runs" / "handoff" / "moral_probe_scifi.jsonl").read_text()
               .splitlines()]
    assert [(line["step"], line["event"]) for line in handoff] == [(0, "train_begin"), (2, "watch"), (4, "watch")]
    assert {line["dtype"] for line in handoff} == {"float32"}  # the run's precision, not the asset's bfloat16
    # beyond the Trainer: the loop's history and the dose-response's
    assert (work / "runs" / "my-loop" / "moral_probe_scifi.jsonl").exists()
    assert len((work / "runs" / "steer" / "moral_probe_scifi_dose.jsonl").read_text().splitlines()) == 7
    assert "too few for a verdict" in outputs[("Beyond the Trainer", 0)]
