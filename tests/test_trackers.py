"""The table of trackers: a tracker of one's own, registered once, is used by the callback, the sweep, the watcher and
the command-line options; a restarted follower sends a tracker only the points it does not hold; trackio's points
sit beside the Trainer's own rows of their step. Tiny random Qwen3 runs and made-up scores: mechanics only.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from helpers.reports import made_up_lines
from helpers.runs import PROBE_ARGS, history, start_model, train_run
from transformers import TrainerCallback

from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.config import ProbeConfig
from tinymcf_callback.errors import ConfigError, RegistryError, SweepError
from tinymcf_callback.figures.tracked import probe_figure
from tinymcf_callback.follow.session import open_run_trackers
from tinymcf_callback.follow.settings import RunSettings
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir.record import RunRecord
from tinymcf_callback.trackers.sinks import Point, Trackers, line_probe_key
from tinymcf_callback.trackers.table import TRACKERS, register
from tinymcf_callback.trackers.tracker import Tracker


# ---- a tracker of one's own ---------------------------------------------------------------------------------------
class LedgerCallback(TrainerCallback):
    """A reporter of one's own, as transformers takes one (``INTEGRATION_TO_CALLBACK``): every row ``Trainer.log``
    gives it, into ``ledger.jsonl`` of the run folder."""

    def __init__(self):
        self.path: Path | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.path = Path(args.output_dir) / "ledger.jsonl"

    def on_log(self, args, state, control, logs=None, **kwargs):
        with self.path.open("a") as f:
            f.write(json.dumps({"by": "trainer", "step": state.global_step, "metrics": logs}) + "\n")


class LedgerTracker(Tracker):
    """The probe's side of the ledger: what the callback adds in the training, and a follower's points."""

    name = "ledger"
    option = ("--ledger-file", "PATH", "the ledger to write to (default: the one moral_probe_run.json records)")

    def __init__(self, path: Path, by: str, *, numbers: bool = True):
        super().__init__(f"ledger {path}")
        self.path, self.by, self.numbers = Path(path), by, numbers

    @classmethod
    def recorded(cls, args, trainer=None) -> dict | None:
        return {"file": str(Path(args.output_dir) / "ledger.jsonl")}  # where LedgerCallback writes

    @classmethod
    def in_training(cls, args, key: str, run: dict | None, *, numbers: bool) -> LedgerTracker | None:
        return cls(Path(run["file"]), "callback", numbers=numbers) if run else None

    @classmethod
    def reopen(cls, run_dir: Path, recorded: dict | None, given: str | None, key: str) -> LedgerTracker:
        path = given or (recorded or {}).get("file")
        if not path:
            raise SweepError("no ledger to write to: pass --ledger-file PATH")
        return cls(Path(path), "follower")

    def send(self, point: Point) -> None:
        row = {"by": self.by, "step": point.step, "key": line_probe_key(point.line), "figure": point.figure is not None,
               "metrics": point.line["metrics"] if self.numbers else {}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def held(self, name: str) -> dict[int, list[float]]:
        held: dict[int, list[float]] = {}
        for row in ledger(self.path):
            if name in row["metrics"]:
                held.setdefault(row["step"], []).append(row["metrics"][name])
        return held


def ledger(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def ledger_tracker(monkeypatch):
    """The ledger registered with transformers (a report_to name the Trainer takes) and in the table of trackers."""
    from transformers.integrations import integration_utils

    monkeypatch.setitem(integration_utils.INTEGRATION_TO_CALLBACK, "ledger", LedgerCallback)
    with TRACKERS.scoped():
        register(LedgerTracker)
        yield LedgerTracker


def test_a_tracker_of_ones_own_is_used_by_the_callback_the_sweep_and_the_watcher(tmp_path, qwen_tok, ledger_tracker,
                                                                                  capsys):
    run = tmp_path / "run"
    train_run(run, qwen_tok, start_model(tmp_path / "init", qwen_tok), max_steps=2, hand_off=False,
              report_to=["ledger"])
    record = RunRecord.read(run)
    assert record.report_to == ["ledger"] and record.trackers == {"ledger": {"file": str(run / "ledger.jsonl")}}
    rows = ledger(run / "ledger.jsonl")
    # the callback: its numbers through Trainer.log (the reporter's rows), its figure through the tracker
    assert [r["step"] for r in rows if "eval_moral_scifi/score" in r["metrics"]] == [0, 1, 2]
    assert [(r["step"], r["figure"]) for r in rows if r["by"] == "callback"] == [(0, True), (1, True), (2, True)]

    json_probe = [*PROBE_ARGS, "--answer-format", "json", "--device", "cpu", "--no-progress"]  # a probe of its own
    assert tinymcf(["sweep", str(run), *json_probe, "--report-to", "auto"]) == 0  # the record names the ledger
    assert "logging each line to ledger" in capsys.readouterr().err
    followed = [r for r in ledger(run / "ledger.jsonl") if r["by"] == "follower"]
    assert [(r["step"], r["key"]) for r in followed] == [(0, "scifi_json"), (1, "scifi_json"), (2, "scifi_json")]
    scores = {line["step"]: line["metrics"]["eval_moral_scifi_json/score"] for line in
              history(run, "moral_probe_scifi_json.jsonl")}
    assert {r["step"]: r["metrics"]["eval_moral_scifi_json/score"] for r in followed} == scores

    # the watcher, started on the ended run: the ledger holds every line, so it gets none again ...
    assert tinymcf(["watch", str(run), *json_probe, "--poll", "0.05"]) == 0  # its default: auto
    assert "every tracker holds them already" in capsys.readouterr().err
    assert len(ledger(run / "ledger.jsonl")) == len(rows) + 3
    # ... and a point the ledger lost is sent to it again, alone
    kept = [json.dumps(r) for r in ledger(run / "ledger.jsonl") if not (r["by"] == "follower" and r["step"] == 1)]
    (run / "ledger.jsonl").write_text("\n".join(kept) + "\n")
    assert tinymcf(["watch", str(run), *json_probe, "--poll", "0.05"]) == 0
    assert "sent to the dashboards again where they were missing (1 to ledger" in capsys.readouterr().err
    assert sorted(r["step"] for r in ledger(run / "ledger.jsonl") if r["by"] == "follower") == [0, 1, 2]
    # the tracker's own option names another ledger: every line goes there
    other = tmp_path / "other.jsonl"
    assert tinymcf(["watch", str(run), *json_probe, "--poll", "0.05", "--ledger-file", str(other)]) == 0
    assert [r["step"] for r in ledger(other)] == [0, 1, 2]


def test_the_table_refuses_a_name_taken_and_lists_what_it_holds(ledger_tracker, capsys):
    class Another(LedgerTracker):
        pass

    with pytest.raises(RegistryError, match="a tracker named 'ledger' is registered already"):
        register(Another)
    with pytest.raises(ConfigError, match="unknown tracker.*neptune; choose from auto, tensorboard, wandb, mlflow, "
                                          "trackio, .*ledger"):
        RunSettings(Path("run"), report_to=("neptune",))
    assert tinymcf(["watch", "--help"]) == 0
    said = capsys.readouterr().out
    assert "--ledger-file PATH" in said and "ledger, comma-separated" in " ".join(said.split())


# ---- what a restarted follower sends -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def probe(qwen_tok):
    return Probe(qwen_tok, "scifi", per_foundation=2, n_resamples=100)


@pytest.fixture(scope="module")
def lines(probe):
    return made_up_lines(probe, (0, 3, 6))[0]


def watched(tmp_path: Path, lines: list[dict], **trackers) -> RunSettings:
    """A run folder whose history holds ``lines`` written by a watcher, and whose record names ``trackers``."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    RunRecord(report_to=list(trackers), trackers=trackers).write(run)
    (run / "moral_probe_scifi.jsonl").write_text("".join(json.dumps({**line, "by": "watch"}) + "\n" for line in lines))
    return RunSettings(run, ProbeConfig(name="scifi", per_foundation=2), report_to=("auto",), figure=False)


def test_a_restarted_follower_sends_mlflow_and_tensorboard_only_what_they_do_not_hold(tmp_path, lines, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's sqlite store keeps artifacts in ./mlruns
    from helpers.trackers import probe_tensorboard
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("training")).info.run_id
    tb = tmp_path / "run" / "runs" / "May01_host"
    settings = watched(tmp_path, lines[:2], mlflow={"run_id": run_id, "tracking_uri": uri},
                       tensorboard={"dir": str(tb), "output_dir": str(tmp_path / "run")})
    first = open_run_trackers(settings)  # the first watcher: its lines (steps 0 and 3) reach both
    first.close()
    assert first.resent == {what: 2 for what in first.names}
    again = open_run_trackers(settings)  # a restarted watcher: it sends nothing either holds
    again.close()
    assert again.resent == {}
    assert [m.step for m in client.get_metric_history(run_id, "eval_moral_scifi/score")] == [0, 3]  # 2, not 4 or 6
    assert [e.step for e in probe_tensorboard(tmp_path / "run").Scalars("eval/moral_scifi/score")] == [0, 3]
    # a line the trackers missed (the watcher killed after writing it): the next one repairs it, in both
    settings = watched(tmp_path, lines, **RunRecord.read(settings.run_dir).trackers)
    repaired = open_run_trackers(settings)
    repaired.close()
    assert repaired.resent == {what: 1 for what in repaired.names}
    assert [m.step for m in client.get_metric_history(run_id, "eval_moral_scifi/score")] == [0, 3, 6]
    assert [e.step for e in probe_tensorboard(tmp_path / "run").Scalars("eval/moral_scifi/score")] == [0, 3, 6]


def test_a_point_held_with_another_value_is_sent_the_history_wins(lines):
    """A step a tracker holds with another score (a line that superseded it) is not taken for held: what the history
    says reaches the tracker."""
    got = []

    class Holds(Tracker):
        name = "holds"

        def send(self, point):
            got.append(point.step)

        def held(self, name):
            return {0: [lines[0]["metrics"][name]], 3: [lines[1]["metrics"][name] + 1e-3]}

    trackers = Trackers([Holds("holds")])
    for line in lines:
        trackers.send(line, again=True)
    assert got == [3, 6] and trackers.resent == {"holds": 2}


# ---- trackio: where a point sits on its default axis ----------------------------------------------------------------
def test_trackios_default_axis_puts_a_followers_points_beside_the_trainers_rows_of_their_step(tmp_path, lines,
                                                                                            trackio_home):
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    training = trackio.init(project="proj", name="the-training", embed=False, auto_log_cpu=False, auto_log_gpu=False)
    for step in range(1, 7):  # as TrackioCallback logs: no trackio step of its own, the Trainer's in each row
        training.log({"train/loss": 3.0 - 0.1 * step, "train/global_step": step})
        if step % 3 == 0:
            training.log({"eval/loss": 2.0, "train/global_step": step})  # a second row of the same step
    training.finish()
    trackio.context_vars.current_run.set(None)
    facts = {"project": "proj", "name": "the-training", "id": training.id, "dir": str(trackio_home)}
    settings = watched(tmp_path, [], trackio=facts)
    followed = open_run_trackers(settings)
    for line in lines:
        followed.send(line, rows=[])
    followed.close()
    again = open_run_trackers(watched(tmp_path, lines, trackio=facts))  # a watcher started again: the rows hold all
    again.close()
    assert again.resent == {}
    logs = SQLiteStorage.get_logs("proj", "the-training")
    trainer_rows = {}
    for log in logs:
        if "train/loss" in log or "eval/loss" in log:
            trainer_rows.setdefault(log["train/global_step"], []).append(log["step"])
    ours = {log["train/global_step"]: log["step"] for log in logs if "eval/moral_scifi/score" in log}
    assert len([log for log in logs if "eval/moral_scifi/score" in log]) == 3
    assert ours == {0: 0, 3: min(trainer_rows[3]), 6: min(trainer_rows[6])}, (ours, trainer_rows)
    assert ours[6] > ours[3] > max(trainer_rows[2])  # in the Trainer's order, among its rows


def test_a_figure_is_captioned_with_the_trainers_step_in_trackio_and_wandb(lines, monkeypatch):
    import trackio
    import wandb

    from tinymcf_callback.trackers.trackio import TrackioTracker
    from tinymcf_callback.trackers.wandb import WandbWriter

    captions = []
    monkeypatch.setattr(trackio, "Image", lambda image, caption: captions.append(caption))
    monkeypatch.setattr(wandb, "Image", lambda image, caption: captions.append(caption))

    class Run:
        id, name, entity, project, config = "r", "r", None, "p", type("Config", (), {"update": lambda *a, **k: None})()
        settings = type("Settings", (), {"mode": "offline"})()

        def log(self, payload, step=None):
            pass

        def define_metric(self, *a, **k):
            pass

    point = Point(lines[1], figure=object())
    TrackioTracker(Run(), "", follower=False).send(point)
    WandbWriter("scifi").write(Run(), point)
    assert captions == ["train/global_step 3"] * 2


def test_the_wandb_offline_notice_is_a_warning_a_trainer_script_shows(lines, caplog):
    from tinymcf_callback.trackers.wandb import WandbWriter

    class Offline:
        id, entity, project = "r", "team", "p"
        settings = type("Settings", (), {"mode": "offline"})()

    writer = WandbWriter("scifi")
    for _ in range(2):
        assert writer._band_chart(None, Offline(), Point(lines[-1], curve=lines)) is None
    said = [r for r in caplog.records if "interval chart" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "the run is offline" in said[0].getMessage()


# ---- the figure ------------------------------------------------------------------------------------------------
def test_the_figure_is_titled_by_its_probe_key_and_never_clips_a_label(lines, monkeypatch):
    import numpy as np

    from tinymcf_callback.figures import tracked

    wide = []
    for line in lines:  # values whose tick labels are wide (-70000): the y label is pushed past a fixed margin
        wide.append({**line, "answer_format": "json", "score": line["score"] * 1e5 - 123456.7,
                     "score_lo": line["score_lo"] * 1e5 - 123456.7, "score_hi": line["score_hi"] * 1e5 - 123456.7})
    titles = []
    monkeypatch.setattr(tracked, "_title", lambda h, title=tracked._title: titles.append(title(h)) or titles[-1])
    fitted = probe_figure(wide, Path("run/moral_probe_scifi_json.jsonl"))
    assert titles[0].startswith("moral probe scifi_json · run · training step 6: score ")
    monkeypatch.setattr(tracked, "_fit", lambda *a: None)  # the control: the fixed margins
    fixed = probe_figure(wide, Path("run/moral_probe_scifi_json.jsonl"))

    def inked(picture, column) -> int:
        return int((picture[:, column].astype(int).sum(axis=1) < 600).sum())  # pixels darker than light grey

    assert inked(fixed, 0) > 0  # the fixed margins clip the y label at the figure's left edge
    assert inked(fitted, 0) == inked(fitted, 1) == 0 and fitted.shape == fixed.shape  # fitted: nothing at the edge
    assert np.asarray(fitted).std() > 10


@pytest.mark.slow
def test_a_restarted_follower_sends_an_offline_wandb_run_only_what_its_files_do_not_hold(tmp_path, lines,
                                                                                          monkeypatch):
    """wandb offline (the only kind here): what the run holds is read from its files, the training's and each
    follower's, by wandb's own record type."""
    import time

    import wandb
    from helpers.trackers import read_wandb_records

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    try:
        training = wandb.init(project="p", id="trainrun1", dir=str(tmp_path))
        for step in range(1, 7):
            training.log({"train/loss": 1.0, "train/global_step": step})
        training.finish()
        facts = {"id": "trainrun1", "project": "p", "entity": None, "mode": "offline", "dir": str(tmp_path)}
        resent = []
        for kept in (lines[:2], lines[:2], lines):  # a watcher, the same restarted, and again after one more line
            time.sleep(1.1)  # an offline run's folder is named after the second it starts in
            followed = open_run_trackers(watched(tmp_path, kept, wandb=facts))
            followed.close()
            resent.append(sum(followed.resent.values()))
    finally:
        wandb.teardown()
    assert resent == [2, 0, 1]
    steps = []  # read back by the tests' own reader of the files (helpers.trackers), not the package's
    for path in sorted((tmp_path / "wandb").glob("offline-run-*-trainrun1/*.wandb")):
        for record in read_wandb_records(path):
            items = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
            if record.WhichOneof("record_type") == "history" and "eval/moral_scifi/score" in items:
                steps.append(json.loads(items["train/global_step"]))
    assert sorted(steps) == [0, 3, 6]  # each point once, in the three followers' files together


def test_without_trainer_a_reporter_the_table_cannot_reach_is_said_once(caplog):
    """Only a reporter that shows logged numbers (neptune, not codecarbon), only when no Trainer.log carries them."""
    from types import SimpleNamespace

    from tinymcf_callback.training.reporters import reporter_sinks

    args = SimpleNamespace(report_to=["codecarbon", "neptune"], output_dir=".")
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        assert reporter_sinks({}, args, "scifi", numbers=False) == []
        assert not caplog.records
        assert reporter_sinks({}, args, "scifi", numbers=True) == []
    [said] = [r.getMessage() for r in caplog.records]
    assert "neptune" in said and "codecarbon" not in said and "trainer=trainer" in said
