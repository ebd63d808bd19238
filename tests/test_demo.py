"""examples/demo.py: its training data stays apart from the probe's vignettes, and --quick runs end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import demo  # examples/ is on sys.path (conftest)

ROOT = Path(__file__).resolve().parents[1]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


def test_demo_data_is_balanced_and_not_the_probe_set():
    rows = demo.load_situations()
    assert len({r["id"] for r in rows}) == len(rows) >= 60
    foundations = {r["foundation"] for r in rows}
    assert foundations == set(demo.REAL)  # Social Norms, the probe's control, is never trained on
    for f in foundations:
        assert sum(r["wrong"] for r in rows if r["foundation"] == f) == sum(
            not r["wrong"] for r in rows if r["foundation"] == f)
    probe_texts = [json.loads(line)["text"] for name in ("configs/scifi.jsonl", "cache/scifi.jsonl")
                   for line in (ROOT / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(probe_texts) == 51 * 4
    for r in rows:
        mine = _words(r["situation"])
        for text in probe_texts:
            theirs = _words(text)
            overlap = len(mine & theirs) / len(mine | theirs)
            assert overlap < 0.4, (r["id"], text)


def test_contrast_pairs_and_answer_only_labels(smollm2_path):
    from transformers import AutoTokenizer

    from tinymcf_callback.prompts import DEFAULT_ANSWER_PREFIX

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    train, held = demo.contrast_sets(demo.load_situations(), seed=0)
    assert len(held) == 6 and len(train) == 24
    assert not {r["id"] for p in held for r in p} & {r["id"] for p in train for r in p}
    assert all(bad["wrong"] and not good["wrong"] and bad["foundation"] == good["foundation"] for bad, good in train)
    items = demo.encode(tok, train[:3])
    answers = []
    for item in items:
        assert len(item["seqs"]) == 4
        item_answers = []
        for seq in item["seqs"]:
            scored = [i for i, label in enumerate(seq["labels"]) if label != -100]
            assert scored == [len(seq["input_ids"]) - 1]  # only the last token, the answer, carries loss
            prompt = tok.decode(seq["input_ids"][:-1])
            assert prompt.endswith("<|im_start|>assistant\n" + DEFAULT_ANSWER_PREFIX)
            item_answers.append(tok.decode(seq["input_ids"][-1:]))
        assert sorted(item_answers) == [" No", " No", " Yes", " Yes"]
        answers += item_answers
    assert answers.count(" Yes") == answers.count(" No") == 6
    batch = demo.Collator(tok.pad_token_id)(items)
    assert batch["input_ids"].shape[0] == 12 and int((batch["labels"] != -100).sum()) == 12


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--quick", "--output-dir", str(out)],
                       capture_output=True, text=True, env=env, timeout=600, cwd=str(ROOT))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    history = [json.loads(line) for line in (out / "moral_probe_scifi.jsonl").read_text().splitlines() if line]
    steps = [h["step"] for h in history]
    assert len(steps) >= 2 and steps[0] == 0 and steps == sorted(set(steps))
    assert all(h["name"] == "scifi" and h["info"]["n_vignettes"] == 2 for h in history)
    assert list(out.glob("runs/*/events.out.tfevents.*")), "no TensorBoard event file"
    summary = json.loads((out / "demo_run.json").read_text())
    assert [c["step"] for c in summary["checkpoints"]] == steps
    assert "per checkpoint" in p.stdout and "TensorBoard logs:" in p.stdout

    # a second run into the same folder replaces the first run's outputs instead of appending to them
    p2 = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--quick", "--steps", "1",
                         "--output-dir", str(out)], capture_output=True, text=True, env=env, timeout=600, cwd=str(ROOT))
    assert p2.returncode == 0, p2.stdout[-3000:] + p2.stderr[-3000:]
    again = [json.loads(line)["step"] for line in (out / "moral_probe_scifi.jsonl").read_text().splitlines() if line]
    assert again == [0, 1]
    assert len(list(out.glob("runs/*"))) == 1


def test_demo_refuses_a_foreign_nonempty_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--quick", "--output-dir", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=120, cwd=str(ROOT))
    assert p.returncode != 0 and "choose another --output-dir" in p.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep me"
