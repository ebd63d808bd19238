"""stats: bootstrap intervals and paired changes, checked by simulation against known truths (no model)."""

import math

import numpy as np
import pandas as pd
import pytest

from tinymcf_callback import FRAMES, analyse
from tinymcf_callback.data.sets import CONDITIONS, CONTROL, FOUNDATIONS, REAL_FOUNDATIONS
from tinymcf_callback.stats.bootstrap import (
    HEADLINE,
    METRICS,
    VignetteScores,
    bootstrap_intervals,
    paired_change,
    t_cdf,
    t_quantile,
    vignette_scores,
)

# vignettes per coarse foundation in the two built-in sets
SCIFI = {"Care": 9, "Fairness": 7, "Loyalty": 7, "Authority": 7, "Sanctity": 7, "Liberty": 7, "Social Norms": 7}
CLIFFORD = {"Care": 32, "Fairness": 17, "Loyalty": 16, "Authority": 17, "Sanctity": 17, "Liberty": 17,
            "Social Norms": 16}
# true mean s per condition (CONDITIONS order): the real foundations differ, the control is near 0
TRUE_MEANS = {f: np.array([0.20 + 0.05 * k, -0.25 + 0.03 * k, 0.10 + 0.04 * k, -0.15]) for k, f in
              enumerate(REAL_FOUNDATIONS)}
TRUE_MEANS[CONTROL] = np.array([0.05, 0.0, -0.05, 0.02])
N_SIM = 400


def _truth(means: dict) -> dict:
    """The population values of the headline numbers and of each foundation's align_other."""
    other = {f: m[0] - m[1] for f, m in means.items()}
    gap = {f: (m[0] - m[1]) - (m[2] - m[3]) for f, m in means.items()}
    score = np.mean([other[f] for f in REAL_FOUNDATIONS])
    return {"score": score, "gap": np.mean([gap[f] for f in REAL_FOUNDATIONS]), "sn": other[CONTROL],
            "score_minus_sn": score - other[CONTROL], **{f"{f}/align_other": other[f] for f in FOUNDATIONS}}


def _skewed(rng, shape):
    """Mean-0, right-skewed, bounded noise: 2 * (Beta(2, 5) - 2/7), in [-0.57, 1.43]."""
    return 2.0 * (rng.beta(2.0, 5.0, size=shape) - 2.0 / 7.0)


def _vignettes(rng, sizes: dict, means: dict, scale: float = 0.25):
    """Per-vignette s: the true means + a shared vignette effect (all four conditions) + per-condition noise."""
    foundation = np.repeat(list(sizes), list(sizes.values()))
    mu = np.stack([means[f] for f in foundation])
    n = len(foundation)
    return foundation, mu + scale * (_skewed(rng, (n, 1)) + _skewed(rng, (n, 4)))


def _data(foundation, s) -> VignetteScores:
    return VignetteScores(np.array([f"v{i}" for i in range(len(s))]), foundation, s)


def _covered(result: dict, truth: dict) -> dict:
    picks = {name: result["headline"][name] for name in HEADLINE}
    picks.update({f"{f}/align_other": result["foundations"][f]["align_other"] for f in FOUNDATIONS})
    return {k: iv.lo <= truth[k] <= iv.hi for k, iv in picks.items()}


@pytest.mark.slow  # a coverage simulation: hundreds of seeded data sets
@pytest.mark.parametrize("sizes", [SCIFI, CLIFFORD], ids=["scifi_sized", "clifford_sized"])
def test_95_percent_intervals_cover_the_truth_95_percent_of_the_time(sizes):
    # 400 simulations: the coverage's standard error is 1.1%, so 95 +- 3% is a ~2.7 sigma band
    truth = _truth(TRUE_MEANS)
    rng = np.random.default_rng(8)
    hits = []
    for i in range(N_SIM):
        foundation, s = _vignettes(rng, sizes, TRUE_MEANS)
        hits.append(_covered(bootstrap_intervals(_data(foundation, s), seed=i), truth))
    coverage = {k: np.mean([h[k] for h in hits]) for k in hits[0]}
    for key in ("score", "gap", "sn", "score_minus_sn", "Fairness/align_other", "Care/align_other"):
        assert 0.92 <= coverage[key] <= 0.98, (key, coverage)


def _pair(rng, sizes: dict, shift: np.ndarray, noise_a: float = 0.08, noise_b: float = 0.12):
    """Two reports of the same vignettes: shared per-vignette profiles, own noise, B's true means + ``shift``."""
    foundation, profile = _vignettes(rng, sizes, TRUE_MEANS)
    n = len(profile)
    a = profile + noise_a * _skewed(rng, (n, 4))
    b = profile + shift + noise_b * _skewed(rng, (n, 4))
    return _data(foundation, a), _data(foundation, b)


@pytest.mark.slow  # a coverage simulation: hundreds of seeded data sets
@pytest.mark.parametrize("sizes", [SCIFI, CLIFFORD], ids=["scifi_sized", "clifford_sized"])
def test_paired_change_rejects_5_percent_under_no_change_and_always_under_a_large_one(sizes):
    # 400 null simulations: the rejection rate's standard error is 1.1%; 2%..8% is a ~2.7 sigma band
    rng = np.random.default_rng(9)
    none = np.zeros(4)
    rejected = {"score": 0, "score_minus_sn": 0, "Fairness/align_other": 0}
    for i in range(N_SIM):
        out = paired_change(*_pair(rng, sizes, none), seed=i)
        rejected["score"] += out["headline"]["score"].p < 0.05
        rejected["score_minus_sn"] += out["headline"]["score_minus_sn"].p < 0.05
        rejected["Fairness/align_other"] += out["foundations"]["Fairness"]["align_other"].p < 0.05
    rates = {k: v / N_SIM for k, v in rejected.items()}
    for key, rate in rates.items():
        assert 0.02 <= rate <= 0.08, (key, rates)

    large = np.array([0.3, 0.0, 0.0, 0.0])  # other_violate judged worse: align_other +0.3 everywhere
    powered = [paired_change(*_pair(rng, sizes, large), seed=i) for i in range(50)]
    assert all(o["headline"]["score"].p < 0.05 for o in powered)
    assert np.mean([o["foundations"]["Fairness"]["align_other"].p < 0.05 for o in powered]) >= 0.95
    assert all(o["headline"]["score"].lo > 0 for o in powered)


def test_p_value_agrees_with_the_interval():
    rng = np.random.default_rng(3)
    out = [paired_change(*_pair(rng, SCIFI, np.array([0.05, 0.0, 0.0, 0.0])), seed=i) for i in range(30)]
    changes = [o["headline"][h] for o in out for h in HEADLINE] + \
              [o["foundations"][f][m] for o in out for f in FOUNDATIONS for m in METRICS]
    assert {c.p < 0.05 for c in changes} == {True, False}  # both outcomes occur, so the check means something
    for c in changes:
        assert (c.p < 0.05) == (c.lo > 0 or c.hi < 0), c
        assert c.lo <= c.change <= c.hi


def test_bootstrap_standard_error_matches_the_classical_one():
    # complete data: align_other is the mean of per-vignette differences, its t interval is textbook
    rng = np.random.default_rng(4)
    foundation, s = _vignettes(rng, SCIFI, TRUE_MEANS)
    out = bootstrap_intervals(_data(foundation, s), n_resamples=20000, seed=1)
    se2 = {}
    for f in FOUNDATIONS:
        d = s[foundation == f, 0] - s[foundation == f, 1]
        n = len(d)
        se2[f] = d.var(ddof=1) / n
        half = t_quantile(0.975, n - 1) * math.sqrt(se2[f])
        iv = out["foundations"][f]["align_other"]
        assert iv.estimate == pytest.approx(d.mean(), abs=1e-12)
        assert (iv.hi - iv.lo) / 2 == pytest.approx(half, rel=0.03), f
    # score: a mean of 6 independent foundation means; Welch-Satterthwaite degrees of freedom
    terms = np.array([se2[f] / 36 for f in REAL_FOUNDATIONS])
    df = terms.sum() ** 2 / sum(t * t / (SCIFI[f] - 1) for t, f in zip(terms, REAL_FOUNDATIONS, strict=True))
    iv = out["headline"]["score"]
    assert (iv.hi - iv.lo) / 2 == pytest.approx(t_quantile(0.975, df) * math.sqrt(terms.sum()), rel=0.03)


def _meta(vignettes):
    return pd.DataFrame([{"id": vid, "foundation": f, "foundation_coarse": f, "condition": c, "frame": fr}
                         for vid, f in vignettes for c in CONDITIONS for fr in FRAMES])


def test_estimates_are_analyses_and_undefined_intervals_are_nan():
    # Loyalty has one vignette, Liberty none, and three P(Yes) are missing
    sizes = {"Care": 5, "Fairness": 3, "Loyalty": 1, "Authority": 4, "Sanctity": 2, "Social Norms": 3}
    meta = _meta([(f"{f}{i}", f) for f, n in sizes.items() for i in range(n)])
    rng = np.random.default_rng(5)
    p_yes = rng.uniform(0, 1, len(meta))
    p_yes[[3, 17, 40]] = np.nan
    report = analyse(p_yes, meta)
    out = bootstrap_intervals(vignette_scores(report["scenarios"]))
    for f in report["table"].index:
        for m in METRICS:
            assert out["foundations"][f][m].estimate == pytest.approx(report["table"].loc[f, m], abs=1e-12)
    for name in ("score", "gap", "sn"):
        assert out["headline"][name].estimate == pytest.approx(report[name], abs=1e-12)
    assert out["n"] == {**{f: 0 for f in FOUNDATIONS}, **sizes}
    assert all(math.isnan(v) for iv in out["foundations"]["Liberty"].values() for v in iv)
    loyalty = out["foundations"]["Loyalty"]["align_other"]
    assert np.isfinite(loyalty.estimate) and math.isnan(loyalty.lo) and math.isnan(loyalty.hi)
    # the score averages Loyalty, whose spread cannot be measured: its interval is undefined too
    assert math.isnan(out["headline"]["score"].lo)
    sn = out["headline"]["sn"]
    assert sn.lo < sn.estimate < sn.hi  # the control has 3 vignettes
    pair = paired_change(vignette_scores(report["scenarios"]), vignette_scores(report["scenarios"]))
    assert math.isnan(pair["foundations"]["Loyalty"]["align_other"].p)
    assert pair["foundations"]["Care"]["align_other"] == (0.0, 0.0, 0.0, 1.0)


def test_absent_foundation_leaves_the_other_intervals_defined():
    rng = np.random.default_rng(6)
    sizes = {f: n for f, n in SCIFI.items() if f != "Liberty"}
    out = bootstrap_intervals(_data(*_vignettes(rng, sizes, TRUE_MEANS)))
    assert all(math.isnan(v) for v in out["foundations"]["Liberty"]["align_other"])
    assert all(np.isfinite(v) for iv in out["headline"].values() for v in iv)
    empty = VignetteScores(np.array([]), np.array([]), np.zeros((0, 4)))
    assert all(math.isnan(v) for c in paired_change(empty, empty)["headline"].values() for v in c)


def test_same_seed_same_intervals_other_seed_slightly_different():
    rng = np.random.default_rng(7)
    data = _data(*_vignettes(rng, SCIFI, TRUE_MEANS))
    a, b, c = (bootstrap_intervals(data, seed=s) for s in (11, 11, 12))
    assert a == b
    assert a["headline"]["score"] != c["headline"]["score"]
    assert a["headline"]["score"].estimate == c["headline"]["score"].estimate
    assert a["headline"]["score"].lo == pytest.approx(c["headline"]["score"].lo, abs=0.02)
    pa, pb = _pair(rng, SCIFI, np.zeros(4))
    assert paired_change(pa, pb, seed=3) == paired_change(pa, pb, seed=3)
    assert paired_change(pa, pb, seed=3) != paired_change(pa, pb, seed=4)


def test_level_and_resamples_are_configurable_and_checked():
    rng = np.random.default_rng(8)
    data = _data(*_vignettes(rng, SCIFI, TRUE_MEANS))
    wide, narrow = bootstrap_intervals(data, level=0.99), bootstrap_intervals(data, level=0.5)
    w, n = wide["headline"]["score"], narrow["headline"]["score"]
    assert w.lo < n.lo < n.hi < w.hi
    assert bootstrap_intervals(data, n_resamples=500)["n_resamples"] == 500
    with pytest.raises(ValueError, match="level"):
        bootstrap_intervals(data, level=95)
    with pytest.raises(ValueError, match="n_resamples"):
        paired_change(data, data, n_resamples=10)


def test_intervals_stay_within_the_possible_range():
    rng = np.random.default_rng(9)
    foundation = np.repeat(list(SCIFI), list(SCIFI.values()))
    s = np.clip(np.tile([1.0, -1.0, 1.0, -1.0], (len(foundation), 1)) + rng.normal(0, 0.3, (len(foundation), 4)), -1, 1)
    out = bootstrap_intervals(_data(foundation, s))
    for f in FOUNDATIONS:
        iv = out["foundations"][f]["align_other"]
        assert -2.0 <= iv.lo <= iv.estimate <= iv.hi <= 2.0
    assert out["headline"]["score"].hi <= 2.0


def test_a_uniform_shift_is_certain_only_when_paired():
    rng = np.random.default_rng(10)
    a = _data(*_vignettes(rng, SCIFI, TRUE_MEANS))
    b = VignetteScores(a.id, a.foundation_coarse, a.s + np.array([0.1, 0.0, 0.0, 0.0]))
    score = paired_change(a, b)["headline"]["score"]
    assert score.change == pytest.approx(0.1)
    assert score.lo == pytest.approx(0.1) and score.hi == pytest.approx(0.1) and score.p == 0.0
    # resampling the two reports independently would not cancel the vignettes' own spread
    unpaired = bootstrap_intervals(a)["headline"]["score"]
    assert unpaired.hi - unpaired.lo > 0.05


def test_pairing_follows_ids_not_row_order():
    rng = np.random.default_rng(11)
    a, b = _pair(rng, SCIFI, np.array([0.1, 0.0, 0.0, 0.0]))
    perm = rng.permutation(len(b.s))
    shuffled = VignetteScores(b.id[perm], b.foundation_coarse[perm], b.s[perm])
    assert paired_change(a, b, seed=2) == paired_change(a, shuffled, seed=2)


def test_reports_of_different_vignettes_are_refused_with_the_ids():
    rng = np.random.default_rng(12)
    a, b = _pair(rng, SCIFI, np.zeros(4))
    other = VignetteScores(np.array([*b.id[:-1], "v_new"]), b.foundation_coarse, b.s)
    with pytest.raises(ValueError, match=r"different vignettes.*v50.*v_new"):
        paired_change(a, other)
    moved = b.foundation_coarse.copy()
    moved[0] = "Liberty"
    with pytest.raises(ValueError, match=r"different coarse foundation.*v0"):
        paired_change(a, VignetteScores(b.id, moved, b.s))


def test_vignette_scores_from_analyse_scenarios():
    meta = _meta([("x", "Care"), ("y", "Care"), ("z", "Social Norms")])
    meta = meta[~((meta.id == "y") & (meta.condition == "self_uphold"))]  # y lacks one condition
    p_yes = np.linspace(0.1, 0.9, len(meta))
    p_yes[2] = np.nan  # x, other_uphold, first frame
    report = analyse(p_yes, meta)
    data = vignette_scores(report["scenarios"])
    assert list(data.id) == ["x", "y", "z"] and list(data.foundation_coarse) == ["Care", "Care", "Social Norms"]
    assert math.isnan(data.s[1, 3]) and np.isfinite(data.s[1, :3]).all()
    assert math.isnan(data.s[0, 1]) and np.isfinite(data.s[0, [0, 2, 3]]).all()
    row = report["scenarios"].set_index(["id", "condition"])["s"]
    assert data.s[0, 0] == row[("x", "other_violate")]
    records = report["scenarios"].astype(object).where(report["scenarios"].notna(), None).to_dict("records")
    from_json = vignette_scores(records)  # a JSON report's scenarios: missing s is null
    assert np.array_equal(from_json.s, data.s, equal_nan=True) and list(from_json.id) == list(data.id)
    with pytest.raises(ValueError, match="repeats"):
        vignette_scores(pd.concat([report["scenarios"], report["scenarios"].iloc[:1]]))
    with pytest.raises(ValueError, match="unknown coarse foundation"):
        VignetteScores(np.array(["a"]), np.array(["Honesty"]), np.zeros((1, 4)))


def test_t_distribution_matches_closed_forms_and_tables():
    """scipy's Student t (since issue 50; before it, the package's own continued fraction and Newton steps): the
    closed forms of 1 and 2 degrees of freedom to float precision, the tables' quantiles, and the numbers the
    package's own code gave, unchanged."""
    for t in (-3.0, -0.4, 0.0, 1.3, 12.0, 40.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-15)  # Cauchy; measured 1.1e-16
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-15)
    for p in (0.6, 0.9, 0.975, 0.9925, 0.9999):
        # tan(pi (p - 1/2)) near p = 1 loses digits of its own: 5e-13 measured at p = 0.9999
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-14)
    for df, q in ((1, 12.706204736), (4, 2.776445105), (6, 2.446911851), (30, 2.042272456), (math.inf, 1.959963985)):
        assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-8)
    assert t_cdf(t_quantile(0.995, 7.3), 7.3) == pytest.approx(0.995, abs=1e-14)  # non-integer df (Welch)
    assert t_quantile(0.975, 7) < t_quantile(0.975, 6.5) < t_quantile(0.975, 6)
    # what the package's own t gave (per-look levels of 99% and 98.5%, Welch's non-integer df): over df <= 100 and
    # p in [0.75, 0.99999] the two differ by at most 2.7e-12 relative in a quantile and 2.1e-14 in a probability
    before = {(0.995, 7.3): 3.451031655622182, (0.975, 2.5): 3.574654842003678, (0.9925, 13.0): 2.801034161832436}
    for (p, df), q in before.items():
        assert t_quantile(p, df) == pytest.approx(q, rel=3e-12)
    with pytest.raises(ValueError, match="0 < p < 1"):
        t_quantile(1.0, 3)


# --- selectivity: did the target move beyond the others? --------------------------------------

def _moved(base: VignetteScores, shifts: dict[str, float]) -> VignetteScores:
    """``base`` with other_violate moved up by ``shifts[f]`` for the vignettes of foundation ``f``."""
    s = base.s.copy()
    for f, d in shifts.items():
        s[base.foundation_coarse == f, 0] += d
    return VignetteScores(base.id, base.foundation_coarse, s)


def _base(rng, per=6) -> VignetteScores:
    fnd = np.repeat(np.array(list(FOUNDATIONS), dtype=object), per)
    return VignetteScores(np.array([f"v{i}" for i in range(len(fnd))]), fnd, rng.uniform(-0.5, 0.5, (len(fnd), 4)))


def test_selectivity_is_the_target_change_minus_the_mean_of_the_others():
    from tinymcf_callback.stats.bootstrap import selectivity

    a = _base(np.random.default_rng(0))
    # Care +0.3, Fairness +0.1, Loyalty -0.1, the control +0.5 (left out), the rest 0: others' mean 0.0
    b = _moved(a, {"Care": 0.3, "Fairness": 0.1, "Loyalty": -0.1, CONTROL: 0.5})
    out = selectivity(a, b, "Care", n_resamples=500)
    assert out["on_target"].change == pytest.approx(0.3)
    assert out["off_target"].change == pytest.approx(0.0, abs=1e-12)
    assert out["selectivity"].change == pytest.approx(0.3)
    assert out["off_target_foundations"] == [f for f in REAL_FOUNDATIONS if f != "Care"]
    # the shifts are exact, per vignette: no spread in the change, so the intervals are points and p ~ 0
    sel = out["selectivity"]
    assert sel.lo == pytest.approx(0.3) and sel.hi == pytest.approx(0.3) and sel.p < 1e-6
    # a uniform move of every foundation is not selective
    even = selectivity(a, _moved(a, {f: 0.2 for f in REAL_FOUNDATIONS}), "Care", n_resamples=500)
    assert even["on_target"].change == pytest.approx(0.2)
    assert even["selectivity"].change == pytest.approx(0.0, abs=1e-12)


def test_selectivity_interval_covers_zero_when_only_noise_moves():
    from tinymcf_callback.stats.bootstrap import selectivity

    rng = np.random.default_rng(1)
    covered = 0
    for i in range(40):
        a = _base(rng)
        b = VignetteScores(a.id, a.foundation_coarse, a.s + rng.normal(0.0, 0.1, a.s.shape))
        sel = selectivity(a, b, "Authority", n_resamples=300, seed=i)["selectivity"]
        covered += sel.lo <= 0.0 <= sel.hi
        assert (sel.p < 0.05) == (not sel.lo <= 0.0 <= sel.hi) or abs(sel.p - 0.05) < 0.02
    assert covered >= 34  # 95% intervals: ~38 of 40


def test_selectivity_refuses_what_it_cannot_measure():
    from tinymcf_callback.stats.bootstrap import selectivity

    a = _base(np.random.default_rng(2))
    with pytest.raises(ValueError, match="not one of the real foundations"):
        selectivity(a, a, CONTROL)
    only_care = VignetteScores(a.id[:6], a.foundation_coarse[:6], a.s[:6])
    with pytest.raises(ValueError, match="besides Care"):
        selectivity(only_care, only_care, "Care")
    no_care = VignetteScores(a.id[6:], a.foundation_coarse[6:], a.s[6:])
    with pytest.raises(ValueError, match="no Care vignettes"):
        selectivity(no_care, no_care, "Care")
