"""Models with sharded parameters: FSDP1 with an auto-wrap policy, FSDP2 per layer, DeepSpeed ZeRO-3 (2 processes, CPU).

Each forward call of such a model gathers parameters from every rank, so every rank must make the
same number of forward calls, on every strategy, including the self-check's and a fallback. The
script (``sharded_probe_script.py``) scores one tiny model per strategy with an uneven split: an odd
number of batches, and on the unpadded path shares that need 7 and 4 forward calls. Before the ranks
filled up to equal counts, the unpadded model aborted within seconds under FSDP (gloo: "Received data
size doesn't match expected size"), and would hang under NCCL; the process group's timeout is short
(60 s) so that a hang fails the test instead of stalling the suite.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers.ports import torchrun

HERE = Path(__file__).resolve().parent
EXPECTED_WRAPPER = {"fsdp1": "FullyShardedDataParallel", "zero3": "DeepSpeedEngine"}


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["fsdp1", "fsdp2", "zero3"])
def test_sharded_models_score_like_one_process_with_equal_forward_calls(wrapper, tmp_path):
    if wrapper == "zero3":
        pytest.importorskip("deepspeed")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PROBE_PG_TIMEOUT": "60"}
    cmd = [*torchrun(2),
           str(HERE / "helpers" / "sharded_probe_script.py"), str(tmp_path), wrapper]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"{wrapper}_rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    one, two = (r["models"] for r in ranks)
    for name, path in (("shared", "shared"), ("full", "full"), ("unpadded", "unpadded"), ("steered", "full")):
        a, b = one[name], two[name]
        assert a["wrapper"] == b["wrapper"] == EXPECTED_WRAPPER.get(wrapper, a["wrapper"])
        assert a["held"] == pytest.approx(a["total"] / 2, rel=0.05)  # each rank really holds half the parameters
        assert a["strategy"] == b["strategy"] == path
        for r in (a, b):  # the same scores as the model alone in one process, on every rank
            assert np.abs(np.array(r["sharded"]) - np.array(r["plain"])).max() < 1e-5
            assert np.abs(np.log(r["sharded_mass"]) - np.log(r["plain_mass"])).max() < 1e-4
        assert a["forward_calls"] == b["forward_calls"]  # what sharded parameters need
        assert [p["calls"] for p in a["planned"]] == [p["calls"] for p in b["planned"]]
        for p in a["planned"] + b["planned"]:
            assert p["calls"] >= p["share_calls"]
        assert a["check"] == {**b["check"], "seconds": a["check"]["seconds"]}  # one verdict for both ranks
    # the unpadded model's shares need different numbers of calls: the short rank filled up
    needed = sorted(r["unpadded"]["planned"][0]["share_calls"] for r in (one, two))
    assert needed[0] < needed[1] == one["unpadded"]["planned"][0]["calls"]
    # the steered model: the shared path failed the check on both ranks at once, then full prompts passed
    steered = one["steered"]
    assert [p["strategy"] for p in steered["planned"]] == ["shared", "full"]
    assert len(steered["check"]["fallbacks"]) == 1 and "shared prefixes gave P(Yes)" in steered["check"]["fallbacks"][0]
    assert one["steered"]["plain_strategy"] == "full"
