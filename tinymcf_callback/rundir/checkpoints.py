"""A Trainer output folder as a follower reads it: its ``checkpoint-<step>`` folders, what each holds, and what
its weights are (a fingerprint, which reads kilobytes, not the weights: docs/formats.md).

Each way a save holds its model is one :class:`Format` record of :data:`FORMATS`, its loader named lazily
(``"tinymcf_callback.follow.sharded:load_fsdp"``) so that this folder never imports the follower.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..errors import SweepError
from ..registry import Registry, resolve

CHECKPOINT_NAME = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
FULL_WEIGHTS = ("model.safetensors", "pytorch_model.bin", *INDEX_FILES)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
FSDP_FOLDER = re.compile(r"pytorch_model_fsdp_\d+")
ZERO_FOLDER = re.compile(r"global_step\d+")
FULL, ADAPTER, FSDP, ZERO = "full", "adapter", "fsdp", "zero"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")
DTYPES = ("float32", "bfloat16", "float16")
_SAMPLE = 64  # bytes read per sample


@dataclass(frozen=True)
class Format:
    """One way a save holds its model: a record of :data:`FORMATS` (see the module).

    Args:
        name: what a :class:`Checkpoint`'s ``format`` says.
        files: the files of a save's folder that hold its weights (the fingerprint reads them).
        loader: ``loader(checkpoint, base_model, *, dtype, device)`` -> the model in eval mode on ``device``, or a
            lazy ``"module:attribute"`` naming it (imported on first use).
        what: what such a save is, in the error asking for ``--base-model`` when it ``needs_base``.
        needs_base: its architecture comes from the run's starting model (``--base-model``).
        requires: the optional package loading it needs (its extra), checked before anything is scored.
    """

    name: str
    files: Callable[[Path], list[Path]]
    loader: Callable | str
    what: str = ""
    needs_base: bool = False
    requires: str | None = None

    def load(self, checkpoint: Checkpoint, base_model: str | None, *, dtype: str, device: str):
        """The model of ``checkpoint`` by this format's loader (its config from where its layout keeps it, or
        ``base_model``, the run's starting model)."""
        return resolve(self.loader)(checkpoint, base_model, dtype=dtype, device=device)


FORMATS: Registry[Format] = Registry("weight format")  # name -> record, in the order they were registered


@dataclass(frozen=True)
class Checkpoint:
    """One saved model of a run (or the run's starting weights as step 0, ``baseline``): its folder, in the layout's
    format (a name of :data:`FORMATS`)."""

    step: int
    folder: Path
    epoch: float | None
    format: str = FULL
    baseline: bool = False  # the run's starting weights (not a checkpoint-<step> folder): step 0
    shown_as: str | None = None  # the path its report names, when it is read from elsewhere (the hand-off queue)
    tokenizer: Path | None = None  # its tokenizer's folder, when not the checkpoint's own (verl, NeMo-RL)
    config: Path | None = None  # the folder of its model's config, when not its own (verl's huggingface/)
    needs_base: bool = False  # its architecture comes from the run's starting model (DCP, an export without config)

    @property
    def adapter(self) -> bool:
        return self.format == ADAPTER

    @property
    def name(self) -> str:
        return "the starting weights" if self.baseline else self.folder.name


# ---- what a folder holds --------------------------------------------------------------------------------------
def checkpoint_format(folder: Path) -> str | None:
    """How ``folder`` holds its model (:data:`FORMATS`), or None when it holds none that can be read."""
    if any((folder / f).exists() for f in FULL_WEIGHTS) or any(folder.glob("model-*.safetensors")):
        return FULL
    if (folder / ADAPTER_CONFIG).exists():
        return ADAPTER
    if any(FSDP_FOLDER.fullmatch(p.name) for p in _subfolders(folder)):
        return FSDP
    if zero_folder(folder) is not None:
        return ZERO
    return None


def zero_folder(folder: Path) -> Path | None:
    """A DeepSpeed checkpoint's ``global_step<N>/`` (the one ``latest`` names, else the only one), or None."""
    named = (folder / "latest").read_text().strip() if (folder / "latest").is_file() else None
    if named and (folder / named).is_dir():
        return folder / named
    found = [p for p in _subfolders(folder) if ZERO_FOLDER.fullmatch(p.name)]
    return found[0] if len(found) == 1 else None


def weight_files(folder: Path, form: str | None = None) -> list[Path]:
    """The files that hold the model's weights (sorted), in the folder's format (its :class:`Format`'s ``files``)."""
    form = form or checkpoint_format(folder)
    return sorted(FORMATS[form].files(folder)) if form in FORMATS else []


def _full_files(folder: Path) -> list[Path]:
    files = [p for p in folder.iterdir() if p.is_file() and (p.name in FULL_WEIGHTS or (
        p.name.startswith(("model-", "pytorch_model-")) and p.suffix in (".safetensors", ".bin")))]
    return [p for p in files if not p.name.endswith(".index.json")]


def _adapter_files(folder: Path) -> list[Path]:
    return [folder / f for f in ADAPTER_WEIGHTS if (folder / f).is_file()]


def _fsdp_files(folder: Path) -> list[Path]:
    return [p for sub in _subfolders(folder) if FSDP_FOLDER.fullmatch(sub.name) for p in sub.rglob("*") if p.is_file()]


def _zero_files(folder: Path) -> list[Path]:
    sub = zero_folder(folder)
    return [p for p in sub.iterdir() if p.is_file() and "states" in p.name] if sub else []


def _subfolders(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []


for _record in (
    Format(FULL, _full_files, "tinymcf_callback.follow.sharded:load_full", what="weights without a config.json"),
    Format(ADAPTER, _adapter_files, "tinymcf_callback.follow.sharded:load_adapter",
           what=f"a PEFT adapter ({ADAPTER_CONFIG}, no full weights)", needs_base=True, requires="peft"),
    Format(FSDP, _fsdp_files, "tinymcf_callback.follow.sharded:load_fsdp",
           what="an FSDP sharded checkpoint (pytorch_model_fsdp_0/, no config.json)", needs_base=True),
    Format(ZERO, _zero_files, "tinymcf_callback.follow.sharded:load_zero", requires="deepspeed"),
):
    FORMATS.register(_record.name, _record)


# ---- what the weights are -------------------------------------------------------------------------------------
def fingerprint(folder: Path, form: str | None = None) -> str | None:
    """A digest of the weights ``folder`` holds (``form``: its format), or None when it holds none it can read;
    ``OSError`` when a weight file disappears or cannot be read meanwhile (the caller retries)."""
    files = weight_files(folder, form)
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.relative_to(folder)}\0{size}\0".encode())
        with open(path, "rb") as f:
            if path.suffix == ".safetensors":
                _safetensors_samples(f, size, digest)
            else:
                for offset in _spread(0, size, 16):
                    f.seek(offset)
                    digest.update(f.read(_SAMPLE))
    return digest.hexdigest()[:20]


def _safetensors_samples(f, size: int, digest) -> None:
    """The header, then the start, middle and end of every tensor's data."""
    n = int.from_bytes(f.read(8), "little")
    if not 0 < n < size:
        raise OSError(f"{f.name}: not a safetensors file (header length {n}, file size {size})")
    header = f.read(n)
    digest.update(header)
    try:
        tensors = json.loads(header)
    except ValueError:
        raise OSError(f"{f.name}: its safetensors header is not JSON (a file still being written?)") from None
    for name in sorted(k for k in tensors if k != "__metadata__"):
        start, end = tensors[name]["data_offsets"]
        for offset in _spread(start, end, 3):
            f.seek(8 + n + offset)
            digest.update(f.read(min(_SAMPLE, end - offset)))


def cut_short(folder: Path, form: str | None = None) -> str | None:
    """Why a weight file of ``folder`` cannot be read whole, naming the file, or None when each one can: reads
    headers and sizes only, so a save cut short fails here, before it is loaded or handed to a server."""
    form = form or checkpoint_format(folder)
    if form not in (FULL, ADAPTER):
        return None  # sharded formats are read by the library that wrote them, which checks its own files
    files = weight_files(folder, form)
    for index in (folder / name for name in INDEX_FILES):
        if index.is_file():
            try:
                listed = set(json.loads(index.read_text()).get("weight_map", {}).values())
            except (OSError, ValueError, AttributeError):
                return f"{index.name} is not a readable index (a save still being written?)"
            missing = sorted(name for name in listed if not (folder / name).is_file())
            if missing:
                verb = "is" if len(missing) == 1 else "are"
                return f"{index.name} lists {', '.join(missing[:3])}, which {verb} not there"
    for path in files:
        why = _whole(path)
        if why is not None:
            return f"{path.name} {why}"
    return None


def _whole(path: Path) -> str | None:
    """Why one weight file is not whole, or None."""
    try:
        size = path.stat().st_size
        if path.suffix == ".safetensors":
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if not 0 < n <= size - 8:
                    return f"is cut short or not a safetensors file ({size:,} bytes, header length {n:,})"
                header = json.loads(f.read(n))
            ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
            need = 8 + n + max(ends, default=0)
            if size < need:
                return f"is cut short: it holds {size:,} of the {need:,} bytes its header names"
        elif path.suffix == ".bin" and size and not zipfile.is_zipfile(path):
            with open(path, "rb") as f:
                if f.read(2) == b"PK":  # a zip archive (torch.save's format) without its closing directory
                    return f"is cut short: a zip archive of {size:,} bytes without its closing directory"
    except ValueError:
        return "has a header that is not JSON (a save still being written?)"
    except (KeyError, TypeError, IndexError):
        return "has a safetensors header without the tensors' offsets"
    return None


def _spread(start: int, end: int, k: int) -> list[int]:
    """``k`` sample offsets from ``start`` to the last full sample before ``end``."""
    last = max(start, end - _SAMPLE)
    if k == 1 or last == start:
        return [start]
    return sorted({start + (last - start) * i // (k - 1) for i in range(k)})


# ---- the run folder -------------------------------------------------------------------------------------------
def read_trainer_state(folder: Path) -> dict | None:
    """The checkpoint's ``trainer_state.json`` (the Trainer writes it last), or None while it is absent or half
    written."""
    try:
        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def read_epoch(state: dict | None) -> float | None:
    epoch = (state or {}).get("epoch")
    return float(epoch) if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) else None


def checkpoint_folders(folder: Path) -> dict[int, Path]:
    """The ``checkpoint-<step>`` folders of ``folder`` by step, in step order; two naming one step are refused."""
    by_step: dict[int, Path] = {}
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = CHECKPOINT_NAME.fullmatch(entry.name)
        if not match or not entry.is_dir():
            continue
        step = int(match.group(1))
        if step in by_step:
            raise SweepError(f"{by_step[step].name} and {entry.name} in {folder} both name step {step}; "
                             f"move one away")
        by_step[step] = entry
    return dict(sorted(by_step.items()))  # numeric order: checkpoint-10 after checkpoint-9


def adapter_base_name(folder: Path) -> str | None:
    """The base model an adapter names in its ``adapter_config.json`` (``base_model_name_or_path``)."""
    try:
        named = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return named if isinstance(named, str) and named else None


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


def saved_dtype(folder: Path) -> str | None:
    """The dtype a model folder's weights were saved in (``config.json``'s ``dtype``, formerly ``torch_dtype``)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dtype = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    return dtype if dtype in DTYPES else None


def same_model_source(a: str, b: str) -> bool:
    """Whether two names of a model (folders or Hub ids) name the same one: equal, or the same folder."""
    if a == b:
        return True
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve() and Path(a).expanduser().exists()
    except OSError:
        return False
