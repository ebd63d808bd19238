"""A probe with a precision target (until=, width=): what it asks, why it stops, what it reports and logs.

The mechanics run on a scripted model (answers of a known structure, the same for a prompt however it is batched:
a served model's protocol, ``score_probe``) and on the tiny random Qwen3 (the engine's real path); the statistics
are tests/test_sequential.py's.
"""

import hashlib
import json

import numpy as np
import pytest
from helpers.report_schema import check_adaptive, check_report_schema, strict_json
from helpers.reports import ENGINE_FIELDS

from tinymcf_callback import AdaptiveProbe, Probe, ProbeLogger, make_probe
from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.data.sets import CONTROL
from tinymcf_callback.errors import ConfigError
from tinymcf_callback.rundir.report import report_to_json
from tinymcf_callback.scoring.engine import ScoreResult
from tinymcf_callback.stats.bootstrap import VignetteScores, paired_change, vignette_scores
from tinymcf_callback.stats.metrics import baseline_record, change_metrics
from tinymcf_callback.views.text import sanity_lines

KEY = "eval_moral_scifi"


class Scripted:
    """A model whose P(Yes) for a prompt depends only on the prompt (its vignette, condition and frame) and on
    ``shift`` (added to every violation's s), so any batching or prefix of the set gives each prompt the same
    answer; ``noise`` is the vignettes' spread. Scored through the served protocol (``score_probe``)."""

    def __init__(self, shift: float = 0.0, noise: float = 0.3, seed: int = 0):
        self.shift, self.noise, self.seed, self.probes = shift, noise, seed, 0

    def _u(self, *key) -> float:
        digest = hashlib.md5(":".join(map(str, (self.seed, *key))).encode()).hexdigest()
        return int(digest[:12], 16) / 16**12 - 0.5

    def score_probe(self, probe, *, progress: bool = False, rows=None) -> ScoreResult:
        self.probes += 1  # every prompt answered: the probe reads those it asked (rows)
        p_yes = []
        for row in probe.meta.itertuples():
            mean = {"other_violate": 0.4, "other_uphold": -0.3, "self_violate": 0.3, "self_uphold": -0.2}[row.condition]
            mean = mean * (0.1 if row.foundation_coarse == CONTROL else 1.0)
            mean += self.shift if row.condition.endswith("violate") else 0.0
            s = np.clip(mean + self.noise * (self._u(row.id) + self._u(row.id, row.condition)), -0.98, 0.98)
            p_yes.append((s + 1) / 2 if row.frame == "wrong" else (1 - s) / 2)
        n = len(p_yes)
        return ScoreResult(np.array(p_yes), np.full(n, 0.8), np.ones(n, dtype=bool), [("Yes", 0.5)], n_forward=1,
                           **ENGINE_FIELDS)


def test_a_level_target_asks_a_prefix_of_its_order_and_reports_it_as_that_subset(qwen_tok):
    model = Scripted()
    probe = make_probe(qwen_tok, "scifi", until="level", width=0.4)
    report = probe.run(model)
    a = report["info"]["adaptive"]
    check_adaptive(a, report["info"])
    k = a["per_foundation"]
    assert a["stopped"] == "width" and a["reached"] < 0.4 and 2 <= k < 9
    assert [look["per_foundation"] for look in a["looks"]] == list(range(2, k + 1))
    assert [look["width"] for look in a["looks"]][-1] == a["reached"]
    assert model.probes == len(a["looks"])  # one scoring per look: the prompts of the vignettes it adds
    # what it asked is per_foundation=k of the same seed: the same prompts, the same numbers
    fixed = Probe(qwen_tok, "scifi", per_foundation=k).run(model)
    assert report["prompt_digest"] == fixed["prompt_digest"] and a["asked"] == fixed["info"]["subset"]
    assert report["score"] == pytest.approx(fixed["score"], abs=1e-12)
    assert report["info"]["subset"] == Probe(qwen_tok, "scifi").config.subset()  # the candidates: the whole set
    # every interval is one of the sequence: wider than the fixed-size one, the score's the stop's own
    assert (report["score_lo"], report["score_hi"]) == (a["looks"][-1]["lo"], a["looks"][-1]["hi"])
    assert report["score_hi"] - report["score_lo"] > fixed["score_hi"] - fixed["score_lo"]
    assert report["level"] == 0.95 and a["per_look_level"] > 0.95


def test_too_narrow_a_width_uses_the_set_up_and_says_so(qwen_tok):
    report = make_probe(qwen_tok, "scifi", until="level", width=1e-6).run(Scripted())
    a = report["info"]["adaptive"]
    assert a["stopped"] == "used up" and a["vignettes"] == a["of_vignettes"] == 51 and len(a["looks"]) == 8
    assert "used up before the interval was as narrow as asked" in a["why"]
    assert a["control"] is None and not a["batched_by_look"]  # the control's interval defined; float32
    assert report["prompt_digest"] == Probe(qwen_tok, "scifi").prompt_digest  # the whole set's prompts
    capped = make_probe(qwen_tok, "scifi", until="level", width=1e-6, per_foundation=4).run(Scripted())
    assert capped["info"]["adaptive"]["vignettes"] == 28 and capped["info"]["adaptive"]["of_vignettes"] == 28


def test_a_change_target_scores_its_baseline_whole_then_stops_once_the_change_is_known(qwen_tok):
    probe = make_probe(qwen_tok, "scifi", until="change", width=0.05)
    base = probe.run(Scripted())
    a = base["info"]["adaptive"]
    assert a["stopped"] == "baseline" and a["vignettes"] == 51 and a["looks"] == [] and a["change"] is None
    assert a["per_look_level"] == 0.95  # scored whole without looking: fixed-size intervals
    record = baseline_record(base, 0)
    itself = probe.run(Scripted(), baseline=record)
    same = itself["info"]["adaptive"]
    assert same["stopped"] == "width" and same["vignettes"] == 14 and same["change"]["estimate"] == 0.0
    assert same["change"]["p"] == 1.0 and same["change"]["width"] == 0.0  # every change 0: the point 0
    # a stop at the first look, 2 control vignettes: its interval is the whole range, and the stop line says so
    assert (itself["sn_lo"], itself["sn_hi"]) == (-2.0, 2.0) and "2 control vignettes asked" in same["control"]
    assert any(same["control"] in line and line.startswith("[tinymcf] until=change") for line in sanity_lines(itself))
    moved = probe.run(Scripted(shift=0.5), baseline=record)
    m = moved["info"]["adaptive"]
    # the first look (1 df) stops only on an overwhelming change; this one, every change +0.5 but where s clips, is
    # not measured there (the first 12 changes are tied: no spread), and is known at the second look
    assert m["looks"][0]["lo"] is None and m["looks"][0]["p"] is None
    assert m["stopped"] == "moved" and m["change"]["lo"] > 0 and m["vignettes"] == 21
    # the baseline's stop line speaks of no look: it took none
    line = next(x for x in sanity_lines(base) if x.startswith("[tinymcf] until=change"))
    assert "fixed-size 95% intervals" in line.replace(" ones", " intervals") and "each look" not in line
    # the baseline's report as loaded is taken alike
    assert probe.run(Scripted(shift=0.5), baseline=base)["info"]["adaptive"]["change"] == m["change"]
    # the change is the paired change over the vignettes both asked (the baseline's rows of the prefix)
    ids = set(vignette_scores(moved["scenarios"]).id)
    b = vignette_scores(base["scenarios"])
    keep = [i for i, v in enumerate(b.id) if v in ids]
    before = VignetteScores(b.id[keep], b.foundation_coarse[keep], b.s[keep])
    assert m["change"]["estimate"] == pytest.approx(
        paired_change(before, vignette_scores(moved["scenarios"]), n_resamples=200)["headline"]["score"].change,
        abs=1e-12)
    # the logged change is the sequence's (valid under the stopping), over those vignettes
    metrics = change_metrics("scifi", record, moved)
    assert metrics[f"{KEY}/score_change"] == m["change"]["estimate"]
    assert metrics[f"{KEY}/score_change_p"] == m["change"]["p"]
    assert (metrics[f"{KEY}/score_change_lo"], metrics[f"{KEY}/score_change_hi"]) == (m["change"]["lo"],
                                                                                    m["change"]["hi"])


def test_a_level_target_with_a_baseline_pairs_over_the_vignettes_both_asked(qwen_tok):
    probe = make_probe(qwen_tok, "scifi", until="level", width=0.4)
    early = probe.run(Scripted())  # stops after 2 or 3 per foundation
    record = baseline_record(early, 0)
    later = make_probe(qwen_tok, "scifi", until="level", width=0.2).run(Scripted(shift=0.2), baseline=record)
    a = later["info"]["adaptive"]
    assert a["vignettes"] >= early["info"]["adaptive"]["vignettes"]
    assert a["change"] is not None and a["change"]["vignettes"] <= early["info"]["adaptive"]["vignettes"]
    assert any("the baseline scored" in w for w in later["info"]["warnings"])
    assert change_metrics("scifi", record, later)[f"{KEY}/score_change"] == a["change"]["estimate"]


def test_a_baseline_of_other_prompts_is_refused_with_its_cause_never_scored_as_a_new_baseline(qwen_tok):
    base = make_probe(qwen_tok, "scifi", until="change").run(Scripted())
    model = Scripted()
    for settings, needle in (({"answer_prefix": ""}, r"its prompts are worded otherwise .* from character \d+ the "
                                                     r"baseline's first prompt reads .* where this probe's reads"),
                             ({"answer_format": "json"}, "the answer format differs: the baseline's is yesno, this "
                                                         "probe's json"),
                             ({"vignettes": Probe(qwen_tok, "scifi").vignettes[1:]},
                              "it asked from other candidate vignettes")):
        other = make_probe(qwen_tok, "scifi", until="change", **settings)
        with pytest.raises(ConfigError, match="the baseline cannot be paired with this probe: " + needle):
            other.run(model, baseline=baseline_record(base, 0))
    assert model.probes == 0  # refused before anything was scored
    json_report = Probe(qwen_tok, "scifi", answer_format="json").run(Scripted())
    assert change_metrics("scifi", baseline_record(base, 0), json_report) == {}  # a fixed probe: no change logged


def test_compare_refuses_two_stopped_probes_of_unequal_prefixes_and_its_advice_compares_them(qwen_tok):
    from tinymcf_callback import compare
    from tinymcf_callback.errors import CompareError

    short = make_probe(qwen_tok, "scifi", until="level", width=0.4).run(Scripted())
    long = make_probe(qwen_tok, "scifi", until="level", width=0.2).run(Scripted(shift=0.1))
    k = short["info"]["adaptive"]["per_foundation"]
    assert long["info"]["adaptive"]["per_foundation"] > k
    with pytest.raises(CompareError, match=f"stopped after .* score both with --per-foundation {k} --subset-seed 0"):
        compare(short, long)
    a, b = (Probe(qwen_tok, "scifi", per_foundation=k).run(Scripted(shift=x)) for x in (0.0, 0.1))
    assert compare(a, b)["headline"]["score"]["change"] == pytest.approx(b["score"] - a["score"], abs=1e-12)


def test_the_settings_refuse_what_cannot_go_together(qwen_tok):
    for settings, needle in (({"until": "soon"}, "until must be 'level'"),
                             ({"until": "level", "width": 0}, "width must be a number above 0"),
                             ({"until": "level", "limit": 14}, "give per_foundation"),
                             ({"until": "change", "n_resamples": 0}, "switches the intervals off"),
                             ({"sd_floor": 0.25}, "sd_floor widens a precision target's intervals: give until='level'"),
                             ({"until": "level", "sd_floor": 0}, "sd_floor must be a number above 0"),
                             ({"until": "level", "sd_floor": 3}, "sd_floor must be a number above 0 and at most 2")):
        with pytest.raises(ConfigError, match=needle):
            make_probe(qwen_tok, "scifi", **settings)
    probe = make_probe(qwen_tok, "scifi", until="level")
    with pytest.raises(ConfigError, match="batches= does not apply"):
        probe.score(Scripted(), batches=[[0]])
    assert probe.config.command_options() == "--name scifi --until level --width 0.05"


def test_a_probe_is_what_it_says_and_make_probe_decides_from_until(qwen_tok):
    """``Probe`` is always a Probe (a precision target is refused there, naming make_probe); ``make_probe`` gives an
    AdaptiveProbe exactly when the settings name ``until``, its candidates built once as one Probe."""
    fixed = make_probe(qwen_tok, "scifi", per_foundation=2)
    assert type(fixed) is Probe and type(Probe(qwen_tok, "scifi")) is Probe
    adaptive = make_probe(qwen_tok, "scifi", until="level", width=0.3)
    assert type(adaptive) is AdaptiveProbe and type(adaptive.candidates) is Probe
    assert adaptive.config.until == "level" and adaptive.candidates.config.until is None
    with pytest.raises(ConfigError, match=r"Probe asks a fixed set .* make_probe\(tok, config\)"):
        Probe(qwen_tok, "scifi", until="level")
    with pytest.raises(ConfigError, match="an AdaptiveProbe needs until="):
        AdaptiveProbe(qwen_tok, "scifi")
    # the looks are slices of the candidates' one encoding: every candidate prompt in exactly one look
    rows = sorted(i for look in adaptive.look_rows for i in look)
    assert rows == list(range(len(adaptive.candidates))) and adaptive.asked_rows(0) == adaptive.look_rows[0]


def test_the_engine_scores_a_prefix_as_it_scores_that_subset(qwen_tok, tiny_qwen):
    """The real forward path: each look's probe batches its own prompts; the numbers are per_foundation=k's."""
    report = make_probe(qwen_tok, "scifi", until="level", width=0.5).run(tiny_qwen)
    a = report["info"]["adaptive"]
    fixed = Probe(qwen_tok, "scifi", per_foundation=a["per_foundation"]).run(tiny_qwen)
    got = np.asarray(report["raw"]["p_yes"])
    want = np.asarray(fixed["raw"]["p_yes"])
    assert report["prompt_digest"] == fixed["prompt_digest"] and np.abs(got - want).max() < 1e-5
    check = report["info"]["self_check"]
    assert check["checked"] and check["max_diff"] <= check["tolerance"]
    assert all(0 <= i < len(got) for i in check["checked"])
    check_report_schema(strict_json(json.dumps(report_to_json(report, step=0), allow_nan=False)) | {"tag": "x"},
                        extra={"tag": "string", "step": "integer"})


def test_the_logger_logs_the_count_the_width_and_a_run_level_p(qwen_tok, tmp_path):
    logger = ProbeLogger(make_probe(qwen_tok, "scifi", until="change", width=0.05), tmp_path, strict=True)
    logger.log(Scripted(), step=0)
    first = logger.log(Scripted(shift=0.3), step=10)
    name = "eval/moral_scifi"
    assert first[f"{name}/vignettes"] == 14 and first[f"{name}/width_reached"] > 0
    assert first[f"{name}/score_change_p_run"] == pytest.approx(min(1.0, 2 * first[f"{name}/score_change_p"]))
    # a loop resumed later (a new logger on the same folder) goes on counting from the history
    again = ProbeLogger(make_probe(qwen_tok, "scifi", until="change", width=0.05), tmp_path, strict=True)
    second = again.log(Scripted(shift=0.3), step=20)
    assert second[f"{name}/score_change_p_run"] == pytest.approx(min(1.0, 6 * second[f"{name}/score_change_p"]))
    lines = [json.loads(x) for x in (tmp_path / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [line["info"]["adaptive"]["stopped"] for line in lines] == ["baseline", "moved", "moved"]
    assert [line["info"]["n_vignettes"] for line in lines] == [51, 14, 14]
    # the training resumed from step 10: step 20's line is set aside, but its test spent its alpha, so the step
    # scored again is the run's third test, not its second a second time
    from tinymcf_callback.rundir.history import append_line, resume_line

    append_line(tmp_path / "moral_probe_scifi.jsonl", resume_line("scifi", "yesno", step=10, started=1.0,
                                                                  superseded=[20]))
    resumed = ProbeLogger(make_probe(qwen_tok, "scifi", until="change", width=0.05), tmp_path, strict=True)
    third = resumed.log(Scripted(shift=0.2, seed=1, noise=0.1), step=20)  # p about 0.016: 12 p apart from 6 p
    assert 0 < third[f"{name}/score_change_p"] < 1 / 12
    assert third[f"{name}/score_change_p_run"] == pytest.approx(12 * third[f"{name}/score_change_p"])


def test_the_figure_rings_the_steps_flagged_at_their_step_and_over_the_run(qwen_tok, tmp_path):
    pytest.importorskip("matplotlib")
    from tinymcf_callback.figures.overview import draw_dashboard
    from tinymcf_callback.views.curves import load_history

    logger = ProbeLogger(make_probe(qwen_tok, "scifi", until="change", width=0.05), tmp_path, strict=True)
    for step, shift in ((0, 0.0), (10, 0.0), (20, 0.5)):
        logger.log(Scripted(shift=shift), step=step)
    h = load_history(tmp_path)
    step, run = h.flagged()
    assert list(step) == [False, False, True] and list(run) == [False, False, True]
    fig = draw_dashboard([h])
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert any(label.endswith("change flagged over the run") for label in labels)
    legend_texts = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    assert any(t.startswith("black ring: flagged over the run") for t in legend_texts)


@pytest.mark.slow  # a model saved and loaded, two probes through the command line
def test_eval_takes_until_width_and_a_baseline_report(qwen_tok, tiny_qwen, tmp_path, capsys):
    from tinymcf_callback.testing import qwen3_tokenizer_dir

    model_dir = tmp_path / "m"
    tiny_qwen.save_pretrained(model_dir)
    qwen_tok.save_pretrained(model_dir)
    del qwen3_tokenizer_dir
    args = ["eval", "--model", str(model_dir), "--out", str(tmp_path), "--no-progress", "--dtype", "float32"]
    assert tinymcf([*args, "--until", "change", "--tag", "base"]) == 0
    assert tinymcf([*args, "--until", "change", "--width", "0.5", "--tag", "again", "--baseline",
                    str(tmp_path / "eval_scifi_base.json")]) == 0
    out = capsys.readouterr().out
    assert "until=change width=0.5: asked 14 of 51 vignettes" in out and "change since the baseline +0.000" in out
    report = json.loads((tmp_path / "eval_scifi_again.json").read_text())
    assert report["info"]["adaptive"]["change"]["estimate"] == 0.0
    assert tinymcf([*args, "--baseline", str(tmp_path / "eval_scifi_base.json")]) == 2
    assert "--baseline goes with --until" in capsys.readouterr().err


@pytest.mark.slow  # five probes of saved checkpoints through the command line
def test_a_sweep_with_a_change_target_over_a_run_whose_weights_never_change_flags_nothing(qwen_tok, tiny_qwen,
                                                                                         tmp_path):
    """The same checkpoint saved again and again: the baseline is scored whole, each later step asks its first look
    only (a change of exactly 0 is known at once), and no step is flagged, at its step or over the run."""
    from tinymcf_callback.rundir.record import RunRecord

    init, run = tmp_path / "init", tmp_path / "run"
    for folder in [init] + [run / f"checkpoint-{step}" for step in (1, 2, 3)]:
        tiny_qwen.save_pretrained(folder)
        qwen_tok.save_pretrained(folder)
        if folder != init:
            step = int(folder.name.split("-")[1])
            (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": step / 3}))
    RunRecord(base_model=str(init), saves=[1, 2, 3], ended=True).write(run)
    assert tinymcf(["sweep", str(run), "--until", "change", "--width", "0.05", "--no-progress"]) == 0
    lines = [json.loads(x) for x in (run / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [(x["step"], x["info"]["n_vignettes"], x["info"]["adaptive"]["stopped"]) for x in lines] == [
        (0, 51, "baseline"), (1, 14, "width"), (2, 14, "width"), (3, 14, "width")]
    for x in lines[1:]:
        m = x["metrics"]
        assert m[f"{KEY}/score_change"] == 0.0 and m[f"{KEY}/score_change_p"] == 1.0
        assert m[f"{KEY}/score_change_p_run"] == 1.0
    # a second sweep extends the same curve like with like (its lines ask prefixes of one order)
    tiny_qwen.save_pretrained(run / "checkpoint-4")
    qwen_tok.save_pretrained(run / "checkpoint-4")
    (run / "checkpoint-4" / "trainer_state.json").write_text(json.dumps({"global_step": 4, "epoch": 4 / 3}))
    RunRecord(base_model=str(init), saves=[1, 2, 3, 4], ended=True).write(run)
    assert tinymcf(["sweep", str(run), "--until", "change", "--width", "0.05", "--no-progress"]) == 0
    last = json.loads((run / "moral_probe_scifi.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 4 and last["metrics"][f"{KEY}/score_change_p_run"] == 1.0


@pytest.mark.slow  # a real Trainer run with the callback
def test_the_callback_with_a_change_target_scores_step_0_whole_and_stops_later_probes(qwen_tok, tmp_path):
    from helpers.trainer_utils import make_trainer

    from tinymcf_callback import MoralProbeCallback

    cb = MoralProbeCallback(name="scifi", until="change", width=0.05)
    trainer = make_trainer(tmp_path / "out", qwen_tok, [cb], max_steps=2, eval=False, save_steps=2)
    cb.trainer = trainer
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "out" / "moral_probe_scifi.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 2]
    base, later = (line["info"]["adaptive"] for line in lines)
    assert base["stopped"] == "baseline" and base["vignettes"] == 51
    # the tiny random model barely moves in 2 steps: its change is known (excludes 0 or narrow) well before 51
    assert later["stopped"] in ("moved", "width") and later["vignettes"] < 51 and later["change"] is not None
    metrics = lines[1]["metrics"]
    assert metrics[f"{KEY}/vignettes"] == later["vignettes"]
    assert metrics[f"{KEY}/score_change_p_run"] == pytest.approx(min(1.0, 2 * metrics[f"{KEY}/score_change_p"]))
    report = json.loads((tmp_path / "out" / "checkpoint-2" / "moral_probe_scifi.json").read_text())
    assert report["info"]["adaptive"] == later


def _candidate_rows(probe, report) -> VignetteScores:
    """A report's per-vignette rows, as the candidates' scores (NaN rows where it did not ask a vignette)."""
    asked = vignette_scores(report["scenarios"])
    where = {str(i): r for r, i in enumerate(asked.id)}
    s = np.full((len(probe.vignettes), 4), np.nan)
    for r, v in enumerate(probe.vignettes):
        if str(v["id"]) in where:
            s[r] = asked.s[where[str(v["id"])]]
    return VignetteScores([v["id"] for v in probe.vignettes], [v["foundation_coarse"] for v in probe.vignettes], s)


def test_a_real_probe_and_the_simulation_over_its_own_rows_step_the_same_looks_to_the_last_digit(qwen_tok, tiny_qwen):
    """One stepping loop: the tiny random Qwen3 scored look by look through the engine, then the simulations'
    ``Sequential.run`` over the rows that probe reported: the same looks (every digit of every interval and p-value)
    and the same stop. The vignettes it did not ask are NaN, so a simulation that read beyond the stop would differ."""
    from tinymcf_callback.testing import tiny_qwen3

    cheap = {"self_check": False, "per_foundation": 5}  # 35 of the 51 vignettes, four looks
    used_up = make_probe(qwen_tok, "scifi", until="level", width=1e-6, **cheap)
    assert isinstance(used_up, AdaptiveProbe)
    whole = used_up.run(tiny_qwen)
    a = whole["info"]["adaptive"]
    assert a["stopped"] == "used up" and len(a["looks"]) == 4
    width = a["looks"][2]["width"] * (1 + 1e-9)  # a width first reached at the third look, or before
    probes = [(used_up, whole, None)]
    mid = make_probe(qwen_tok, "scifi", until="level", width=width, **cheap)
    probes.append((mid, mid.run(tiny_qwen), None))
    change = make_probe(qwen_tok, "scifi", until="change", width=0.02, **cheap)
    base = change.run(tiny_qwen3(seed=1))
    probes.append((change, change.run(tiny_qwen, baseline=base), base))
    stops = []
    for probe, report, baseline in probes:
        a = report["info"]["adaptive"]
        before = None if baseline is None else _candidate_rows(probe, baseline)
        looks, why = probe.sequential.run(_candidate_rows(probe, report), before)
        assert [look.as_dict() for look in looks] == a["looks"] and why == a["stopped"]
        stops.append((len(looks), why))
    assert stops[1][0] <= 3 and stops[2][1] in ("moved", "width", "used up")


def test_in_bfloat16_the_report_says_its_looks_were_batched_apart(qwen_tok, tiny_qwen):
    """In a half precision a prompt's P(Yes) moves with its batch, and the looks batch apart: the stopped report may
    differ from per_foundation=k scored at once, and it says so (float32: per_foundation=k's own numbers)."""
    import copy

    import torch

    half = copy.deepcopy(tiny_qwen).to(torch.bfloat16)
    report = make_probe(qwen_tok, "scifi", until="level", width=1e-6, per_foundation=3, self_check=False).run(half)
    a = report["info"]["adaptive"]
    assert report["dtype"] == "bfloat16" and len(a["looks"]) == 2 and a["batched_by_look"]
    assert any("scored in bfloat16, look by look" in w for w in report["info"]["warnings"])


def test_an_sd_floor_is_recorded_said_and_keeps_every_look_at_least_its_width(qwen_tok, capsys):
    """sd_floor (docs/statistics.md, rare one-sided extremes): each look's interval at least as wide as the floor
    makes it, the report and its stop line say so, and a watcher's options carry it."""
    plain = make_probe(qwen_tok, "scifi", until="level", width=0.4).run(Scripted())
    probe = make_probe(qwen_tok, "scifi", until="level", width=0.4, sd_floor=0.5)
    report = probe.run(Scripted())
    a = report["info"]["adaptive"]
    check_adaptive(a, report["info"])
    assert a["sd_floor"] == 0.5 and plain["info"]["adaptive"]["sd_floor"] is None
    assert a["per_foundation"] > plain["info"]["adaptive"]["per_foundation"]  # the floor asks more
    from tinymcf_callback.stats.bootstrap import t_quantile

    for look in a["looks"]:
        n = look["per_foundation"]  # every real foundation has this many asked (up to 7), and n - 1 df
        least = 2 * t_quantile(0.5 + a["per_look_level"] / 2, n - 1) * 0.5 / np.sqrt(6 * n)
        assert look["width"] >= min(least, 4.0) * (1 - 1e-12)  # clipped to the score's range [-2, +2]
    assert probe.config.command_options() == "--name scifi --until level --width 0.4 --sd-floor 0.5"
    # the stop line says what the floor did: the width it held the interval at, where the probe would have stopped
    floor = a["floor"]
    assert floor["width_without"] < a["reached"] and floor["stop_without"] == plain["info"]["adaptive"]["vignettes"]
    line = next(x for x in sanity_lines(report) if x.startswith("[tinymcf] until=level width=0.4 sd_floor=0.5: asked"))
    assert (f"sd_floor=0.5 widened the interval to {a['reached']:.3f} ({floor['width_without']:.3f} without it), "
            f"which is why it asked {a['vignettes']} vignettes: without the floor it would have stopped at "
            f"{floor['stop_without']}") in line
    assert plain["info"]["adaptive"]["floor"] is None and "widened" not in "\n".join(sanity_lines(plain))
    assert tinymcf(["eval", "--model", "nowhere", "--sd-floor", "0.25"]) == 2  # refused before any model is sought
    err = capsys.readouterr().err
    assert "--sd-floor widens a precision target's intervals: give until='level' or 'change' (--until)" in err
