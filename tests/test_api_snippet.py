"""The documented lower-level API, run exactly as docs/python.md writes it.

    prompts, meta = format_prompts(tok, vignettes)
    # ... your own forward pass returning [N, V] logits at the answer position ...
    scored = score_prompts(logits, tok)
    report = analyse(scored.p_yes, meta, yn_mass=scored.yn_mass)
    print(report["info"])

(the docs' forward pass uses ``encode_batch``; the first test writes its own, independent of the engine)

with ``vignettes = load_vignettes("scifi")`` (all 51 vignettes, 408 prompts) and a forward
pass written here, independent of the engine: left-padded batches, positions that skip
the padding, the last position's logits.
"""

import numpy as np
import pytest
import torch

from tinymcf_callback import Probe, analyse, format_prompts, load_vignettes, score_prompts


def my_forward(model, tok, prompts, batch_size=32):
    """A user's own forward pass: ``[N, V]`` logits at each prompt's answer position."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            enc = tok(prompts[start:start + batch_size], add_special_tokens=False, padding=True,
                      padding_side="left", return_tensors="pt")
            positions = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
            out.append(model(**enc, position_ids=positions, logits_to_keep=1).logits[:, -1])
    return torch.cat(out)


@pytest.mark.slow
def test_documented_snippet_runs_as_written(tiny_qwen, qwen_tok, capsys):
    model, tok = tiny_qwen, qwen_tok
    vignettes = load_vignettes("scifi")

    prompts, meta = format_prompts(tok, vignettes)
    logits = my_forward(model, tok, prompts)
    scored = score_prompts(logits, tok)
    report = analyse(scored.p_yes, meta, yn_mass=scored.yn_mass)
    print(report["info"])

    printed = capsys.readouterr().out
    assert logits.shape == (408, model.config.vocab_size)
    for key in ("yn_mass_mean", "frame_agreement", "elapsed_s"):
        assert key in printed and report["info"][key] is not None, key
    assert report["info"]["elapsed_s"] > 0  # seconds since format_prompts: covers the forward pass above
    assert isinstance(scored.p_yes, np.ndarray) and isinstance(scored.yn_mass, np.ndarray)

    probe = Probe(tok, "scifi").run(model)  # the same numbers through the package's own engine
    assert np.abs(scored.p_yes - probe["raw"]["p_yes"].to_numpy()).max() < 1e-5
    assert np.abs(scored.yn_mass - probe["raw"]["yn_mass"].to_numpy()).max() < 1e-5
    for key in ("score", "gap", "sn"):
        assert abs(report[key] - probe[key]) < 1e-5, key
    for key in ("yn_mass_mean", "yn_mass_min", "frame_agreement"):
        assert abs(report["info"][key] - probe["info"][key]) < 1e-5, key


@pytest.mark.slow
def test_encode_batch_is_the_engines_encoding_whatever_the_tokenizer_pads(tiny_qwen, qwen_tok):
    import copy

    from tinymcf_callback import compare
    from tinymcf_callback.scoring.engine import encode_batch

    tok = copy.deepcopy(qwen_tok)
    tok.padding_side = "right"  # SmolLM2's default: the trap encode_batch avoids
    vignettes = load_vignettes("scifi", per_foundation=2)
    prompts, meta = format_prompts(tok, vignettes)
    logits = []
    with torch.inference_mode():
        for start in range(0, len(prompts), 16):  # the documented snippet
            batch = encode_batch(tok, prompts[start:start + 16], tiny_qwen)
            logits.append(tiny_qwen(**batch).logits[:, -1])
    scored = score_prompts(torch.cat(logits), tok)
    report = analyse(scored.p_yes, meta, yn_mass=scored.yn_mass, name="scifi")

    probe = Probe(qwen_tok, "scifi", per_foundation=2).run(tiny_qwen)
    assert np.abs(scored.p_yes - probe["raw"]["p_yes"].to_numpy()).max() < 1e-5
    # the hand-scored report is a report: intervals, raw rows, the prompts' digest; compare pairs it
    assert report["prompt_digest"] == probe["prompt_digest"] and report["score_lo"] <= report["score"]
    assert list(report["raw"]["p_yes"]) == list(scored.p_yes)
    change = compare(probe, report)
    assert abs(change["headline"]["score"]["change"]) < 1e-5

    # what the obvious way gives: right-padded rows read a pad token's logits, not the answer's
    with torch.inference_mode():
        enc = tok(prompts[:16], padding=True, return_tensors="pt")
        naive = score_prompts(tiny_qwen(**enc).logits[:, -1], tok).p_yes
    assert np.abs(naive - scored.p_yes[:16]).max() > 1e-3
    batch = encode_batch(tok, prompts[:2])  # without a model: positions from 0, left padding
    assert batch["attention_mask"][:, 0].tolist() == [int(len(tok(p, add_special_tokens=False).input_ids) ==
                                                           batch["input_ids"].shape[1]) for p in prompts[:2]]
    assert batch["position_ids"][batch["attention_mask"].bool()].min() == 0 and batch["use_cache"] is False
