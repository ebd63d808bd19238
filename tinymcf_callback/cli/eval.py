"""``tinymcf eval --model PATH_OR_ID``: score one model, print what it says, write its JSON report.

Loads a causal LM (a local folder or a Hub id; with ``HF_HUB_OFFLINE=1`` only local), scores it
on a vignette set, prints the sanity lines and the per-foundation table, and writes the report
(``eval_<name>_<tag>.json``, ``eval_<name>_json_<tag>.json`` with ``--answer-format json``)
atomically into ``--out``. Every probe setting is an option (:func:`~.options.add_probe_options`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import TinymcfError
from ..extras import require
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT
from .options import add_home, add_loading, add_probe_options, add_progress, probe_config

NAME = "eval"
SUMMARY = "score one model and write its JSON report"


class LoadError(TinymcfError):
    """A model or tokenizer named on the command line cannot be loaded, or a folder cannot be written."""


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="a local model folder or a Hugging Face id")
    p.add_argument("--tag", default=None, help="label for this run, e.g. step_500 (default: the model folder's name)")
    p.add_argument("--out", default=None, help="folder for the JSON report (default: the current folder)")
    p.add_argument("--gguf-file", default=None, help="a GGUF file inside --model, for GGUF checkpoints")
    add_loading(p)
    add_home(p)
    add_progress(p)
    add_probe_options(p, skip=("target",))  # one model: no change to measure a target's selectivity by


def check_out_dir(out: Path) -> None:
    """Fail before minutes of scoring, not after: the report's folder must exist (made here) and be writable."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LoadError(f"cannot create the output folder {out}: {e.strerror}") from None
    if not os.access(out, os.W_OK):
        raise LoadError(f"the output folder {out} is not writable; pass a writable folder with --out")


def check_model_source(path: str, gguf_file: str | None = None) -> None:
    """Refuse, in one line, a ``--model`` that names no model: a missing folder, or a folder without ``config.json``.

    A name that is not a folder is taken for a Hub id (``org/name``), unless it reads as a path (``/``, ``./``,
    ``../``, ``~``) or the Hub is off (``HF_HUB_OFFLINE=1``): then it is a folder that is not there.
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
    if path.startswith(("/", "./", "../", "~")) or path.count("/") > 1:
        raise LoadError(f"no such folder {folder}: pass a local model folder, or a Hub id (org/name)")
    if offline and not _in_hub_cache(path):
        raise LoadError(f"no such folder {folder}, and HF_HUB_OFFLINE=1 with no copy of a Hub model {path} in the "
                        f"local Hub cache: pass a local model folder (an offline copy of SmolLM2: python -c "
                        f"'from tinymcf_callback.testing import smollm2_dir; print(smollm2_dir())'), or unset "
                        f"HF_HUB_OFFLINE with the Hub reachable")


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hub cache holds ``repo_id``'s config.json (what an offline load needs first)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id at all
        return False


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def load_tokenizer(path: str, gguf_file: str | None = None):
    from transformers import AutoTokenizer

    check_model_source(path, gguf_file)
    try:
        return AutoTokenizer.from_pretrained(path, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as e:
        raise LoadError(f"cannot load the tokenizer of {path}: {_one_line(e)}") from None


def load_model(path: str, *, device: str, dtype: str = "auto", gguf_file: str | None = None):
    """The causal LM of ``path`` on ``device``, in ``dtype`` (``auto``: the checkpoint's own)."""
    import torch
    from transformers import AutoModelForCausalLM

    check_model_source(path, gguf_file)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto" if dtype == "auto" else getattr(torch, dtype),
                                                     **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as e:
        raise LoadError(f"cannot load the model {path}: {_one_line(e)}") from None
    return model.to(device)


def run(args) -> int:
    import torch

    from ..probe import Probe
    from ..results.report import write_report
    from ..results.text import format_table, sanity_lines

    config = probe_config(args)
    out_dir = Path(args.out or ".")
    check_out_dir(out_dir)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.gguf_file:
        require("gguf")
    probe = Probe(load_tokenizer(args.model, args.gguf_file), config=config)  # bad data fail before the weights load
    model = load_model(args.model, device=device, dtype=args.dtype, gguf_file=args.gguf_file)
    report = probe.run(model, progress=not args.no_progress)
    print("\n".join(sanity_lines(report)))
    print(format_table(report["table"]))
    tag = args.tag or Path(str(args.model).rstrip("/")).name or "model"
    safe_tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in tag)
    fmt = "" if config.answer_format == DEFAULT_ANSWER_FORMAT else f"_{config.answer_format}"
    path = out_dir / f"eval_{config.name}{fmt}_{safe_tag}.json"
    try:
        write_report(path, report, tag=tag, model=str(args.model))
    except OSError as e:
        raise LoadError(f"cannot write {path}: {e.strerror}") from None
    print(f"[tinymcf] report written to {path}")
    return 0
