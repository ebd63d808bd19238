"""Loading what a command scores: a tokenizer and a causal LM from a folder or a Hub id, in a chosen dtype.

One recipe for ``tinymcf eval`` and the sweep: a name that names no model is refused in one line
before transformers is asked (:func:`check_model_source`), and a loader's many-line error becomes one
:class:`~tinymcf_callback.errors.LoadError` naming the path.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import LoadError, one_line
from .extras import require


def check_model_source(path: str, gguf_file: str | None = None) -> None:
    """Refuse, in one line, a ``--model`` that names no model: a missing folder, or a folder without ``config.json``.

    A name that is not a folder is taken for a Hub id (``org/name``), unless it reads as a path (``/``, ``./``,
    ``../``, ``~``, more than one ``/``, or a first part that is a folder here: ``runs/base``), or the Hub is off
    (``HF_HUB_OFFLINE=1``) and the local Hub cache lacks it: then it is a folder that is not there.
    """
    folder = Path(path).expanduser()
    if folder.is_dir():
        if gguf_file:
            if not (folder / gguf_file).is_file():
                raise LoadError(f"{folder} holds no {gguf_file} (--gguf-file names a file inside --model)")
        elif not (folder / "config.json").is_file():
            raise LoadError(f"{folder} has no config.json, so it is not a saved model: pass the folder model."
                            f"save_pretrained() wrote, or a Trainer checkpoint (checkpoint-<step>)")
        return
    if folder.exists():
        raise LoadError(f"{folder} is a file, not a model folder: pass the folder that holds config.json")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    first = Path(path).parts[0] if Path(path).parts else ""
    if path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or (first and Path(first).is_dir()):
        raise LoadError(f"no such folder {folder}: pass a local model folder, or a Hub id (org/name)")
    if offline and not _in_hub_cache(path):
        raise LoadError(f"no such folder {folder}, and HF_HUB_OFFLINE=1 with no copy of a Hub model {path} in the "
                        f"local Hub cache: pass a local model folder (an offline copy of SmolLM2: python -c "
                        f"'from tinymcf_callback.testing import smollm2_dir; print(smollm2_dir())'), or unset "
                        f"HF_HUB_OFFLINE with the Hub reachable")


def hub_options(path: str) -> dict:
    """How to load ``path`` when it is a Hub id: asked of the Hub once, quickly, so that a typo or an unreachable Hub
    is one line within seconds (transformers alone retries for half a minute, in many lines). ``{}``: load as
    usual; ``{"local_files_only": True}``: the Hub is unreachable and the local cache has the model. Raises
    :class:`LoadError` for a name the Hub does not know, or an unreachable Hub without a cached copy."""
    if Path(path).expanduser().exists() or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in (
            "1", "true", "yes", "on"):
        return {}
    import huggingface_hub

    try:
        huggingface_hub.model_info(path, timeout=10)
    except huggingface_hub.errors.RepositoryNotFoundError:
        raise LoadError(f"no model {path} on the Hugging Face Hub (a typo? a private or gated model needs `hf auth "
                        f"login` first), and no such folder here") from None
    except Exception as e:  # noqa: BLE001 - no connection, a timeout, a proxy refusing: the Hub cannot be asked
        if _in_hub_cache(path):
            return {"local_files_only": True}
        raise LoadError(f"cannot reach the Hugging Face Hub to fetch {path} ({one_line(e, 160)}), and the local Hub "
                        f"cache has no copy of it: pass a local model folder, or try again with the Hub reachable"
                        ) from None
    return {}


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hub cache holds ``repo_id``'s config.json (what an offline load needs first)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id at all
        return False


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def load_tokenizer(path: str, gguf_file: str | None = None, *, alone: bool = False):
    """The tokenizer of ``path``; ``alone``: a folder holding just a tokenizer will do (a served model's). A folder
    without a tokenizer file (a model saved alone) is refused: transformers would build an empty tokenizer from its
    config."""
    from transformers import AutoTokenizer

    from .rundir.checkpoints import TOKENIZER_FILES

    if not (alone and Path(path).is_dir()):
        check_model_source(path, gguf_file)
    if Path(path).is_dir() and gguf_file is None and not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        raise LoadError(f"cannot load the tokenizer of {path}: it has no tokenizer files "
                        f"({', '.join(TOKENIZER_FILES)})")
    options = hub_options(path)
    try:
        return AutoTokenizer.from_pretrained(path, **options, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as e:
        raise LoadError(f"cannot load the tokenizer of {path}: {_one_line(e)}") from None


def load_model(path: str, *, device: str, dtype: str = "auto", gguf_file: str | None = None,
               adapter: str | os.PathLike | None = None):
    """The causal LM of ``path`` on ``device``, in ``dtype`` (``auto``: the checkpoint's own); with ``adapter``
    (a PEFT adapter folder) the adapter applied to it (``peft``, the ``[peft]`` extra)."""
    from transformers import AutoModelForCausalLM

    check_model_source(path, gguf_file)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), **hub_options(path),
                                                     **({"gguf_file": gguf_file} if gguf_file else {}))
        if adapter is not None:
            model = require("peft").PeftModel.from_pretrained(model, str(adapter))
    except (OSError, ValueError) as e:
        raise LoadError(f"cannot load the model {adapter or path}: {_one_line(e)}") from None
    return model.to(device)


def torch_dtype(name: str):
    """``"auto"`` (the checkpoint's own), or the ``torch`` dtype of that name (``"bfloat16"``, ...)."""
    import torch

    return "auto" if name == "auto" else getattr(torch, name)


def release_memory() -> None:
    """After a model is dropped: collect it and hand the accelerator's cached blocks back (before the next load)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
