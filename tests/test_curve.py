"""One curve writer (rundir/curve.py): the history and its baseline report, decided and written one way by the
callback, ProbeLogger, the sweep and the watcher.

Files only, made-up reports: where the files are, the baseline report that always belongs to the current run's
step 0 (an earlier one set aside, never lost), the saved baseline used only for the prompts it asked (else said
why), one resume mark per resumed attempt, and appends that keep what a full disk refused for the next one.
"""

from __future__ import annotations

import errno
import json
import logging

import pytest
from helpers.fake_runs import line, write_history
from helpers.reports import made_up_scores

from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir import history as history_module
from tinymcf_callback.rundir.curve import Curve, Unwritten
from tinymcf_callback.rundir.history import read_lines
from tinymcf_callback.rundir.report import load_report


@pytest.fixture(scope="module")
def reports(qwen_tok):
    """Two made-up reports of one probe, and one of another subset (another prompt digest)."""
    probe = Probe(qwen_tok, "scifi", limit=2, n_resamples=0)
    other = Probe(qwen_tok, "scifi", limit=3, n_resamples=0)
    return (probe.report(made_up_scores(probe, seed=0)), probe.report(made_up_scores(probe, seed=1)),
            other.report(made_up_scores(other, seed=0)))


def curve(run) -> Curve:
    return Curve(run, "scifi", "yesno")


def test_the_files_of_a_curve_are_named_by_its_set_and_answer_format(tmp_path):
    assert curve(tmp_path).path.name == "moral_probe_scifi.jsonl"
    assert curve(tmp_path).baseline_path.name == "moral_probe_scifi_baseline.json"
    json_curve = Curve(tmp_path, "scifi", "json")
    assert (json_curve.path.name, json_curve.baseline_path.name) == ("moral_probe_scifi_json.jsonl",
                                                                     "moral_probe_scifi_json_baseline.json")


def test_a_baseline_line_goes_with_its_report_and_an_earlier_report_is_set_aside_not_lost(tmp_path, reports):
    first, second, _ = reports
    c = curve(tmp_path)
    c.append(line(0, event="train_begin"), baseline=(first, 0, 0.0))
    assert load_report(c.baseline_path)["score"] == pytest.approx(first["score"])
    c.append(line(0, event="train_begin"), baseline=(second, 0, 0.0))  # a new run in the same folder
    assert load_report(c.baseline_path)["score"] == pytest.approx(second["score"])
    [kept] = tmp_path.glob("moral_probe_scifi_baseline.json.set-aside-*")
    assert load_report(kept)["score"] == pytest.approx(first["score"])  # the earlier run's, whole
    assert [x["event"] for _, x in read_lines(c.path)] == ["train_begin", "train_begin"]


def test_the_saved_baseline_is_used_only_for_the_prompts_it_asked_and_otherwise_says_why(tmp_path, reports):
    first, _, other = reports
    c = curve(tmp_path)
    record, why = c.saved_baseline(first["prompt_digest"])
    assert record is None and "is not beside the history" in why
    c.append(line(0, event="train_begin"), baseline=(first, 0, 0.0))
    record, why = c.saved_baseline(first["prompt_digest"])
    assert why is None and record["prompt_digest"] == first["prompt_digest"] and record["step"] == 0
    record, why = c.saved_baseline(other["prompt_digest"])
    assert record is None and "its prompts differ from this probe's" in why and str(c.baseline_path) in why
    c.baseline_path.write_text("{not json")
    record, why = c.saved_baseline(first["prompt_digest"])
    assert record is None and "cannot be read" in why


@pytest.mark.parametrize("lines, from_step, started, expected", [
    ([line(s) for s in (1, 2, 3)], 1, 5.0, [2, 3]),  # later steps of the abandoned branch: set aside
    ([line(s) for s in (1, 2)], 2, 5.0, None),  # nothing later: nothing to set aside
    ([line(s) for s in (1, 2, 3)], 0, 5.0, None),  # a run from step 0 is not a resume
    ([*(line(s) for s in (1, 2, 3)), {**line(1, event="resumed", score=None), "info": {"resumed": {
        "from_step": 1, "attempt_started": 5.0, "superseded": [2, 3]}}}], 1, 5.0, None),  # this attempt: marked
    ([*(line(s) for s in (1, 2, 3)), {**line(1, event="resumed", score=None), "info": {"resumed": {
        "from_step": 1, "attempt_started": 5.0, "superseded": [2, 3]}}}, line(2), line(3)], 1, 9.0, [2, 3]),
], ids=["later steps", "none later", "from step 0", "already marked", "a second resume"])
def test_one_resume_mark_per_attempt_that_abandoned_steps(tmp_path, lines, from_step, started, expected):
    write_history(tmp_path, lines)
    mark = curve(tmp_path).read().resume_line("scifi", "yesno", from_step=from_step, started=started)
    assert (None if mark is None else mark["info"]["resumed"]["superseded"]) == expected
    if mark is not None:
        assert mark["event"] == "resumed" and mark["step"] == from_step and mark["score"] is None


def test_what_a_full_disk_refused_is_written_first_at_the_next_append(tmp_path, reports, monkeypatch):
    first, _, _ = reports
    c = curve(tmp_path)
    real = history_module.append_jsonl
    full = [True]

    def append(path, obj):
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, obj)

    monkeypatch.setattr(history_module, "append_jsonl", append)
    with pytest.raises(Unwritten) as refused:
        c.append(line(0, event="train_begin"), baseline=(first, 0, 0.0))
    assert refused.value.steps == [0] and refused.value.path == c.path and "No space left" in refused.value.reason
    assert c.baseline_path.exists()  # the report went in; its line waits
    with pytest.raises(Unwritten) as refused:
        c.append(line(1))
    assert refused.value.steps == [0, 1]
    full[0] = False
    assert c.append(line(2)) is True
    assert [x["step"] for _, x in read_lines(c.path)] == [0, 1, 2] and c.pending == []


def test_a_baseline_report_that_cannot_be_written_is_named_and_kept_with_its_line(tmp_path, reports, monkeypatch):
    first, _, _ = reports
    c = curve(tmp_path)
    from tinymcf_callback.rundir import curve as curve_module

    def refuse(path, report, **extra):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(curve_module, "write_report", refuse)
    with pytest.raises(Unwritten) as refused:
        c.append(line(0, event="train_begin"), baseline=(first, 0, 0.0))
    assert refused.value.path == c.baseline_path and not c.path.exists()  # no line without its report
    monkeypatch.undo()
    c.append(line(1))
    assert c.baseline_path.exists() and [x["step"] for _, x in read_lines(c.path)] == [0, 1]


def test_once_writes_a_step_once_per_weights_and_a_gap_once(tmp_path):
    c = curve(tmp_path)
    assert c.append(line(2, fingerprint="a"), once=True) is True
    assert c.append(line(2, fingerprint="a"), once=True) is False  # the same weights again: not written
    assert c.append(line(2, fingerprint="b"), once=True) is True  # saved again with other weights
    gap = c.gap(step=4, epoch=2.0, why="rotated away", event="deleted")
    assert c.append(gap, once=True) is True and c.append(gap, once=True) is False
    assert [(x["step"], x.get("fingerprint")) for _, x in read_lines(c.path)] == [(2, "a"), (2, "b"), (4, None)]


def test_give_up_says_which_steps_are_lost(tmp_path, monkeypatch, caplog):
    c = curve(tmp_path)
    monkeypatch.setattr(history_module, "append_jsonl", lambda path, obj: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device", str(path))))
    for step in (3, 4):
        with pytest.raises(Unwritten):
            c.append(line(step))
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        assert c.flush() is False
        assert c.give_up() == [3, 4]
    assert "step(s) 3, 4 were never written" in caplog.text and c.pending == []


def test_every_writer_of_a_run_writes_through_the_curve():
    """The callback (through ProbeLogger), ProbeLogger, and the sweep and the watcher (through Rounds) hold a Curve;
    none appends to the history or writes the baseline report another way."""
    import inspect

    from tinymcf_callback.follow import rounds
    from tinymcf_callback.training import callback, logger, writers

    for module in (rounds, logger, callback, writers):
        source = inspect.getsource(module)
        assert "append_line(" not in source and "baseline_path(" not in source, module.__name__
    assert "Curve(" in inspect.getsource(logger) and "self.curve" in inspect.getsource(rounds)


# ---- numbering and the once-check read only what was appended since ------------------------------------------
def with_test(step: int, p: float = 0.01, **kw) -> dict:
    """A line that carries a change test (its score_change_p)."""
    return line(step, metrics={"eval_moral_scifi/score_change_p": p}, **kw)


def test_numbering_counts_the_current_run_as_a_whole_read_does_reading_only_what_was_appended(tmp_path, monkeypatch):
    from tinymcf_callback.stats.metrics import count_tests

    c = curve(tmp_path)
    other = curve(tmp_path)  # another writer of the same history (the callback beside a watcher)
    resumed = {"resumed": {"from_step": 2, "attempt_started": 1.0, "superseded": [3, 4]}}
    lines = [line(0, event="train_begin"), with_test(1), with_test(2), line(3, event="deleted"), with_test(3),
             with_test(4), line(2, event="resumed", info=resumed), with_test(3), line(0, event="train_begin"),
             with_test(1), with_test(2)]
    seen = []
    for i, x in enumerate(lines):
        (c if i % 3 else other).append(x)
        seen.append(c.tests())
        # the whole read's count, after every line: every line of the newest run, a resume's set-aside steps
        # included (each test spent its share of alpha once), the resume lines themselves left out
        whole = [json.loads(x) for x in c.path.read_text().splitlines()]
        start = max((n for n, x in enumerate(whole) if x["event"] == "train_begin"), default=0)
        assert c.tests() == count_tests([x for x in whole[start:] if x["event"] != "resumed"]), i
    assert seen == [0, 1, 2, 2, 3, 4, 4, 5, 0, 1, 2]
    from tinymcf_callback.rundir import curve as curve_module

    for module, name in ((history_module, "read_lines"), (curve_module, "read_lines")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("read the whole history"))
    numbered = c.number(with_test(3))
    assert numbered["metrics"]["eval_moral_scifi/score_change_p_run"] == pytest.approx(0.01 * 3 * 4)  # test 3
    assert c.append(numbered, once=True) and not c.append(with_test(3), once=True)  # the same weights: written once
    assert c.tests() == 3


def test_numbering_starts_again_when_the_history_is_set_aside(tmp_path):
    c = curve(tmp_path)
    for x in (line(0, event="train_begin"), with_test(1), with_test(2)):
        c.append(x)
    assert c.tests() == 2
    c.path.rename(tmp_path / "elsewhere.jsonl")  # --restart: set aside, the curve starts again
    assert c.tests() == 0
    c.append(with_test(1))
    assert c.tests() == 1
