"""Two-process DDP on CPU (torchrun, gloo): same metrics as one process, logged once, no hang."""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
KEY = "eval_moral_scifi/score"


def _run(cmd, tmp):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def _probe_entries(path):
    data = json.loads(Path(path).read_text())
    return data, [e for e in data["log_history"] if KEY in e]


def test_ddp_two_processes_match_single(tmp_path):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    _run([sys.executable, str(HERE / "ddp_probe_script.py"), str(single)], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
          str(HERE / "ddp_probe_script.py"), str(ddp)], tmp_path)
    s_data, s_entries = _probe_entries(single / "log_history_rank0.json")
    d_data, d_entries = _probe_entries(ddp / "log_history_rank0.json")
    assert d_data["world"] == 2 and d_data["n_batches"] % 2 == 1
    assert [e["step"] for e in s_entries] == [e["step"] for e in d_entries] == [0, 1, 2]  # each step once
    for s, d in zip(s_entries, d_entries):
        moral = [k for k in s if k.startswith("eval_moral") and not k.endswith("elapsed_s")]
        assert set(moral) == {k for k in d if k.startswith("eval_moral") and not k.endswith("elapsed_s")}
        for k in moral:
            assert d[k] == pytest.approx(s[k], abs=1e-5), k
    # rank 1 holds the same log_history (metrics identical on every rank), but only rank 0 wrote files
    _, r1_entries = _probe_entries(ddp / "log_history_rank1.json")
    assert [e[KEY] for e in r1_entries] == [e[KEY] for e in d_entries]
    lines = (ddp / "moral_probe_scifi.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert len(glob.glob(str(ddp / "checkpoint-*" / "moral_probe_scifi.json"))) == 2
