"""Every architecture family scores each prompt as if it were scored alone, prefix sharing or not.

Tiny random models (hidden size 64, 2 layers, ``initializer_range`` 0.125 so that a wrong
mask or position moves P(Yes) visibly) with the real Qwen3 tokenizer, on ``scifi`` limit=3
(24 prompts) in three batches. The reference runs each prompt alone: no padding, no mask,
no position ids, no cache. Each model also checks the path the engine took (shared
prefixes, full prompts, or unpadded prompts) and that a model kept off the faster path
says why once in the log. Run with ``-s`` to see the measured differences.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from tinymcf_callback.probe import Probe

TOLERANCE = 1e-4
MASS_REL_TOLERANCE = 1e-3

from helpers.models import ARCHITECTURES, FULL, SHARED, UNPADDED

from tinymcf_callback.scoring.answers import score_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def probes(qwen_tok):
    shared = Probe(qwen_tok, "scifi", limit=3, token_budget=600)
    full = Probe(qwen_tok, "scifi", limit=3, token_budget=600, share_prefix=False)
    assert len(shared.batches) >= 2 and len(full.batches) >= 2  # the root cache is reused across batches
    assert max(map(len, shared.encoded)) > 32  # longer than the 16- and 32-token windows
    return shared, full


def score_alone(model, probe, tok):
    """The reference: each prompt alone, no padding, no mask, no position ids, no cache (P(Yes), Yes+No mass)."""
    with torch.inference_mode():
        logits = torch.cat([model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[:, -1]
                            for ids in probe.encoded])
    return score_prompts(logits, tok)


def _expected_forward_calls(path: str, probe: Probe) -> int:
    if path == SHARED:
        return 1 + 2 * len(probe.batches)  # the header once, then scenario + questions per batch
    if path == FULL:
        return len(probe.batches)
    return sum(len({len(probe.encoded[i]) for i in b}) for b in probe.batches)  # one call per length


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_scores_equal_each_prompt_alone(arch, probes, qwen_tok, caplog):
    factory, path = ARCHITECTURES[arch]
    shared, full = probes
    torch.manual_seed(0)
    model = factory().eval()
    alone = score_alone(model, shared, qwen_tok)
    reference, reference_mass = alone.p_yes, alone.yn_mass
    assert reference.std() > 1e-3  # the random weights spread P(Yes): a wrong mask would show
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        a = shared.score(model)
        shared.score(model)  # a second probe of the same model: nothing new in the log
        b = full.score(model)
    shared_diff, full_diff = np.abs(a.p_yes - reference).max(), np.abs(b.p_yes - reference).max()
    print(f"\n| {arch} | {shared_diff:.1e} | {full_diff:.1e} | {path} |", end="")
    assert shared_diff < TOLERANCE and full_diff < TOLERANCE
    for res in (a, b):  # the Yes+No mass is ~1e-4 on random weights: compare it relatively
        assert (np.abs(res.yn_mass - reference_mass) / reference_mass).max() < MASS_REL_TOLERANCE
    assert a.n_forward == _expected_forward_calls(path, shared)
    notes = [r.getMessage() for r in caplog.records if type(model).__name__ in r.getMessage()]
    if path == SHARED:
        assert notes == []
    else:
        # said once by each probe it concerns (the full probe has no shared path to leave), not per batch nor per call
        assert len(notes) == (2 if path == UNPADDED else 1), notes
        assert ("shared-prefix path" in notes[0]) == (path == FULL)
        assert ("unpadded" in notes[0]) == (path == UNPADDED)


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)])  # one replay path
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_reduced_precision_is_checked_in_float32_and_no_clean_model_is_flagged(arch, dtype, probes):
    """In bfloat16 and float16 every architecture keeps its path: the float32 replay finds it right within 1e-5,
    and the scores it reports are within their own precision's tolerance of the float32 reference."""
    from tinymcf_callback.scoring.selfcheck import TOLERANCES

    factory, path = ARCHITECTURES[arch]
    torch.manual_seed(0)
    model = factory().eval().to(getattr(torch, dtype))
    res = probes[0].score(model)
    check = res.check
    assert res.strategy == path and check["fallbacks"] == [], check
    assert check["reference"] == "float32 replay" and check["replay_note"] is None
    assert check["max_diff"] < 1e-5 and check["scored_diff"] < TOLERANCES[dtype] / 4
    assert res.precision["compute"] == dtype
