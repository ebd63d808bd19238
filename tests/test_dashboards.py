"""The probe where people look: TensorBoard, MLflow and trackio read back by their own libraries (made-up scores).

Each dashboard is written through the package's sinks (what the sweep and the watcher open for a run) and read back
the way the dashboard reads it: TensorBoard's event multiplexer reloaded as a live TensorBoard reloads, the
custom-scalars layout parsed from its own protobuf, an MLflow sqlite store through ``MlflowClient``, trackio's local
database through its storage. Mechanics only: the numbers are made up (``helpers.reports``).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.cli_checks import one_error_line
from helpers.reports import made_up_lines

from tinymcf_callback.cli.main import main
from tinymcf_callback.errors import ConfigError, SweepError
from tinymcf_callback.figures.tracked import probe_figure
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir.record import RunRecord
from tinymcf_callback.trackers.bands import band_rows
from tinymcf_callback.trackers.mlflow import public_uri
from tinymcf_callback.trackers.open import open_trackers
from tinymcf_callback.trackers.sinks import Sink, Trackers
from tinymcf_callback.trackers.table import resolve
from tinymcf_callback.trackers.tensorboard import TensorBoardTracker, margin_layout, probe_folder, tensorboard_folder
from tinymcf_callback.views.rows import ROW_COLUMNS, vignette_rows, vignette_texts

STEPS = (0, 3, 6)
SCORE = "eval_moral_scifi/score"


@pytest.fixture(scope="module")
def probe(qwen_tok):
    return Probe(qwen_tok, "scifi", per_foundation=2, n_resamples=200)


@pytest.fixture(scope="module")
def lines(probe):
    return made_up_lines(probe, STEPS)


def rows_of(probe, report, step):
    return vignette_rows(report, step, vignette_texts(probe.vignettes))


def run_folder(tmp_path: Path, report_to=(), **trackers) -> Path:
    """``<tmp>/out`` with a record naming ``trackers`` (name -> the run it has open) and ``report_to``."""
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    if "tensorboard" in trackers:
        trackers["tensorboard"] = {"dir": trackers["tensorboard"], "output_dir": str(out)}
    RunRecord(report_to=list(report_to), trackers=trackers).write(out)
    return out


# ---- TensorBoard ----------------------------------------------------------------------------------------------
def live_tensorboard(logdir: Path):
    """TensorBoard's own multiplexer, as the server holds it; ``reload()`` does what its reload thread does."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    tb = EventMultiplexer()

    def reload():
        tb.AddRunsFromDirectory(str(logdir))
        tb.Reload()
        return tb

    return reload


def steps_seen(tb, run: str, tag: str) -> list[int]:
    try:
        return [e.step for e in tb.Tensors(run, tag)]
    except KeyError:
        return []


def test_a_live_tensorboard_keeps_following_the_training_while_the_probe_writes(tmp_path, lines, probe):
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / "out" / "runs"
    training_dir = logdir / "Dec01_12-00-00_host"
    training = SummaryWriter(str(training_dir))  # the Trainer's own writer
    out = run_folder(tmp_path, report_to=["tensorboard"], tensorboard=str(training_dir))
    trackers = open_trackers(out, ["auto"], "scifi", figure=lambda curve: probe_figure(curve, out / "h.jsonl"))
    reload = live_tensorboard(logdir)
    line_list, report = lines
    for k, line in enumerate(line_list):  # the training and the probe write in turn; TensorBoard reloads between
        for step in range(3 * k, 3 * k + 3):
            training.add_scalar("train/loss", 10.0 - step, step)
        training.flush()
        reload()
        time.sleep(1.05)  # event file names carry the second they were opened in: a new file sorts after the old
        assert trackers.send(line, rows=rows_of(probe, report, line["step"]))
        reload()
    for step in range(9, 12):  # the training goes on after the probe's last point
        training.add_scalar("train/loss", 10.0 - step, step)
    training.flush()
    tb = reload()
    trackers.close()
    assert steps_seen(tb, "Dec01_12-00-00_host", "train/loss") == list(range(12))  # never frozen
    probe_run = "Dec01_12-00-00_host/moral_probe_scifi"  # a run of its own, next to the training's
    assert steps_seen(tb, probe_run, "eval/moral_scifi/score") == list(STEPS)
    assert steps_seen(tb, probe_run, "eval/moral_scifi/care/align_other_lo") == list(STEPS)
    assert not steps_seen(tb, "Dec01_12-00-00_host", "eval/moral_scifi/score")  # nothing in the training's folder
    assert sorted(p.name for p in training_dir.iterdir() if p.is_file()) == [
        p.name for p in training_dir.glob("events.out.tfevents*") if not p.name.endswith(".tinymcf")]


def test_the_reader_freezes_on_a_second_file_in_the_trainings_folder(tmp_path):
    """The control: the same reader, a second writer in the training's own folder (how the probe wrote before):
    the training's later points are not seen until a restart, so the test above can fail."""
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / "runs"
    training = SummaryWriter(str(logdir / "run"))
    for step in range(3):
        training.add_scalar("train/loss", 1.0, step)
    training.flush()
    reload = live_tensorboard(logdir)
    reload()
    time.sleep(1.05)
    second = SummaryWriter(str(logdir / "run"), filename_suffix=".tinymcf")
    second.add_scalar("eval/moral_scifi/score", 0.1, 2)
    second.flush()
    reload()
    for step in range(3, 6):
        training.add_scalar("train/loss", 1.0, step)
    training.flush()
    assert steps_seen(reload(), "run", "train/loss") == [0, 1, 2]
    assert steps_seen(live_tensorboard(logdir)(), "run", "train/loss") == list(range(6))  # a restart sees them


def test_the_margin_layout_and_the_figure_are_read_back_by_tensorboard(tmp_path, lines, probe):
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    out = run_folder(tmp_path, tensorboard=str(tmp_path / "out" / "runs" / "x"))
    trackers = Trackers([TensorBoardTracker.reopen(out, RunRecord.read(out).trackers["tensorboard"], None, "scifi")],
                        figure=lambda curve: probe_figure(curve, out / "h.jsonl"))
    line_list, report = lines
    for line in line_list:
        trackers.send(line, rows=[])
    trackers.close()
    acc = EventAccumulator(str(probe_folder(out / "runs" / "x", "scifi")), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors(metadata.CONFIG_SUMMARY_TAG)[-1].tensor_proto.string_val[0])
    charts = {chart.title: chart for category in layout.category for chart in category.chart}
    margins = {title: [(s.value, s.lower, s.upper) for s in chart.margin.series] for title, chart in charts.items()}
    p = "eval/moral_scifi"
    for title, tag in (("score", "score"), ("Social Norms control", "social_norms"),
                       ("score minus the control", "score_minus_sn"), ("change of the score since step 0",
                                                                       "score_change")):
        assert margins[title] == [(f"{p}/{tag}", f"{p}/{tag}_lo", f"{p}/{tag}_hi")], title
    foundations = [row["foundation"] for row in line_list[-1]["table"]]
    assert len(foundations) == 7
    for foundation in ("care", "fairness", "loyalty", "authority", "sanctity", "liberty", "social_norms"):
        tag = f"{p}/{foundation}/align_other"
        assert margins[f"{foundation} align_other"] == [(tag, f"{tag}_lo", f"{tag}_hi")]
        assert [e.step for e in acc.Scalars(f"{tag}_hi")] == list(STEPS)  # each bound is there to draw
    images = acc.Images(f"{p}/figure")
    assert [i.step for i in images] == list(STEPS)
    picture = np.asarray(Image.open(io.BytesIO(images[-1].encoded_image_string)))
    assert picture.shape == probe_figure(line_list, out / "h.jsonl").shape and picture.std() > 10  # drawn, not blank


def test_a_layout_without_intervals_draws_plain_charts():
    layout = margin_layout("scifi", {"eval/moral_scifi/score": 0.1, "eval/moral_scifi/care/align_other": 0.2})
    [(_, headline), (_, foundations)] = layout.items()
    assert headline == {"score": ["Multiline", [r"^eval/moral_scifi/score$"]]}  # a regex: not score_lo too
    assert foundations == {"care align_other": ["Multiline", [r"^eval/moral_scifi/care/align_other$"]]}


def test_a_copied_run_folder_writes_into_its_own_logging_folder(tmp_path):
    original = tmp_path / "original"
    record = {"dir": str(original / "runs" / "May01_host"), "output_dir": str(original)}
    copy = tmp_path / "copy"
    (copy / "runs" / "May01_host").mkdir(parents=True)
    folder, why = tensorboard_folder(copy, record)
    assert folder == copy.resolve() / "runs" / "May01_host" and "copy" in why and str(original) in why
    elsewhere = {"dir": str(tmp_path / "shared_tb" / "run1"), "output_dir": str(original)}
    folder, why = tensorboard_folder(copy, elsewhere)
    assert folder == tmp_path / "shared_tb" / "run1" and "outside the run folder" in why  # said, where it goes
    assert "it is not there: created" in why  # a recorded folder that is gone is said
    old = {"dir": str(original / "runs" / "May01_host")}  # a record that does not say which run folder it was in
    assert tensorboard_folder(copy, old)[0] == copy.resolve() / "runs" / "May01_host"


# ---- the figure, the rows, the bands ----------------------------------------------------------------------------
def test_each_probe_gets_the_figure_of_the_curve_so_far_drawn_once_for_all_trackers(lines, probe):
    drawn, got = [], {"a": [], "b": [], "numbers only": []}
    sinks = [Sink(name, lambda point, name=name: got[name].append(point), figure=name != "numbers only")
             for name in got]

    def figure(curve):
        drawn.append([line["step"] for line in curve])
        return probe_figure(curve, Path("run/moral_probe_scifi.jsonl"))

    trackers = Trackers(sinks, figure=figure)
    line_list, report = lines
    trackers.send(line_list[0], again=True)  # a line sent again: no figure, no rows
    for line in line_list[1:]:
        trackers.send(line, rows=rows_of(probe, report, line["step"]))
    assert drawn == [[0, 3], [0, 3, 6]]  # the curve so far, once per probe
    assert [p.figure is None for p in got["a"]] == [True, False, False] and got["a"][2].figure is got["b"][2].figure
    assert [p.fresh for p in got["a"]] == [False, True, True]
    assert got["a"][2].figure.dtype == np.uint8 and got["a"][2].figure.shape[2] == 3
    none = Trackers(sinks[2:], figure=figure)
    none.send(line_list[1], rows=[])
    assert len(drawn) == 2  # no tracker shows it: not drawn


def test_a_figure_that_cannot_be_drawn_costs_the_figure_not_the_point(lines, caplog):
    got = []

    def broken(curve):
        raise ImportError("no matplotlib")

    trackers = Trackers([Sink("t", got.append, figure=True)], figure=broken)
    for line in lines[0]:
        assert trackers.send(line, rows=[])
    assert len(got) == 3 and all(p.figure is None for p in got)
    assert sum("no figure in this run" in r.message for r in caplog.records) == 1  # said once


def test_the_vignette_rows_and_the_bands_are_the_reports_numbers(lines, probe):
    line_list, report = lines
    rows = rows_of(probe, report, 6)
    assert len(rows) == report["info"]["n_vignettes"] == 14 and list(rows[0]) == list(ROW_COLUMNS)
    first = rows[0]
    assert first["text"] == next(v["other_violate"] for v in probe.vignettes if v["id"] == first["id"])
    assert first["align_other"] == pytest.approx(first["s_other_violate"] - first["s_other_uphold"])
    care = [r["align_other"] for r in rows if r["foundation_coarse"] == "Care"]
    assert np.mean(care) == pytest.approx(report["table"].loc["Care", "align_other"], abs=1e-12)
    bands = band_rows(line_list)
    score = [b for b in bands if b["metric"] == "score"]
    assert [(b["step"], b["value"], b["lo"], b["hi"]) for b in score] == [
        (line["step"], line["score"], line["score_lo"], line["score_hi"]) for line in line_list]
    assert {b["metric"] for b in bands} >= {"Care align_other", "Social Norms align_other",
                                            "change since step 0"}


# ---- MLflow -----------------------------------------------------------------------------------------------------
def test_the_sweeps_trackers_write_into_the_trainings_mlflow_run(tmp_path, lines, probe, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's sqlite store keeps artifacts in ./mlruns, wandb runs in ./wandb
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    training = client.create_run(client.create_experiment("training"), run_name="the-training")  # as the Trainer's
    run_id = training.info.run_id
    client.log_metric(run_id, "train/loss", 3.0, step=1)
    out = run_folder(tmp_path, report_to=["mlflow"], mlflow={"run_id": run_id, "tracking_uri": uri})
    trackers = open_trackers(out, ["auto"], "scifi", figure=lambda curve: probe_figure(curve, out / "h.jsonl"))
    line_list, report = lines
    for line in line_list:
        assert trackers.send(line, rows=rows_of(probe, report, line["step"]))
        client.log_metric(run_id, "train/loss", 2.0, step=line["step"] + 1)  # the training writes meanwhile
    trackers.send(line_list[-1], again=True)  # sent again: the same point, no rows added
    trackers.close()

    assert [r.info.run_id for r in client.search_runs([training.info.experiment_id])] == [run_id]  # no new run
    assert client.get_run(run_id).info.status == "RUNNING"  # not ended: the training ends its run
    history = client.get_metric_history(run_id, "eval_moral_scifi/score")
    assert sorted({m.step for m in history}) == list(STEPS)
    assert {m.step: m.value for m in history} == {line["step"]: line["score"] for line in line_list}
    for bound in ("score_lo", "score_hi", "care/align_other_lo", "care/align_other_hi"):
        assert {m.step for m in client.get_metric_history(run_id, f"eval_moral_scifi/{bound}")} == set(STEPS)
    assert len(client.get_metric_history(run_id, "train/loss")) == 4  # the training's own points, all there
    images = [a.path for a in client.list_artifacts(run_id, "images")]
    assert sorted({int(p.split("+step+")[1].split("+")[0]) for p in images if p.endswith(".png")}) == list(STEPS)
    vignettes = pd_read(client, run_id, "moral_probe_scifi/vignettes.json")
    assert list(vignettes.columns) == list(ROW_COLUMNS)
    assert vignettes.groupby("step").size().to_dict() == {step: 14 for step in STEPS}  # every probe's rows kept
    foundations = pd_read(client, run_id, "moral_probe_scifi/foundations.json")
    assert foundations.groupby("step").size().to_dict() == {step: 7 for step in STEPS}
    assert mlflow.active_run() is None  # the client wrote; nothing was started in this process


def pd_read(client, run_id: str, path: str):
    import pandas as pd

    local = client.download_artifacts(run_id, path)
    data = json.loads(Path(local).read_text())
    return pd.DataFrame(data["data"], columns=data["columns"])


def test_an_mlflow_run_that_is_not_there_is_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's sqlite store keeps artifacts in ./mlruns, wandb runs in ./wandb
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    MlflowClient().search_experiments()  # the store the training made (MLflow says on stderr when it makes one)
    capsys.readouterr()
    out = run_folder(tmp_path)
    (out / "checkpoint-1").mkdir()
    (out / "checkpoint-1" / "trainer_state.json").write_text("{}")
    rc = main(["sweep", str(out), "--report-to", "mlflow", "--limit", "1", "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "no MLflow run to log into", "--mlflow-run RUN_ID")
    rc = main(["sweep", str(out), "--report-to", "mlflow", "--mlflow-run", "0123abc", "--limit", "1"])
    one_error_line(rc, capsys.readouterr().err, "the MLflow run 0123abc cannot be read", "MLFLOW_TRACKING_URI")


def test_a_tracking_store_or_folder_that_is_not_there_is_refused_and_nothing_is_made(tmp_path, capsys, monkeypatch):
    from helpers.ports import free_port

    monkeypatch.chdir(tmp_path)
    out = run_folder(tmp_path)
    (out / "checkpoint-1").mkdir()
    (out / "checkpoint-1" / "trainer_state.json").write_text("{}")
    before = sorted(p.name for p in tmp_path.iterdir())
    sweep = ["sweep", str(out), "--limit", "1", "--no-progress"]
    typo = f"sqlite:///{tmp_path}/mlfow/mlflow.db"  # a typo of the training's store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", typo)
    rc = main([*sweep, "--report-to", "mlflow", "--mlflow-run", "0123abc"])
    one_error_line(rc, capsys.readouterr().err, f"the MLflow store {typo} does not exist", "MLFLOW_TRACKING_URI")
    server = f"http://127.0.0.1:{free_port()}/a/long/path/to/the/tracking/server/that/nobody/listens/on"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    rc = main([*sweep, "--report-to", "mlflow", "--mlflow-run", "0123abc"])
    one_error_line(rc, capsys.readouterr().err, f"no MLflow tracking server answers at {server} (", "start it")
    rc = main([*sweep, "--report-to", "tensorboard", "--tensorboard-dir", str(tmp_path / "runs" / "typo")])
    one_error_line(rc, capsys.readouterr().err, f"--tensorboard-dir {tmp_path / 'runs' / 'typo'}: no such folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no store, no folder, no mlruns made
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1", "moral_probe_run.json"]


def test_credentials_never_reach_the_record():
    assert public_uri("https://alice:s3cret@mlflow.example.com/path") == "https://mlflow.example.com/path"
    assert public_uri("sqlite:///mlflow.db") == f"sqlite:///{Path('mlflow.db').resolve()}"  # a follower elsewhere
    assert public_uri("sqlite:////abs/mlflow.db") == "sqlite:////abs/mlflow.db"
    assert public_uri("databricks") == "databricks"


# ---- trackio ------------------------------------------------------------------------------------------------------
def test_the_sweeps_trackers_write_into_the_trainings_trackio_run(tmp_path, lines, probe, trackio_home):
    trackio_dir = trackio_home
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    training = trackio.init(project="proj", name="the-training", embed=False, auto_log_cpu=False, auto_log_gpu=False)
    facts = {"project": "proj", "name": "the-training", "id": training.id, "dir": str(trackio_dir)}
    training.log({"train/loss": 3.0, "train/global_step": 1})
    training.finish()  # the training's process: here the same one, so its run is closed before ours opens
    trackio.context_vars.current_run.set(None)
    out = run_folder(tmp_path, report_to=["trackio"], trackio=facts)
    trackers = open_trackers(out, ["auto"], "scifi", figure=lambda curve: probe_figure(curve, out / "h.jsonl"))
    line_list, report = lines
    for line in line_list:
        assert trackers.send(line, rows=rows_of(probe, report, line["step"]))
    trackers.close()
    assert SQLiteStorage.get_runs("proj") == ["the-training"]  # the training's run, no other
    logs = SQLiteStorage.get_logs("proj", "the-training")
    ours = [log for log in logs if "eval/moral_scifi/score" in log]
    assert [log["train/global_step"] for log in ours] == list(STEPS)
    assert [log["eval/moral_scifi/score_hi"] for log in ours] == [line["score_hi"] for line in line_list]
    assert all(log["eval/moral_scifi/figure"]["_type"] == "trackio.image" for log in ours)
    table = ours[-1]["eval/moral_scifi/vignette_rows"]
    assert table["_type"] == "trackio.table" and len(table["_value"]) == 14 and table["_value"][0]["step"] == 6
    assert any(log.get("train/loss") == 3.0 for log in logs)


# ---- what is asked for --------------------------------------------------------------------------------------------
def test_unknown_trackers_are_refused_and_auto_takes_the_trainers():
    with pytest.raises(ConfigError, match="unknown tracker.*neptune"):
        resolve(["neptune"], None)
    recorded = ["tensorboard", "mlflow", "codecarbon", "trackio"]  # codecarbon: the Trainer's, not a tracker here
    assert resolve(["auto", "wandb"], recorded) == ["wandb", "tensorboard", "mlflow", "trackio"]
    assert resolve("auto,none", None) == [] and resolve("tensorboard, wandb,tensorboard", None) == [
        "tensorboard", "wandb"]


def test_a_trackio_run_must_be_named(tmp_path):
    with pytest.raises(SweepError, match="--trackio-run PROJECT/RUN"):
        open_trackers(run_folder(tmp_path), ["trackio"], "scifi")
    with pytest.raises(SweepError, match="takes PROJECT/RUN"):
        open_trackers(run_folder(tmp_path), ["trackio"], "scifi", runs={"trackio": "x"})


# ---- the callback in the training process ---------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("given", [False, True], ids=["add_callback", "trainer="])
def test_the_callback_gives_each_reporter_its_numbers_figure_tables_and_layout(tmp_path, qwen_tok, monkeypatch,
                                                                               trackio_home, given):
    """``trainer.add_callback(MoralProbeCallback(name="scifi"))``: the numbers reach TensorBoard (the probe's own
    folder), MLflow's sqlite store and trackio at the Trainer's steps through the table of trackers; with trainer=,
    through Trainer.log (the Trainer's own TensorBoard folder, MLflowCallback, TrackioCallback). The figure, the
    tables and the layout go through the trackers either way."""
    monkeypatch.chdir(tmp_path)  # MLflow's sqlite store keeps artifacts in ./mlruns
    from helpers.trackers import probe_scalars, probe_tensorboard, tensorboard_scalars
    from helpers.trainer_utils import make_trainer
    from mlflow.tracking import MlflowClient

    from tinymcf_callback import MoralProbeCallback

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    trainer = make_trainer(tmp_path / "out", qwen_tok, report_to=("tensorboard", "mlflow", "trackio"),
                           project="in-process")
    trainer.add_callback(MoralProbeCallback(name="scifi", limit=3, n_resamples=100, verbose=False,
                                            trainer=trainer if given else None))
    trainer.train()
    from trackio.sqlite_storage import SQLiteStorage

    scores = {e["step"]: e[SCORE] for e in trainer.state.log_history if SCORE in e}
    assert sorted(scores) == [0, 2, 4]
    logs = SQLiteStorage.get_logs("in-process", RunRecord.read(tmp_path / "out").trackers["trackio"]["name"])
    figures = [log["train/global_step"] for log in logs if "eval/moral_scifi/figure" in log]
    assert figures == [0, 2, 4]  # beside the Trainer's own rows
    by_step = {log["step"]: log for log in logs}  # trackio's own step (its default x axis) -> the row
    for log in logs:
        if "eval/moral_scifi/figure" in log:  # the row right before it: the Trainer's of the same step (the step-0
            before = by_step.get(log["step"] - 1)  # baseline without trainer= comes before any of the Trainer's)
            assert before["train/global_step"] == log["train/global_step"] if before or given else log["step"] == 0
            numbers = before if given else log  # TrackioCallback's row, else the probe's own
            assert numbers["eval/moral_scifi/score"] == pytest.approx(scores[log["train/global_step"]], rel=1e-12)
    assert sorted(log["train/global_step"] for log in logs if "eval/moral_scifi/score_hi" in log) == [0, 2, 4]
    assert all(len(log["eval/moral_scifi/vignette_rows"]["_value"]) == 3 for log in logs
               if "eval/moral_scifi/vignette_rows" in log)
    record = RunRecord.read(tmp_path / "out")
    assert record.trackers["mlflow"]["tracking_uri"] == uri
    assert record.trackers["tensorboard"]["output_dir"] == str(tmp_path / "out")
    run_id = record.trackers["mlflow"]["run_id"]
    client = MlflowClient(uri)
    assert {m.step for m in client.get_metric_history(run_id, "eval_moral_scifi/care/align_other_hi")} == {0, 2, 4}
    history = client.get_metric_history(run_id, "eval_moral_scifi/score")  # each step once, the value logged
    assert {m.step: m.value for m in history} == pytest.approx(scores, rel=1e-12) and len(history) == 3
    images = {p.path.split("+step+")[1].split("+")[0] for p in client.list_artifacts(run_id, "images")}
    assert images == {"0", "2", "4"}
    assert pd_read(client, run_id, "moral_probe_scifi/vignettes.json").groupby("step").size().to_dict() == {
        0: 3, 2: 3, 4: 3}
    probe_tb = probe_tensorboard(tmp_path / "out")  # beside the Trainer's folder
    assert "custom_scalars__config__" in probe_tb.Tags()["tensors"]
    assert [i.step for i in probe_tb.Images("eval/moral_scifi/figure")] == [0, 2, 4]
    scalars = tensorboard_scalars if given else probe_scalars  # the Trainer's folder through Trainer.log, else its own
    assert sorted(scalars(tmp_path / "out", "eval/moral_scifi/care/align_other_lo")) == [0, 2, 4]
    assert scalars(tmp_path / "out") == pytest.approx(scores, abs=1e-6)  # TensorBoard stores float32
    assert bool(probe_tb.Tags()["scalars"]) is not given


def test_figure_false_leaves_the_figure_out(tmp_path, qwen_tok):
    from helpers.trackers import probe_tensorboard
    from helpers.trainer_utils import make_trainer

    from tinymcf_callback import MoralProbeCallback

    cb = MoralProbeCallback(name="scifi", limit=2, n_resamples=0, verbose=False, figure=False)
    make_trainer(tmp_path / "out", qwen_tok, [cb], max_steps=2, report_to=("tensorboard",)).train()
    probe_tb = probe_tensorboard(tmp_path / "out")
    assert probe_tb.Tags()["tensors"] == ["custom_scalars__config__"] and not probe_tb.Tags()["images"]


def test_a_reporter_that_fails_is_a_warning_and_the_training_goes_on(tmp_path, qwen_tok, monkeypatch, caplog):
    from helpers.trainer_utils import make_trainer

    from tinymcf_callback import MoralProbeCallback
    from tinymcf_callback.trackers import tensorboard as tensorboard_sink_module

    def broken(self, point):
        raise OSError("No space left on device")

    monkeypatch.setattr(tensorboard_sink_module.TensorBoardWriter, "send", broken)
    cb = MoralProbeCallback(name="scifi", limit=2, n_resamples=0, verbose=False)
    trainer = make_trainer(tmp_path / "out", qwen_tok, [cb], report_to=("tensorboard",))
    trainer.train()
    assert trainer.state.global_step == 4
    assert [line["step"] for line in map(json.loads, (tmp_path / "out" / "moral_probe_scifi.jsonl").open())] == [
        0, 2, 4]
    said = [r.message for r in caplog.records if "not sent to TensorBoard" in r.message]
    assert len(said) == 3 and "No space left on device" in said[0]
    assert any("did not reach it" in r.message for r in caplog.records)  # said again at the end, per tracker


# ---- wandb: the band chart -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_wandb_band_chart_is_a_panel_of_the_run_over_the_curve_so_far(tmp_path, lines, probe, monkeypatch):
    """An offline run (the only kind here) with the entity's chart preset taken as there: the panel's definition and
    its table, read back from the run file."""
    monkeypatch.chdir(tmp_path)  # MLflow's sqlite store keeps artifacts in ./mlruns, wandb runs in ./wandb
    import wandb
    from helpers.trackers import wandb_run_records

    from tinymcf_callback.trackers import wandb as wandb_trackers

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # as the other wandb tests: wandb keeps a process's settings
    monkeypatch.setattr(wandb_trackers, "_offline", lambda run: False)  # as an online run would
    monkeypatch.setitem(wandb_trackers._presets, "my-team", True)
    run = wandb.init(project="p", entity="my-team", dir=str(tmp_path))
    try:
        trackers = Trackers([wandb_trackers.WandbTracker(run)])
        line_list, report = lines
        for line in line_list:
            assert trackers.send(line, rows=rows_of(probe, report, line["step"]))
        run.finish()
    finally:
        wandb.teardown()  # the process's wandb settings (its folder among them) are not the next test's
    rows, _, config = wandb_run_records(tmp_path)
    panel = config["_wandb/visualize/eval/moral_scifi/intervals"]
    assert panel["panel_type"] == "Vega2"
    assert panel["panel_config"]["panelDefId"] == f"my-team/{wandb_trackers.BAND_CHART}"
    assert panel["panel_config"]["fieldSettings"] == wandb_trackers.BAND_FIELDS
    last = [r for r in rows if "eval/moral_scifi/intervals_table/path" in r][-1]
    [run_dir] = Path(tmp_path / "wandb").glob("offline-run-*")
    table = json.loads((run_dir / "files" / json.loads(last["eval/moral_scifi/intervals_table/path"])).read_text())
    assert table["columns"] == ["step", "metric", "value", "lo", "hi"]
    assert [tuple(r) for r in table["data"]] == [tuple(b.values()) for b in band_rows(line_list)]  # the whole curve
    spec = json.dumps(wandb_trackers.BAND_SPEC)
    assert all(f"${{field:{field}}}" in spec for field in wandb_trackers.BAND_FIELDS)


# ---- a real run, followed while it trains ---------------------------------------------------------------------
@pytest.mark.slow
def test_the_watcher_writes_into_the_trainings_own_runs_while_it_trains(tmp_path, monkeypatch):
    """The training reports to TensorBoard, an MLflow sqlite store and trackio's local store and hands its probes
    off; the watcher follows it from another process, writing into the same three runs while the training writes.
    Read back: one MLflow run and one trackio run (no new one), the training's own points all there, the probe's at
    the Trainer's steps, and TensorBoard's reader reloaded throughout still sees every training step."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    here = Path(__file__).resolve().parent
    run, init, gate = tmp_path / "run", tmp_path / "init", tmp_path / "go-on"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**__import__("os").environ, "MLFLOW_TRACKING_URI": uri, "TRACKIO_DIR": str(tmp_path / "trackio"),
           "WATCHED_REPORT_TO": "tensorboard,mlflow,trackio", "WATCHED_TRACKIO_PROJECT": "watched",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    training = subprocess.Popen([sys.executable, str(here / "helpers" / "watched_run.py"), str(run), str(init), "watch",
                                 str(gate)], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
    deadline = time.monotonic() + 300
    while not (run / "moral_probe_run.json").exists():
        assert training.poll() is None and time.monotonic() < deadline, training.stderr.read()
        time.sleep(0.2)
    watcher = subprocess.Popen([sys.executable, "-m", "tinymcf_callback", "watch", str(run), "--per-foundation", "1",
                                "--n-resamples", "0", "--device", "cpu", "--poll", "0.2", "--no-progress"], env=env,
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not (run / "moral_probe_scifi.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    record = RunRecord.read(run)
    reload = live_tensorboard(run / "runs")
    reload()
    gate.write_text("")  # the training goes on while the watcher writes into its runs
    while training.poll() is None:
        reload()  # a live TensorBoard, reloading as the two write
        time.sleep(0.5)
    out, _ = watcher.communicate(timeout=600)
    assert training.returncode == 0, training.stderr.read()
    assert watcher.returncode == 0, out
    assert "MLflow run" in out and "trackio run" in out and "moral_probe_scifi;" in out  # where each line goes

    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    run_id = record.trackers["mlflow"]["run_id"]
    assert [r.info.run_id for r in runs] == [run_id]  # the training's run, no other
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == list(range(1, 7))
    assert sorted(m.step for m in client.get_metric_history(run_id, "eval_moral_scifi/score")) == list(range(7))
    assert client.get_run(run_id).info.status == "FINISHED"  # ended by the training, once

    monkeypatch.setattr("trackio.sqlite_storage.TRACKIO_DIR", tmp_path / "trackio")  # read where they wrote
    from trackio.sqlite_storage import SQLiteStorage

    assert record.trackers["trackio"]["dir"] == str(tmp_path / "trackio")
    assert SQLiteStorage.get_runs("watched") == [record.trackers["trackio"]["name"]]
    logs = SQLiteStorage.get_logs("watched", record.trackers["trackio"]["name"])
    assert sorted(log["train/global_step"] for log in logs if "eval/moral_scifi/score" in log) == list(range(7))
    assert sorted(log["train/global_step"] for log in logs if "train/loss" in log) == list(range(1, 7))

    # on trackio's default x axis (its own row counter) each point sits on the Trainer's first row of its step
    trainer_rows = {}
    for log in logs:
        if "train/loss" in log:
            trainer_rows.setdefault(log["train/global_step"], []).append(log["step"])
    placed = {log["train/global_step"]: log["step"] for log in logs if "eval/moral_scifi/score" in log}
    print(f"trackio steps: the Trainer's rows {trainer_rows}, the watcher's points {placed}")
    assert placed == {0: 0, **{s: min(trainer_rows[s]) for s in range(1, 7)}}, (placed, trainer_rows)
    assert all(log["eval/moral_scifi/figure"]["caption"] == f"train/global_step {log['train/global_step']}"
               for log in logs if "eval/moral_scifi/figure" in log)

    tb = reload()
    training_run = Path(record.trackers["tensorboard"]["dir"]).name
    assert steps_seen(tb, training_run, "train/loss") == list(range(1, 7))
    assert steps_seen(tb, f"{training_run}/moral_probe_scifi", "eval/moral_scifi/score") == list(range(7))

    # the watcher started again on the ended run: every tracker holds every point, none gets one twice
    counts = (len(client.get_metric_history(run_id, "eval_moral_scifi/score")),
              len([log for log in SQLiteStorage.get_logs("watched", record.trackers["trackio"]["name"])
                   if "eval/moral_scifi/score" in log]))
    again = subprocess.run(watcher.args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "7 line(s) an earlier sweep or watch wrote: every tracker holds them already" in again.stderr
    after = (len(client.get_metric_history(run_id, "eval_moral_scifi/score")),
             len([log for log in SQLiteStorage.get_logs("watched", record.trackers["trackio"]["name"])
                  if "eval/moral_scifi/score" in log]))
    print(f"a restarted watcher: MLflow history entries and trackio rows of the score {counts} -> {after}")
    assert counts == after == (7, 7)
    assert steps_seen(live_tensorboard(run / "runs")(), f"{training_run}/moral_probe_scifi",
                      "eval/moral_scifi/score") == list(range(7))


@pytest.mark.slow
def test_the_sweeps_trackers_write_into_a_run_on_an_mlflow_tracking_server(tmp_path, lines, probe, monkeypatch):
    """A real ``mlflow server`` on a free loopback port: the training's run made through it, the probe's points
    written into that run over HTTP while the training logs, read back through the server."""
    monkeypatch.chdir(tmp_path)  # MLflow's sqlite store keeps artifacts in ./mlruns, wandb runs in ./wandb
    import subprocess
    import sys
    import urllib.request

    from helpers.ports import free_port
    from mlflow.tracking import MlflowClient

    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                               f"sqlite:///{tmp_path}/server.db", "--artifacts-destination", str(tmp_path / "art"),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if urllib.request.urlopen(f"{uri}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()
            time.sleep(0.5)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        client = MlflowClient(uri)
        run_id = client.create_run(client.create_experiment("served")).info.run_id
        out = run_folder(tmp_path, report_to=["mlflow"], mlflow={"run_id": run_id, "tracking_uri": uri})
        trackers = open_trackers(out, ["auto"], "scifi", figure=lambda curve: probe_figure(curve, out / "h.jsonl"))
        line_list, report = lines
        for line in line_list:
            assert trackers.send(line, rows=rows_of(probe, report, line["step"]))
            client.log_metric(run_id, "loss", 1.0, step=line["step"] + 1)
        trackers.close()
        assert {m.step for m in client.get_metric_history(run_id, "eval_moral_scifi/score_hi")} == set(STEPS)
        assert len(client.get_metric_history(run_id, "loss")) == 3
        assert pd_read(client, run_id, "moral_probe_scifi/vignettes.json").groupby("step").size().to_dict() == {
            step: 14 for step in STEPS}
        assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    finally:
        server.terminate()
        server.wait(timeout=30)
