"""The slow benchmark's parts on their own: the pairs read and checked, their tokens (TRL's way), the pairs engine
against a plain transformers computation and against itself broken on purpose, the intervals, the schedule.

Tiny random models: mechanics only, never moral content. The runs followed end to end, lm-eval against itself and
SmolLM2 are in test_benchmark_runs.py (slow).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tinymcf_callback.benchmark import scoring
from tinymcf_callback.benchmark.analysis import agreement, prefs_change, summarise
from tinymcf_callback.benchmark.config import BenchmarkConfig
from tinymcf_callback.benchmark.encoding import chat_texts, encode_pairs
from tinymcf_callback.benchmark.pairs import load_pairs, pairs_digest
from tinymcf_callback.benchmark.runner import Benchmark
from tinymcf_callback.benchmark.schedule import parse_at, predicted_saves, roles_of
from tinymcf_callback.errors import ConfigError, ProbeDataError
from tinymcf_callback.stats.bootstrap import stratified_means

pytestmark = pytest.mark.usefixtures("one_thread")
DATA = Path(__file__).resolve().parent / "data" / "prefs"
PLAIN, CHAT = DATA / "ethics_like.jsonl", DATA / "ethics_like_chat.jsonl"
# float32 spread of a continuation's log-probability on the tiny random Qwen3, a token: the engine's strategies
# against each sequence alone, every sequence of the test pairs, measured at most 8e-7 (sums of 1-18 tokens)
TINY_SPREAD = 2e-6


# ---- the pairs -----------------------------------------------------------------------------------------------
def test_pairs_are_read_checked_and_sampled_in_the_datas_order():
    pairs = load_pairs(PLAIN)
    assert len(pairs) == 36 and pairs.configs == ["commonsense", "deontology", "justice", "utilitarianism"]
    assert not pairs.conversational and pairs.record["kind"] == "file" and len(pairs.record["sha256"]) == 64
    chat = load_pairs(CHAT, configs=["justice"])
    assert chat.conversational and set(chat.config) == {"justice"} and len(chat) == 4
    drawn = load_pairs(PLAIN, per_config=3, seed=5)
    assert [drawn.config.count(c) for c in drawn.configs] == [3, 3, 3, 3]
    assert drawn.record["digest"] == pairs_digest(drawn)
    order = [(c, r) for c, r in zip(drawn.config, drawn.row, strict=True)]
    assert order == sorted(order, key=lambda cr: (pairs.configs.index(cr[0]), cr[1]))  # the data's order
    assert load_pairs(PLAIN, per_config=3, seed=5).record["digest"] == drawn.record["digest"]  # seeded
    assert load_pairs(PLAIN, per_config=3, seed=6).record["digest"] != drawn.record["digest"]
    first = load_pairs(PLAIN, limit=2)
    assert first.row == [0, 1] * 4


@pytest.mark.parametrize("rows, needles", [
    ([{"question": "q", "good": "a", "bad": "b"}], ["missing prompt, chosen, rejected", "found: question, good, bad"]),
    ([{"prompt": "p", "chosen": "", "rejected": "b"}], ["empty chosen", "pair 0"]),
    ([{"prompt": [{"role": "user", "content": "q"}], "chosen": [], "rejected": [{"role": "assistant",
                                                                                "content": "b"}]}], ["empty chosen"]),
    ([{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": [{"role": "user", "content": "q"}],
      "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}],
     ["conversational", "plain text"]),
    ([{"chosen": [{"role": "user", "content": "q"}], "rejected": [{"role": "user", "content": "q"}]}],
     ["implicit prompt"]),
])
def test_bad_pairs_are_one_line_naming_what_is_wrong(rows, needles, tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ProbeDataError) as e:
        load_pairs(path)
    assert "\n" not in str(e.value)
    for needle in needles:
        assert needle in str(e.value)


def test_the_other_file_formats_read_the_same_pairs(tmp_path):
    import pandas as pd

    rows = [json.loads(line) for line in PLAIN.read_text().splitlines()]
    (tmp_path / "p.json").write_text(json.dumps(rows))
    pd.DataFrame(rows).to_csv(tmp_path / "p.csv", index=False)
    pd.DataFrame(rows).to_parquet(tmp_path / "p.parquet")
    chat = [json.loads(line) for line in CHAT.read_text().splitlines()]
    pd.DataFrame(chat).to_parquet(tmp_path / "c.parquet")  # message lists as parquet structs
    digest = load_pairs(PLAIN).record["digest"]
    for name in ("p.json", "p.csv", "p.parquet"):
        assert load_pairs(tmp_path / name).record["digest"] == digest, name
    assert load_pairs(tmp_path / "c.parquet").record["digest"] == load_pairs(CHAT).record["digest"]


# ---- their tokens --------------------------------------------------------------------------------------------
def test_conversational_pairs_render_as_trls_maybe_apply_chat_template(qwen_tok):
    from trl.data_utils import maybe_apply_chat_template

    pairs = load_pairs(CHAT)
    for p, c, r in zip(pairs.prompt, pairs.chosen, pairs.rejected, strict=True):
        trl = maybe_apply_chat_template({"prompt": p, "chosen": c, "rejected": r}, qwen_tok)
        assert chat_texts(qwen_tok, p, c, r) == (trl["prompt"], trl["chosen"], trl["rejected"])


def test_prompt_and_continuations_are_tokenised_apart_and_joined(qwen_tok):
    pairs = load_pairs(PLAIN)
    enc = encode_pairs(qwen_tok, pairs)
    for i in range(len(pairs)):
        assert enc.prompt[i] == qwen_tok(pairs.prompt[i], add_special_tokens=False)["input_ids"]
        assert enc.chosen[i] == qwen_tok(pairs.chosen[i], add_special_tokens=False)["input_ids"]
    # apart, not joined: "visited the " + "pet store." is not tokenised as one text would be
    i = pairs.prompt.index("I forgot to wear my mask when I visited the ")
    joined = qwen_tok(pairs.prompt[i] + pairs.chosen[i], add_special_tokens=False)["input_ids"]
    assert enc.prompt[i] + enc.chosen[i] != joined
    with pytest.raises(ProbeDataError, match="no chat template"):
        qwen_tok_plain = type(qwen_tok).from_pretrained(qwen_tok.name_or_path)
        qwen_tok_plain.chat_template = None
        encode_pairs(qwen_tok_plain, load_pairs(CHAT))


# ---- the engine ----------------------------------------------------------------------------------------------
def transformers_logps(model, prompt: list[int], cont: list[int]) -> float:
    """A plain transformers computation: the whole sequence, full logits, log-softmax, the continuation's sum."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + cont])).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    return float(sum(logp[len(prompt) - 1 + j, t] for j, t in enumerate(cont)))


@pytest.mark.parametrize("source", [PLAIN, CHAT], ids=["plain", "chat"])
def test_margins_equal_a_plain_transformers_computation(source, tiny_qwen, qwen_tok):
    bench = Benchmark(qwen_tok, prefs=str(source), n_resamples=100, limit=3)
    block = bench.score_prefs(tiny_qwen)
    enc = bench.encoded
    assert block["strategy"] == "shared" and block["self_check"]["max_diff"] <= block["self_check"]["tolerance"]
    assert block["sequences"]["sequences"] <= 2 * len(enc)
    for i, row in enumerate(block["pairs"]):
        for side, ids in (("chosen", enc.chosen[i]), ("rejected", enc.rejected[i])):
            ref = transformers_logps(tiny_qwen, enc.prompt[i], ids)
            assert abs(row[f"{side}_logp"] - ref) <= TINY_SPREAD * len(ids), (i, side)
        assert row["margin"] == pytest.approx(row["chosen_logp"] - row["rejected_logp"], abs=1e-12)
    margins = np.array([r["margin"] for r in block["pairs"]])
    assert block["accuracy"] == pytest.approx(np.mean(margins > 0))
    assert block["margin"] == pytest.approx(margins.mean())
    assert [r["config"] for r in block["configs"]] == bench.pairs.configs


def test_every_strategy_gives_each_sequence_alone(tiny_qwen, qwen_tok):
    bench = Benchmark(qwen_tok, prefs=str(CHAT), self_check=False)
    seqs = bench.seqs
    tokens = np.array([len(c) for c in seqs.conts])
    with torch.inference_mode():  # as inside the probe's mode
        alone = scoring.score_alone(tiny_qwen, seqs, list(range(len(seqs.conts))))
        for strategy in scoring.STRATEGIES:
            runner = scoring.PairRunner(strategy, tiny_qwen, seqs, qwen_tok.pad_token_id)
            batches = [[p] for p in range(len(seqs.prompts))][:2] + [list(range(2, len(seqs.prompts)))]
            got = scoring.run_batches(runner, batches)
            assert np.abs((got - alone) / tokens).max() <= TINY_SPREAD, strategy


def test_a_broken_fast_path_is_caught_and_left(tiny_qwen, qwen_tok, monkeypatch):
    """Positions off by one on the shared path's continuations: the self-check sees it and scores full sequences."""
    right_pad = scoring.right_pad

    def broken(rows, pad_id, width=None):
        ids, mask = right_pad(rows, pad_id, width)
        return torch.roll(ids, 1, dims=1), mask  # each continuation token moved one place to the right

    monkeypatch.setattr(scoring, "right_pad", broken)
    bench = Benchmark(qwen_tok, prefs=str(PLAIN), n_resamples=100)
    block = bench.score_prefs(tiny_qwen)
    assert block["strategy"] == "full" and "shared prompts" in block["self_check"]["fallbacks"][0]
    ref = transformers_logps(tiny_qwen, bench.encoded.prompt[0], bench.encoded.chosen[0])
    assert abs(block["pairs"][0]["chosen_logp"] - ref) <= TINY_SPREAD * len(bench.encoded.chosen[0])


def test_a_reduced_precision_model_is_checked_in_a_float32_replay(qwen_tok):
    from tinymcf_callback.testing import tiny_qwen3

    model = tiny_qwen3(0).to(torch.bfloat16)
    block = Benchmark(qwen_tok, prefs=str(CHAT), n_resamples=100).score_prefs(model)
    check = block["self_check"]
    assert block["precision"]["compute"] == "bfloat16" and check["reference"] == "float32 replay"
    assert check["max_diff"] <= check["tolerance"] and check["scored_diff"] is not None
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the replay left the model as it was


# ---- the numbers ---------------------------------------------------------------------------------------------
def test_intervals_resample_pairs_within_configs():
    rng = np.random.default_rng(3)
    x = rng.normal(0.5, 2.0, 600)
    groups = np.repeat(["a", "b", "c"], [100, 200, 300])
    out = stratified_means(x, groups, n_resamples=4000, seed=1)
    pooled = out["pooled"][0]
    assert pooled.estimate == pytest.approx(x.mean())
    # the pooled standard error of a stratified mean: sqrt(sum (n_g / N)^2 s_g^2 / n_g); the bootstrap's is within
    # its own noise (4000 resamples: about 2%)
    se = math.sqrt(sum((np.sum(groups == g) / len(x)) ** 2 * x[groups == g].var(ddof=1) / np.sum(groups == g)
                       for g in "abc"))
    assert (pooled.hi - pooled.lo) / 2 / 1.96 == pytest.approx(se, rel=0.05)
    one = stratified_means(np.ones(3), ["a", "a", "b"])
    assert math.isnan(one["groups"]["b"][0].lo) and math.isnan(one["pooled"][0].lo)  # one pair: no spread known


def test_a_scoring_compared_with_itself_changes_by_nothing():
    chosen, rejected = np.array([-3.0, -5.0, -2.0, -1.0]), np.array([-4.0, -4.0, -6.0, -0.5])
    block = {**summarise(chosen, rejected, ["a", "a", "b", "b"], n_resamples=200), "token_digest": "x",
             "pairs": [{"config": c, "margin": m} for c, m in zip("aabb", chosen - rejected, strict=True)]}
    assert block["accuracy"] == 0.5 and block["margin"] == pytest.approx(np.mean(chosen - rejected))
    change = prefs_change(block, block, n_resamples=200)
    assert change["accuracy"]["change"] == 0 and change["margin"]["lo"] == change["margin"]["hi"] == 0
    assert agreement({"lo": 0.1, "hi": 0.3}, {"lo": 0.02, "hi": 0.2})[0] == "agree"
    assert agreement({"lo": 0.1, "hi": 0.3}, {"lo": -0.4, "hi": -0.1})[0] == "disagree"
    assert agreement({"lo": -0.1, "hi": 0.3}, {"lo": 0.02, "hi": 0.2})[0] == "cannot tell"


# ---- when ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("at, saves, length, ended, expected", [
    ("start,middle,end", predicted_saves(10, 2), 10, False, {0: ("start",), 4: ("middle",), 10: ("end",)}),
    ("start,middle,end", [2, 4], 10, False, {0: ("start",)}),  # neither the end nor its middle known yet
    ("start,middle,end", [2, 4, 6], None, True, {0: ("start",), 2: ("middle",), 6: ("end",)}),
    ("start,middle,end", [2, 4, 6], 10, True, {0: ("start",), 2: ("middle",), 6: ("end",)}),  # it stopped early
    ("middle,end", [6], 6, False, {6: ("middle", "end")}),
    ("all", [1, 2, 3], 3, False, {0: ("step",), 1: ("step",), 2: ("step",), 3: ("step",)}),
    ("0,3", [1, 2, 3], 3, False, {0: ("step",), 3: ("step",)}),
])
def test_start_middle_and_end_of_a_run(at, saves, length, ended, expected):
    assert roles_of(parse_at(at), saves, length=length, ended=ended) == expected


@pytest.mark.parametrize("settings, needle", [
    ({}, "needs prefs"),
    ({"prefs": "x.jsonl", "limit": 2, "per_config": 3}, "give one"),
    ({"lm_eval": "ethics_cm", "per_config": 3}, "go with prefs"),
    ({"prefs": "x.jsonl", "at": "start,later"}, "'later'"),
    ({"prefs": "x.jsonl", "n_resamples": 10}, "n_resamples"),
])
def test_bad_settings_are_refused(settings, needle):
    with pytest.raises(ConfigError, match=needle):
        BenchmarkConfig(**settings)
