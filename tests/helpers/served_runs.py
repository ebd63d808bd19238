"""A run folder for the tests that follow a run through a server (``--reload``), and what its lines measured."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def saved_run(tmp_path, qwen_tok, *, adapters: bool = False, steps=(1, 2), model=None,
              targets=("q_proj", "v_proj")) -> tuple[Path, Path]:
    """A run folder of checkpoints (other weights each, or adapters of ``targets`` on the base; ``model``: that one
    everywhere) and its starting model."""
    from tinymcf_callback.rundir.record import RunRecord
    from tinymcf_callback.testing import tiny_qwen3

    init = tmp_path / "init"
    (model or tiny_qwen3(seed=0)).save_pretrained(init)
    qwen_tok.save_pretrained(init)
    run = tmp_path / "run"
    for step in steps:
        folder = run / f"checkpoint-{step}"
        if adapters:
            from peft import LoraConfig, get_peft_model

            torch.manual_seed(step)
            adapted = get_peft_model(tiny_qwen3(seed=0), LoraConfig(r=4, target_modules=list(targets),
                                                                    init_lora_weights=False))
            adapted.save_pretrained(folder)
        else:
            (model or tiny_qwen3(seed=step)).save_pretrained(folder)
        qwen_tok.save_pretrained(folder)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": step / 2}))
    RunRecord(base_model=str(init), saves=list(steps), ended=True).write(run)
    return run, init


def numbers(line: dict) -> dict:
    """What a history line measured (not how: the backend, its self-check and its precision say that)."""
    # yn_top3_rate is null through vLLM's logprob_token_ids (it returns the ids asked for instead of the top k)
    how = ("backend", "self_check", "strategy", "precision", "n_forward", "elapsed_s", "warnings", "yn_top3_rate",
           "batches")
    return {"step": line["step"], "score": line["score"], "gap": line["gap"], "metrics": line["metrics"],
            "table": line["table"], "info": {k: v for k, v in line["info"].items() if k not in how}}
