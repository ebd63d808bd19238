#!/usr/bin/env python
"""The engine on the cases that were found wrong from outside: what each strategy gives, and what the probe reports.

For each case, every prompt of ``scifi`` (``--limit`` vignettes) is scored alone (the reference:
no padding, mask, position ids or cache), then by each strategy forced with the self-check off
(what the engine would report without it), then by the probe as it runs (checked). Printed: the
largest |P(Yes) - P(Yes) alone| of each, the strategy the probe ended on and why it left the
faster ones. Nothing is hard-coded; tiny random models use ``initializer_range`` 0.125 so that a
wrong position or mask shows.

    python -m benchmarks.engine_cases                 # tiny cases + SmolLM2 steering and precision (~2 min)
    python -m benchmarks.engine_cases --flex          # also flex_attention on CPU (compiles: ~2 more min)
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers as T  # noqa: E402

from tinymcf_callback import testing as offline_assets  # noqa: E402
from tinymcf_callback.probe import Probe  # noqa: E402
from tinymcf_callback.scoring.engine import STRATEGIES, run_batches, score_alone  # noqa: E402

VOCAB, INIT = 151936, 0.125


def decoder(**extra):
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, initializer_range=INIT, **extra)


def roberta_like(family):
    config = getattr(T, f"{family}Config")(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512,
                                           initializer_range=INIT, is_decoder=True)
    model = getattr(T, f"{family}ForCausalLM")(config)
    if family == "Xmod":
        model.set_default_language("en_XX")
    return model


def steering_hook(model, layer, coefficient, last_only):
    torch.manual_seed(1)
    direction = torch.randn(model.config.hidden_size)
    direction /= direction.norm()

    def add(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if last_only:
            hidden[:, -1] += coefficient * direction
        else:
            hidden += coefficient * direction
        return output

    return layer.register_forward_hook(add)


def tiny_cases():
    yield from ((f"{f}ForCausalLM", lambda f=f: roberta_like(f), None) for f in
                ("Roberta", "XLMRoberta", "Camembert", "Data2VecText", "RobertaPreLayerNorm", "XLMRobertaXL", "Xmod"))
    yield "RecurrentGemma", lambda: T.RecurrentGemmaForCausalLM(T.RecurrentGemmaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, lru_width=64, attention_window_size=2048, block_types=["recurrent", "attention"],
        initializer_range=INIT)), None
    yield "Dory, last_loop cache", lambda: T.DoryForCausalLM(T.DoryConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=INIT, n_input_layers=1,
        n_output_layers=1, n_recurrent_loops=2, recurrent_kv_cache_mode="last_loop", sliding_window=1024)), None
    yield "Qwen3, per_layer_config window", lambda: T.Qwen3ForCausalLM(T.Qwen3Config(
        per_layer_config={0: {"sliding_window": 16}}, **decoder(head_dim=16))), None
    yield "Llama, pad token outside the vocabulary", lambda: T.LlamaForCausalLM(
        T.LlamaConfig(**{**decoder(), "vocab_size": 49152})), "smollm2+pad"


def measure(name, model, tok, limit, budget, unsteered=None):
    probe = Probe(tok, "scifi", limit=limit, token_budget=budget)
    with torch.inference_mode():
        reference = score_alone(model, probe.encoded, list(range(len(probe))), tok)[0].p_yes
    row = {"case": name}
    if unsteered is not None:
        row["effect"] = f"{np.abs(reference - unsteered).max():.1e}"
    for strategy in STRATEGIES:
        forced = Probe(tok, "scifi", limit=limit, token_budget=budget, self_check=False)
        try:
            with torch.inference_mode():
                res = run_batches(model, forced.encoded, forced.batches, tok, prefix_plan=forced.prefix_plan,
                                  strategy=strategy)
            row[strategy] = f"{np.abs(res.p_yes - reference).max():.1e}"
        except Exception as e:  # noqa: BLE001 - a strategy that fails is a result here
            row[strategy] = type(e).__name__
    try:
        res = probe.score(model)
        row["probe"] = f"{np.abs(res.p_yes - reference).max():.1e}"
        row["ends on"] = res.strategy
        row["left"] = "; ".join(f.split(" (")[0].split(" gave ")[0] + (" (check)" if " gave " in f else " (error)")
                                for f in res.check["fallbacks"]) or "-"
    except Exception as e:  # noqa: BLE001
        row["probe"], row["ends on"], row["left"] = type(e).__name__, "-", str(e)[:60]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=3, help="vignettes of scifi per case (8 prompts each; default 3)")
    ap.add_argument("--flex", action="store_true", help="also flex_attention on CPU (inductor compiles, minutes)")
    ap.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2 cases")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    qwen = T.AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
    smol_tok = T.AutoTokenizer.from_pretrained(offline_assets.smollm2_dir())
    padded_tok = copy.deepcopy(smol_tok)
    padded_tok.add_special_tokens({"pad_token": "[PAD]"})
    rows = []
    for name, factory, which in tiny_cases():
        torch.manual_seed(0)
        rows.append(measure(name, factory().eval(), padded_tok if which else qwen, args.limit, 600))
    if args.flex:
        torch.manual_seed(0)
        model = T.LlamaForCausalLM(T.LlamaConfig(**decoder())).eval()
        model.set_attn_implementation("flex_attention")
        rows.append(measure("Llama, flex_attention on CPU", model, qwen, 1, 600))
    if not args.no_smollm2:
        smol = T.AutoModelForCausalLM.from_pretrained(offline_assets.smollm2_dir(), dtype=torch.float32).eval()
        plain = Probe(smol_tok, "scifi", limit=args.limit)
        with torch.inference_mode():
            unsteered = score_alone(smol, plain.encoded, list(range(len(plain))), smol_tok)[0].p_yes
        for last_only in (True, False):
            for c in (8.0, -8.0):
                handle = steering_hook(smol, smol.model.layers[15], c, last_only)
                where = "last position" if last_only else "every position"
                rows.append(measure(f"SmolLM2, hook at layer 15 {where}, c={c:+.0f}", smol, smol_tok, args.limit,
                                    8192, unsteered))
                handle.remove()
        rows.append(measure("SmolLM2, no hook", smol, smol_tok, args.limit, 8192))
    head = ["case", *STRATEGIES, "probe", "ends on", "left", "effect"]
    print("largest |P(Yes) - P(Yes) alone| per strategy forced (no check), and the probe as it runs (checked)\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(r.get(h, "")) for h in head) + " |")
    print("\neffect: the steering hook's own effect, max |P(Yes) steered - P(Yes) unsteered| (each prompt alone)")
    if not args.no_smollm2:
        print()
        precision_and_template(smol, smol_tok)
    return 0


def precision_and_template(model, tok, limit: int = 6) -> None:
    """SmolLM2 on the first ``limit`` vignettes: fp32 against the same weights under bf16 autocast (what a bf16
    Trainer ran the probe in before), and the answer mass with and without the chat template."""
    fp32 = Probe(tok, "scifi", limit=limit, n_resamples=0).run(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = Probe(tok, "scifi", limit=limit, n_resamples=0, keep_autocast=True).run(model)
    no_template = copy.deepcopy(tok)
    no_template.chat_template = None
    plain = Probe(no_template, "scifi", limit=limit, n_resamples=0).run(model)
    dp = np.abs(fp32["raw"]["p_yes"].to_numpy() - autocast["raw"]["p_yes"].to_numpy()).max()
    print(f"SmolLM2-135M, first {limit} vignettes, the same weights:")
    print("| scored in | score | frame agreement | Yes+No mass |")
    print("|---|---|---|---|")
    for label, rep in (("float32", fp32), ("float32 weights under bfloat16 autocast", autocast),
                       ("float32, no chat template", plain)):
        info = rep["info"]
        print(f"| {label} | {rep['score']:+.4f} | {info['frame_agreement']:+.3f} | {info['yn_mass_mean']:.3f} |")
    print(f"largest |P(Yes) float32 - P(Yes) autocast| = {dp:.3f}")


if __name__ == "__main__":
    sys.exit(main())
