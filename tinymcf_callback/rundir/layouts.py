"""The folders a training run saves its models in, by the trainer that wrote them: one rule for the sweep and the
watcher of which folders there are, which are complete, and what each holds.

Each trainer's layout is one :class:`Layout` record of :data:`LAYOUTS`, tried in order. A save without a completion
marker counts once no file of it changed for ``settle`` seconds. The layouts' table: docs/rl.md; adding one
(:func:`register_layout`): docs/development.md.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import RegistryError
from ..registry import Registry
from .checkpoints import (
    ADAPTER_CONFIG,
    CHECKPOINT_NAME,
    FORMATS,
    FULL,
    INDEX_FILES,
    Checkpoint,
    Format,
    checkpoint_format,
    read_epoch,
    read_trainer_state,
    weight_files,
)

TRAINER, VERL, OPENRLHF, NEMO_RL, TORCHTITAN, PLAIN = "trainer", "verl", "openrlhf", "nemo-rl", "torchtitan", "plain"
VERL_SHARDS, DCP = "verl-fsdp", "dcp"  # save formats besides the Trainer's (checkpoints.FORMATS)
SETTLE_S = 5.0  # a save without a completion marker counts once its files are this long unchanged

VERL_NAME = re.compile(r"global_step_(\d+)")
VERL_TRACKER = "latest_checkpointed_iteration.txt"
VERL_SHARD = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")
OPENRLHF_NAME = re.compile(r"global_step(\d+)_hf")
NEMO_NAME = re.compile(r"step_(\d+)")
TITAN_NAME = re.compile(r"step-(\d+)")
PLAIN_NAME = re.compile(r"(?:global_step|step|steps|iter|iteration|ckpt|checkpoint|epoch)[-_]?(\d+)")


# ---- the record ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Save:
    """One save being read by its layout's ``read``: its step, the folder ``find`` gave, the run folder, and the
    settings of the completeness rules (see the module)."""

    step: int
    folder: Path
    run_dir: Path
    settle: float = SETTLE_S  # "steady": no file changed for this long
    expect_state: bool = True  # the trainer layout: the run's checkpoints carry trainer_state.json
    now: float = 0.0

    def steady(self, files: list[Path]) -> bool:
        """All of ``files`` are there and none has changed for ``settle`` seconds."""
        try:
            newest = max(os.stat(p).st_mtime for p in files) if files else None
        except OSError:
            return False
        return newest is not None and self.now - newest >= self.settle

    def complete_weights(self, folder: Path | None = None, *, need_config: bool = True) -> bool:
        """``folder`` (the save's own by default) is a ``save_pretrained`` folder written whole: its config (when
        needed), its weights (every shard its index names) there, and :meth:`steady`."""
        folder = folder or self.folder
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
        return self.steady([p for p in folder.iterdir() if p.is_file()])


@dataclass(frozen=True)
class Layout:
    """One trainer's folder layout: a record of :data:`LAYOUTS` (see the module).

    Args:
        name: what the sweep and the watcher call it.
        described: what its saves look like, in the line that says which layout a run folder holds.
        find: a subfolder of the run folder -> ``(step, the folder its model is read from)`` when it is one of this
            layout's saves (complete or not), else None. Folder names and what they hold only: no weights read.
        read: the :class:`Save` -> its :class:`Checkpoint` once complete (its format, tokenizer and config folders),
            else None (not complete yet, or no model in it).
        formats: the weight formats it brings beside the Trainer's (registered with it).
    """

    name: str
    described: str
    find: Callable[[Path], tuple[int, Path] | None]
    read: Callable[[Save], Checkpoint | None]
    formats: tuple[Format, ...] = ()


LAYOUTS: Registry[Layout] = Registry("run folder layout")  # name -> record, in the order a run folder is tried


def register_layout(layout: Layout, *, last: bool = False) -> Layout:
    """Add ``layout`` to :data:`LAYOUTS` with its formats: tried before ``plain`` (whose folder names would take many
    others' saves), or after every other with ``last``; a clash is a :class:`~tinymcf_callback.errors.RegistryError`."""
    for form in layout.formats:
        if form.name in FORMATS and FORMATS[form.name] != form:
            raise RegistryError(f"the layout {layout.name!r} brings a weight format {form.name!r} other than the one "
                                f"registered under that name (weight formats: {FORMATS.listed()})")
    LAYOUTS.register(layout.name, layout, before=None if last else PLAIN)
    for form in layout.formats:
        if form.name not in FORMATS:
            FORMATS.register(form.name, form)
    return layout


@dataclass(frozen=True)
class Found:
    """What a run folder holds: its layout (None: none known yet) and its saves by step, complete or not."""

    layout: str | None
    saves: dict[int, Path]

    @property
    def described(self) -> str:
        return LAYOUTS[self.layout].described if self.layout in LAYOUTS else "no saves of a known layout"


def find_saves(run_dir: Path) -> Found:
    """The layout of ``run_dir`` (the first in the table's order that has saves there) and its saves."""
    try:
        entries = sorted(p for p in run_dir.iterdir() if p.is_dir())
    except OSError:
        return Found(None, {})
    by_layout: dict[str, dict[int, Path]] = {}
    for entry in entries:
        for layout in LAYOUTS.values():
            found = layout.find(entry)
            if found is not None:
                step, folder = found
                by_layout.setdefault(layout.name, {})[step] = folder
                break
    for name in LAYOUTS:
        if name in by_layout:
            return Found(name, dict(sorted(by_layout[name].items())))
    return Found(None, {})


def read_save(layout: str, step: int, folder: Path, run_dir: Path, *, settle: float = SETTLE_S,
              expect_state: bool = True) -> Checkpoint | None:
    """The save of ``step`` in ``folder``, read by ``layout``'s record: None while it is not complete or holds no
    model (``expect_state``: see :class:`Save`)."""
    return LAYOUTS[layout].read(Save(step, folder, run_dir, settle, expect_state, time.time()))


# ---- the layouts -----------------------------------------------------------------------------------------------
def named_saves(pattern: re.Pattern, holds: Callable[[Path], bool] = lambda entry: True, *,
                inside: str = "") -> Callable[[Path], tuple[int, Path] | None]:
    """A layout's ``find`` for saves named by their step: a folder whose whole name matches ``pattern`` (its first
    group the step) and that ``holds`` what the layout's saves hold; the save's model in its subfolder ``inside``."""
    def find(entry: Path) -> tuple[int, Path] | None:
        m = pattern.fullmatch(entry.name)
        return (int(m.group(1)), entry / inside if inside else entry) if m and holds(entry) else None
    return find


def _read_trainer(save: Save) -> Checkpoint | None:
    folder = save.folder
    state = read_trainer_state(folder)
    form = checkpoint_format(folder)
    if form is None:
        return None
    if state is None and (save.expect_state or not save.steady(model_files(folder, form))):
        return None
    return Checkpoint(save.step, folder, read_epoch(state), form)


def _read_verl(save: Save) -> Checkpoint | None:
    actor, step = save.folder, save.step
    hf = actor / "huggingface"
    if not (hf / "config.json").is_file():
        return None
    tracker = _read_int(save.run_dir / VERL_TRACKER)
    marked = tracker is not None and tracker >= step
    tokenizer = hf if (hf / "tokenizer_config.json").is_file() else None
    if _has_weights(hf):  # checkpoint.save_contents holds hf_model: a whole save_pretrained model
        if marked or (tracker is None and save.complete_weights(hf)):
            return Checkpoint(step, hf, None, FULL, tokenizer=tokenizer)
        return None
    shards = verl_shards(actor)
    world = _verl_world_size(actor, shards)
    if world is None or sorted(shards) != list(range(world)):
        return None
    if not marked and not (tracker is None and save.steady(list(shards.values()))):
        return None
    return Checkpoint(step, actor, None, VERL_SHARDS, tokenizer=tokenizer, config=hf)


def _read_openrlhf(save: Save) -> Checkpoint | None:
    if not (save.folder / "tokenizer_config.json").is_file():  # its tokenizer is written last
        return None
    return _read_plain(save)


def _read_nemo_rl(save: Save) -> Checkpoint | None:
    weights = save.folder / "policy" / "weights"
    if not (weights / ".metadata").is_file():
        return None
    tokenizer = save.folder / "policy" / "tokenizer"
    return Checkpoint(save.step, weights, None, DCP, tokenizer=tokenizer if tokenizer.is_dir() else None,
                      needs_base=True)


def _read_torchtitan(save: Save) -> Checkpoint | None:
    if (save.folder / ".metadata").is_file():
        return Checkpoint(save.step, save.folder, None, DCP, needs_base=True)
    if save.complete_weights(need_config=False):
        return Checkpoint(save.step, save.folder, None, FULL, needs_base=True)
    return None


def _read_plain(save: Save) -> Checkpoint | None:
    """A ``save_pretrained`` folder (plain loops, OpenRLHF)."""
    if not save.complete_weights():
        return None
    form = checkpoint_format(save.folder)
    return Checkpoint(save.step, save.folder, None, form) if form else None


def _titan_save(folder: Path) -> bool:
    """A torchtitan save: a torch distributed checkpoint (``.distcp`` files, ``.metadata`` once done) or its HF
    export (safetensors with an index and no config)."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return False
    return any(n.endswith(".distcp") or n == ".metadata" for n in names) or (
        "model.safetensors.index.json" in names and "config.json" not in names)


def _verl_files(folder: Path) -> list[Path]:
    """verl's rank shards of the model."""
    return [p for p in folder.iterdir() if p.is_file() and p.name.startswith("model_world_size_")]


def _dcp_files(folder: Path) -> list[Path]:
    """A torch distributed checkpoint's files."""
    return [p for p in folder.iterdir() if p.is_file() and (p.suffix == ".distcp" or p.name == ".metadata")]


VERL_FORMAT = Format(VERL_SHARDS, _verl_files, "tinymcf_callback.follow.sharded:load_verl")
DCP_FORMAT = Format(DCP, _dcp_files, "tinymcf_callback.follow.sharded:load_dcp", what="a torch distributed checkpoint",
                    needs_base=True)

for _layout in (
    Layout(TRAINER, "Hugging Face Trainer checkpoint-<step> folders", named_saves(CHECKPOINT_NAME), _read_trainer),
    Layout(VERL, "verl global_step_<N>/actor folders",
           named_saves(VERL_NAME, lambda e: (e / "actor").is_dir(), inside="actor"), _read_verl,
           formats=(VERL_FORMAT,)),
    Layout(OPENRLHF, "OpenRLHF global_step<N>_hf folders", named_saves(OPENRLHF_NAME), _read_openrlhf),
    Layout(NEMO_RL, "NeMo-RL step_<N> folders", named_saves(NEMO_NAME, lambda e: (e / "policy").is_dir()),
           _read_nemo_rl, formats=(DCP_FORMAT,)),
    Layout(TORCHTITAN, "torchtitan step-<N> folders", named_saves(TITAN_NAME, _titan_save), _read_torchtitan,
           formats=(DCP_FORMAT,)),
    Layout(PLAIN, "save_pretrained folders named by their step (step_<N>, step-<N>, iter_<N>, ...)",
           named_saves(PLAIN_NAME, lambda e: not e.name.startswith("tmp_")), _read_plain),
):
    register_layout(_layout, last=True)


# ---- what the readers share ------------------------------------------------------------------------------------
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
    files = list(weight_files(folder, form))
    files += [folder / n for n in ("config.json", ADAPTER_CONFIG, *INDEX_FILES) if (folder / n).is_file()]
    return files


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or (folder / "pytorch_model.bin").is_file()


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
