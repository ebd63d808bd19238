#!/usr/bin/env python
"""Preference pairs: the engine's pairs per second against lm-evaluation-harness's log-likelihood, at equal margins,
and what start/middle/end costs beside a run. One run, ratios between methods of the same run only.

Every method scores the same pairs (the project's test pairs by default, plain text and conversational; ``--prefs``
for others, e.g. ``wassname/ethics_expression_preferences --config justice`` where it is in the datasets cache) on
the same model, the same token ids (:func:`tinymcf_callback.benchmark.encoding.encode_pairs`):

- ``tinymcf``: ``Benchmark.score_prefs`` as a user gets it: each prompt once in the key/value cache, the
  continuations' logits only, its self-check included (its own time is in the JSON);
- ``tinymcf-unchecked``: the same without the self-check;
- ``lm-eval``: the real lm-evaluation-harness (``lm_eval`` 0.4.13): ``HFLM(pretrained=model, tokenizer=tok,
  batch_size=64)`` scoring each (prompt, continuation) through ``_loglikelihood_tokens``, its scoring step once it
  has tokenised, on the same ids; margin = its chosen log-likelihood minus its rejected one.

Each margin of every method must equal ``tinymcf``'s within the engine's float32 tolerance times the tokens
(``selfcheck.TOLERANCE``), or the run fails (exit 1). The methods run in interleaved rounds (``--runs``), each keeping
its best, with ``--threads`` torch threads. The token counts say what bounds the ratio: lm-eval runs every
sequence whole, the engine each prompt once and the continuations on top, so the ratio grows with how much of a pair
is prompt (and with a chat template's shared header), and cannot pass the ratio of the two token counts by much.

``--run-cost`` also trains the model 6 steps (a save every 2) with the callback probing (``per_foundation=2``) and
the benchmark at start/middle/end, and reports what each took of the run, from their own timed lines.

    python -m benchmarks.prefs                                  # SmolLM2-135M fp32, 2 threads, ~10 min idle
    python -m benchmarks.prefs --quick                          # smoke run: the tiny Qwen3, 1 round
    python -m benchmarks.prefs --run-cost --out benchmarks/prefs.json
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tinymcf_callback.benchmark.runner import Benchmark
from tinymcf_callback.benchmark.selfcheck import TOLERANCE

ROOT = Path(__file__).resolve().parents[1]

DATA = ROOT / "tests" / "data" / "prefs"
SOURCES = {"plain": str(DATA / "ethics_like.jsonl"), "chat": str(DATA / "ethics_like_chat.jsonl")}
LM_EVAL_BATCH = 64


def load(name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinymcf_callback import testing

    if name == "tiny-qwen3":
        return testing.tiny_qwen3(0), AutoTokenizer.from_pretrained(testing.qwen3_tokenizer_dir())
    path = testing.smollm2_dir()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def lm_eval_margins(lm, enc) -> np.ndarray:
    """lm-eval's margins: each (prompt, continuation) scored by ``HFLM._loglikelihood_tokens``."""
    n = len(enc)
    requests = [(("", ""), p, c) for p, c in zip(enc.prompt + enc.prompt, enc.chosen + enc.rejected, strict=True)]
    with torch.no_grad():
        ll = np.array([x for x, _ in lm._loglikelihood_tokens(requests, disable_tqdm=True)])
    return ll[:n] - ll[n:]


def time_methods(model, tok, source: str, runs: int, configs, per_config) -> dict:
    from lm_eval.models.huggingface import HFLM

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    settings = {"prefs": source, "n_resamples": 100, "configs": configs, "per_config": per_config}
    checked, unchecked = Benchmark(tok, **settings), Benchmark(tok, self_check=False, **settings)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=LM_EVAL_BATCH)
    enc = checked.encoded
    methods = {"tinymcf": lambda: checked.score_prefs(model),
               "tinymcf-unchecked": lambda: unchecked.score_prefs(model),
               "lm-eval": lambda: lm_eval_margins(lm, enc)}
    for run in methods.values():  # warm-up: the first forward call of a process pays for its kernels
        run()
    best, outputs = dict.fromkeys(methods, float("inf")), {}
    for _ in range(runs):
        for name, run in methods.items():
            gc.collect()
            started = time.perf_counter()
            outputs[name] = run()
            best[name] = min(best[name], time.perf_counter() - started)
    ours = np.array([r["margin"] for r in outputs["tinymcf"]["pairs"]])
    tokens = np.array([len(c) + len(r) for c, r in zip(enc.chosen, enc.rejected, strict=True)])
    diffs = {"tinymcf-unchecked": np.abs(np.array([r["margin"] for r in outputs["tinymcf-unchecked"]["pairs"]])
                                         - ours),
             "lm-eval": np.abs(outputs["lm-eval"] - ours)}
    seqs = checked.seqs
    lm_tokens = sum(len(p) + len(c) - 1 for p, c in zip(enc.prompt * 2, enc.chosen + enc.rejected, strict=True))
    our_tokens = seqs.root + sum(len(p) - seqs.root for p in seqs.prompts) + sum(len(c) - 1 for c in seqs.conts)
    check = outputs["tinymcf"]["self_check"]
    return {"source": source, "pairs": len(enc), "template": enc.template, "seconds": best,
            "pairs_per_s": {k: len(enc) / v for k, v in best.items()},
            "lm_eval_over_tinymcf": best["lm-eval"] / best["tinymcf"],
            "lm_eval_over_unchecked": best["lm-eval"] / best["tinymcf-unchecked"],
            "max_margin_diff": {k: float(v.max()) for k, v in diffs.items()},
            "equal": all(bool((v <= TOLERANCE * tokens).all()) for v in diffs.values()),
            "tokens": {"lm_eval": lm_tokens, "tinymcf_real": our_tokens, "ratio": lm_tokens / our_tokens},
            "strategy": outputs["tinymcf"]["strategy"], "n_forward": outputs["tinymcf"]["n_forward"],
            "self_check_s": check["seconds"] if check else None}


def run_cost(model_name: str, source: str, per_config) -> dict:
    """A 6-step run of the model (saves every 2 steps) with the callback probing (``per_foundation=2``) and the
    benchmark at start/middle/end: the seconds each took, read from their own lines (the benchmark's
    ``elapsed_s``, the probe's ``info.elapsed_s``), against the run's wall time. Measured inside the one run, so a
    busy neighbour of the machine moves all three alike."""
    import tempfile

    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from tinymcf_callback import MoralProbeCallback, testing
    from tinymcf_callback.benchmark.history import read_bench
    from tinymcf_callback.rundir.history import read_lines

    texts = ["Returning a lost wallet to its owner is kind.", "Cheating a customer out of his change is wrong."]
    model, tok = load(model_name)
    with tempfile.TemporaryDirectory() as folder:
        if model_name == "tiny-qwen3":
            model.save_pretrained(folder)
            tok.save_pretrained(folder)
        else:
            folder = str(testing.smollm2_dir())
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as run_dir:
        args = TrainingArguments(run_dir, max_steps=6, save_steps=2, per_device_train_batch_size=4,
                                 save_only_model=True, report_to="none", seed=0, use_cpu=True, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=[tok(t) for t in texts * 8], processing_class=tok,
                          data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
        trainer.remove_callback(PrinterCallback)  # the logs would print at every step
        trainer.add_callback(MoralProbeCallback(name="scifi", per_foundation=2, verbose=False, trainer=trainer,
                                                prefs=source, benchmark={"per_config": per_config}))
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
        bench = read_bench(Path(run_dir) / "moral_bench_scifi.jsonl")
        probes = [line for _, line in read_lines(Path(run_dir) / "moral_probe_scifi.jsonl")]
    benchmark = sum(line["prefs"]["elapsed_s"] for line in bench)
    probe = sum(line["info"]["elapsed_s"] for line in probes)
    return {"run_s": wall, "benchmark_s": benchmark, "benchmark_steps": [line["step"] for line in bench],
            "probe_s": probe, "probes": len(probes), "benchmark_share_of_run": benchmark / wall,
            "rest_of_run_s": wall - benchmark - probe}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny-qwen3"), default="smollm2")
    parser.add_argument("--prefs", action="append", default=None, metavar="SOURCE",
                        help="pairs to time (repeatable; default: the project's plain and chat test pairs)")
    parser.add_argument("--config", action="append", default=None, help="configs of --prefs (a Hub dataset's)")
    parser.add_argument("--per-config", type=int, default=None, help="pairs drawn from each config")
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds; each method keeps its best")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2: the target machine's cores)")
    parser.add_argument("--run-cost", action="store_true", help="also time start/middle/end beside a 6-step run")
    parser.add_argument("--quick", action="store_true", help="smoke run: the tiny Qwen3, one round")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.model, args.runs = "tiny-qwen3", 1
    torch.set_num_threads(args.threads)
    model, tok = load(args.model)
    sources = args.prefs or list(SOURCES.values())
    rows = [time_methods(model, tok, s, args.runs, args.config or (), args.per_config) for s in sources]
    result = {"model": args.model, "threads": args.threads, "runs": args.runs, "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "rows": rows}
    print(f"{args.model} fp32, {args.threads} threads, best of {args.runs}")
    print(f"{'pairs':<44} {'n':>4} {'tinymcf/s':>10} {'unchecked/s':>12} {'lm-eval/s':>10} {'ratio':>6} "
          f"{'tokens ratio':>12} {'max |dmargin|':>14}")
    for r in rows:
        p = r["pairs_per_s"]
        print(f"{Path(r['source']).name + ' (' + r['template'] + ')':<44} {r['pairs']:>4} {p['tinymcf']:>10.1f} "
              f"{p['tinymcf-unchecked']:>12.1f} {p['lm-eval']:>10.1f} {r['lm_eval_over_tinymcf']:>5.2f}x "
              f"{r['tokens']['ratio']:>11.2f}x {r['max_margin_diff']['lm-eval']:>14.1e}")
    if args.run_cost:
        result["run_cost"] = run_cost(args.model, sources[0], args.per_config)
        c = result["run_cost"]
        print(f"a 6-step run, saves every 2: {c['run_s']:.1f} s in all; the benchmark at steps "
              f"{', '.join(map(str, c['benchmark_steps']))}: {c['benchmark_s']:.1f} s "
              f"({c['benchmark_share_of_run']:.0%} of the run); the probe's {c['probes']} probes: "
              f"{c['probe_s']:.1f} s; training and saving: {c['rest_of_run_s']:.1f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if not all(r["equal"] for r in rows):
        print("FAILED: a method's margins differ from tinymcf's beyond the float32 tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
