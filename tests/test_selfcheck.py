"""The engine checks itself: the defects found from outside are caught (or fixed at their cause), and so is a new one.

Every case is scored against the simplest reference, each prompt alone (``score_alone``: no padding,
mask, position ids or cache), on tiny random models with ``initializer_range`` 0.125 so that a wrong
position or mask moves P(Yes) visibly. Before the self-check each of these reported a wrong number
without a word: RoBERTa-family decoders 0.079-0.42 off on every path (positions counted from 0),
RecurrentGemma 2.2e-3 on padded rows, a last-position steering hook 1e-3 on the shared path, Dory's
``last_loop`` cache 6.3e-5 on the shared path; a pad token outside the vocabulary and a per-layer
config crashed every probe; a compiler error on the fast path ended the probe.
"""

import logging

import numpy as np
import pytest
import torch
import transformers as T

from tinymcf_callback.errors import ConfigError, EngineMismatchError
from tinymcf_callback.probe import Probe
from tinymcf_callback.scoring import batching, engine, model_info
from tinymcf_callback.scoring.engine import score_alone
from tinymcf_callback.scoring.model_info import attention_windows, position_base
from tinymcf_callback.scoring.selfcheck import N_CHECKED, TOLERANCES, check_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, INIT = 151936, 0.125
AGREE = 1e-5  # P(Yes) of each prompt against each prompt alone, fp32 (measured: <= 5e-7 on every case here)


def decoder(**extra):
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, initializer_range=INIT, **extra)


def build(factory):
    torch.manual_seed(0)
    return factory().eval()


@pytest.fixture(scope="module")
def probes(qwen_tok):
    """``scifi`` limit 3 (24 prompts) in several batches, with and without prefix sharing."""
    return tuple(Probe(qwen_tok, "scifi", limit=3, token_budget=600, share_prefix=share) for share in (True, False))


def alone(model, probe):
    with torch.inference_mode():
        return score_alone(model, probe.encoded, list(range(len(probe))), probe.tok)[0]


def assert_each_prompt_as_alone(res, reference):
    assert np.abs(res.p_yes - reference.p_yes).max() < AGREE
    assert np.abs(np.log(res.yn_mass) - np.log(reference.yn_mass)).max() < 1e-4


# ---- RoBERTa-family decoders: positions from padding_idx + 1, fixed at the cause --------------------------------
ROBERTA_FAMILY = ["Roberta", "XLMRoberta", "Camembert", "Data2VecText", "RobertaPreLayerNorm", "XLMRobertaXL", "Xmod"]


def roberta_like(family: str):
    config = getattr(T, f"{family}Config")(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512,
                                           initializer_range=INIT, is_decoder=True)
    model = getattr(T, f"{family}ForCausalLM")(config)
    if family == "Xmod":
        model.set_default_language("en_XX")  # X-MOD routes each input through a language adapter
    return model


@pytest.mark.parametrize("family", ROBERTA_FAMILY)
def test_roberta_family_decoders_get_their_own_positions(family, probes, caplog):
    model = build(lambda: roberta_like(family))
    assert position_base(model) == model.config.pad_token_id + 1 == 2
    reference = alone(model, probes[0])
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        for probe in probes:
            res = probe.score(model)
            assert_each_prompt_as_alone(res, reference)
            assert res.check["fallbacks"] == []  # right on the fast path itself, not only after falling back
    assert [r.getMessage() for r in caplog.records] == []
    assert probes[0].score(model).strategy == "shared"


def test_roberta_positions_counted_from_zero_are_what_the_check_would_catch(probes, monkeypatch):
    """Guard: with the old positions (from 0) the same model is far off, so the test above can fail."""
    model = build(lambda: roberta_like("Roberta"))
    reference = alone(model, probes[0])
    monkeypatch.setattr(model_info, "position_base", lambda m: 0)
    unchecked = Probe(probes[0].tok, "scifi", limit=3, token_budget=600, self_check=False)
    assert np.abs(unchecked.score(model).p_yes - reference.p_yes).max() > 0.05
    with pytest.raises(EngineMismatchError, match="RobertaForCausalLM: even unpadded prompts"):
        probes[0].score(model)  # every path is wrong, and the probe says so instead of reporting a number


# ---- caught by the check, with no rule written for them -------------------------------------------------------
def recurrent_gemma():
    return T.RecurrentGemmaForCausalLM(T.RecurrentGemmaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, lru_width=64, attention_window_size=2048, block_types=["recurrent", "attention"],
        initializer_range=INIT))


def dory_last_loop():
    return T.DoryForCausalLM(T.DoryConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=INIT, n_input_layers=1,
        n_output_layers=1, n_recurrent_loops=2, recurrent_kv_cache_mode="last_loop", sliding_window=1024))


def steered(at: str):
    """A tiny Llama with a steering hook on its first layer: ``c * v`` added at the last position, or everywhere."""
    model = T.LlamaForCausalLM(T.LlamaConfig(**decoder()))
    direction = torch.randn(64)

    def add(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if at == "last":
            hidden[:, -1] += 4.0 * direction
        else:
            hidden += 4.0 * direction
        return output

    model.model.layers[0].register_forward_hook(add)
    return model


CAUGHT = {  # model, the strategy it lands on, the strategies the check left (in order)
    "recurrent_gemma": (recurrent_gemma, "unpadded", ["full prompts (left-padded)"]),
    "dory_last_loop": (dory_last_loop, "full", ["shared prefixes"]),
    "steering_hook_at_the_last_position": (lambda: steered("last"), "full", ["shared prefixes"]),
    "steering_hook_at_every_position": (lambda: steered("all"), "shared", []),
}


@pytest.mark.parametrize("case", list(CAUGHT))
def test_wrong_fast_paths_are_caught_and_left(case, probes, caplog):
    factory, lands_on, left = CAUGHT[case]
    model = build(factory)
    shared, _ = probes
    reference = alone(model, shared)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        res = shared.score(model)
        again = shared.score(model)  # the next probe starts where this one ended, and is checked again
    assert_each_prompt_as_alone(res, reference)
    assert res.strategy == again.strategy == lands_on
    assert [why.split(" gave ")[0] for why in res.check["fallbacks"]] == left
    for why in res.check["fallbacks"]:  # the measured difference, above the precision's tolerance
        measured = max(float(why.split("gave P(Yes) ")[1].split()[0]), float(why.split("mass ")[1].split()[0]))
        assert measured > TOLERANCES["float32"] and "float32-precision tolerance 2e-05" in why
    assert again.check["fallbacks"] == [] and again.check["max_diff"] < AGREE
    fallback_lines = [r.getMessage() for r in caplog.records if "instead" in r.getMessage()]
    assert len(fallback_lines) == len(left)  # said once, with the measured difference
    assert all(type(model).__name__ in line for line in fallback_lines)


# ---- a new wrong path: the engine broken on purpose ------------------------------------------------------------
def _positions_over_padding(mask, offset):
    """Broken on purpose: positions counted over the padding too (as if position_ids were dropped)."""
    return offset + torch.arange(mask.shape[-1]).expand_as(mask)


def _pad_on_the_right(seqs, pad_id, width=None):
    """Broken on purpose: padding at the right end of each row, where the answer should be."""
    width = width or max(len(q) for q in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, q in enumerate(seqs):
        ids[row, :len(q)] = torch.tensor(q, dtype=torch.long)
        mask[row, :len(q)] = 1
    return ids, mask


BREAKS = {  # what is broken, the probe it breaks (prefix sharing or not), the strategies left on the way to unpadded
    "positions": ("_positions", _positions_over_padding, True, ["shared prefixes", "full prompts (left-padded)"]),
    # the shared path's questions are all of one length here, so only the full path reads a pad as the answer
    "right_padding": ("_left_pad", _pad_on_the_right, False, ["full prompts (left-padded)"]),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_an_engine_broken_on_purpose_falls_back_and_says_so(name, qwen_tok, monkeypatch, caplog):
    """No rule knows these breaks: the check sees the fast paths go wrong and lands on the unpadded one."""
    from helpers.models import ARCHITECTURES

    attribute, broken, share, left = BREAKS[name]
    model = build(ARCHITECTURES["gpt2"][0])  # absolute positions: a wrong position shows
    probe = Probe(qwen_tok, "scifi", limit=3, token_budget=600, share_prefix=share)
    reference = alone(model, probe)
    monkeypatch.setattr(engine, attribute, broken)
    unchecked = Probe(qwen_tok, "scifi", limit=3, token_budget=600, share_prefix=share, self_check=False)
    assert np.abs(unchecked.score(model).p_yes - reference.p_yes).max() > 1e-2  # the break is real
    caplog.clear()  # what building the probes said (limit=3's note); the scoring's own warnings below
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        res = probe.score(model)
    assert res.strategy == "unpadded"
    assert_each_prompt_as_alone(res, reference)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(": ", 1)[1].split(" gave ")[0] for line in lines] == left
    assert all(line.startswith("GPT2LMHeadModel: ") and "away from each prompt scored alone" in line for line in lines)


def test_a_model_wrong_on_every_path_is_refused_with_its_class_and_difference(probes, qwen_tok):
    """A model whose answer depends on the other rows of its batch: even unpadded batches disagree with alone."""
    model = build(lambda: T.LlamaForCausalLM(T.LlamaConfig(**decoder())))
    tilt = torch.linspace(0.0, 1.0, VOCAB)  # moves Yes against No, more the more rows the batch has
    model.lm_head.register_forward_hook(lambda m, args, out: out + 0.5 * (out.shape[0] - 1) * tilt)
    with pytest.raises(EngineMismatchError) as raised:
        Probe(qwen_tok, "scifi", limit=3, token_budget=600).score(model)
    message = str(raised.value)
    assert message.startswith("LlamaForCausalLM: even unpadded prompts (one length per forward call) gave P(Yes) ")
    assert "reports nothing rather than a wrong number" in message and "self_check_tolerance" in message


# ---- fast-path failures -----------------------------------------------------------------------------------------
class CompilerError(Exception):
    """Stands for torch inductor's ``CppCompileError``: not one of the exception types a cache rejection raises."""


def test_a_fast_path_that_raises_any_error_falls_back_with_one_line_each(probes, caplog):
    """Like flex_attention on CPU: the shared and the padded path fail inside the compiler, the unpadded one works."""
    model = build(lambda: T.LlamaForCausalLM(T.LlamaConfig(**decoder())))
    model.config._attn_implementation_before = model.config._attn_implementation
    real_forward = model.forward

    def fussy(*args, **kwargs):
        mask = kwargs.get("attention_mask")
        if kwargs.get("cache") is not None or (mask is not None and not bool(mask.all())):
            raise CompilerError("g++ failed: 'cur_qSplitSize0' was not declared in this scope")
        return real_forward(*args, **kwargs)

    model.forward = fussy
    shared, _ = probes
    reference = alone(model, shared)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        res = shared.score(model)
        shared.score(model)
    assert res.strategy == "unpadded"
    assert_each_prompt_as_alone(res, reference)
    assert res.check["fallbacks"] == [
        "shared prefixes failed (CompilerError: g++ failed: 'cur_qSplitSize0' was not declared in this scope)",
        "full prompts (left-padded) failed (CompilerError: g++ failed: 'cur_qSplitSize0' was not declared in this "
        "scope)"]
    assert len(caplog.records) == 2  # one line per strategy left, not one per probe
    assert model.config._attn_implementation == model.config._attn_implementation_before  # left as the user set it


@pytest.mark.slow
def test_flex_attention_on_cpu_falls_back_to_a_path_that_compiles(qwen_tok, caplog):
    """The real case: inductor's CPU code for flex attention fails on the shared path's and then the padded path's
    shapes (a torch bug); the unpadded path compiles. The attention implementation is left as the user set it."""
    model = build(lambda: T.LlamaForCausalLM(T.LlamaConfig(**decoder())))
    model.set_attn_implementation("flex_attention")
    probe = Probe(qwen_tok, "scifi", limit=1, token_budget=600)
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        res = probe.score(model)
    assert model.config._attn_implementation == "flex_attention"
    assert res.check["max_diff"] < AGREE and res.strategy in ("full", "unpadded")
    reference = alone(model, probe)
    assert np.abs(res.p_yes - reference.p_yes).max() < AGREE


# ---- crashes that were not the model's fault ---------------------------------------------------------------------
def test_a_pad_token_outside_the_vocabulary_pads_with_one_inside(probes):
    from transformers import AutoTokenizer

    from tinymcf_callback import testing as offline_assets

    tok = AutoTokenizer.from_pretrained(offline_assets.smollm2_dir())
    tok.add_special_tokens({"pad_token": "[PAD]"})  # id 49152, one past the model's 49,152-row embedding
    model = build(lambda: T.LlamaForCausalLM(T.LlamaConfig(**{**decoder(), "vocab_size": 49152})))
    for share in (True, False):
        probe = Probe(tok, "scifi", limit=3, token_budget=600, share_prefix=share)
        assert probe.tok.pad_token_id == 49152
        assert_each_prompt_as_alone(probe.score(model), alone(model, probe))


def test_per_layer_configs_are_read_per_layer(probes):
    """transformers 5's per_layer_config: reading sliding_window from the global config raises; the rules read each
    layer's (a window counts unless that layer switches it off) and never crash the choice of path."""
    off = build(lambda: T.Qwen3ForCausalLM(T.Qwen3Config(per_layer_config={0: {"sliding_window": 16}},
                                                         **decoder(head_dim=16))))
    assert attention_windows(off) == {}  # layer 0 sets a window but use_sliding_window is False there
    on = build(lambda: T.Qwen3ForCausalLM(T.Qwen3Config(
        per_layer_config={0: {"sliding_window": 16, "use_sliding_window": True}}, **decoder(head_dim=16))))
    assert attention_windows(on) == {"sliding_window": 16}
    assert probes[0].score(on).strategy == "full"  # a 16-slot window is shorter than the shared prefixes' cache
    for probe in probes:
        assert_each_prompt_as_alone(probe.score(off), alone(off, probes[0]))


def test_a_tokenizer_without_a_chat_template_is_said_once_a_probe_in_the_log_and_every_report(qwen_tok, caplog):
    import copy

    plain = copy.deepcopy(qwen_tok)
    plain.chat_template = None
    model = build(lambda: T.LlamaForCausalLM(T.LlamaConfig(**decoder())))
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        probe = Probe(plain, "scifi", limit=1)  # said as it is built, not at each of its probes
        reports = [probe.run(model) for _ in range(2)]
    notes = [r.getMessage() for r in caplog.records if "chat template" in r.getMessage()]
    assert len(notes) == 1 and "plain 'Question: ... Answer:' form" in notes[0]
    for report in reports:
        assert any("no chat template" in w for w in report["info"]["warnings"])
        assert report["info"]["sample_prompt"].startswith("Question: ")
    assert not any("chat template" in w for w in Probe(qwen_tok, "scifi", limit=1).run(model)["info"]["warnings"])


# ---- the check itself ---------------------------------------------------------------------------------------------
def test_the_check_is_recorded_and_cheap(qwen_tok, tiny_qwen):
    shared = Probe(qwen_tok, "scifi", limit=3, token_budget=600)  # a fresh rotation: its first probe checks
    report = shared.run(tiny_qwen)
    check = report["info"]["self_check"]
    assert check["strategy"] == report["info"]["strategy"] == "shared" and check["fallbacks"] == []
    assert 1 <= check["n_forward"] == len(check["checked"]) <= N_CHECKED and check["max_diff"] < AGREE
    assert check["tolerance"] == check["resolution"] == TOLERANCES["float32"] and check["precision"] == "float32"
    assert check["reference"] == "float32" and check["replay_note"] is None and check["scored_diff"] is None
    assert len(check["checked_prompts"]) == len(check["checked"])
    assert check["checked_prompts"][0].startswith("vignette ")
    assert check["coverage"]["checked_this_cycle"] >= len(check["checked"])
    assert 0 < check["seconds"] < report["info"]["elapsed_s"] and check["waiting"] is False
    # the next probes of the same model check prompts only as their time pays for them (a checked prompt costs this
    # tiny model far more than CHECK_BUDGET of a probe): some wait, and a waiting probe compares nothing
    later = [shared.run(tiny_qwen)["info"]["self_check"] for _ in range(3)]
    waiting = [c for c in later if c["waiting"]]
    assert waiting and all(c["checked"] == [] and c["n_forward"] == 0 and c["resolution"] is None for c in waiting)
    assert all(c["coverage"]["checked_this_cycle"] >= len(check["checked"]) for c in later)


def test_the_checked_prompts_cover_the_padding_and_the_seams(probes):
    """The most padded prompt, the most padded of the last batch, and on the shared path the prompt with the most
    padding before its scenario and the one with the most before its question (the two seams in the cache)."""
    shared, full = probes
    for probe, strategy in ((shared, "shared"), (full, "full")):
        pads = batching.padding_per_prompt(probe.encoded, probe.batches, strategy, probe.prefix_plan)
        picks = check_prompts(probe.encoded, probe.batches, strategy, probe.prefix_plan)
        assert len(picks) == len(set(picks)) == N_CHECKED
        first, second = picks[:2]
        assert pads[first] == max(pads.values()) > 0
        assert second in probe.batches[-1] and pads[second] == max(pads[i] for i in probe.batches[-1])
        if strategy == "shared":
            seams = {i: pad for b in probe.batches
                     for i, pad in batching.seam_padding(probe.encoded, b, probe.prefix_plan).items()}
            assert max(seams[i][0] for i in picks) == max(s[0] for s in seams.values()) > 0
            assert max(seams[i][1] for i in picks) == max(s[1] for s in seams.values())  # the questions: 0 here
        else:
            least = min(pads[i] for i in pads if pads[i] > 0)
            assert least in {pads[i] for i in picks}  # a short stretch of padding is looked at too


def test_low_precision_is_replayed_in_float32_and_a_tolerance_can_be_set(qwen_tok):
    bf16 = build(lambda: T.LlamaForCausalLM(T.LlamaConfig(**decoder()))).to(torch.bfloat16)
    res = Probe(qwen_tok, "scifi", limit=1).score(bf16)
    assert res.precision == {"dtype": "bfloat16", "autocast": None, "device": "cpu", "compute": "bfloat16"}
    check = res.check
    assert check["precision"] == "bfloat16" and check["reference"] == "float32 replay"
    assert check["tolerance"] == check["resolution"] == TOLERANCES["float32"] and check["max_diff"] < AGREE
    assert check["scored_tolerance"] == TOLERANCES["bfloat16"] and 0 < check["scored_diff"] < 0.05
    set_by_hand = Probe(qwen_tok, "scifi", limit=1, self_check_tolerance=0.05).score(bf16).check
    assert set_by_hand["tolerance"] == set_by_hand["scored_tolerance"] == 0.05
    for bad in (0, 1.5, True, "1e-3"):
        with pytest.raises(ValueError, match="self_check_tolerance must be a number between 0 and 1"):
            Probe(qwen_tok, "scifi", limit=1, self_check_tolerance=bad)


def test_the_check_can_be_switched_off(qwen_tok, tiny_qwen):
    res = Probe(qwen_tok, "scifi", limit=1, self_check=False).score(tiny_qwen)
    assert res.check is None and res.strategy == "shared"


def test_the_budget_is_a_setting(qwen_tok, tiny_qwen):
    """self_check_budget: the share of a run's probe time the check spends. All of it: every probe checks."""
    generous = Probe(qwen_tok, "scifi", limit=3, token_budget=600, self_check_budget=1.0)
    checks = [generous.score(tiny_qwen).check for _ in range(3)]
    assert all(c["checked"] and not c["waiting"] for c in checks)
    assert checks[-1]["coverage"]["checked_this_cycle"] == len({i for c in checks for i in c["checked"]})
    with pytest.raises(ConfigError, match="self_check_budget must be a number above 0"):
        Probe(qwen_tok, "scifi", self_check_budget=0)
