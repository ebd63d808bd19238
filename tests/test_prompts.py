"""Prompt formatting and Yes/No token discovery on real tokenizers."""

import copy
import time

import pytest

from tinymcf_callback import FRAMES, format_prompt, format_prompts, load_vignettes
from tinymcf_callback.data.sets import CONDITIONS
from tinymcf_callback.scoring.prompts import answer_token_ids

SCENE = "You see a wizard turning a lost traveller into a toad for fun."


def test_qwen3_prompt_disables_thinking_and_prefills(qwen_tok):
    p = format_prompt(qwen_tok, SCENE, FRAMES["wrong"])
    assert p.startswith("<|im_start|>user\n" + SCENE + "\n\n" + FRAMES["wrong"] + "<|im_end|>")
    assert p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nAnswer:")


def test_smollm2_prompt_uses_its_template(smollm2):
    _, tok = smollm2
    p = format_prompt(tok, SCENE, FRAMES["accept"])
    assert "<|im_start|>system\n" in p  # SmolLM2's default system prompt
    assert p.endswith(FRAMES["accept"] + "<|im_end|>\n<|im_start|>assistant\nAnswer:")
    assert format_prompt(tok, SCENE, FRAMES["accept"], answer_prefix="").endswith("assistant\n")


def test_plain_format_without_chat_template(qwen_tok):
    tok = copy.deepcopy(qwen_tok)
    tok.chat_template = None
    p = format_prompt(tok, SCENE, FRAMES["wrong"])
    assert p == f"Question: {SCENE}\n\n{FRAMES['wrong']}\nAnswer:"  # Qwen adds no BOS


@pytest.mark.parametrize("add_bos", [True, False])
def test_plain_format_starts_with_bos_exactly_when_the_tokenizer_adds_one(smollm2_path, add_bos):
    """Without a chat template the prompt opens with BOS when the tokenizer adds it, once (never twice)."""
    from transformers import AutoTokenizer

    from tinymcf_callback.probe import Probe

    tok = AutoTokenizer.from_pretrained(smollm2_path, add_bos_token=add_bos)
    tok.chat_template = None
    assert (tok("x").input_ids[0] == tok.bos_token_id) == add_bos  # the tokenizer's own habit, both ways
    p = format_prompt(tok, SCENE, FRAMES["wrong"])
    assert p == f"{tok.bos_token if add_bos else ''}Question: {SCENE}\n\n{FRAMES['wrong']}\nAnswer:"
    encoded = Probe(tok, "scifi", limit=1).encoded
    assert all((ids[0] == tok.bos_token_id) == add_bos and ids[1] != tok.bos_token_id for ids in encoded)


def test_trailing_space_prefill_is_refused(qwen_tok):
    with pytest.raises(ValueError, match="whitespace"):
        format_prompt(qwen_tok, SCENE, FRAMES["wrong"], answer_prefix="A: ")


def test_format_prompts_covers_vignette_condition_frame(qwen_tok):
    vs = load_vignettes("scifi", limit=3)
    before = time.time()
    prompts, meta = format_prompts(qwen_tok, vs)
    assert before <= meta.attrs["formatted_at"] <= time.time()  # analyse's elapsed_s counts from here
    assert len(prompts) == len(meta) == 3 * len(CONDITIONS) * len(FRAMES)
    assert list(meta.columns) == ["id", "foundation", "foundation_coarse", "condition", "frame", "wrong"]
    r = meta.iloc[11]
    v = next(v for v in vs if v["id"] == r["id"])
    assert v[r["condition"]] in prompts[11] and FRAMES[r["frame"]] in prompts[11]


def test_answer_tokens_found_from_vocabulary(qwen_tok, smollm2):
    yes, no = answer_token_ids(qwen_tok)
    assert {7414, 9454} <= set(yes) and {2308, 2753} <= set(no)
    assert all(qwen_tok.decode([i]).strip().lower() == "yes" for i in yes)
    assert answer_token_ids(qwen_tok) is answer_token_ids(qwen_tok)  # computed once per tokenizer
    _, stok = smollm2
    syes, sno = answer_token_ids(stok)
    assert stok.convert_tokens_to_ids("ĠYes") in syes and stok.convert_tokens_to_ids("No") in sno


@pytest.mark.parametrize("which", [pytest.param("qwen3", marks=pytest.mark.slow), "smollm2"])  # 2.4 s, 0.5 s
def test_the_answer_candidates_find_every_answer_token_the_whole_vocabulary_does(which):
    """Decoding only the entries that spell an answer word finds the ids decoding the whole vocabulary finds."""
    from transformers import AutoTokenizer

    from tinymcf_callback import testing
    from tinymcf_callback.scoring.prompts import ANSWER_WORDS, answer_candidates

    tok = AutoTokenizer.from_pretrained(testing.qwen3_tokenizer_dir() if which == "qwen3" else testing.smollm2_dir())
    decoded = tok.batch_decode([[i] for i in range(len(tok))], skip_special_tokens=False,
                               clean_up_tokenization_spaces=False)
    whole = {i for i, text in enumerate(decoded) if text.strip().lower() in ANSWER_WORDS}
    candidates = answer_candidates(tok)
    assert whole <= set(candidates) and len(candidates) < len(tok) / 20


def test_tokenizer_without_yes_no_is_a_clear_error():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", "maybe", "perhaps", "yes-ish"])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]")
    with pytest.raises(ValueError, match="no single token for Yes"):
        answer_token_ids(tok)
