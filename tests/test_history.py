"""The history file has one owner (``rundir.history``): two writers cannot tear it, readers share one set of rules."""

from __future__ import annotations

import json
import multiprocessing

import pytest

from tinymcf_callback._io import read_jsonl
from tinymcf_callback.errors import HistoryError
from tinymcf_callback.rundir.history import (
    BASELINE_EVENT,
    append_line,
    current_run,
    last_line_per_step,
    read_lines,
)

LINES_EACH = 150
PAD = "x" * 6000  # a real history line is 5-10 KB (the table and the info)


def _write(path: str, writer: str, n: int) -> None:
    for i in range(n):
        append_line(path, {"writer": writer, "i": i, "pad": PAD})


def test_two_processes_appending_to_one_history_leave_it_whole(tmp_path):
    """The callback and a sweep of the same folder append at once: every line arrives whole, once, in its order.

    Before, a torn last line (a writer killed mid-append) stayed in the file once another line followed it,
    and every reader refused the history from then on.
    """
    path = tmp_path / "moral_probe_scifi.jsonl"
    path.write_text('{"writer": "earlier", "i": 0, "pad": ""}\n{"torn": ')  # a crash left a torn last line
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write, args=(str(path), w, LINES_EACH)) for w in ("callback", "sweep")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    raw = path.read_text()
    assert raw.endswith("\n")
    parsed = [json.loads(text) for text in raw.split("\n") if text]  # raises on a torn or interleaved line
    assert parsed[0]["writer"] == "earlier"  # the torn fragment was dropped, the whole line before it kept
    for writer in ("callback", "sweep"):
        assert [line["i"] for line in parsed if line["writer"] == writer] == list(range(LINES_EACH))
    numbered = read_jsonl(path, torn_tail=True)  # these lines test the appends, not the history's schema
    assert numbered[0][0] == 1 and len(numbered) == 2 * LINES_EACH + 1 and numbered.torn is None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert (tmp_path / ".moral_probe_scifi.jsonl.lock").exists()  # the lock beside it, hidden


def test_the_current_run_starts_at_the_last_baseline_and_a_repeated_step_keeps_its_last_line(tmp_path):
    path = tmp_path / "h.jsonl"
    lines = [(1, {"step": 0, "event": BASELINE_EVENT}), (2, {"step": 10, "event": "save"}),
             (3, {"step": 0, "event": BASELINE_EVENT}), (4, {"step": 10, "event": "save", "v": 1}),
             (5, {"step": 10, "event": "save", "v": 2})]
    run = current_run(path, lines, warn=False)
    assert [n for n, _ in run] == [3, 4, 5]
    assert [(line["step"], line.get("v")) for _, line in last_line_per_step(path, run)] == [(0, None), (10, 2)]


def test_an_empty_or_malformed_history_is_refused_naming_the_file_and_line(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(HistoryError, match="is empty"):
        read_lines(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(HistoryError, match=r"bad\.jsonl:2: not valid JSON"):
        read_lines(bad)


def test_a_line_has_exactly_the_fields_the_format_documents(qwen_tok):
    from helpers.reports import made_up_scores

    from tinymcf_callback.probe import Probe
    from tinymcf_callback.rundir.history import LINE_FIELDS, history_line

    probe = Probe(qwen_tok, "scifi", limit=2)
    line = history_line("scifi", probe.report(made_up_scores(probe), elapsed=1.0), {}, step=0, epoch=None,
                        event=BASELINE_EVENT)
    assert list(line) == list(LINE_FIELDS)


# ---- setting aside: never a file replaced ----------------------------------------------------------------------
def test_two_set_asides_in_one_second_keep_both_and_replace_nothing(tmp_path, monkeypatch):
    import time

    from tinymcf_callback.rundir.history import set_aside

    monkeypatch.setattr(time, "strftime", lambda *a: "20261205-071900")  # one second for every call
    history, report = tmp_path / "moral_probe_scifi.jsonl", tmp_path / "moral_probe_scifi_baseline.json"
    taken = tmp_path / "moral_probe_scifi.jsonl.set-aside-20261205-071900-3"
    taken.write_text("someone else's")
    names = []
    for n in range(4):
        history.write_text(f"history {n}\n")
        report.write_text(f"report {n}") if n != 1 else None  # the second restart finds no report
        names.append([p.name for p in set_aside(history, report)])
        assert not history.exists() and not report.exists()
    stamp = "set-aside-20261205-071900"
    assert names == [[f"moral_probe_scifi.jsonl.{stamp}", f"moral_probe_scifi_baseline.json.{stamp}"],
                     [f"moral_probe_scifi.jsonl.{stamp}-2"],
                     [f"moral_probe_scifi.jsonl.{stamp}-4", f"moral_probe_scifi_baseline.json.{stamp}-4"],
                     [f"moral_probe_scifi.jsonl.{stamp}-5", f"moral_probe_scifi_baseline.json.{stamp}-5"]]
    kept = {p.name: p.read_text() for p in tmp_path.glob("*.set-aside-*")}
    assert sorted(v for k, v in kept.items() if k.startswith("moral_probe_scifi.jsonl")) == [
        "history 0\n", "history 1\n", "history 2\n", "history 3\n", "someone else's"]
    assert sorted(v for k, v in kept.items() if "baseline" in k) == ["report 0", "report 2", "report 3"]
    assert set_aside(history, report) == []  # nothing there: nothing moved


def test_two_restarts_in_one_second_keep_both_histories(tmp_path, monkeypatch):
    """``tinymcf sweep --restart`` twice in one second: the second set-aside replaced the first."""
    import time

    from tinymcf_callback.config import ProbeConfig
    from tinymcf_callback.follow.session import restart_history
    from tinymcf_callback.follow.settings import RunSettings

    monkeypatch.setattr(time, "strftime", lambda *a: "20261205-071900")
    settings = RunSettings(tmp_path, ProbeConfig(name="scifi", limit=2), restart=True)
    for n in range(2):
        settings.history.write_text(f"run {n}\n")
        restart_history(settings)
    kept = sorted(p.read_text() for p in tmp_path.glob("moral_probe_scifi.jsonl.set-aside-*"))
    assert kept == ["run 0\n", "run 1\n"]
