"""Where the intervals show: the report dict, the JSON report (schema 2), the sanity lines, the history line.

The reports come from ``Probe.report`` on the real ``scifi`` prompts (Qwen3 tokenizer) with made-up
per-prompt P(Yes) of a known structure: no model is run, so every foundation (and the control) has
several vignettes and real spread. The intervals are checked against the classical t interval of
each foundation's per-vignette differences, computed here from the report's own scenarios.
"""

import json
import math
import re

import numpy as np
import pytest

from tinymcf_callback.callback import LOGGED_HEADLINE, history_line, report_metrics
from tinymcf_callback.engine import ScoreResult
from tinymcf_callback.plot import load_history
from tinymcf_callback.probe import HEADLINE_FIELDS, SCHEMA_VERSION, Probe, report_to_json, sanity_lines
from tinymcf_callback.sets import CONTROL, FOUNDATIONS, REAL_FOUNDATIONS
from tinymcf_callback.stats import METRICS, t_quantile

HEADLINE = ("score", "gap", "sn", "score_minus_sn")
JSON_TOP = {"schema_version", "name", *HEADLINE_FIELDS, "level", "n_resamples", "seed", "prompt_digest", "info",
            "frames", "table", "scenarios", "prompts"}
# true mean s per condition (other_violate, other_uphold, self_violate, self_uphold)
TRUE_S = {"other_violate": 0.5, "other_uphold": -0.3, "self_violate": 0.3, "self_uphold": -0.2}


def made_up_scores(probe: Probe, seed: int = 0, shift: float = 0.0) -> ScoreResult:
    """P(Yes) per prompt from a per-vignette s: condition mean + vignette effect + noise (+ ``shift`` on violations).

    The control's conditions are pulled towards 0, so ``sn`` is near 0 and the score clearly positive.
    """
    rng = np.random.default_rng(seed)
    meta = probe.meta
    ids = meta["id"].unique()
    vignette = dict(zip(ids, rng.normal(0.0, 0.15, len(ids)), strict=True))
    p_yes = np.empty(len(meta))
    for i, row in enumerate(meta.itertuples()):
        mean = TRUE_S[row.condition] * (0.1 if row.foundation_coarse == CONTROL else 1.0)
        mean += shift if row.condition.endswith("violate") else 0.0
        s = np.clip(mean + vignette[row.id] + rng.normal(0.0, 0.2), -0.98, 0.98)
        wrongness = (s + 1.0) / 2.0
        p_yes[i] = wrongness if row.frame == "wrong" else 1.0 - wrongness
    return ScoreResult(p_yes, rng.uniform(0.6, 0.9, len(meta)), np.ones(len(meta), dtype=bool),
                       [("Yes", 0.5), ("No", 0.3)], n_forward=1)


@pytest.fixture(scope="module")
def probe(qwen_tok):
    return Probe(qwen_tok, "scifi")


@pytest.fixture(scope="module")
def report(probe):
    return probe.report(made_up_scores(probe), elapsed=1.0)


def test_report_carries_intervals_around_its_own_numbers(report):
    assert report["level"] == 0.95 and report["n_resamples"] == 2000 and report["seed"] == 0
    for name in HEADLINE:
        est, lo, hi = report[name], report[f"{name}_lo"], report[f"{name}_hi"]
        assert isinstance(lo, float) and isinstance(hi, float), name
        assert lo < est < hi, name
    assert report["score_minus_sn"] == pytest.approx(report["score"] - report["sn"], abs=1e-12)
    assert report["score_lo"] > 0.3 and report["sn_lo"] < 0.05 < report["score_lo"]  # the made-up truth: 0.8, 0.08
    table = report["table"]
    assert list(table.index) == list(FOUNDATIONS)
    for metric in METRICS:
        assert {f"{metric}_lo", f"{metric}_hi"} <= set(table.columns)
        assert (table[f"{metric}_lo"] < table[metric]).all() and (table[metric] < table[f"{metric}_hi"]).all()
    # the estimates are the table's own: the headline score is the mean align_other over the real foundations
    assert report["score"] == pytest.approx(table.loc[list(REAL_FOUNDATIONS), "align_other"].mean(), abs=1e-12)


def _differences(report, foundation, metric="align_other") -> np.ndarray:
    """Per-vignette violate-minus-uphold differences of one foundation, from the report's scenarios."""
    sc = report["scenarios"]
    wide = sc[sc["foundation_coarse"] == foundation].pivot(index="id", columns="condition", values="s")
    assert metric == "align_other"
    return (wide["other_violate"] - wide["other_uphold"]).to_numpy()


def test_intervals_match_the_classical_t_interval(report):
    """Independent reference: ``mean(d) ± t(n-1) sd(d)/sqrt(n)`` per foundation; Welch for the score."""
    variances, dfs = [], []
    for foundation in FOUNDATIONS:
        d = _differences(report, foundation)
        n, se = len(d), d.std(ddof=1) / math.sqrt(len(d))
        row = report["table"].loc[foundation]
        assert row["align_other"] == pytest.approx(d.mean(), abs=1e-12)
        assert (row["align_other_lo"] + row["align_other_hi"]) / 2 == pytest.approx(d.mean(), abs=1e-12)
        half = (row["align_other_hi"] - row["align_other_lo"]) / 2
        assert half / (t_quantile(0.975, n - 1) * se) == pytest.approx(1.0, abs=0.1), foundation
        if foundation in REAL_FOUNDATIONS:
            variances.append(se**2 / len(REAL_FOUNDATIONS) ** 2)
            dfs.append(n - 1)
    v = np.array(variances)
    welch = v.sum() ** 2 / (v**2 / np.array(dfs)).sum()
    half = (report["score_hi"] - report["score_lo"]) / 2
    assert half / (t_quantile(0.975, welch) * math.sqrt(v.sum())) == pytest.approx(1.0, abs=0.1)


def test_json_report_schema_2(report, probe):
    data = json.loads(json.dumps(report_to_json(report, step=7), allow_nan=False))  # strict JSON: no NaN
    assert SCHEMA_VERSION == 2 and data["schema_version"] == 2 and data["step"] == 7
    assert set(data) == JSON_TOP | {"step"}
    for field in (*HEADLINE_FIELDS, "level", "n_resamples", "seed"):
        assert data[field] == report[field], field
    assert data["prompt_digest"] == probe.prompt_digest and re.fullmatch(r"[0-9a-f]{64}", data["prompt_digest"])
    rows = {row["foundation"]: row for row in data["table"]}
    for foundation, row in report["table"].iterrows():
        for metric in METRICS:
            for col in (metric, f"{metric}_lo", f"{metric}_hi"):
                assert rows[foundation][col] == pytest.approx(row[col], abs=0), (foundation, col)
    assert {(s["id"]) for s in data["scenarios"]} == set(probe.meta["id"])


def test_same_seed_same_json_other_seed_other_intervals(probe, qwen_tok):
    res = made_up_scores(probe, seed=3)
    first = report_to_json(probe.report(res, elapsed=1.0))
    again = report_to_json(Probe(qwen_tok, "scifi").report(res, elapsed=1.0))
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    other = report_to_json(Probe(qwen_tok, "scifi", seed=1).report(res, elapsed=1.0))
    assert other["score"] == first["score"] and other["score_lo"] != first["score_lo"]
    assert other["score_lo"] == pytest.approx(first["score_lo"], abs=0.02)


def test_sanity_lines_show_each_headline_interval_and_the_level_once(report):
    text = "\n".join(sanity_lines(report))
    number = r"[+-]\d\.\d{3}"
    for label, name in (("score", "score"), ("gap", "gap"), ("social-norms control", "sn"),
                        ("score minus control", "score_minus_sn")):
        match = re.search(rf"{label}=({number}) \[({number}), ({number})\]", text)
        assert match, label
        shown = [float(x) for x in match.groups()]
        assert shown == pytest.approx([report[name], report[f"{name}_lo"], report[f"{name}_hi"]], abs=5e-4), label
    assert text.count("95% intervals") == 1 and "2000 times, seed 0" in text


def test_intervals_off_with_zero_resamples(probe, qwen_tok):
    off = Probe(qwen_tok, "scifi", n_resamples=0)
    res = made_up_scores(probe)
    rep = off.report(res, elapsed=1.0)
    assert rep["level"] is None and rep["n_resamples"] == 0
    assert all(rep[f"{name}_{b}"] is None for name in HEADLINE for b in ("lo", "hi"))
    assert rep["score"] == probe.report(res, elapsed=1.0)["score"]
    assert rep["table"][[f"{m}_{b}" for m in METRICS for b in ("lo", "hi")]].isna().all().all()
    text = "\n".join(sanity_lines(rep))
    assert "no intervals (n_resamples=0)" in text and "[" not in text.split("score=")[1].split("\n")[0]
    assert json.dumps(report_to_json(rep), allow_nan=False)


@pytest.mark.parametrize("kwargs, needle", [
    ({"level": 1.0}, "level must be a number between 0 and 1"),
    ({"level": None}, "pass n_resamples=0"),
    ({"n_resamples": 50}, "n_resamples must be a whole number >= 100"),
    ({"n_resamples": True}, "n_resamples must be"),
])
def test_bad_interval_settings_are_refused_before_any_work(qwen_tok, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        Probe(qwen_tok, "scifi", limit=1, **kwargs)


def test_one_vignette_gives_null_bounds_never_an_error(qwen_tok):
    one = Probe(qwen_tok, "scifi", limit=1)
    rep = one.report(made_up_scores(one), elapsed=1.0)
    assert rep["score"] is not None and rep["score_lo"] is None and rep["sn"] is None
    assert np.isnan(rep["table"].loc["Care", "align_other_lo"])
    data = json.loads(json.dumps(report_to_json(rep), allow_nan=False))
    assert data["table"][0]["align_other_lo"] is None and data["score_minus_sn"] is None
    assert "score=" in "\n".join(sanity_lines(rep)) and "[n/a]" in "\n".join(sanity_lines(rep))


def test_prompt_digest_names_the_questions_asked(probe, qwen_tok):
    assert Probe(qwen_tok, "scifi").prompt_digest == probe.prompt_digest
    assert Probe(qwen_tok, "scifi", answer_prefix="A:").prompt_digest != probe.prompt_digest
    assert Probe(qwen_tok, "scifi", limit=50).prompt_digest != probe.prompt_digest


def test_history_line_has_the_fields_the_plot_reads(report, tmp_path):
    """The callback's history line carries the report's bounds under the names ``plot`` draws bands from."""
    lines = [history_line("scifi", report, report_metrics("scifi", report), step=s, epoch=None, event="evaluate")
             for s in (0, 10)]
    for field in (*HEADLINE_FIELDS, "level", "n_resamples", "seed", "prompt_digest"):
        assert lines[0][field] == report[field], field
    assert {f"{m}_{b}" for m in METRICS for b in ("lo", "hi")} <= set(lines[0]["table"][0])
    path = tmp_path / "moral_probe_scifi.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    history = load_history(path)
    assert history.level == 0.95
    for name in HEADLINE:
        series = history.headline[name]
        assert series.lo is not None and series.lo[0] == pytest.approx(report[f"{name}_lo"]), name
    care = history.foundations["Care"]["align_other"]
    assert care.hi[1] == pytest.approx(report["table"].loc["Care", "align_other_hi"])


def test_logged_scalars_hold_headline_bounds_only(report):
    metrics = report_metrics("scifi", report)
    for key, field in LOGGED_HEADLINE.items():
        for suffix in ("", "_lo", "_hi"):
            assert metrics[f"eval_moral_scifi/{key}{suffix}"] == report[f"{field}{suffix}"], key + suffix
    assert not [k for k in metrics if k.count("/") > 1 and k.endswith(("_lo", "_hi"))]  # no per-foundation bounds
