"""What the engine reads off a model: the model inside its wrappers, causal LM or not, windows and states."""

import copy
import logging
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist
import transformers as T

from tinymcf_callback import evaluate
from tinymcf_callback.errors import UnsupportedModelError
from tinymcf_callback.probe import Probe
from tinymcf_callback.scoring.answers import score_prompts
from tinymcf_callback.scoring.model_info import (
    ForwardArgs,
    attention_windows,
    check_causal_lm,
    shared_prefix_blocker,
    unwrap_model,
)

SMALL = dict(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


class ForwardingEngine(torch.nn.Module):
    """The shape of DeepSpeed's engine (not installed here): ``.module`` and ``forward(*inputs, **kwargs)``."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)


@pytest.fixture
def single_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _alone(model, probe, tok):
    with torch.inference_mode():
        logits = torch.cat([model(input_ids=torch.tensor([ids])).logits[:, -1] for ids in probe.encoded])
    return score_prompts(logits, tok).p_yes


def test_ddp_around_peft_keeps_the_shared_path(tiny_qwen, qwen_tok, single_process_group):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)  # random B: scores move
    peft = get_peft_model(copy.deepcopy(tiny_qwen), lora)
    ddp = torch.nn.parallel.DistributedDataParallel(peft)
    assert unwrap_model(ddp) is peft.get_base_model()
    assert ForwardArgs.of(ddp) == ForwardArgs(position_ids=True, logits_to_keep=True, cache_kw="cache")
    probe = Probe(qwen_tok, "scifi", limit=2)
    res = probe.score(ddp)
    assert res.n_forward == 1 + 2 * len(probe.batches)  # shared prefixes through DDP and PEFT
    assert np.abs(res.p_yes - _alone(peft, probe, qwen_tok)).max() < 1e-5
    assert np.abs(res.p_yes - probe.score(tiny_qwen).p_yes).max() > 1e-4  # the adapter was really applied


@pytest.mark.parametrize("kind", ["prompt", "prefix"])
def test_peft_prompt_learning_scores_unpadded_without_a_cache(kind, tiny_qwen, qwen_tok, caplog):
    from peft import PrefixTuningConfig, PromptTuningConfig, get_peft_model

    config_class = PromptTuningConfig if kind == "prompt" else PrefixTuningConfig
    config = config_class(task_type="CAUSAL_LM", num_virtual_tokens=5)
    torch.manual_seed(0)
    peft = get_peft_model(copy.deepcopy(tiny_qwen), config).eval()
    with torch.no_grad():
        for p in peft.prompt_encoder.parameters():
            p.normal_(0.0, 1.0)  # virtual tokens that move the scores
    shared = Probe(qwen_tok, "scifi", limit=1)
    full = Probe(qwen_tok, "scifi", limit=1, share_prefix=False)
    reference = _alone(peft, shared, qwen_tok)
    assert np.abs(reference - shared.score(tiny_qwen).p_yes).max() > 1e-3  # the adapter matters
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        for probe in (shared, full, shared):
            assert np.abs(probe.score(peft).p_yes - reference).max() < 1e-5
    notes = [r.getMessage() for r in caplog.records if r.name == "tinymcf_callback" and "limit=" not in r.getMessage()]
    assert len(notes) == 2  # once by each probe (the limit's subset note is another matter)
    assert all("prompt-learning adapter" in note for note in notes)


def test_unwrap_peels_what_accelerate_peels_and_what_it_leaves(tiny_qwen):
    """accelerate's ``extract_model_from_parallel`` is the library's rule for the containers it names (DDP,
    DataParallel, FSDP v1, DeepSpeed's engine, by class) and torch.compile on top: ``unwrap_model`` agrees on each,
    and goes on where it stops (a compiled model inside a container, PEFT; docs/development.md says why it is kept)."""
    from accelerate.utils import extract_model_from_parallel

    compiled = torch.compile(tiny_qwen, backend="eager")  # wrapped, not compiled until called
    for wrapped in (torch.nn.DataParallel(tiny_qwen), compiled, torch.compile(torch.nn.DataParallel(tiny_qwen))):
        assert unwrap_model(wrapped) is extract_model_from_parallel(wrapped, keep_torch_compile=False) is tiny_qwen
    nested = torch.nn.DataParallel(compiled)
    assert extract_model_from_parallel(nested, keep_torch_compile=False) is compiled  # accelerate stops here
    assert unwrap_model(nested) is tiny_qwen


@pytest.mark.slow
def test_unwrap_peels_nested_wrappers_and_stops_at_the_model(tiny_qwen):
    compiled = torch.compile(tiny_qwen, backend="eager")
    assert unwrap_model(ForwardingEngine(ForwardingEngine(compiled))) is tiny_qwen
    assert unwrap_model(tiny_qwen) is tiny_qwen  # its child `model` is not a wrapper: forward has named arguments
    assert ForwardArgs.of(ForwardingEngine(tiny_qwen)).logits_to_keep


def _tiny(cls, config_cls, **extra):
    torch.manual_seed(0)
    return cls(config_cls(**{**SMALL, **extra})).eval()


@pytest.mark.parametrize("make, says", [
    (lambda: _tiny(T.BertForMaskedLM, T.BertConfig), "BertForMaskedLM is a masked language model"),
    (lambda: _tiny(T.T5ForConditionalGeneration, T.T5Config, d_model=32, d_ff=64, num_layers=1, num_heads=2),
     "T5ForConditionalGeneration is an encoder-decoder model"),
    (lambda: _tiny(T.LlamaModel, T.LlamaConfig), "LlamaModel has no language-model head"),
    (lambda: _tiny(T.BertLMHeadModel, T.BertConfig), "BertLMHeadModel has is_decoder=False"),
])
def test_models_passed_by_mistake_get_one_clear_error_before_any_forward(make, says, qwen_tok):
    model = make()
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    probe = Probe(qwen_tok, "scifi", limit=1)
    for run in (probe.score, probe.run, lambda m: evaluate(m, qwen_tok, limit=1, verbose=False)):
        with pytest.raises(UnsupportedModelError, match=says) as err:
            run(model)
        assert "AutoModelForCausalLM" in str(err.value)  # the class that loads one the probe can read
    assert calls == []


def test_legitimate_causal_lms_are_accepted(qwen_tok):
    check_causal_lm(_tiny(T.BertLMHeadModel, T.BertConfig, is_decoder=True))  # BERT as a causal decoder

    class MyCausalLM(T.LlamaForCausalLM):  # a custom subclass, unknown to transformers' tables
        pass

    check_causal_lm(_tiny(MyCausalLM, T.LlamaConfig))

    class RemoteCodeLM(T.PreTrainedModel):  # trust_remote_code style: head not called lm_head, registered in auto_map
        config_class = T.LlamaConfig

        def __init__(self, config):
            super().__init__(config)
            self.body = T.LlamaModel(config)
            self.output_layer = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    remote = RemoteCodeLM(T.LlamaConfig(**SMALL, auto_map={"AutoModelForCausalLM": "modeling_x.RemoteCodeLM"}))
    check_causal_lm(remote)
    remote.config.auto_map = None
    with pytest.raises(UnsupportedModelError, match="RemoteCodeLM"):
        check_causal_lm(remote)


@pytest.mark.parametrize("config, expect", [
    (T.MistralConfig(**SMALL, sliding_window=60), "sliding_window=60"),  # window equal to the slots: refused
    (T.MistralConfig(**SMALL, sliding_window=61), None),
    (T.Qwen2Config(**SMALL, use_sliding_window=False, sliding_window=8), None),  # switched off explicitly
    (T.Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=8, max_window_layers=1), "sliding_window=8"),
    (T.Llama4TextConfig(**SMALL, attention_chunk_size=16), "attention_chunk_size=16"),
    (T.Gemma3TextConfig(**SMALL, sliding_window=16, sliding_window_pattern=2), "sliding_window=16"),
    (T.GPTNeoConfig(window_size=16, attention_types=[[["global", "local"], 1]], num_layers=2), "window_size=16"),
    (T.Lfm2Config(**SMALL, layer_types=["conv"]), "conv layers"),
    (T.JambaConfig(**SMALL), "state"),
    (T.Qwen3NextConfig(**SMALL), "linear_attention layers"),
])
def test_shared_prefix_blocker_reads_windows_and_states_from_configs(config, expect):
    model = type("M", (torch.nn.Module,), {})()
    model.config = config
    reason = shared_prefix_blocker(model, ForwardArgs(True, True, "cache"), 60)
    assert (reason is None) if expect is None else (expect in reason), reason


def test_unreadable_window_is_conservative():
    model = type("M", (torch.nn.Module,), {})()
    model.config = types.SimpleNamespace(model_type="custom", sliding_window=[32, None])  # a remote-code config
    assert "not a window size the probe understands" in attention_windows(model)
    assert "not a window size" in shared_prefix_blocker(model, ForwardArgs(True, True, "cache"), 10)


def test_fallback_reason_is_logged_once_per_model(qwen_tok, caplog):
    torch.manual_seed(0)
    model = T.MistralForCausalLM(T.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=8)).eval()
    probe = Probe(qwen_tok, "scifi", limit=2, token_budget=300)
    assert len(probe.batches) > 1
    caplog.clear()  # the probe's own note on limit=2
    with caplog.at_level(logging.WARNING, logger="tinymcf_callback"):
        probe.score(model)
        probe.score(model)
    notes = [r for r in caplog.records if r.name == "tinymcf_callback"]
    assert len(notes) == 1 and "MistralForCausalLM cannot take the shared-prefix path" in notes[0].getMessage()
    assert "sliding_window=8" in notes[0].getMessage()
