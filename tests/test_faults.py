"""Nothing lost, every fault loud: a full disk, a second writer, a cut-off or hand-edited file.

Each case as a user meets it (the ``tinymcf`` command or the Python API), checked by the exit status, the
message and the files afterwards: nothing damaged, nothing lost, nothing doubled. The full disk is real:
``RLIMIT_FSIZE`` makes the kernel cut a write short exactly as a full filesystem does (a short ``write``,
then ``EFBIG`` where a full disk says ``ENOSPC``), with no root and no special filesystem.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import resource
import signal
from pathlib import Path

import pytest
from helpers.cli_checks import one_error_line
from helpers.prepare import cli as prepare_cli
from helpers.reports import made_up_scores

from tinymcf_callback._io import append_jsonl, read_jsonl
from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.errors import HistoryError
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir.history import append_line, history_line, read_lines, sole_writer
from tinymcf_callback.rundir.report import write_report
from tinymcf_callback.stats.metrics import report_metrics
from tinymcf_callback.training.logger import ProbeLogger


@contextlib.contextmanager
def disk_space(n_bytes: int):
    """Files of this process can grow to ``n_bytes`` and no further (a full disk, as the kernel reports it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error from write(), not a signal that kills
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, before)


@pytest.fixture(scope="module")
def small_probe(qwen_tok):
    return Probe(qwen_tok, "scifi", limit=7)


@pytest.fixture(scope="module")
def made_up_report(small_probe):
    return lambda seed: small_probe.report(made_up_scores(small_probe, seed=seed), elapsed=0.0)


@pytest.fixture(scope="module")
def a_line(made_up_report):
    def line(step: int) -> dict:
        report = made_up_report(step)
        return history_line("scifi", report, report_metrics("scifi", report), step=step, epoch=None, event="log")

    return line


# ---- a full disk -----------------------------------------------------------------------------------------------
def test_an_append_the_disk_cuts_short_raises_and_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "moral_probe_scifi.jsonl"
    append_jsonl(path, {"step": 0})
    before = path.read_bytes()
    with disk_space(len(before) + 40), pytest.raises(OSError) as raised:  # room for 40 bytes of the next line
        append_jsonl(path, {"step": 1, "pad": "x" * 200})
    assert raised.value.filename == str(path) and "could be written" in str(raised.value)
    assert path.read_bytes() == before  # the 40 bytes that reached the file are gone again
    with disk_space(len(before)), pytest.raises(OSError) as raised:  # no room at all: the kernel's own error
        append_jsonl(path, {"step": 1})
    assert raised.value.filename == str(path) and path.read_bytes() == before


def test_the_probe_logger_keeps_what_a_full_disk_refused_and_writes_it_at_the_next_probe(tmp_path, qwen_tok,
                                                                                       tiny_qwen, caplog):
    logger = ProbeLogger(Probe(qwen_tok, "scifi", limit=2, n_resamples=100), tmp_path)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        with disk_space(0):
            assert logger.log(tiny_qwen, step=0)  # the metrics still come back: training goes on
            assert logger.log(tiny_qwen, step=10)
        assert not (tmp_path / "moral_probe_scifi.jsonl").exists() or not (
            tmp_path / "moral_probe_scifi.jsonl").read_bytes()
        said = [r.getMessage() for r in caplog.records]
        assert any("step(s) 0, 10 are kept and written at the next probe" in m for m in said)
        assert any("could not write the baseline report" in m for m in said)
        logger.log(tiny_qwen, step=20)  # room again: the kept lines go first, in step order
    lines = [line for _, line in read_lines(tmp_path / "moral_probe_scifi.jsonl")]
    assert [line["step"] for line in lines] == [0, 10, 20] and lines[0]["event"] == "train_begin"
    assert (tmp_path / "moral_probe_scifi_baseline.json").exists()  # the baseline's report, written late
    assert "eval_moral_scifi/score_change" in lines[1]["metrics"]
    assert logger.close() == []


def test_lines_still_unwritten_at_the_end_are_said_lost(tmp_path, qwen_tok, tiny_qwen, caplog):
    logger = ProbeLogger(Probe(qwen_tok, "scifi", limit=2, n_resamples=0), tmp_path, baseline=False)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"), disk_space(0):
        logger.log(tiny_qwen, step=5)
        assert logger.close() == [5]
    assert any("step(s) 5 were never written" in r.getMessage() and "lost" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_a_sweep_on_a_full_disk_fails_naming_the_file_and_the_steps_and_a_rerun_completes(tmp_path, qwen_tok, capsys):
    from helpers.trainer_utils import make_trainer

    run = tmp_path / "run"
    make_trainer(run, qwen_tok, eval=False, max_steps=3, save_steps=1, save_only_model=True).train()
    capsys.readouterr()  # the training's own output
    argv = ["sweep", str(run), "--limit", "2", "--no-baseline", "--no-progress", "--device", "cpu"]
    history = run / "moral_probe_scifi.jsonl"
    with disk_space(300):  # a history line is a few kB: the first append is cut short after 300 bytes
        rc = tinymcf(argv)
    line = one_error_line(rc, capsys.readouterr().err, str(history),
                          "step(s) 1 scored but not written", "2 checkpoint(s) after them were not scored")
    assert "only 300 of the line's" in line and "is the disk full?" in line
    assert not history.exists() or history.read_bytes() == b""  # no fragment left behind
    assert tinymcf(argv) == 0  # room again: the rerun writes every step, once
    assert [line["step"] for _, line in read_lines(history)] == [1, 2, 3]


# ---- a second writer -------------------------------------------------------------------------------------------
def test_a_second_sweep_of_the_same_run_is_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    with sole_writer(run / "moral_probe_scifi.jsonl", "tinymcf sweep"):  # the first sweep, still at work
        rc = tinymcf(["sweep", str(run), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "another sweep or watch is writing", "moral_probe_scifi.jsonl",
                   "picks up the steps still missing")
    assert not (run / "moral_probe_scifi.jsonl").exists()


def test_a_step_two_writers_scored_is_written_once(tmp_path, a_line):
    path = tmp_path / "moral_probe_scifi.jsonl"
    first = a_line(10)
    assert append_line(path, a_line(0), once=True) and append_line(path, first, once=True)
    assert append_line(path, a_line(10), once=True) is False
    assert [line["step"] for _, line in read_lines(path)] == [0, 10]


# ---- a cut-off or wrong file ---------------------------------------------------------------------------------------
def test_a_user_set_with_a_cut_off_last_line_is_refused_naming_the_line(tmp_path, capsys):
    src = tmp_path / "mine.jsonl"
    src.write_text('{"text": "You see a man kicking a dog.", "foundation": "Care"}\n'
                   '{"text": "You see a girl cheating at cards.", "foun')
    rc, out, err = prepare_cli(capsys, "prepare", "--name", "mine", "--source", src)
    one_error_line(rc, err, f"{src}:2", "cut off")
    assert "valid" not in out


def test_a_binary_user_set_is_refused_naming_the_file_and_line(tmp_path, capsys):
    src = tmp_path / "mine.jsonl"
    src.write_bytes(b'{"text": "You see a man kicking a dog.", "foundation": "Care"}\n\x89PNG\r\n\x1a\n\x00\x00')
    rc, out, err = prepare_cli(capsys, "prepare", "--name", "mine", "--source", src)
    one_error_line(rc, err, f"{src}:2", "not UTF-8")


@pytest.fixture
def run_with_history(tmp_path, a_line):
    run = tmp_path / "run"
    (run / "checkpoint-30").mkdir(parents=True)
    history = run / "moral_probe_scifi.jsonl"
    append_line(history, a_line(0))
    append_line(history, a_line(10))
    return run, history


@pytest.mark.parametrize("damage, needle", [
    (lambda line: {**line, "step": "thirty"}, "'step' is 'thirty'"),
    (lambda line: {**line, "score": "abc"}, "'score' is 'abc', not a number"),
    (lambda line: {**line, "table": None}, "'table' is None"),
])
def test_a_history_line_of_the_wrong_types_is_refused_by_every_reader_before_anything_is_appended(
        run_with_history, damage, needle, capsys):
    run, history = run_with_history
    lines = history.read_text().splitlines()
    lines[1] = json.dumps(damage(json.loads(lines[1])))
    history.write_text("\n".join(lines) + "\n")
    before = history.read_bytes()
    with pytest.raises(HistoryError, match=f"{history}:2: .*{needle}"):
        read_lines(history)
    rc = tinymcf(["sweep", str(run), "--no-progress", "--no-baseline"])
    one_error_line(rc, capsys.readouterr().err, f"{history}:2", needle)
    rc = tinymcf(["plot", str(history), "--out", str(run / "curve.png")])
    one_error_line(rc, capsys.readouterr().err, f"{history}:2", needle)
    assert history.read_bytes() == before


def test_a_history_line_that_is_not_utf8_is_named(run_with_history, capsys):
    run, history = run_with_history
    history.write_bytes(history.read_bytes() + b'{"step": 20, "name": "caf\xe9"}\n')
    rc = tinymcf(["sweep", str(run), "--no-progress", "--no-baseline"])
    one_error_line(rc, capsys.readouterr().err, f"{history}:3", "not UTF-8")


@pytest.mark.parametrize("edit, needle", [
    ({"score": "abc"}, "'score' is 'abc', not a number or null"),
    ({"table": None}, "'table' is None, not a list"),
    ({"scenarios": [{"id": "a", "s": "high"}]}, "scenarios[0]: 's' is 'high'"),
])
def test_compare_of_a_hand_edited_report_is_one_line_naming_the_file(tmp_path, edit, needle, capsys, made_up_report):
    good = write_report(tmp_path / "a.json", made_up_report(1))
    data = json.loads(good.read_text())
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({**copy.deepcopy(data), **edit}))
    rc = tinymcf(["compare", str(good), str(bad)])
    one_error_line(rc, capsys.readouterr().err, str(bad), needle)


def test_eval_of_a_folder_without_config_json_is_one_line(tmp_path, capsys):
    folder = tmp_path / "checkpoint-7"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    rc = tinymcf(["eval", "--model", str(folder), "--out", str(tmp_path), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, str(folder), "no config.json")
    rc = tinymcf(["eval", "--model", str(tmp_path / "nowhere"), "--out", str(tmp_path), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "no such folder", str(tmp_path / "nowhere"))


def test_eval_of_a_hub_id_offline_and_not_cached_names_the_offline_route(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    rc = tinymcf(["eval", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--out", str(tmp_path), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "HF_HUB_OFFLINE=1", "local Hub cache", "smollm2_dir()")


def test_reading_a_file_the_package_appends_to_skips_only_a_torn_tail(tmp_path):
    path = Path(tmp_path / "cache.jsonl")
    path.write_text('{"a": 1}\n{"a": ')
    assert read_jsonl(path, torn_tail=True).torn == 2
    with pytest.raises(ValueError, match=r"cache\.jsonl:2: the last line is cut off"):
        read_jsonl(path)


def test_the_callback_on_a_full_disk_warns_trains_on_and_says_what_is_lost(tmp_path, qwen_tok, caplog, monkeypatch):
    """The Trainer's own printing goes to files too (pytest captures it in one), so the full disk is the history's
    alone here: its writes fail as on a full disk (ENOSPC); the kernel's side is tested above."""
    import errno

    from helpers.trainer_utils import make_trainer

    from tinymcf_callback import MoralProbeCallback
    from tinymcf_callback.rundir import history as history_module

    def full(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(history_module, "append_jsonl", full)
    callback = MoralProbeCallback(name="scifi", limit=2, n_resamples=0, events="evaluate", verbose=False)
    trainer = make_trainer(tmp_path, qwen_tok, [callback], max_steps=2, eval_steps=1, save_steps=100)  # no save
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        trainer.train()  # the probe's history cannot be written; the training is not stopped by it
    said = [r.getMessage() for r in caplog.records]
    assert trainer.state.global_step == 2 and [log["step"] for log in trainer.state.log_history
                                               if "eval_moral_scifi/score" in log] == [0, 1, 2]
    assert any("step(s) 0, 1 are kept and written at the next probe" in m for m in said)
    assert any("step(s) 0, 1, 2 were never written" in m and "lost" in m for m in said)
    assert not (tmp_path / "moral_probe_scifi.jsonl").exists()
