"""The probe on torch FSDP (v1 and v2) models: 2 processes on CPU (torchrun, gloo), GPT-2 style positions.

FSDP v1's forward is ``(*args, **kwargs)``; the engine must read the signature of the model
inside (``unwrap_model``) to keep ``logits_to_keep``, ``position_ids`` and the shared-prefix
cache, while calling the wrapper so FSDP gathers the sharded parameters. FSDP v2
(``fully_shard``) keeps the model's class and must keep working the same way.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers.ports import torchrun

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_fsdp_v1_and_v2_score_like_the_unwrapped_model(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [*torchrun(2),
           str(HERE / "helpers" / "fsdp_probe_script.py"), str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for rank in (0, 1):
        r = json.loads((tmp_path / f"fsdp_rank{rank}.json").read_text())
        assert r["world"] == 2 and r["wrapper"] == "FullyShardedDataParallel"
        assert r["held"] < 0.6 * r["total"]  # parameters really sharded: each rank holds about half
        assert np.abs(np.array(r["wrapped"]) - np.array(r["plain"])).max() < 1e-5
        assert np.abs(np.array(r["wrapped_mass"]) - np.array(r["plain_mass"])).max() < 1e-5
        assert r["n_forward"] == r["plain_n_forward"] == 1 + 2 * r["n_batches"]  # the shared-prefix path
        assert r["logits_seq_lens"] == [1]  # logits_to_keep=1 reached the model: never [batch, seq, vocab]
        assert r["v2_class"] == "FSDPGPT2LMHeadModel"
        assert np.abs(np.array(r["v2"]) - np.array(r["plain"])).max() < 1e-5
        assert r["v2_n_forward"] == r["n_forward"] and r["v2_logits_seq_lens"] == [1]
