"""Where the intervals show: the report dict, the JSON report (schema 2), the sanity lines, the history line.

The reports come from ``Probe.report`` on the real ``scifi`` prompts (Qwen3 tokenizer) with made-up
per-prompt P(Yes) of a known structure: no model is run, so every foundation (and the control) has
several vignettes and real spread. The intervals are checked against the classical t interval of
each foundation's per-vignette differences, computed here from the report's own scenarios. The JSON
report is checked field by field against the package's schema (tests/helpers/report_schema.py), once as the
eval CLI writes it.
"""

import json
import math
import re

import numpy as np
import pytest
from helpers.report_schema import check_report_schema, strict_json
from helpers.reports import ENGINE_FIELDS, made_up_scores

from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.data.home import folders
from tinymcf_callback.data.sets import CONDITIONS, FOUNDATIONS, REAL_FOUNDATIONS, md5
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir.history import history_line
from tinymcf_callback.rundir.report import SCHEMA_VERSION, report_to_json
from tinymcf_callback.scoring.engine import ScoreResult
from tinymcf_callback.stats.analysis import HEADLINE_FIELDS
from tinymcf_callback.stats.bootstrap import METRICS, t_quantile
from tinymcf_callback.stats.metrics import LOGGED_HEADLINE, report_metrics, slug
from tinymcf_callback.views.curves import load_history
from tinymcf_callback.views.text import sanity_lines

HEADLINE = ("score", "gap", "sn", "score_minus_sn")

def test_the_docs_schema_tables_escape_a_bar_inside_a_cell():
    from tinymcf_callback.rundir import report as fmt

    assert "\\|" in fmt.schema_markdown("info")  # a | inside a cell is escaped, so the table stays a table


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
    check_report_schema(data, ("step",))
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
    ({"level": None}, "to switch the intervals off set the resamples to 0"),
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
    check_report_schema(data)  # null where undefined, never NaN or a missing field
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


def test_logged_scalars_hold_the_headline_bounds_and_each_foundations_align_other_bounds(report):
    metrics = report_metrics("scifi", report)
    for key, field in LOGGED_HEADLINE.items():
        for suffix in ("", "_lo", "_hi"):
            assert metrics[f"eval_moral_scifi/{key}{suffix}"] == report[f"{field}{suffix}"], key + suffix
    per_foundation = sorted(k for k in metrics if k.count("/") > 1 and k.endswith(("_lo", "_hi")))
    assert per_foundation == sorted(f"eval_moral_scifi/{slug(f)}/align_other{b}" for f in report["table"].index
                                    for b in ("_lo", "_hi"))  # the band a dashboard draws; align_self's: tables only
    for foundation, row in report["table"].iterrows():
        assert metrics[f"eval_moral_scifi/{slug(foundation)}/align_other_lo"] == row["align_other_lo"]
        assert metrics[f"eval_moral_scifi/{slug(foundation)}/align_other_hi"] == row["align_other_hi"]


def test_eval_cli_report_has_the_whole_documented_schema(tiny_qwen, qwen_tok, tmp_path):
    """``eval --model`` as written to disk (tiny random Qwen3: mechanics): every field, type and relation.

    Two vignettes keep it fast; the all-foundations report above goes through the same ``report_to_json``
    (``test_json_report_schema_2``), and here ``sn`` and the one-foundation bounds are null, as documented.
    """
    model_dir = tmp_path / "tiny"
    tiny_qwen.save_pretrained(model_dir)
    qwen_tok.save_pretrained(model_dir)
    assert tinymcf(["eval", "--model", str(model_dir), "--limit", "2", "--device", "cpu", "--out", str(tmp_path),
                      "--tag", "t", "--no-progress", "--n-resamples", "200"]) == 0
    data = strict_json((tmp_path / "eval_scifi_t.json").read_text())
    check_report_schema(data, ("tag",))
    assert (data["name"], data["tag"], data["model"], data["device"], data["dtype"]) == (
        "scifi", "t", str(model_dir), "cpu", "float32")
    assert (data["level"], data["n_resamples"], data["seed"]) == (0.95, 200, 0)
    assert [row["foundation"] for row in data["table"]] == ["Care"] and len(data["prompts"]) == 16
    assert data["sn"] is None and data["score_minus_sn"] is None and data["score_lo"] <= data["score"]
    assert data["prompt_digest"] == Probe(qwen_tok, "scifi", 2).prompt_digest


# ---- the human-correlation warning -----------------------------------------------------------------------
def rated_set(name: str = "rated", per_foundation: int = 3) -> list[float]:
    """A set with human wrongness ratings, registered in the test's home with its rewrites; the ratings."""
    f = folders()
    for d in (f.sets, f.cache):
        d.mkdir(parents=True, exist_ok=True)
    rows, cache = [], []
    for k, foundation in enumerate(FOUNDATIONS):
        for i in range(per_foundation):
            text = f"You see person {i} of group {k} doing something odd."
            rows.append({"id": md5(text), "foundation": foundation, "foundation_coarse": foundation, "text": text,
                         "wrong": round(0.5 + 0.45 * ((7 * k + 3 * i) % 8), 2)})
            for condition in CONDITIONS[1:]:
                rewrite = "You see them help." if condition == "other_uphold" else "You help."
                cache.append({"source_md5": md5(text), "condition": condition, "text": rewrite, "producer": "test",
                              "rules_version": 2})
    (f.sets / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (f.sets / f"{name}.json").write_text(json.dumps({"description": "rated", "source": "user", "human_ratings": True,
                                                     "rows": len(rows), "format": "jsonl"}))
    (f.cache / f"{name}.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cache))
    return [r["wrong"] for r in rows]


def scores_correlated_with(probe: Probe, ratings: list[float], r: float) -> ScoreResult:
    """P(Yes) whose s(other_violate) correlates exactly ``r`` with ``ratings`` (other conditions: s = 0)."""
    x = np.asarray(ratings) - np.mean(ratings)
    z = np.cos(np.arange(len(x)) * 1.7)
    z -= z.mean()
    z -= (z @ x) / (x @ x) * x  # orthogonal to the ratings and to the constant
    y = r * x / np.linalg.norm(x) + math.sqrt(1 - r * r) * z / np.linalg.norm(z)
    s_of = dict(zip(probe.meta["id"].unique(), 0.8 * y / np.abs(y).max(), strict=True))
    s = np.array([s_of[row.id] if row.condition == "other_violate" else 0.0 for row in probe.meta.itertuples()])
    p_yes = np.where(probe.meta["frame"] == "wrong", (1 + s) / 2, (1 - s) / 2)
    n = len(p_yes)
    return ScoreResult(p_yes, np.full(n, 0.9), np.ones(n, dtype=bool), [("Yes", 0.5), ("No", 0.4)], n_forward=1,
                       **ENGINE_FIELDS)


@pytest.mark.parametrize("r, warned", [(0.39, True), (0.41, False), (-0.8, True)])
def test_human_correlation_is_warned_below_0_4(qwen_tok, r, warned):
    ratings = rated_set()
    rated = Probe(qwen_tok, "rated", n_resamples=0)
    rep = rated.report(scores_correlated_with(rated, ratings, r), elapsed=1.0)
    assert rep["info"]["human_corr"] == pytest.approx(r, abs=1e-9)
    warning = f"correlation with human wrongness ratings is {r:.2f} (< 0.4)"
    assert (warning in rep["info"]["warnings"]) == warned, rep["info"]["warnings"]
    lines = sanity_lines(rep)
    assert f"[tinymcf] correlation of s(other_violate) with human wrongness = {r:.3f}" in lines
    assert (f"[tinymcf] WARNING: {warning}" in lines) == warned
    check_report_schema(strict_json(json.dumps(report_to_json(rep))), rated=True)
