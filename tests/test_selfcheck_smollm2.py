"""The issue's table on the real model: SmolLM2-135M-Instruct in bfloat16 and float16 (slow: a real model, and
reduced precision is slow on these CPUs).

Measured before the float32 replay (every prompt of ``scifi`` against each prompt alone, the check's verdict):
positions +1 on padded rows moved P(Yes) by 0.066 in bfloat16 and 0.043 in float16 and was missed in both, the
score moving by 1.8x its own interval's half-width; clean bfloat16 noise reached 0.073 (14 vignettes). Here a
balanced subset (one vignette per foundation) keeps the test to minutes.
"""

import pytest
import torch
from helpers.defects import TABLE
from transformers import AutoModelForCausalLM

from tinymcf_callback.probe import Probe
from tinymcf_callback.scoring.selfcheck import TOLERANCES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def probe(smollm2):
    _, tok = smollm2
    return Probe(tok, "scifi", per_foundation=1, n_resamples=0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_smollm2_in_reduced_precision_is_not_flagged_and_its_defect_is_caught(dtype, probe, smollm2_path):
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=getattr(torch, dtype)).eval()
    clean = probe.score(model)
    check = clean.check
    assert clean.strategy == "shared" and check["fallbacks"] == [] and check["reference"] == "float32 replay"
    assert check["max_diff"] < 1e-5 and check["scored_diff"] < TOLERANCES[dtype]
    inject, lands_on = TABLE["positions +1 on padded rows"]
    handles = inject(model)
    try:
        res = probe.score(model)
    finally:
        for handle in handles:
            handle.remove()
    assert res.strategy == lands_on and len(res.check["fallbacks"]) == 1
    assert "in a float32 replay" in res.check["fallbacks"][0] and res.check["max_diff"] < 1e-5
