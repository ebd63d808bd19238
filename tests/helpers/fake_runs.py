"""Run folders made of files alone, for the decisions that are a function of the files (the planner's, the curve's):
checkpoint folders with a few bytes of weights, the run's record, a history of chosen lines, the hand-off queue.

No model is trained or loaded: a checkpoint's ``model.safetensors`` holds one small tensor (its fingerprint is
what the planner reads), ``trainer_state.json`` is the Trainer's last write. Real training follows the same
decisions end to end in test_run_life.py (slow).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

HISTORY = "moral_probe_scifi.jsonl"


def fake_checkpoint(run: Path, step: int, *, state: str | None = None, max_steps: int = 6, save_steps: int = 2,
                    value: float | None = None, dtype: str | None = None, adapter_of: str | None = None,
                    mtime: float | None = None) -> Path:
    """``checkpoint-<step>`` with a one-tensor model (``value``: its weights, default the step), a tokenizer file and
    ``trainer_state.json`` (``state``: its text instead, e.g. half written); ``adapter_of``: a PEFT adapter naming
    that base instead of full weights; ``dtype``: the dtype its config records; ``mtime``: its trainer_state's time."""
    import torch
    from safetensors.torch import save_file

    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    tensor = {"w": torch.full((4,), float(step if value is None else value))}
    if adapter_of is not None:
        (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": adapter_of}))
        save_file(tensor, str(folder / "adapter_model.safetensors"))
    else:
        (folder / "config.json").write_text(json.dumps({"dtype": dtype} if dtype else {}))
        save_file(tensor, str(folder / "model.safetensors"))
    (folder / "tokenizer_config.json").write_text("{}")
    text = state if state is not None else json.dumps({"global_step": step, "epoch": step / 2,
                                                       "max_steps": max_steps, "save_steps": save_steps})
    (folder / "trainer_state.json").write_text(text)
    if mtime is not None:
        os.utime(folder / "trainer_state.json", (mtime, mtime))
    return folder


def fake_model(folder: Path) -> Path:
    """A starting model's folder (a config and a tokenizer file): what --base-model or the run's record names."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


def line(step: int, *, event: str = "watch", fingerprint: str | None = None, compute: str = "float32",
         autocast: str | None = None, score: float | None = 0.1, **extra) -> dict:
    """A history line as the follower reads it (the fields the planner looks at; numbers made up)."""
    dtype = "float32" if autocast or compute == "tf32" else compute
    return {"step": step, "epoch": step / 2, "event": event, "name": "scifi", "answer_format": "yesno",
            "model": f"checkpoint-{step}", "device": "cpu", "dtype": dtype, "autocast": autocast, "compute": compute,
            "score": score, "metrics": {}, "info": {}, "table": [], "fingerprint": fingerprint, **extra}


def write_history(run: Path, lines: list[dict], name: str = HISTORY) -> Path:
    path = run / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def planner_for(run: Path, *, following: bool = True, answer_format: str = "yesno", **settings):
    """The planner of a watcher (``following``) or a sweep of ``run``, probing two scifi vignettes."""
    from tinymcf_callback.config import ProbeConfig
    from tinymcf_callback.follow.planner import Planner
    from tinymcf_callback.follow.settings import RunSettings

    settings.setdefault("baseline", False)
    probe = ProbeConfig(name="scifi", limit=2, answer_format=answer_format)
    return Planner(RunSettings(run, probe, **settings), following=following)


def watch_settings(run: Path, **kw):
    from tinymcf_callback.config import ProbeConfig
    from tinymcf_callback.follow.settings import RunSettings, WatchSettings

    return WatchSettings(RunSettings(run, ProbeConfig(name="scifi", limit=2), baseline=False), poll=0.01, **kw)
