"""The folders a training run saves its models in, by the trainer that wrote them: one rule for the sweep and the
watcher of which folders there are, which are complete, and what each holds.

A run folder is read in the first layout below that it holds (each found by its folder names and what they hold):

=============  ===========================================  ===================================================
layout         a save                                       complete when
=============  ===========================================  ===================================================
``trainer``    ``checkpoint-<N>/`` (Hugging Face Trainer,   its ``trainer_state.json`` (written last) parses; in a run
               TRL, a loop using its naming)                whose checkpoints hold none, its files are steady
``verl``       ``global_step_<N>/actor/``: the rank shards  ``latest_checkpointed_iteration.txt`` (written last)
               ``model_world_size_<W>_rank_<R>.pt`` and     names N or later; without it (``async_save``) every
               ``huggingface/`` (config, tokenizer; the     rank's shard is there and steady
               weights too with ``save_contents: hf_model``)
``openrlhf``   ``global_step<N>_hf/`` (``--save_hf_ckpt``)  config, weights and tokenizer (written last) there and
                                                            steady
``nemo-rl``    ``step_<N>/`` (``tmp_step_<N>`` renamed when  its name (``tmp_step_<N>`` never is); its weights a torch
               done); ``policy/weights/`` a torch           distributed checkpoint with ``.metadata``
               distributed checkpoint
``torchtitan`` ``step-<N>/``: a torch distributed           ``.metadata`` (written last); an export: its index and
               checkpoint, or its HF export (safetensors     every shard it names, steady
               and index, no config)
``plain``      ``save_pretrained`` folders named            config, weights (every shard of an index) there and
               ``step_<N>``, ``step-<N>``, ``iter_<N>``,    steady
               ``checkpoint_<N>``, ...
=============  ===========================================  ===================================================

"Steady" is one rule for every layout without a completion marker: the save's files are all there and none has
changed for ``settle`` seconds (the newest file time at least that old), so a sweep after the fact and a watcher
during the run accept and refuse the same folders. What the model needs from elsewhere is named on the save:
verl's rank shards take their config from ``huggingface/``; a torch distributed checkpoint (NeMo-RL, torchtitan)
and torchtitan's export take the architecture from the run's starting model (``--base-model``).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .checkpoints import (
    ADAPTER_CONFIG,
    CHECKPOINT_NAME,
    FULL,
    Checkpoint,
    checkpoint_format,
    read_epoch,
    read_trainer_state,
)

TRAINER, VERL, OPENRLHF, NEMO_RL, TORCHTITAN, PLAIN = "trainer", "verl", "openrlhf", "nemo-rl", "torchtitan", "plain"
LAYOUTS = {
    TRAINER: "Hugging Face Trainer checkpoint-<step> folders",
    VERL: "verl global_step_<N>/actor folders",
    OPENRLHF: "OpenRLHF global_step<N>_hf folders",
    NEMO_RL: "NeMo-RL step_<N> folders",
    TORCHTITAN: "torchtitan step-<N> folders",
    PLAIN: "save_pretrained folders named by their step (step_<N>, step-<N>, iter_<N>, ...)",
}
VERL_SHARDS, DCP = "verl-fsdp", "dcp"  # save formats besides checkpoints.FORMATS
SETTLE_S = 5.0  # a save without a completion marker counts once its files are this long unchanged

VERL_NAME = re.compile(r"global_step_(\d+)")
VERL_TRACKER = "latest_checkpointed_iteration.txt"
VERL_SHARD = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")
OPENRLHF_NAME = re.compile(r"global_step(\d+)_hf")
NEMO_NAME = re.compile(r"step_(\d+)")
TITAN_NAME = re.compile(r"step-(\d+)")
PLAIN_NAME = re.compile(r"(?:global_step|step|steps|iter|iteration|ckpt|checkpoint|epoch)[-_]?(\d+)")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class Found:
    """What a run folder holds: its layout (None: no save of a known layout yet) and its saves by step, complete or
    not (the folder a save's model is read from)."""

    layout: str | None
    saves: dict[int, Path]

    @property
    def described(self) -> str:
        return LAYOUTS.get(self.layout or "", "no saves of a known layout")


def find_saves(run_dir: Path) -> Found:
    """The layout of ``run_dir`` and its saves (see the module); the first layout it holds, in the table's order."""
    try:
        entries = sorted(p for p in run_dir.iterdir() if p.is_dir())
    except OSError:
        return Found(None, {})
    by_layout: dict[str, dict[int, Path]] = {}
    for entry in entries:
        name = entry.name
        if CHECKPOINT_NAME.fullmatch(name):
            by_layout.setdefault(TRAINER, {})[int(name.split("-")[1])] = entry
        elif (m := VERL_NAME.fullmatch(name)) and (entry / "actor").is_dir():
            by_layout.setdefault(VERL, {})[int(m.group(1))] = entry / "actor"
        elif m := OPENRLHF_NAME.fullmatch(name):
            by_layout.setdefault(OPENRLHF, {})[int(m.group(1))] = entry
        elif (m := NEMO_NAME.fullmatch(name)) and (entry / "policy").is_dir():
            by_layout.setdefault(NEMO_RL, {})[int(m.group(1))] = entry
        elif (m := TITAN_NAME.fullmatch(name)) and _titan_save(entry):
            by_layout.setdefault(TORCHTITAN, {})[int(m.group(1))] = entry
        elif (m := PLAIN_NAME.fullmatch(name)) and not name.startswith("tmp_"):
            by_layout.setdefault(PLAIN, {})[int(m.group(1))] = entry
    for layout in LAYOUTS:
        if layout in by_layout:
            return Found(layout, dict(sorted(by_layout[layout].items())))
    return Found(None, {})


def _titan_save(folder: Path) -> bool:
    """A torchtitan save: a torch distributed checkpoint (``.distcp`` files, ``.metadata`` once done) or its HF
    export (safetensors with an index and no config)."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return False
    return any(n.endswith(".distcp") or n == ".metadata" for n in names) or (
        "model.safetensors.index.json" in names and "config.json" not in names)


def read_save(layout: str, step: int, folder: Path, run_dir: Path, *, settle: float = SETTLE_S,
              expect_state: bool = True, now: float | None = None) -> Checkpoint | None:
    """The save of ``step`` in ``folder``, or None while it is not complete (see the module) or holds no model.
    ``expect_state`` (the trainer layout): the run's checkpoints carry ``trainer_state.json``, which marks each
    complete; without it their files must be steady."""
    now = time.time() if now is None else now
    if layout == TRAINER:
        state = read_trainer_state(folder)
        form = checkpoint_format(folder)
        if form is None:
            return None
        if state is None and (expect_state or not _steady(model_files(folder, form), settle, now)):
            return None
        return Checkpoint(step, folder, read_epoch(state), form)
    if layout == VERL:
        return _verl(step, folder, run_dir, settle, now)
    if layout == NEMO_RL:
        weights = folder / "policy" / "weights"
        if not (weights / ".metadata").is_file():
            return None
        tokenizer = folder / "policy" / "tokenizer"
        return Checkpoint(step, weights, None, DCP, tokenizer=tokenizer if tokenizer.is_dir() else None,
                          needs_base=True)
    if layout == TORCHTITAN:
        if (folder / ".metadata").is_file():
            return Checkpoint(step, folder, None, DCP, needs_base=True)
        if _complete_weights(folder, settle, now, need_config=False):
            return Checkpoint(step, folder, None, FULL, needs_base=True)
        return None
    if layout == OPENRLHF and not (folder / "tokenizer_config.json").is_file():  # its tokenizer is written last
        return None
    if _complete_weights(folder, settle, now):  # openrlhf and plain: a save_pretrained folder
        form = checkpoint_format(folder)
        return Checkpoint(step, folder, None, form) if form else None
    return None


def _verl(step: int, actor: Path, run_dir: Path, settle: float, now: float) -> Checkpoint | None:
    hf = actor / "huggingface"
    if not (hf / "config.json").is_file():
        return None
    tracker = _read_int(run_dir / VERL_TRACKER)
    marked = tracker is not None and tracker >= step
    tokenizer = hf if (hf / "tokenizer_config.json").is_file() else None
    if _has_weights(hf):  # checkpoint.save_contents holds hf_model: a whole save_pretrained model
        if marked or (tracker is None and _complete_weights(hf, settle, now)):
            return Checkpoint(step, hf, None, FULL, tokenizer=tokenizer)
        return None
    shards = verl_shards(actor)
    world = _verl_world_size(actor, shards)
    if world is None or sorted(shards) != list(range(world)):
        return None
    if not marked and not (tracker is None and _steady(list(shards.values()), settle, now)):
        return None
    return Checkpoint(step, actor, None, VERL_SHARDS, tokenizer=tokenizer, config=hf)


def verl_shards(actor: Path) -> dict[int, Path]:
    """The model's rank shards of a verl actor folder, by rank."""
    out = {}
    for p in actor.iterdir() if actor.is_dir() else []:
        m = VERL_SHARD.fullmatch(p.name)
        if m:
            out[int(m.group(2))] = p
    return dict(sorted(out.items()))


def _verl_world_size(actor: Path, shards: dict[int, Path]) -> int | None:
    try:
        return int(json.loads((actor / "fsdp_config.json").read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        sizes = {int(VERL_SHARD.fullmatch(p.name).group(1)) for p in shards.values()}
        return sizes.pop() if len(sizes) == 1 else None


def model_files(folder: Path, form: str | None = None) -> list[Path]:
    """Every file a save's model is read from (its weights, its config and its index), for the steadiness rule."""
    from .checkpoints import weight_files

    files = list(weight_files(folder, form))
    files += [folder / n for n in ("config.json", ADAPTER_CONFIG, *INDEX_FILES) if (folder / n).is_file()]
    return files


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or (folder / "pytorch_model.bin").is_file()


def _complete_weights(folder: Path, settle: float, now: float, *, need_config: bool = True) -> bool:
    """A ``save_pretrained`` folder written whole: its config (when needed), its weights (every shard its index
    names) there, and nothing changed for ``settle`` seconds."""
    if need_config and not ((folder / "config.json").is_file() or (folder / ADAPTER_CONFIG).is_file()):
        return False
    index = next((folder / n for n in INDEX_FILES if (folder / n).is_file()), None)
    if index is not None:
        try:
            named = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False  # being written
        if not all((folder / n).is_file() for n in named):
            return False
    elif not _has_weights(folder) and not (folder / "adapter_model.safetensors").is_file():
        return False
    files = [p for p in folder.iterdir() if p.is_file()]
    return _steady(files, settle, now)


def _steady(files: list[Path], settle: float, now: float) -> bool:
    """All of ``files`` are there and none has changed for ``settle`` seconds."""
    try:
        newest = max(os.stat(p).st_mtime for p in files) if files else None
    except OSError:
        return False
    return newest is not None and now - newest >= settle


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
