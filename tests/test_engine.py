"""The scoring engine: exact maths, batching invariance, last-position only, state restored."""

import logging
import random

import numpy as np
import pytest
import torch
from helpers.models import reference_alone

from tinymcf_callback import score_prompts
from tinymcf_callback.probe import Probe
from tinymcf_callback.scoring.batching import DEFAULT_TOKEN_BUDGET, plan_batches
from tinymcf_callback.scoring.engine import run_batches
from tinymcf_callback.scoring.mode import probe_mode
from tinymcf_callback.scoring.prompts import answer_token_ids

BF16_TOLERANCE = 1e-3  # P(Yes), bf16 against the same weights in fp32 (tiny random Qwen3: 1.4e-4 measured)


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
    scored = score_prompts(logits, qwen_tok)
    p_yes, mass = scored.p_yes, scored.yn_mass
    assert p_yes[0] == pytest.approx(np.e / (np.e + 1), abs=1e-6) and mass[0] == pytest.approx(1.0, abs=1e-6)
    assert p_yes[1] == pytest.approx(2 / 3, abs=1e-6)  # two Yes variants against one No
    assert mass[1] == pytest.approx(3 / 8, abs=1e-6)   # Yes+No = 3 of 3 + 5


def assert_scores_match(res, idx, reference, p_tol=1e-4, mass_rel_tol=1e-3):
    """P(Yes) within ``p_tol``; the Yes+No mass within a *relative* ``mass_rel_tol`` (random weights give a mass
    near 1e-4, where an absolute 1e-4 would accept any value)."""
    p_ref, m_ref = reference
    assert np.abs(res.p_yes[idx] - p_ref).max() < p_tol
    assert (np.abs(res.yn_mass[idx] - m_ref) / m_ref).max() < mass_rel_tol


def _mixed_lengths(probe, k):
    order = sorted(range(len(probe.encoded)), key=lambda i: len(probe.encoded[i]))
    pick = np.linspace(0, len(order) - 1, k).round().astype(int)
    idx = [order[j] for j in pick]
    assert len({len(probe.encoded[i]) for i in idx}) > 3  # real padding in the batch
    return idx


@pytest.fixture(scope="module")
def tiny_gpt2():
    """Absolute (learned) position embeddings: a padding position that leaks into a prompt moves its score."""
    from helpers.models import ARCHITECTURES

    torch.manual_seed(0)
    return ARCHITECTURES["gpt2"][0]().eval()


def _model_and_tok(which, request):
    if which == "smollm2":
        return request.getfixturevalue("smollm2")
    model = request.getfixturevalue("tiny_qwen" if which == "tiny_qwen3" else "tiny_gpt2")
    return model, request.getfixturevalue("qwen_tok")


SMOLLM2 = pytest.mark.slow  # a real model: the full suite only


@pytest.mark.parametrize("which, limit, k", [("tiny_qwen3", None, 24), ("tiny_gpt2", 6, 24),
                                            pytest.param("smollm2", 10, 8, marks=SMOLLM2)])
def test_batching_invariance(which, limit, k, request):
    """One left-padded batch of mixed lengths gives each prompt's own P(Yes) and Yes+No mass."""
    model, tok = _model_and_tok(which, request)
    shared, full = (Probe(tok, "scifi", limit=limit, share_prefix=share) for share in (True, False))
    idx = _mixed_lengths(shared, k)
    reference = reference_alone(model, [shared.encoded[i] for i in idx], tok)
    for probe in (shared, full):
        assert_scores_match(probe.score(model, batches=[idx]), idx, reference)
    if which == "smollm2":
        assert reference[1].mean() > 0.3  # a real model puts real mass on Yes/No


def test_absolute_positions_need_the_position_ids(tiny_gpt2, qwen_tok):
    """Guard for the invariance tests: on the tiny GPT-2, a left-padded batch scored with the model's default
    positions (padding counted) is far from each prompt alone, so a lost ``position_ids`` cannot pass them."""
    probe = Probe(qwen_tok, "scifi", limit=1)
    idx = _mixed_lengths(probe, 6)
    seqs = [probe.encoded[i] for i in idx]
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(q)) + q for q in seqs])
    mask = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in seqs])
    with torch.inference_mode():
        logits = tiny_gpt2(input_ids=ids, attention_mask=mask).logits[:, -1]
    p_default = score_prompts(logits, qwen_tok).p_yes
    assert np.abs(p_default - reference_alone(tiny_gpt2, seqs, qwen_tok)[0]).max() > 1e-2


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
    """A bf16 model is scored as it is: the engine's forward calls reach this very model, which computes in
    bf16 and returns bf16 logits (an fp32 copy, or an upcast of the weights, would show here). Only the
    self-check's calls, after the scoring, replay the checked prompts in float32 (scoring.replay)."""
    from tinymcf_callback import testing as offline_assets

    model = offline_assets.tiny_qwen3(seed=1).to(torch.bfloat16)
    seen = []  # (dtype of the hidden states reaching the LM head, dtype of the logits it returns), per forward call
    hook = model.lm_head.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype)))
    try:
        probe = Probe(qwen_tok, "scifi", limit=2)
        res = probe.score(model)
    finally:
        hook.remove()
    assert len(seen) == res.n_forward + res.check["n_forward"] and res.n_forward > 0  # the scoring and the self-check
    assert set(seen[:res.n_forward]) == {(torch.bfloat16, torch.bfloat16)}
    assert res.check["reference"] == "float32 replay" and set(seen[res.n_forward:]) == {(torch.float32, torch.float32)}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert np.isfinite(res.p_yes).all()
    # bf16 changes the numbers a little: same weights in fp32 (1.4e-4 measured; P(Yes) spreads 2.7e-3 here)
    fp32 = probe.score(offline_assets.tiny_qwen3(seed=1).to(torch.bfloat16).float())
    assert 0 < np.abs(res.p_yes - fp32.p_yes).max() < BF16_TOLERANCE


def test_token_budget_bounds_each_forward_call_and_the_longest_prompts_go_first(tiny_qwen, qwen_tok):
    """README: left-padded, length-sorted batches of at most ``token_budget`` padded tokens, largest batch first.

    Read off the forward calls the model really receives (full prompts: one call per batch): no call holds more
    padded tokens than the budget (unless a single prompt), the widths never grow, the first call holds the
    longest prompt and, at the default budget, the most padded tokens.
    """
    shapes = []
    hook = tiny_qwen.register_forward_pre_hook(lambda m, args, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                               with_kwargs=True)
    try:
        for budget in (DEFAULT_TOKEN_BUDGET, 600):
            shapes.clear()
            probe = Probe(qwen_tok, "scifi", token_budget=budget, share_prefix=False)
            res = probe.score(tiny_qwen)
            checked = shapes[len(probe.batches):]  # the self-check's calls come last: one prompt each, unpadded
            assert checked == [(1, len(probe.encoded[i])) for i in res.check["checked"]]
            del shapes[len(probe.batches):]
            assert len(shapes) == len(probe.batches) > 1
            assert all(rows * width <= budget or rows == 1 for rows, width in shapes), shapes
            widths = [width for _, width in shapes]
            assert widths == sorted(widths, reverse=True) and widths[0] == max(map(len, probe.encoded))
            assert sum(rows for rows, _ in shapes) == len(probe)
            if budget == DEFAULT_TOKEN_BUDGET:
                sizes = [rows * width for rows, width in shapes]
                assert sizes[0] == max(sizes), sizes
    finally:
        hook.remove()


def test_prompt_longer_than_context_is_refused(qwen_tok):
    from tinymcf_callback import testing as offline_assets

    model = offline_assets.tiny_qwen3(seed=2)
    model.config.max_position_embeddings = 20
    probe = Probe(qwen_tok, "scifi", limit=1)
    with pytest.raises(ValueError, match=r"vignette [0-9a-f]{32} .* tokens long, more than the model's context of 20"):
        probe.score(model)


def test_nan_logits_raise(qwen_tok):
    from tinymcf_callback import testing as offline_assets

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


@pytest.mark.parametrize("which, limit", [("tiny_qwen3", 6), ("tiny_gpt2", 6),
                                         pytest.param("smollm2", 4, marks=SMOLLM2)])
def test_shared_prefix_matches_full_prompts(which, limit, request):
    """Shared prefixes (header and scenario from the cache) give the full prompts' scores and each prompt's own."""
    model, tok = _model_and_tok(which, request)
    shared = Probe(tok, "scifi", limit=limit, token_budget=1200)
    full = Probe(tok, "scifi", limit=limit, token_budget=1200, share_prefix=False)
    plan = shared.prefix_plan
    assert len(plan.root) > 0 and all(len(m) > 5 for m in plan.mid)  # chat header and scenarios are shared
    for i, seq in enumerate(shared.encoded):  # the plan only splits, never changes, the token sequence
        assert plan.root + plan.mid[plan.group_of[i]] + plan.tail(shared.encoded, i) == seq
    a, b = shared.score(model), full.score(model)
    everything = list(range(len(shared)))
    assert_scores_match(a, everything, (b.p_yes, b.yn_mass))
    if which != "smollm2":  # SmolLM2 against each prompt alone: test_batching_invariance (cheaper there)
        assert_scores_match(a, everything, reference_alone(model, shared.encoded, tok))
    assert len(shared.batches) > 1 and a.n_forward == 1 + 2 * len(shared.batches)  # root once, then per batch


def test_the_shared_root_reaches_each_batch_as_views_and_stays_as_it_was(tiny_qwen, qwen_tok, monkeypatch):
    """A batch's rows hold the root's one row as ``expand`` views (nothing copied), each batch's forward calls leave
    the root's cache as it was, and the scores are bit for bit those of the rows copied one by one (the cache layers
    the engine does not know are copied so)."""
    from tinymcf_callback.scoring import engine
    from tinymcf_callback.scoring.model_info import pad_token_id

    probe = Probe(qwen_tok, "scifi", limit=4, token_budget=600)
    with probe_mode(tiny_qwen):
        runner = engine.make_strategy("shared", tiny_qwen, probe.encoded, pad_token_id(tiny_qwen, qwen_tok),
                                      torch.device("cpu"), probe.prefix_plan)
        root = runner._root()
        before = [(layer.keys.clone(), layer.values.clone()) for layer in root.layers]
        rows = runner._root_rows(5)
        for layer, view in zip(root.layers, rows.layers, strict=True):
            assert view.keys.shape[0] == 5 and view.keys.stride(0) == 0
            assert view.keys.data_ptr() == layer.keys.data_ptr() and view.values.data_ptr() == layer.values.data_ptr()
        viewed = [runner.logits(batch) for batch in probe.batches]
        for layer, (keys, values) in zip(root.layers, before, strict=True):
            assert layer.keys.shape[0] == 1 and torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
        monkeypatch.setattr(engine, "VIEWED_LAYERS", ())  # a cache of other layers: copied and repeated, as before
        copied = [runner.logits(batch) for batch in probe.batches]
    assert len(probe.batches) > 1 and all(torch.equal(a, b) for a, b in zip(viewed, copied, strict=True))


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
    caplog.clear()  # the probe's own note on limit=2; only the scoring's warnings are read below
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
    caplog.clear()  # the probe's own note on limit=2
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        a = probe.score(model)
    assert a.n_forward == len(probe.batches) > 1  # the failed attempt is not counted
    assert np.abs(a.p_yes - probe.score(tiny_qwen).p_yes).max() < 1e-5
    assert [r.getMessage() for r in caplog.records] == [
        "RejectsCache: shared prefixes failed (NotImplementedError: no cache here); scoring full prompts "
        "(left-padded) instead"]
    assert a.strategy == "full" and a.check["fallbacks"] == ["shared prefixes failed (NotImplementedError: no cache "
                                                            "here)"]


@pytest.mark.slow
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
    from tinymcf_callback.scoring.engine import ScoreResult, _record

    vocab = len(qwen_tok)
    res = ScoreResult(np.full(2, np.nan), np.full(2, np.nan), np.zeros(2, dtype=bool))
    answer_ids = torch.tensor([7414, 2308])
    big = torch.full((2, vocab), 60000.0, dtype=torch.float16)  # its sum overflows float16, not the check
    _record(res, [0, 1], big, qwen_tok, answer_ids, None)
    logits = torch.zeros((2, vocab))
    logits[1, 12345] = bad  # one entry of one row
    with pytest.raises(FloatingPointError, match="NaN or infinite"):
        _record(res, [0, 1], logits, qwen_tok, answer_ids, None)
