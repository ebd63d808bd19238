"""Optional dependencies, imported one way: :func:`require` gives the module or says which extra to install.

What only some commands need comes with an extra (:data:`EXTRAS`); every import of one goes through here, so a missing
one is always the same single error, never a ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib

from .errors import MissingExtraError

PACKAGE = "tinymcf_callback"
# module -> (the extra that brings it, what it is needed for)
EXTRAS = {
    "openai": ("api", "talking to an OpenAI-compatible server (prepare and validate's LLM, a served model's "
                      "--endpoint)"),
    "dotenv": ("prepare", "reading the API key from a .env file"),
    "vaderSentiment": ("prepare", "the lexical-cue rule that checks every uphold rewrite"),
    "matplotlib": ("plot", "drawing the curves"),
    "wandb": ("wandb", "logging to Weights & Biases"),
    "tensorboard": ("tensorboard", "logging to TensorBoard"),
    "mlflow": ("mlflow", "logging to MLflow"),
    "trackio": ("trackio", "logging to trackio"),
    "peft": ("peft", "scoring PEFT adapter checkpoints"),
    "gguf": ("gguf", "loading GGUF checkpoints (--gguf-file)"),
    "deepspeed": ("deepspeed", "reading DeepSpeed ZeRO checkpoints (their float32 weights, zero_to_fp32)"),
    "datasets": ("prefs", "reading preference pairs from a Hugging Face dataset (--prefs NAME or a dataset folder)"),
    "lm_eval": ("lmeval", "running lm-evaluation-harness tasks beside the probe (--lm-eval)"),
}


def install_hint(module: str) -> str:
    extra = EXTRAS[module.split(".")[0]][0]
    return f"pip install '{PACKAGE}[{extra}]'"


def require(module: str):
    """The module ``module`` (e.g. ``"openai"`` or ``"vaderSentiment.vaderSentiment"``), or :class:`MissingExtraError`.

    The error names the package, what it is needed for and the extra to install.
    """
    top = module.split(".")[0]
    if top not in EXTRAS:
        raise KeyError(f"{top!r} is not an optional dependency of {PACKAGE} (known: {', '.join(EXTRAS)})")
    try:
        return importlib.import_module(module)
    except ImportError:
        extra, purpose = EXTRAS[top]
        raise MissingExtraError(f"{purpose} needs the {top} package, part of the [{extra}] extra: "
                                f"{install_hint(top)}") from None


def available(module: str) -> bool:
    """Can ``module`` be imported? (For choosing a path; use :func:`require` to import it.)"""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
