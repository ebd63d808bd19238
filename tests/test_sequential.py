"""stats.sequential: the order a precision target asks in, its looks, and intervals that hold under the stopping.

No model: per-vignette scores of a known structure, and the real scifi set's foundations and ids.
"""

import math
from functools import partial

import numpy as np
import pytest

from tinymcf_callback.data.sets import CONTROL, FOUNDATIONS, REAL_FOUNDATIONS, balanced_subset, load_vignettes
from tinymcf_callback.stats.bootstrap import VignetteScores, bootstrap_intervals, paired_change
from tinymcf_callback.stats.metrics import count_tests, run_level_p, with_run_level
from tinymcf_callback.stats.sequential import (
    Boundary,
    Look,
    Schedule,
    Sequential,
    balanced_order,
    interval,
    moments,
    p_look,
    stop_reason,
)


@pytest.fixture(scope="module")
def scifi():
    vs = load_vignettes("scifi")
    return [v["id"] for v in vs], [v["foundation_coarse"] for v in vs]


def _scores(ids, foundations, rng, shift=0.0, noise=0.3, base=None):
    """Per-vignette s: a foundation mean, a vignette effect shared by the conditions, condition noise; ``base``: the
    same vignettes' earlier scores, moved by ``shift`` on the violations plus noise (a paired change)."""
    n = len(ids)
    if base is None:
        mu = np.array([[0.3, -0.2, 0.2, -0.1] if f != CONTROL else [0.05, 0.0, 0.0, 0.0] for f in foundations])
        s = mu + noise * (rng.normal(size=(n, 1)) + rng.normal(size=(n, 4)))
    else:
        s = base.s + np.array([shift, 0.0, shift, 0.0]) + noise * rng.normal(size=(n, 4))
    return VignetteScores(np.array(ids), np.array(foundations), np.clip(s, -1, 1))


def test_the_order_asks_round_by_round_and_its_prefixes_are_per_foundation_subsets(scifi):
    ids, foundations = scifi
    rows = [{"id": i, "foundation_coarse": f} for i, f in zip(ids, foundations, strict=True)]
    for seed in (0, 3):
        order = balanced_order(ids, foundations, seed)
        assert sorted(order) == list(range(len(ids)))
        schedule = Schedule.of(foundations)
        assert schedule.looks == (2, 3, 4, 5, 6, 7, 8, 9)  # Care has 9 vignettes, the others 7
        for k, n in enumerate(schedule.looks):
            prefix = {ids[i] for i in order[:schedule.vignettes(k)]}
            assert prefix == {r["id"] for r in balanced_subset(rows, n, seed)}, (seed, n)
        first_round = [foundations[i] for i in order[:7]]
        assert first_round == list(FOUNDATIONS)  # one of each, the control kept
    assert balanced_order(ids, foundations, 0) != balanced_order(ids, foundations, 1)


def test_a_looks_moments_are_the_bootstraps_without_its_noise(scifi):
    """The variance the stop uses is the one the probe's bootstrap estimates: the same interval to within the
    resampling's noise, and the very estimate the report gives."""
    ids, foundations = scifi
    rng = np.random.default_rng(0)
    a = _scores(ids, foundations, rng)
    b = _scores(ids, foundations, rng, shift=0.1, noise=0.1, base=a)
    level = moments(a, df="welch")  # the fixed-size intervals' degrees of freedom
    boot = bootstrap_intervals(a, n_resamples=20000)["headline"]["score"]
    assert level.estimate == pytest.approx(boot.estimate, abs=1e-12)
    half = (boot.hi - boot.lo) / 2
    from tinymcf_callback.stats.bootstrap import t_quantile

    assert t_quantile(0.975, level.df) * math.sqrt(level.var) == pytest.approx(half, rel=0.03)
    change = moments(b, a, df="welch")
    boot = paired_change(a, b, n_resamples=20000)["headline"]["score"]
    assert change.estimate == pytest.approx(boot.change, abs=1e-12)
    assert t_quantile(0.975, change.df) * math.sqrt(change.var) == pytest.approx((boot.hi - boot.lo) / 2, rel=0.03)
    # a look's own: the same estimate and variance, the fewest degrees of freedom (scifi's smallest foundation: 7)
    for own, welch in ((moments(a), level), (moments(b, a), change)):
        assert (own.estimate, own.var, own.df) == (welch.estimate, welch.var, 6.0) and welch.df > 6
    assert moments(a, a).var == 0.0 and moments(a, a).estimate == 0.0  # a model compared with itself


def test_the_boundary_widens_each_look_by_what_the_looks_cost_and_its_p_value_agrees(scifi):
    _, foundations = scifi
    boundary = Schedule.of(foundations).boundary()
    per_look = boundary.per_look(0.95)
    assert 0.975 < per_look < 0.995  # 8 looks: about 98.5% each so that all hold together at 95%
    one = Boundary.of(Schedule((2, 2, 2, 2, 2, 2, 2), (2,)))
    assert one.per_look(0.95) == 0.95  # one look: nothing to pay
    p_looks = [0.5, 0.1, 1 - per_look, 0.001, 1e-6]
    p_seq = [boundary.p_value(p) for p in p_looks]
    assert all(x >= p for x, p in zip(p_seq, p_looks, strict=True))
    assert p_seq == sorted(p_seq, reverse=True)
    assert p_seq[2] == pytest.approx(0.05, abs=0.002)  # at the per-look level's edge: the sequence's 5%


def test_the_change_targets_p_value_is_its_stops_and_holds_its_level_under_no_change(scifi):
    """The p-value of a change target's stop: the chance with no change of stopping on a change at least as extreme.
    Between the stopped look's own t-test and the sequence's over all 8 looks (what was reported before, larger), at
    most 1 - level exactly when the interval excludes 0, and, over null runs stopped by the probe's own rule, below
    alpha at most alpha of the time."""
    ids, foundations = scifi
    boundary = Schedule.of(foundations).boundary()
    per_look = boundary.per_look(0.95)
    for p in (0.01, 1e-3, 1e-5, 1e-9):
        stop, over_all = boundary.p_value(p, 0.95), boundary.p_value(p)
        assert p <= stop < over_all, p
    assert boundary.p_value(1e-3) > 2.5 * boundary.p_value(1e-3, 0.95)  # the old report, at a look's p of 0.001
    crossing = boundary.p_value((1 - per_look) * 0.99, 0.95)
    holding = boundary.p_value((1 - per_look) * 1.01, 0.95)
    assert crossing <= 0.05 < holding + 0.002
    assert holding == boundary.p_value((1 - per_look) * 1.01)  # an interval that holds 0: the sequence's
    # how often it falls below alpha with no change: the null populations below


def _benchmark():
    """benchmarks/adaptive.py (its null populations, the rule before issue 48) and the real rows it simulates from."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import adaptive

    return adaptive, json.loads(adaptive.ROWS.read_text())["rows"]


def test_tied_changes_never_give_p_0_and_a_model_against_itself_gives_1(scifi):
    """Every change tied (zero spread, an estimate not 0) has measured no spread: no interval, p NaN, never 0; every
    change 0 is a model against itself (the point 0, p 1); a tie in some foundations only is taken as it is."""
    ids, foundations = scifi
    n = len(ids)
    zeros = VignetteScores(np.array(ids), np.array(foundations), np.zeros((n, 4)))
    tied = VignetteScores(np.array(ids), np.array(foundations), np.column_stack([np.full(n, -0.25), np.zeros((n, 3))]))
    m = moments(tied, zeros)
    assert (m.estimate, m.var) == (-0.25, 0.0)
    assert math.isnan(p_look(m)) and all(math.isnan(x) for x in interval(m, 0.95, 4.0))
    looks, why = Sequential.of(ids, foundations, until="change", width=0.05, level=0.95).run(tied, zeros)
    assert why == "used up" and all(math.isnan(look.p) for look in looks) and looks[-1].as_dict()["p"] is None
    looks, why = Sequential.of(ids, foundations, until="change", width=0.05, level=0.95).run(zeros, zeros)
    assert why == "width" and (looks[0].lo, looks[0].hi, looks[0].p) == (0.0, 0.0, 1.0)
    some = tied.s.copy()
    some[np.array(foundations) == "Care", 0] = np.linspace(-1, 0.5, sum(f == "Care" for f in foundations))
    m = moments(VignetteScores(tied.id, tied.foundation_coarse, some), zeros)
    assert m.var > 0 and 0 < p_look(m) < 1


NULLS_BEFORE_FAILED = ("skewed, lognormal sigma 1", "asymmetric bimodal", "one foundation sd 1, the others 0.05")


def test_the_stops_p_value_holds_on_the_nulls_the_rule_before_failed():
    """The change target's stop on the null populations where the rule before (Welch-Satterthwaite df, ties p = 0)
    flagged 12-15% of the runs at 5%: 300 runs each through the probe's loop, at most 5% + two standard errors
    (7.5%); the same runs by the rule before exceed it (the bar tells them apart). The full table: the slow test."""
    adaptive, rows = _benchmark()
    bar = 0.05 + 2 * math.sqrt(0.05 * 0.95 / 300)
    for name in NULLS_BEFORE_FAILED:
        now = adaptive.null_stops(rows, name, 300)
        assert now["rejected"]["0.05"] <= bar and now["p_zero"] == 0, (name, now)
        before = adaptive.null_stops(rows, name, 300, estimate=adaptive.before_48)
        assert before["rejected"]["0.05"] > bar, (name, before)


@pytest.mark.slow  # 4,000 simulated change targets a null (about 9 s each on one core)
@pytest.mark.parametrize("name", ["Gaussian", "the real 0->10 changes, centred", "skewed, Exp(1)",
                                  "skewed, lognormal sigma 1", "asymmetric bimodal",
                                  "one foundation sd 1, the others 0.05", "bimodal +-1"])
def test_the_stops_p_value_holds_within_a_point_on_every_null(name):
    """docs/statistics.md's table, rerun (the benchmark's own runs): with no change, the share of change targets whose
    p-value is at most alpha stays within alpha + 1 point at alpha 0.01, 0.05 and 0.10. 4,000 runs: a true rate of
    7% at alpha 0.05 passes the 6% bar in 0.7% of such runs (2.5 standard errors), so it would fail here."""
    adaptive, rows = _benchmark()
    assert name in adaptive.NULLS
    result = adaptive.null_stops(rows, name, 4000)
    for alpha in adaptive.ALPHAS:
        assert result["rejected"][str(alpha)] <= alpha + 0.01, (alpha, result)
    assert result["p_zero"] == 0


def test_stop_reasons():
    look = lambda lo, hi: Look(2, 14, (lo + hi) / 2, lo, hi)  # noqa: E731
    assert stop_reason("level", 0.1, look(0.2, 0.25)) == "width"
    assert stop_reason("level", 0.1, look(0.2, 0.35)) is None
    assert stop_reason("change", 0.1, look(0.2, 0.9)) == "moved"  # excludes 0: answered, however wide
    assert stop_reason("change", 0.1, look(-0.04, 0.05)) == "width"
    assert stop_reason("change", 0.1, look(-0.3, 0.3)) is None
    assert stop_reason("level", 0.1, look(math.nan, math.nan)) is None


def _coverage(ids, foundations, *, until, width, naive=False, n_sim=400):
    """Simulated probes of fresh vignette draws (each its own random order): how often the interval at the stop
    covers the population's value, and the mean vignettes asked. ``naive``: each look's interval the fixed-size
    one (95%, Welch-Satterthwaite's degrees of freedom)."""
    rng = np.random.default_rng(11)
    covered, asked = 0, []
    truth = np.mean([0.3 - (-0.2) for _ in REAL_FOUNDATIONS]) if until == "level" else 0.0
    for sim in range(n_sim):
        seq = Sequential.of(ids, foundations, until=until, width=width, level=0.95, seed=sim)
        if naive:
            seq.per_look, seq.estimate = 0.95, partial(moments, df="welch")
        a = _scores(ids, foundations, rng, noise=0.35)
        b = _scores(ids, foundations, rng, shift=0.0, noise=0.15, base=a) if until == "change" else None
        looks, _ = seq.run(b, a) if b is not None else seq.run(a)
        covered += looks[-1].lo <= truth <= looks[-1].hi
        asked.append(looks[-1].vignettes)
    return covered / n_sim, float(np.mean(asked))


@pytest.mark.parametrize("until,width", [("level", 0.45), ("change", 0.2)])
def test_intervals_keep_their_coverage_under_the_stopping_where_fixed_ones_do_not(scifi, until, width):
    """Stopping at the first narrow interval: the fixed 95% interval at the stop covers the truth less often than
    95% (a narrow interval is more often one whose spread was underestimated); the sequence's keeps it."""
    ids, foundations = scifi
    naive, asked_naive = _coverage(ids, foundations, until=until, width=width, naive=True)
    held, asked = _coverage(ids, foundations, until=until, width=width)
    assert held >= 0.93, held  # 400 simulations: 95% +- 2.2% (two standard errors)
    assert naive < held - 0.02, (naive, held)
    assert 14 <= asked < len(ids)  # it does stop early, later than the naive rule
    assert asked_naive <= asked


def test_the_run_level_p_spends_alpha_over_any_number_of_tests():
    assert run_level_p(0.01, 1) == pytest.approx(0.02)
    assert run_level_p(0.01, 4) == pytest.approx(0.2)
    assert run_level_p(0.2, 9) == 1.0
    assert math.isnan(run_level_p(math.nan, 1))
    # a run of 30 probes that never moves: correlated per-step p-values (each step's change shares the vignettes'
    # drift); the per-step rule flags many such runs, the run-level rule at most 5%
    rng = np.random.default_rng(5)
    from statistics import NormalDist

    step_flags = run_flags = 0
    for _ in range(2000):
        z = np.cumsum(rng.normal(size=30)) / np.sqrt(np.arange(1, 31))  # a random walk's standardised means
        p = [2 * (1 - NormalDist().cdf(abs(x))) for x in z]
        step_flags += any(x < 0.05 for x in p)
        run_flags += any(run_level_p(x, j + 1) < 0.05 for j, x in enumerate(p))
    assert step_flags / 2000 > 0.2
    assert run_flags / 2000 <= 0.05


def test_a_lines_run_level_p_counts_the_runs_earlier_tests_not_its_baseline():
    name, fmt = "scifi", "yesno"
    key = "eval_moral_scifi/score_change_p"
    lines = [{"event": "train_begin", "metrics": {key: 1.0}}, {"event": "save", "metrics": {key: 0.01}},
             {"event": "save", "metrics": {}}]
    assert count_tests(lines) == 1
    line = {"event": "save", "metrics": {key: 0.01}}
    assert with_run_level(line, name, fmt, count_tests(lines)) == 2
    assert line["metrics"]["eval_moral_scifi/score_change_p_run"] == pytest.approx(0.06)
    baseline = {"event": "train_begin", "metrics": {key: 1.0}}
    assert with_run_level(baseline, name, fmt, 0) == 0 and "eval_moral_scifi/score_change_p_run" not in \
        baseline["metrics"]


def test_an_sd_floor_lifts_each_foundations_variance_to_its_floor_and_leaves_a_wider_spread_alone(scifi):
    ids, foundations = scifi
    rng = np.random.default_rng(2)
    a = _scores(ids, foundations, rng)
    b = _scores(ids, foundations, rng, shift=0.1, noise=0.1, base=a)
    plain, tiny = moments(a), moments(a, sd_floor=1e-6)
    assert (tiny.estimate, tiny.var, tiny.df) == (plain.estimate, plain.var, plain.df)
    sizes = [sum(f == g for g in foundations) for f in REAL_FOUNDATIONS]
    k = len(sizes)
    high = moments(a, sd_floor=2.0)  # above every foundation's own spread: each variance is the floor's
    assert high.estimate == plain.estimate
    assert high.var == pytest.approx(sum(4.0 / n for n in sizes) / k**2, rel=1e-12)
    floored = moments(b, a, sd_floor=0.25)  # the change's too, and never below its own
    assert floored.var >= moments(b, a).var and floored.var >= sum(0.0625 / n for n in sizes) / k**2 * (1 - 1e-12)
    assert moments(a, a, sd_floor=0.25).var > 0  # a model against itself: the floor's interval, not a point
    seq = Sequential.of(ids, foundations, until="level", width=0.05, level=0.95, sd_floor=2.0)
    look = seq.look(len(seq.schedule.looks) - 1, a)
    assert look.width > 0.9 and seq.run(a)[1] == "used up"  # wider than any width asked: every vignette


def test_an_sd_floor_of_025_covers_a_population_with_rare_extremes_where_the_sequence_alone_does_not():
    """docs/statistics.md's remedy, on the benchmark's own rare-extremes population (benchmarks/adaptive.py: SmolLM2's
    real rows at step 0 with 2 of 51 vignettes at the top of align_other's range, sets drawn from it): the stopped
    interval covers its value far less often than 95%, and with ``sd_floor=0.25`` at least 94%."""
    import json

    from benchmarks import adaptive

    rows = json.loads(adaptive.ROWS.read_text())["rows"]
    pop = adaptive.with_extremes(adaptive.as_scores(rows["smollm2/step-0"]))
    truth = moments(pop).estimate
    rng = np.random.default_rng(5)
    covered = {None: [], 0.25: []}
    for i in range(200):
        rows_i = adaptive.resampled(pop.foundation_coarse, rng)
        ids = np.array([f"{pop.id[j]}#{n}" for n, j in enumerate(rows_i)], dtype=object)
        drawn = VignetteScores(ids, pop.foundation_coarse[rows_i], pop.s[rows_i])
        for floor in covered:
            seq = Sequential.of(list(ids), list(drawn.foundation_coarse), until="level", width=0.05, level=0.95,
                                seed=i, sd_floor=floor)
            stop = seq.run(drawn)[0][-1]
            covered[floor].append(stop.lo <= truth <= stop.hi)
    assert np.mean(covered[None]) < 0.7, np.mean(covered[None])
    assert np.mean(covered[0.25]) >= 0.94, np.mean(covered[0.25])
