#!/usr/bin/env python
"""The self-check in each precision: clean noise, and defects injected from outside, before and after the replay.

For each model and precision (float32, bfloat16, float16), every prompt of a balanced ``scifi`` subset is scored
alone (the reference), then by the shared-prefix path forced with the self-check off. Printed:

- **noise**: on the clean model, the largest, median and 99th-percentile |P(Yes) - P(Yes) alone| over every prompt
  (what the precision itself does; no defect);
- per defect (``tests/helpers/defects.py``: the issue's two and the held-out ones), **true**: the largest
  |P(Yes) - P(Yes) alone| of the forced shared path over every prompt, in that precision; **before**: the
  verdict of the check as it was (two prompts compared in the precision itself, at its tolerance: 0.2 in
  bfloat16), **after**: the verdict of the check as it is now (a float32 replay of the checked prompts), with the
  strategy the probe ends on. "caught" means the shared path was left.

    python -m benchmarks.precision_cases                        # tiny Llama + SmolLM2 (~20 min on 2 cores)
    python -m benchmarks.precision_cases --models tiny-llama    # ~1 min

Nothing is hard-coded. bfloat16 and float16 are slow on CPUs, which is why SmolLM2 gets one vignette per
foundation (56 prompts) and the two defects of the issue's table.
"""

from __future__ import annotations

import argparse
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

from tests.helpers.defects import HELD_OUT, TABLE  # noqa: E402
from tinymcf_callback import testing as offline_assets  # noqa: E402
from tinymcf_callback.probe import Probe  # noqa: E402
from tinymcf_callback.scoring import selfcheck  # noqa: E402
from tinymcf_callback.scoring.engine import run_batches, score_alone  # noqa: E402

PRECISIONS = ("float32", "bfloat16", "float16")


def tiny_llama(dtype):
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.125)).eval().to(getattr(torch, dtype))


def setup(key: str):
    """(model factory by dtype, tokenizer, probe settings, defects) of a model key."""
    if key == "tiny-llama":
        tok = T.AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
        return tiny_llama, tok, {"limit": 3, "token_budget": 600}, {**TABLE, **HELD_OUT}
    path = offline_assets.smollm2_dir()
    tok = T.AutoTokenizer.from_pretrained(path)
    load = lambda dtype: T.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()  # noqa: E731
    return load, tok, {"per_foundation": 1}, dict(TABLE)


def everything_alone(model, probe):
    with torch.inference_mode():
        return score_alone(model, probe.encoded, list(range(len(probe))), probe.tok)[0].p_yes


def forced_shared(model, probe):
    with torch.inference_mode():
        return run_batches(model, probe.encoded, probe.batches, probe.tok, prefix_plan=probe.prefix_plan,
                           strategy="shared").p_yes


def verdict(model, probe, *, before: bool):
    """The check's verdict (caught: the shared path left) as it was (``before``) or as it is, by a probe meeting the
    model for the first time (from the rules, its riskiest prompts first)."""
    probe = Probe(probe.tok, config=probe.config)
    saved = selfcheck.REDUCED_PRECISIONS, selfcheck.N_CHECKED
    if before:  # compared in the precision itself, two prompts
        selfcheck.REDUCED_PRECISIONS, selfcheck.N_CHECKED = (), 2
    try:
        res = probe.score(model)
    finally:
        selfcheck.REDUCED_PRECISIONS, selfcheck.N_CHECKED = saved
    return ("caught" if res.check["fallbacks"] else "missed"), res.strategy, res.check


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny-llama,smollm2", help="comma-separated: tiny-llama, smollm2")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    args = ap.parse_args(argv)
    logging.getLogger("tinymcf_callback").setLevel(logging.ERROR)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    rows = []
    for key in args.models.split(","):
        load, tok, settings, defects = setup(key)
        probe = Probe(tok, "scifi", n_resamples=0, **settings)
        print(f"## {key}: {len(probe)} prompts in {len(probe.batches)} batches", flush=True)
        for dtype in args.precisions.split(","):
            model = load(dtype)
            alone = everything_alone(model, probe)
            d = np.abs(forced_shared(model, probe) - alone)
            _, _, clean = verdict(model, probe, before=False)
            print(f"{key} {dtype} clean: noise max {d.max():.1e} median {np.median(d):.1e} p99 "
                  f"{np.quantile(d, 0.99):.1e}; check: {clean['reference']}, max_diff {clean['max_diff']:.1e}, "
                  f"resolution {clean['resolution']:.0e}, {len(clean['fallbacks'])} fallbacks, "
                  f"{clean['seconds']:.2f}s", flush=True)
            for name, (inject, _) in defects.items():
                handles = inject(model)
                try:
                    true = float(np.abs(forced_shared(model, probe) - everything_alone(model, probe)).max())
                    was, _, _ = verdict(model, probe, before=True)
                    now, lands, check = verdict(model, probe, before=False)
                finally:
                    for handle in handles:
                        handle.remove()
                rows.append((key, name, dtype, true, was, now, lands))
                print(f"| {key} | {name} | {dtype} | {true:.3f} | {was} | {now} ({lands}) |", flush=True)
    print("\n| model | defect | precision | true | before | after (ends on) |\n|---|---|---|---|---|---|")
    for key, name, dtype, true, was, now, lands in rows:
        print(f"| {key} | {name} | {dtype} | {true:.3f} | {was} | {now} ({lands}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
