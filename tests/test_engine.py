"""The scoring engine: exact maths, batching invariance, last-position only, state restored."""

import logging
import random

import numpy as np
import pytest
import torch

from tinymcf_callback import score_prompts
from tinymcf_callback.engine import plan_batches, probe_mode, run_batches
from tinymcf_callback.probe import Probe
from tinymcf_callback.prompts import answer_token_ids


def test_plan_batches_respects_budget_and_covers_all():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, size=300).tolist()
    batches = plan_batches(lengths, token_budget=1000, max_batch_size=16)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(300))
    for b in batches:
        assert len(b) <= 16
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 1000
    assert plan_batches([5000, 3], token_budget=100) == [[0], [1]]  # too long for the budget: alone
    with pytest.raises(ValueError):
        plan_batches([3], token_budget=0)


def test_score_prompts_exact(qwen_tok):
    yes, no = answer_token_ids(qwen_tok)
    vocab = len(qwen_tok)
    logits = torch.full((2, vocab), -1e4)
    logits[0, 7414], logits[0, 2308] = 2.0, 1.0  # ' Yes', ' No'; everything else ~0 probability
    logits[1, 7414], logits[1, 9454], logits[1, 2753], logits[1, 100] = 0.0, 0.0, 0.0, np.log(5.0)
    p_yes, mass = score_prompts(logits, qwen_tok)
    assert p_yes[0] == pytest.approx(np.e / (np.e + 1), abs=1e-6) and mass[0] == pytest.approx(1.0, abs=1e-6)
    assert p_yes[1] == pytest.approx(2 / 3, abs=1e-6)  # two Yes variants against one No
    assert mass[1] == pytest.approx(3 / 8, abs=1e-6)   # Yes+No = 3 of 3 + 5


def _alone_vs_batched(model, probe, idx):
    res_batch = probe.score(model, batches=[idx])
    alone = [probe.score(model, batches=[[i]]) for i in idx]
    p_alone = np.array([r.p_yes[i] for r, i in zip(alone, idx, strict=True)])
    m_alone = np.array([r.yn_mass[i] for r, i in zip(alone, idx, strict=True)])
    return res_batch.p_yes[idx], p_alone, res_batch.yn_mass[idx], m_alone


def _mixed_lengths(probe, k):
    order = sorted(range(len(probe.encoded)), key=lambda i: len(probe.encoded[i]))
    pick = np.linspace(0, len(order) - 1, k).round().astype(int)
    idx = [order[j] for j in pick]
    assert len({len(probe.encoded[i]) for i in idx}) > 3  # real padding in the batch
    return idx


def test_batching_invariance_tiny_qwen3(tiny_qwen, qwen_tok):
    probe = Probe(qwen_tok, "scifi")
    p_b, p_a, m_b, m_a = _alone_vs_batched(tiny_qwen, probe, _mixed_lengths(probe, 24))
    assert np.abs(p_b - p_a).max() < 1e-4 and np.abs(m_b - m_a).max() < 1e-4


def test_batching_invariance_smollm2(smollm2):
    model, tok = smollm2
    probe = Probe(tok, "scifi", limit=10)
    p_b, p_a, m_b, m_a = _alone_vs_batched(model, probe, _mixed_lengths(probe, 8))
    assert np.abs(p_b - p_a).max() < 1e-4 and np.abs(m_b - m_a).max() < 1e-4
    assert m_a.mean() > 0.3  # a real model puts real mass on Yes/No


def test_only_last_position_logits(tiny_qwen, qwen_tok):
    shapes = []
    h = tiny_qwen.lm_head.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    try:
        probe = Probe(qwen_tok, "scifi", limit=4)
        probe.score(tiny_qwen)
    finally:
        h.remove()
    assert shapes and all(s[1] == 1 for s in shapes), shapes


def test_model_dtype_is_respected(qwen_tok):
    import offline_assets

    model = offline_assets.tiny_qwen3(seed=1).to(torch.bfloat16)
    probe = Probe(qwen_tok, "scifi", limit=2)
    res = probe.score(model)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert np.isfinite(res.p_yes).all()


def test_prompt_longer_than_context_is_refused(qwen_tok):
    import offline_assets

    model = offline_assets.tiny_qwen3(seed=2)
    model.config.max_position_embeddings = 20
    probe = Probe(qwen_tok, "scifi", limit=1)
    with pytest.raises(ValueError, match=r"vignette [0-9a-f]{32} .* tokens long, more than the model's context of 20"):
        probe.score(model)


def test_nan_logits_raise(qwen_tok):
    import offline_assets

    model = offline_assets.tiny_qwen3(seed=3)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="NaN"):
        Probe(qwen_tok, "scifi", limit=1).score(model)


def test_probe_mode_restores_modes_and_rng(tiny_qwen):
    tiny_qwen.train()
    tiny_qwen.model.layers[0].eval()  # a mixed state must come back exactly
    before = {n: m.training for n, m in tiny_qwen.named_modules()}
    def seed_all():
        random.seed(1)
        np.random.seed(1)
        torch.manual_seed(1)

    seed_all()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_all()
    with probe_mode(tiny_qwen):
        assert not tiny_qwen.training and torch.is_inference_mode_enabled()
        random.random(), np.random.rand(), torch.rand(3)  # the probe may consume randomness
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert {n: m.training for n, m in tiny_qwen.named_modules()} == before
    tiny_qwen.eval()


def test_oom_batch_is_split_and_retried(tiny_qwen, qwen_tok, monkeypatch):
    probe = Probe(qwen_tok, "scifi", limit=2, share_prefix=False)
    ref = probe.score(tiny_qwen)
    real_forward = tiny_qwen.forward
    calls = []

    def flaky(*a, **kw):
        calls.append(kw["input_ids"].shape[0])
        if kw["input_ids"].shape[0] > 4:
            raise torch.OutOfMemoryError("simulated")
        return real_forward(*a, **kw)

    monkeypatch.setattr(tiny_qwen, "forward", flaky)
    res = probe.score(tiny_qwen, batches=[list(range(len(probe)))])
    assert calls == [16, 8, 4, 4, 8, 4, 4]  # halves until it fits
    assert np.abs(res.p_yes - ref.p_yes).max() < 1e-5


def test_run_batches_scores_only_given_batches(tiny_qwen, qwen_tok):
    probe = Probe(qwen_tok, "scifi", limit=2)
    with probe_mode(tiny_qwen):
        res = run_batches(tiny_qwen, probe.encoded, [[0, 3]], qwen_tok)
    assert np.isfinite(res.p_yes[[0, 3]]).all() and np.isnan(np.delete(res.p_yes, [0, 3])).all()


@pytest.mark.parametrize("which", ["tiny_qwen3", "smollm2"])
def test_shared_prefix_matches_full_prompts(which, request):
    if which == "smollm2":
        model, tok = request.getfixturevalue("smollm2")
        limit = 4
    else:
        model, tok = request.getfixturevalue("tiny_qwen"), request.getfixturevalue("qwen_tok")
        limit = 12
    shared = Probe(tok, "scifi", limit=limit, token_budget=1200)
    full = Probe(tok, "scifi", limit=limit, token_budget=1200, share_prefix=False)
    plan = shared.prefix_plan
    assert len(plan.root) > 0 and all(len(m) > 5 for m in plan.mid)  # chat header and scenarios are shared
    for i, seq in enumerate(shared.encoded):  # the plan only splits, never changes, the token sequence
        assert plan.root + plan.mid[plan.group_of[i]] + plan.tail(shared.encoded, i) == seq
    a, b = shared.score(model), full.score(model)
    assert np.abs(a.p_yes - b.p_yes).max() < 1e-4 and np.abs(a.yn_mass - b.yn_mass).max() < 1e-4
    assert a.n_forward == 1 + 2 * len(shared.batches)  # root once, then scenario + questions per batch


class _Inner(torch.nn.Module):
    """A hand-written model around the tiny Qwen3, with the forward arguments a test chooses."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()


def test_model_without_cache_gets_full_prompts(tiny_qwen, qwen_tok, caplog):
    class NoCache(_Inner):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=False, logits_to_keep=0):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              logits_to_keep=logits_to_keep)

    probe = Probe(qwen_tok, "scifi", limit=2)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        a, b = probe.score(NoCache(tiny_qwen)), probe.score(tiny_qwen)
    assert a.n_forward == len(probe.batches) and np.abs(a.p_yes - b.p_yes).max() < 1e-5
    assert [r.getMessage() for r in caplog.records] == [
        "NoCache cannot take the shared-prefix path: its forward takes no key/value cache; scoring full prompts "
        "(same scores, more compute)"]


def test_model_rejecting_the_cache_at_run_time_falls_back_once(tiny_qwen, qwen_tok, caplog):
    class RejectsCache(_Inner):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=False, logits_to_keep=0,
                    cache=None):
            if cache is not None:
                raise NotImplementedError("no cache here")
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              logits_to_keep=logits_to_keep)

    probe = Probe(qwen_tok, "scifi", limit=2, token_budget=300)
    model = RejectsCache(tiny_qwen)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        a = probe.score(model)
    assert a.n_forward == len(probe.batches) > 1  # the failed attempt is not counted
    assert np.abs(a.p_yes - probe.score(tiny_qwen).p_yes).max() < 1e-5
    assert [r.getMessage() for r in caplog.records] == [
        "shared-prefix scoring is not supported by RejectsCache (NotImplementedError: no cache here); "
        "scoring full prompts"]


def test_compiled_model_scores_like_eager(tiny_qwen, qwen_tok):
    probe = Probe(qwen_tok, "scifi", limit=1)
    ref = probe.score(tiny_qwen)
    compiled = torch.compile(tiny_qwen, backend="eager")  # graph capture without minutes of CPU codegen
    res = probe.score(compiled)
    assert res.n_forward == ref.n_forward  # shared-prefix path kept: the signature is read through _orig_mod
    assert np.abs(res.p_yes - ref.p_yes).max() < 1e-5


@pytest.mark.parametrize("limit", [True, False, 0, -1, 1.5, "2"])
def test_limit_must_be_a_positive_whole_number(limit, qwen_tok):
    with pytest.raises(ValueError, match="limit must be a positive whole number"):
        Probe(qwen_tok, "scifi", limit=limit)
    assert len(Probe(qwen_tok, "scifi", limit=np.int64(2)).vignettes) == 2


def test_probe_reports_only_its_own_elapsed(tiny_qwen, qwen_tok):
    probe = Probe(qwen_tok, "scifi", limit=1)
    res = probe.score(tiny_qwen)
    assert probe.report(res)["info"]["elapsed_s"] is None  # not "seconds since the Probe was built"
    assert probe.report(res, elapsed=0.25)["info"]["elapsed_s"] == 0.25
    assert 0 < probe.run(tiny_qwen)["info"]["elapsed_s"] < 60


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_any_non_finite_logit_raises_and_large_finite_ones_do_not(bad, qwen_tok):
    from tinymcf_callback.engine import ScoreResult, _record

    vocab = len(qwen_tok)
    res = ScoreResult(np.full(2, np.nan), np.full(2, np.nan), np.zeros(2, dtype=bool))
    answer_ids = torch.tensor([7414, 2308])
    big = torch.full((2, vocab), 60000.0, dtype=torch.float16)  # its sum overflows float16, not the check
    _record(res, [0, 1], big, qwen_tok, answer_ids, None)
    logits = torch.zeros((2, vocab))
    logits[1, 12345] = bad  # one entry of one row
    with pytest.raises(FloatingPointError, match="NaN or infinite"):
        _record(res, [0, 1], logits, qwen_tok, answer_ids, None)
