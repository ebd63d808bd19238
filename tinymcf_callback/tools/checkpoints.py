"""A Trainer output folder as the sweep reads it: its ``checkpoint-<step>`` folders, their epoch, adapter and tokenizer.

The Trainer names each save ``checkpoint-<step>`` (``PREFIX_CHECKPOINT_DIR``), writes the weights
first and ``trainer_state.json`` (which holds the epoch) with the rest of the training state; a PEFT
run saves ``adapter_config.json`` and adapter weights only, scored on top of the base model.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..errors import SweepError

CHECKPOINT_NAME = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")
FULL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
ADAPTER_CONFIG = "adapter_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")


@dataclass(frozen=True)
class Checkpoint:
    """One ``checkpoint-<step>`` folder; ``adapter``: PEFT weights only, scored on top of the base model."""

    step: int
    folder: Path
    epoch: float | None
    adapter: bool
    baseline: bool = False  # the run's starting weights (not a checkpoint-<step> folder): step 0
    shown_as: str | None = None  # the path its report names, when it is read from elsewhere (the hand-off queue)


def find_checkpoints(run_dir: Path) -> list[Checkpoint]:
    """The ``checkpoint-<step>`` folders of ``run_dir``, in numeric step order (checkpoint-10 after -9)."""
    if not run_dir.is_dir():
        raise SweepError(f"no such folder {run_dir}: tinymcf sweep takes a Trainer output directory "
                         f"(TrainingArguments.output_dir)")
    by_step: dict[int, Path] = {}
    for entry in run_dir.iterdir():
        match = CHECKPOINT_NAME.fullmatch(entry.name)
        if not match or not entry.is_dir():
            continue
        step = int(match.group(1))
        if step in by_step:
            raise SweepError(f"{by_step[step].name} and {entry.name} in {run_dir} both name step {step}; "
                             f"move one away")
        by_step[step] = entry
    if not by_step:
        raise SweepError(f"{run_dir} holds no {PREFIX_CHECKPOINT_DIR}-<step> folders: pass the output_dir of a "
                         f"Trainer run that saved checkpoints (save_strategy other than 'no')")
    return [Checkpoint(step, folder, read_epoch(folder), is_adapter(folder))
            for step, folder in sorted(by_step.items())]


def read_trainer_state(folder: Path) -> dict | None:
    """The checkpoint's ``trainer_state.json`` (the Trainer writes it last), or None while it is absent or half
    written: a checkpoint is complete once this parses."""
    try:
        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def read_epoch(folder: Path) -> float | None:
    """The epoch the Trainer recorded in the checkpoint's ``trainer_state.json`` (None when absent or unreadable)."""
    epoch = (read_trainer_state(folder) or {}).get("epoch")
    return float(epoch) if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) else None


def is_adapter(folder: Path) -> bool:
    """A PEFT adapter checkpoint: ``adapter_config.json`` and no full model weights."""
    return (folder / ADAPTER_CONFIG).exists() and not any((folder / f).exists() for f in FULL_WEIGHTS)


def adapter_base_name(folder: Path) -> str | None:
    """The base model an adapter names in its ``adapter_config.json`` (a hint for the error message)."""
    try:
        return json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None


def tokenizer_fingerprint(source: str) -> str:
    """Equal for tokenizers that format and tokenise the prompts alike: the bytes of their files (or the Hub id)."""
    folder = Path(source)
    if not folder.is_dir():
        return source
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()


# ---- the history ---------------------------------------------------------------------------------


DTYPES = ("float32", "bfloat16", "float16")


def saved_dtype(folder: Path) -> str | None:
    """The dtype a model folder's weights were saved in (``config.json``'s ``dtype``, formerly ``torch_dtype``)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dtype = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    return dtype if dtype in DTYPES else None
