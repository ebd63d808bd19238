"""Scoring across ranks: shards merge back to the one-process result; two-process DDP on CPU (torchrun,
gloo) gives the same metrics as one process, logged once, no hang, with each rank scoring its own half of the
batches (recorded by the script: the batches each rank scored and the forward calls its model received)."""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.ports import torchrun

from tinymcf_callback.probe import Probe
from tinymcf_callback.scoring.ranks import Ranks, merge_shards, to_shard

HERE = Path(__file__).resolve().parent
KEY = "eval_moral_scifi/score"


def _run(cmd, tmp):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def _probe_entries(path):
    data = json.loads(Path(path).read_text())
    return data, [e for e in data["log_history"] if KEY in e]


def padded_split(n_items: int, n_ranks: int) -> list[list[int]]:
    """The shares ``split_between_processes(range(n_items), apply_padding=True)`` gives each rank."""
    per, extra = divmod(n_items, n_ranks)
    shares = []
    for rank in range(n_ranks):
        start = rank * per + min(rank, extra)
        share = list(range(start, start + per + (rank < extra)))
        shares.append(share + [n_items - 1] * (per + (extra > 0) - len(share)))
    return shares


def test_shards_merge_to_the_one_process_result(qwen_tok, tiny_qwen):
    probe = Probe(qwen_tok, "scifi", limit=3, token_budget=400)
    batches = probe.batches
    whole = probe.score(tiny_qwen)
    alone = probe.score(tiny_qwen, ranks=Ranks.current())  # one process: the plain path
    np.testing.assert_array_equal(alone.p_yes, whole.p_yes)
    # The shares of as many ranks as make a short rank (4 batches, 3 ranks: [0, 1], [2, 3], [3, 3]),
    # scored here in turn.
    n_ranks = next(n for n in range(2, len(batches) + 2) if len(batches) % n)
    shares = padded_split(len(batches), n_ranks)
    assert len({len(s) for s in shares}) == 1 and sum(map(len, shares)) > len(batches)  # equal, padded
    shards = []
    for share in shares:
        res = probe.score(tiny_qwen, batches=[batches[b] for b in share])
        shards.append(to_shard(res, [i for b in share for i in batches[b]]))
    merged = merge_shards(shards, len(probe))
    assert not np.isnan(merged.p_yes).any()
    np.testing.assert_allclose(merged.p_yes, whole.p_yes, atol=1e-6)
    np.testing.assert_allclose(merged.yn_mass, whole.yn_mass, atol=1e-6)
    np.testing.assert_array_equal(merged.yn_top3, whole.yn_top3)
    assert merged.top_tokens == whole.top_tokens
    assert merged.n_forward == sum(s.n_forward for s in shards)
    with pytest.raises(RuntimeError, match="scored by no process"):
        merge_shards(shards[1:], len(probe))


@pytest.mark.slow
def test_ddp_two_processes_match_single(tmp_path):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    _run([sys.executable, str(HERE / "helpers" / "ddp_probe_script.py"), str(single)], tmp_path)
    _run([*torchrun(2),
          str(HERE / "helpers" / "ddp_probe_script.py"), str(ddp)], tmp_path)
    s_data, s_entries = _probe_entries(single / "log_history_rank0.json")
    d_data, d_entries = _probe_entries(ddp / "log_history_rank0.json")
    assert d_data["world"] == 2 and d_data["n_batches"] % 2 == 1
    assert [e["step"] for e in s_entries] == [e["step"] for e in d_entries] == [0, 1, 2]  # each step once
    for s, d in zip(s_entries, d_entries, strict=True):
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
    n = s_data["n_batches"]
    assert [(s["batches"], s["forward_calls"]) for s in s_data["shares"]] == [(list(range(n)), 1 + 2 * n)] * 3
    # the self-check: each checked prompt scored alone, one call each, in fp32 no replay
    assert [s["probe_forward_calls"] - s["forward_calls"] for s in s_data["shares"]] == [
        len(s["check"]["checked"]) for s in s_data["shares"]]
    checked = [len(s["check"]["checked"]) for s in s_data["shares"]]
    assert checked[0] >= 1 and all(n <= 4 for n in checked)  # the first probe checks; later ones as the budget pays
    assert all(s["check"]["waiting"] == (n == 0) for s, n in zip(s_data["shares"], checked, strict=True))
    assert_each_rank_scored_its_own_share(d_data, json.loads((ddp / "log_history_rank1.json").read_text()))


def assert_each_rank_scored_its_own_share(rank0: dict, rank1: dict) -> None:
    """Per probe: equal numbers of batches and of forward calls on both ranks (what sharded models need),
    disjoint shares of the batches that together cover every prompt; the forward calls are the shared path's
    for the rank's own share (1 + 2 per batch), not the whole set's."""
    n_batches, n_prompts = rank0["n_batches"], rank0["n_prompts"]
    assert len(rank0["shares"]) == len(rank1["shares"]) == 3  # steps 0, 1, 2
    for one, two in zip(rank0["shares"], rank1["shares"], strict=True):
        assert len(one["batches"]) == len(two["batches"]) == (n_batches + 1) // 2  # padded to equal length
        assert one["forward_calls"] == two["forward_calls"] == one["n_forward"] == two["n_forward"]
        assert one["forward_calls"] == 1 + 2 * len(one["batches"])
        assert not set(one["batches"]) & set(two["batches"])  # nothing scored twice (padding repeats one's own)
        assert set(one["batches"]) | set(two["batches"]) == set(range(n_batches))
        assert sorted(one["prompts"] + two["prompts"]) == list(range(n_prompts))
        # the self-check: both ranks score the same prompts alone and reach the same verdict
        assert one["check"] == {**two["check"], "seconds": one["check"]["seconds"]}
        checked = len(one["check"]["checked"])
        assert one["probe_forward_calls"] == two["probe_forward_calls"] == one["forward_calls"] + checked
