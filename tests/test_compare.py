"""compare: the paired change between two reports, and its refusals (different sets, vignettes, prompts).

Reports come from ``Probe.report`` on real prompts with made-up P(Yes) (see test_report), and from
``evaluate`` on the tiny random Qwen3 for the dict-versus-JSON check: mechanics only.
"""

import json
import math
import warnings

import numpy as np
import pytest
from helpers.reports import made_up_scores

from tinymcf_callback import compare, evaluate
from tinymcf_callback.errors import CompareError
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir.report import READABLE_SCHEMAS, SCHEMA_VERSION, report_to_json
from tinymcf_callback.stats.bootstrap import HEADLINE, METRICS


def as_json(report) -> dict:
    """A report as ``eval --model`` or the callback would store it, read back."""
    return json.loads(json.dumps(report_to_json(report), allow_nan=False))


@pytest.fixture(scope="module")
def probe(qwen_tok):
    return Probe(qwen_tok, "scifi")


@pytest.fixture(scope="module")
def before(probe):
    return probe.report(made_up_scores(probe, seed=0), elapsed=1.0)


@pytest.fixture(scope="module")
def after(probe):
    """The same vignettes with violations judged 0.15 worse (same vignette effects): the score rises by ~0.15."""
    return probe.report(made_up_scores(probe, seed=0, shift=0.15), elapsed=1.0)


def test_a_report_against_itself_changes_nothing(before):
    result = compare(before, as_json(before))
    for name in HEADLINE:
        row = result["headline"][name]
        assert abs(row["change"]) < 1e-12 and row["p"] == pytest.approx(1.0, abs=1e-9), name
        assert row["lo"] <= 0.0 <= row["hi"]
    table = result["table"]
    assert len(table) == 7 * len(METRICS) and (table["change"].abs() < 1e-12).all()
    assert np.allclose(table["p"], 1.0) and result["warnings"] == []


def test_change_is_b_minus_a_with_an_interval_and_p(before, after):
    result = compare(before, after)
    score = result["headline"]["score"]
    assert score["a"] == before["score"] and score["b"] == after["score"]
    assert score["change"] == pytest.approx(after["score"] - before["score"], abs=1e-12)
    assert 0.1 < score["change"] < 0.2 and score["lo"] < score["change"] < score["hi"] and score["p"] < 0.001
    # paired: narrower than the unpaired intervals of either report
    assert score["hi"] - score["lo"] < before["score_hi"] - before["score_lo"]
    care = result["table"].set_index(["foundation", "metric"]).loc[("Care", "align_other")]
    assert care["n"] == 9 and care["change"] == pytest.approx(
        after["table"].loc["Care", "align_other"] - before["table"].loc["Care", "align_other"], abs=1e-12)
    assert result["level"] == 0.95 and result["n_vignettes"] == 51
    narrower = compare(before, after, level=0.5)["headline"]["score"]
    assert narrower["hi"] - narrower["lo"] < score["hi"] - score["lo"]


def test_the_same_seed_gives_the_same_comparison(before, after):
    a, b = compare(before, after), compare(as_json(before), as_json(after))
    assert a["headline"] == b["headline"]
    assert a["table"].equals(b["table"])


def test_dict_from_evaluate_and_its_json_agree(tiny_qwen, qwen_tok):
    rep = evaluate(tiny_qwen, qwen_tok, "scifi", limit=3, verbose=False)
    result = compare(rep, as_json(rep))
    assert result["headline"]["score"]["change"] == 0.0 and result["headline"]["score"]["p"] == 1.0


def test_different_vignettes_are_refused_with_their_ids(qwen_tok):
    three, four = Probe(qwen_tok, "scifi", limit=3), Probe(qwen_tok, "scifi", limit=4)
    a, b = three.report(made_up_scores(three), elapsed=1.0), four.report(made_up_scores(four), elapsed=1.0)
    extra = str(four.meta["id"].iloc[-1])
    with pytest.raises(CompareError, match="different vignettes") as e:
        compare(a, as_json(b))
    assert extra in str(e.value) and "--limit" in str(e.value) and "3 and 4" in str(e.value)


def test_different_prompts_are_refused_saying_which(qwen_tok):
    answer, short = Probe(qwen_tok, "scifi", limit=3), Probe(qwen_tok, "scifi", limit=3, answer_prefix="A:")
    a, b = answer.report(made_up_scores(answer), elapsed=1.0), short.report(made_up_scores(short), elapsed=1.0)
    with pytest.raises(CompareError, match="different prompt texts") as e:
        compare(as_json(a), as_json(b))
    message = str(e.value)
    assert a["prompt_digest"][:12] in message and b["prompt_digest"][:12] in message
    assert "Answer:'" in message and "A:'" in message and "answer_prefix" in message


def test_different_sets_are_refused(qwen_tok, generated_clifford, before):
    from tinymcf_callback.cli.main import main as tinymcf
    from tinymcf_callback.data.home import folders

    generated_clifford.install_rewrites(folders().cache)
    assert tinymcf(["prepare", "--name", "clifford", "--source", str(generated_clifford.path),
                         "--allow-checksum-change"]) == 0
    other = Probe(qwen_tok, "clifford", limit=3)
    with pytest.raises(CompareError, match="set 'scifi' and B of set 'clifford'"):
        compare(before, other.report(made_up_scores(other), elapsed=1.0))


def schema_1(report) -> dict:
    """A report as version 1 wrote it: no bounds, no score_minus_sn, no digest, no interval settings."""
    data = as_json(report)
    for key in [k for k in data if k.endswith(("_lo", "_hi")) or k in ("score_minus_sn", "prompt_digest", "level",
                                                                       "n_resamples", "seed")]:
        del data[key]
    data["table"] = [{k: v for k, v in row.items() if not k.endswith(("_lo", "_hi"))} for row in data["table"]]
    return {**data, "schema_version": 1}


def test_schema_1_is_accepted_with_a_warning_when_the_vignettes_match(before, after, qwen_tok):
    with pytest.warns(UserWarning, match="prompts could not be checked"):
        result = compare(schema_1(before), after)
    assert result["headline"]["score_minus_sn"]["change"] == pytest.approx(
        after["score_minus_sn"] - before["score_minus_sn"], abs=1e-12)
    assert result["warnings"] and "A has no prompt_digest" in result["warnings"][0]
    three = Probe(qwen_tok, "scifi", limit=3)
    with pytest.raises(CompareError, match="different vignettes"), warnings.catch_warnings():
        warnings.simplefilter("error")
        compare(schema_1(before), three.report(made_up_scores(three), elapsed=1.0))


def test_unknown_schema_and_edited_reports_are_refused(before, after):
    assert SCHEMA_VERSION in READABLE_SCHEMAS
    with pytest.raises(CompareError, match="schema_version 3.*upgrade"):
        compare({**as_json(before), "schema_version": 3}, after)
    edited = as_json(after)
    edited["score"] += 0.01
    with pytest.raises(CompareError, match="edited or damaged"):
        compare(before, edited)
    with pytest.raises(CompareError, match="has no scenarios"):
        compare({k: v for k, v in as_json(before).items() if k != "scenarios"}, after)
    with pytest.raises(CompareError, match="n_resamples"):
        compare(before, after, n_resamples=0)


def test_undefined_changes_are_none_not_errors(qwen_tok):
    one = Probe(qwen_tok, "scifi", limit=1)  # one vignette: no spread, no control
    a, b = (one.report(made_up_scores(one, seed=s), elapsed=1.0) for s in (0, 1))
    result = compare(a, b)
    assert result["headline"]["score"]["change"] is not None and result["headline"]["score"]["p"] is None
    assert result["headline"]["sn"] == {"a": None, "b": None, "change": None, "lo": None, "hi": None, "p": None}
    assert math.isnan(result["table"]["lo"].iloc[0])


def test_a_target_adds_selectivity_in_the_result_and_the_text(probe, before, capsys, tmp_path):
    from tinymcf_callback.cli.main import main
    from tinymcf_callback.rundir.report import write_report
    from tinymcf_callback.views.comparison import format_comparison

    # B: Care's violations judged 0.3 worse, nothing else moved (the same vignette effects and noise)
    res = made_up_scores(probe, seed=0)
    care = (probe.meta["foundation_coarse"] == "Care") & probe.meta["condition"].str.endswith("violate")
    wrong = probe.meta["frame"] == "wrong"
    res.p_yes = res.p_yes.copy()
    res.p_yes[care & wrong] = np.clip(res.p_yes[care & wrong] + 0.15, 0, 1)
    res.p_yes[care & ~wrong] = np.clip(res.p_yes[care & ~wrong] - 0.15, 0, 1)
    after_care = probe.report(res, elapsed=1.0)
    result = compare(before, after_care, target="Care")
    sel = result["selectivity"]
    moved = after_care["table"]["align_other"] - before["table"]["align_other"]
    assert sel["target"] == "Care" and len(sel["off_target_foundations"]) == 5
    assert sel["on_target"]["change"] == pytest.approx(moved["Care"], abs=1e-12) and moved["Care"] > 0.1
    assert sel["off_target"]["change"] == pytest.approx(0.0, abs=1e-12)
    assert sel["selectivity"]["change"] == pytest.approx(moved["Care"], abs=1e-12)
    assert sel["selectivity"]["lo"] > 0 and sel["selectivity"]["p"] < 0.05
    assert "selectivity" not in compare(before, after_care)
    text = format_comparison(result)
    assert "selectivity of Care" in text and "on - off target" in text
    with pytest.raises(CompareError, match="selectivity of 'Care': .* no real foundation besides Care"):
        care_only = Probe(probe.tok, "scifi", limit=9)  # the first 9 of scifi: Care only
        compare(*(care_only.report(made_up_scores(care_only, seed=0, shift=d)) for d in (0.0, 0.1)), target="Care")

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_report(a, before)
    write_report(b, after_care)
    assert main(["compare", str(a), str(b), "--target", "Care"]) == 0
    assert "on - off target" in capsys.readouterr().out



def test_a_report_of_near_zero_scores_against_itself_has_a_defined_interval_and_p(tiny_qwen, qwen_tok):
    """A random tiny model scores every vignette near 0: the paired change's variance is rounding noise that cancels
    (and its Welch-Satterthwaite df with it); the change is known exactly: 0, its interval [0, 0], p 1."""
    report = Probe(qwen_tok, "scifi", per_foundation=2).run(tiny_qwen)
    assert abs(report["score"]) < 1e-2
    result = compare(report, as_json(report))
    for name in HEADLINE:
        row = result["headline"][name]
        assert row["change"] == 0.0 and row["lo"] == row["hi"] == 0.0 and row["p"] == 1.0, (name, row)
