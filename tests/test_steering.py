"""Steering dose-response on tiny random models: the hook, the random control, the dose history (mechanics only)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.models import ARCHITECTURES

from tinymcf_callback import Probe, ResidualSteering, compare, dose_response, random_directions, residual_direction
from tinymcf_callback.errors import ConfigError
from tinymcf_callback.rundir.history import read_lines
from tinymcf_callback.steering.dose import DoseResponse
from tinymcf_callback.steering.hooks import decoder_layers


@pytest.fixture(scope="module")
def probe(qwen_tok):
    return Probe(qwen_tok, "scifi", per_foundation=1, n_resamples=200)


@pytest.fixture(scope="module")
def direction(tiny_qwen):
    torch.manual_seed(3)
    return torch.randn(tiny_qwen.config.hidden_size)


def test_every_position_steering_is_one_number_on_every_path(tiny_qwen, qwen_tok, probe, direction):
    """Adding c*v at every position after a layer is the same on the shared path as each prompt whole."""
    steer = ResidualSteering(tiny_qwen, 0, direction)
    full = Probe(qwen_tok, "scifi", per_foundation=1, share_prefix=False)
    base = probe.score(tiny_qwen).p_yes
    with steer(2.0):
        shared, whole = probe.score(tiny_qwen), full.score(tiny_qwen)
    assert shared.strategy == "shared" and not shared.check["fallbacks"]  # the self-check found them equal
    assert np.abs(shared.p_yes - whole.p_yes).max() < 1e-5
    assert np.abs(shared.p_yes - base).max() > 1e-3  # the push moved the answers
    with steer(0.0):
        assert np.array_equal(probe.score(tiny_qwen).p_yes, base)  # c = 0 is no hook at all
    assert np.array_equal(probe.score(tiny_qwen).p_yes, base)  # the hook is gone after the block


def test_answer_position_steering_scores_each_prompt_whole(tiny_qwen, qwen_tok, probe, direction, caplog):
    """At the answer position only, the shared path would also push the prefixes' last tokens: the dose-response
    scores each prompt whole, and gets what a hook on each prompt alone gives."""
    steer = ResidualSteering(tiny_qwen, 0, direction, at="answer")  # layer 0: the next layer reads the cache
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        result = dose_response(probe, tiny_qwen, steer, [3.0])
    rep = result.reports[("real", 0, 3.0)]
    assert rep["info"]["strategy"] == "full" and not rep["info"]["self_check"]["fallbacks"]
    alone = Probe(qwen_tok, "scifi", per_foundation=1, share_prefix=False, self_check=False)
    with steer(3.0):
        ref = alone.run(tiny_qwen)
    assert np.abs(rep["raw"]["p_yes"].to_numpy() - ref["raw"]["p_yes"].to_numpy()).max() < 1e-6
    # on the shared path this hook also pushes the prefixes' last tokens, which later tokens attend to: another
    # number (on this tiny Qwen3 by 4.5e-6, within float32's tolerance; test_selfcheck has a tiny Llama where it is
    # 1e-3 and the self-check falls back); at every position the two paths agree exactly (the test above)
    shared_probe = Probe(qwen_tok, "scifi", per_foundation=1, self_check=False)
    with steer(3.0):
        shared = shared_probe.score(tiny_qwen)
    assert shared.strategy == "shared" and np.abs(shared.p_yes - ref["raw"]["p_yes"].to_numpy()).max() > 1e-6


@pytest.mark.slow
def test_dose_response_changes_random_control_and_history(tiny_qwen, probe, direction, tmp_path):
    steer = ResidualSteering(tiny_qwen, 0, direction)
    result = dose_response(probe, tiny_qwen, steer, [2.0, -2.0], n_random=3, seed=1, output_dir=tmp_path)
    assert result.coefficients == [-2.0, 0.0, 2.0] and result.n_random == 3
    assert len(result.reports) == 1 + 2 * (1 + 3)
    # each change is the paired change against the unsteered report: what compare() gives
    for key in [("real", 0, 2.0), ("random", 2, -2.0)]:
        ours = result.changes[key]["headline"]["score"]
        theirs = compare(result.base, result.reports[key], n_resamples=200)["headline"]["score"]
        assert ours.change == pytest.approx(theirs["change"], abs=1e-12)
        assert ours.change == pytest.approx(result.reports[key]["score"] - result.base["score"], abs=1e-12)
    control = result.control()
    assert list(control["coefficient"]) == [-2.0, 2.0]
    for row in control.itertuples():
        rand = [result.changes[("random", j, row.coefficient)]["headline"]["score"].change for j in range(3)]
        assert row.random_min == pytest.approx(min(rand)) and row.random_max == pytest.approx(max(rand))
        assert row.rank_p == (1 + sum(abs(r) >= abs(row.real) for r in rand)) / 4  # k = 3: at best 1/4
        assert not row.reachable and row.beyond_random is None  # 1/4 > 0.05: no verdict, said so
    assert "n_random=3 is too few for a verdict" in result.summary()
    per = result.foundations()
    assert set(per["foundation"]) == set(result.base["table"].index) and len(per) == 2 * 7
    table = result.table()
    assert len(table) == 9 and set(table["direction"]) == {"none", "real", "random"}
    assert table["answering"].dtype == bool and "c=+2" in result.summary()

    lines = [line for _, line in read_lines(tmp_path / "moral_probe_scifi_dose.jsonl")]
    assert len(lines) == 9
    assert (lines[0]["event"], lines[0]["direction"], lines[0]["coefficient"]) == ("train_begin", "none", 0.0)
    assert {line["event"] for line in lines[1:]} == {"dose"}
    assert [(ln["direction"], ln["direction_index"], ln["coefficient"]) for ln in lines[1:3]] == [
        ("real", 0, -2.0), ("real", 0, 2.0)]
    assert lines[2]["metrics"]["eval_moral_scifi/score_change"] == pytest.approx(
        result.changes[("real", 0, 2.0)]["headline"]["score"].change, abs=1e-9)
    assert all(isinstance(line["answering"], bool) for line in lines)


def test_random_directions_have_the_norm_and_are_seeded(direction):
    r = random_directions(direction, 4, seed=0)
    assert r.shape == (4, direction.numel())
    assert torch.allclose(r.norm(dim=1), direction.norm().expand(4))
    assert torch.equal(r, random_directions(direction, 4, seed=0))
    assert not torch.equal(r, random_directions(direction, 4, seed=1))
    cos = (r @ direction) / (r.norm(dim=1) * direction.norm())
    assert cos.abs().max() < 0.6  # random in 64 dimensions: far from the real direction


def test_residual_direction_is_a_difference_of_means_at_the_answer_position(tiny_qwen, qwen_tok):
    from tinymcf_callback.scoring.engine import encode_batch
    from tinymcf_callback.scoring.prompts import FRAMES, format_prompt

    pos, neg = ["You see a man kick a dog."], ["You see a man pet a dog.", "You see a girl feed a cat."]
    v = residual_direction(tiny_qwen, qwen_tok, pos, neg, layer=0)

    def at_answer(text):
        batch = encode_batch(qwen_tok, [format_prompt(qwen_tok, text, FRAMES["wrong"])], tiny_qwen)
        with torch.inference_mode():
            return tiny_qwen(**batch, output_hidden_states=True).hidden_states[1][0, -1]

    expected = at_answer(pos[0]) - (at_answer(neg[0]) + at_answer(neg[1])) / 2
    assert torch.allclose(v, expected, atol=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "opt", "gpt_neox", "bloom", "falcon", "mpt", "mamba"])
def test_the_decoder_layers_are_found_across_families(arch):
    model = ARCHITECTURES[arch][0]()
    layers = decoder_layers(model)
    assert isinstance(layers, torch.nn.ModuleList) and len(layers) == 2


def test_bad_steering_input_is_refused(tiny_qwen, probe, direction):
    with pytest.raises(ConfigError, match="layer must be a decoder layer index"):
        ResidualSteering(tiny_qwen, 5, direction)
    with pytest.raises(ConfigError, match="residual stream has 64"):
        ResidualSteering(tiny_qwen, 0, torch.ones(10))
    with pytest.raises(ConfigError, match="at must be one of every, answer"):
        ResidualSteering(tiny_qwen, 0, direction, at="last")
    with pytest.raises(ConfigError, match="n_random needs a ResidualSteering"):
        dose_response(probe, tiny_qwen, lambda c: torch.no_grad(), [1.0], n_random=2)
    with pytest.raises(ConfigError, match="coefficients must be"):
        dose_response(probe, tiny_qwen, ResidualSteering(tiny_qwen, 0, direction), ["strong"])
    assert json.dumps(repr(ResidualSteering(tiny_qwen, -1, direction))).count("layer=1") == 1


class _Change:
    def __init__(self, change):
        self.change, self.lo, self.hi, self.p = change, change - 0.01, change + 0.01, 0.5


def constructed(real: float, randoms: list[float], level: float = 0.95) -> DoseResponse:
    """A dose-response at c = +8 with these changes of the score: no model, only the verdict's arithmetic."""
    report = {"score": 0.1, "table": pd.DataFrame(index=["Care"]), "info": {"yn_mass_mean": 0.9}}
    result = DoseResponse("scifi", [0.0, 8.0], n_random=len(randoms), level=level)
    result.reports = {("none", 0, 0.0): report, ("real", 0, 8.0): report}
    result.changes = {("real", 0, 8.0): {"headline": {"score": _Change(real)}}}
    for j, r in enumerate(randoms):
        result.changes[("random", j, 8.0)] = {"headline": {"score": _Change(r)}}
    return result


@pytest.mark.parametrize("real, randoms, p, verdict, says", [
    # moved less than every random direction: p = 1, never "beyond" (the old range check said BEYOND at k=2)
    (-0.0004, [0.01, -0.02] + [0.03] * 17, 1.0, False, "p=1.00 -> no more than the random directions"),
    # larger in size than all 19: the smallest p, 1/20 = 0.05, a verdict with its direction
    (-0.5, [0.01 * (j + 1) for j in range(19)], 0.05, True, "p=0.05 -> moved MORE than the random directions (down)"),
    (0.5, [0.01 * (j + 1) for j in range(19)], 0.05, True, "(up)"),
    # outside the random range but k = 4: p 0.2 cannot reach 0.05: no verdict, and the summary says why
    (0.3, [0.1, 0.2, -0.1, 0.0], 0.2, None, "n_random=4 is too few for a verdict: its smallest p is 1/5 = 0.20"),
    # k = 2, inside the spread
    (0.0004, [0.01, -0.02], 1.0, None, "use n_random >= 19"),
])
def test_the_steering_verdict_is_a_rank_test_with_its_p_and_direction(real, randoms, p, verdict, says):
    result = constructed(real, randoms)
    row = result.control().iloc[0]
    assert row["rank_p"] == pytest.approx(p) and row["beyond_random"] == verdict
    assert row["direction"] == ("+" if real >= 0 else "-")
    assert says in result.summary()
    assert "BEYOND" not in result.summary()


def test_the_verdicts_level_follows_the_probes():
    """At level 0.9 the test is at p <= 0.1: 9 random directions suffice."""
    result = constructed(0.5, [0.01 * (j + 1) for j in range(9)], level=0.9)
    assert bool(result.control().iloc[0]["beyond_random"]) and "p <= 0.1" in result.summary()
