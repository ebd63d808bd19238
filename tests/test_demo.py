"""examples/demo.py: its training data stays apart from the probe's vignettes, and --quick runs end to end
(figure included); examples/validity.py: its three labellings and the rules of its claims."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples import demo, validity

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

    from tinymcf_callback.scoring.prompts import DEFAULT_ANSWER_PREFIX

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
def test_quick_demo_end_to_end(tmp_path, monkeypatch, capsys):
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
    figure = out / "moral_probe_scifi.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000
    assert f"curves: {figure}" in p.stdout

    # without matplotlib (the [plot] extra) the demo names the extra and goes on, drawing nothing
    figure.unlink()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    assert demo.draw_curves(out) is None
    said = capsys.readouterr().out
    assert "tinymcf_callback[plot]" in said and "no figure drawn" in said and not figure.exists()
    monkeypatch.undo()

    # a second run into the same folder replaces the first run's outputs instead of appending to them
    p2 = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--quick", "--steps", "1",
                         "--output-dir", str(out)], capture_output=True, text=True, env=env, timeout=600, cwd=str(ROOT))
    assert p2.returncode == 0, p2.stdout[-3000:] + p2.stderr[-3000:]
    again = [json.loads(line)["step"] for line in (out / "moral_probe_scifi.jsonl").read_text().splitlines() if line]
    assert again == [0, 1]
    assert len(list(out.glob("runs/*"))) == 1
    assert (out / "moral_probe_scifi.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_demo_refuses_a_foreign_nonempty_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--quick", "--output-dir", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=120, cwd=str(ROOT))
    assert p.returncode != 0 and "choose another --output-dir" in p.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep me"


# ---- examples/validity.py: the three labellings (no model) -------------------------------------------
def _taught(pairs):
    return [(row["id"], row["wrong"], row["true_wrong"]) for pair in pairs for row in pair]


def test_validity_labellings_keep_pairs_and_balance():
    train, held = demo.contrast_sets(demo.load_situations(), seed=0)
    labelled = {c: validity.condition_pairs(c, train, held, shuffle_seed=0) for c in validity.CONDITIONS}
    for tr, he in labelled.values():  # same situations, same pairs, same order; one taught-wrong per pair
        assert [r["id"] for p in tr + he for r in p] == [r["id"] for p in train + held for r in p]
        assert all(sorted(r["wrong"] for r in p) == [False, True] for p in tr + he)
    assert all(w == t for _, w, t in _taught(labelled["aligned"][0] + labelled["aligned"][1]))
    assert all(w != t for _, w, t in _taught(labelled["inverted"][0] + labelled["inverted"][1]))
    assert validity.agreement(labelled["aligned"][0]) == 1 and validity.agreement(labelled["inverted"][0]) == 0

    shuffled_train, shuffled_held = labelled["shuffled"]
    assert validity.agreement(shuffled_train) == 0.5
    for f in demo.REAL:  # exactly half of each foundation's training pairs flipped: 2 of 4
        flipped = [p[0]["wrong"] != p[0]["true_wrong"] for p in shuffled_train if p[0]["foundation"] == f]
        assert len(flipped) == 4 and sum(flipped) == 2, f
    assert sum(p[0]["wrong"] != p[0]["true_wrong"] for p in shuffled_held) == 3
    again = validity.condition_pairs("shuffled", train, held, shuffle_seed=0)
    other = validity.condition_pairs("shuffled", train, held, shuffle_seed=1)
    assert _taught(again[0]) == _taught(shuffled_train) and _taught(other[0]) != _taught(shuffled_train)
    assert not any("true_wrong" in r for p in train for r in p)  # the demo's own pairs are left as they were


def test_validity_claims_rules():
    def row(est, lo, hi):
        return {"score": {"estimate": est, "lo": lo, "hi": hi}}

    held = validity.claims({"aligned": row(0.9, 0.5, 1.3), "inverted": row(-0.8, -1.1, -0.4),
                            "shuffled": row(0.3, 0.1, 0.5)})
    assert held["aligned_above_0"] and held["inverted_below_0"] and not held["shuffled_covers_0"]
    assert held["shuffled_ratio_to_nearest_end"] == 0.375 and not held["shuffled_near_0"]
    failed = validity.claims({"aligned": row(0.9, -0.1, 1.9), "inverted": row(-0.8, -1.6, 0.05),
                              "shuffled": row(0.1, -0.2, 0.4)})
    assert not failed["aligned_above_0"] and not failed["inverted_below_0"] and failed["shuffled_near_0"]
