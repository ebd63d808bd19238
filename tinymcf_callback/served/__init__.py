"""Scoring a model that lives in an inference server (vLLM, SGLang, llama.cpp, any OpenAI-compatible one).

:class:`ServedModel` stands where a local model would: ``Probe.run``, ``evaluate``, the callback, the sweep and the
watcher take it (docs/served.md; its modules: docs/development.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import ServedConfig
from .forms import FORMS

if TYPE_CHECKING:
    from .model import ServedModel

__all__ = ["FORMS", "ServedConfig", "ServedModel"]


def __getattr__(name: str):
    """``ServedModel`` loaded on first use (it brings torch): the package's light parts (its settings, the reload
    routes that ``tinymcf --help`` lists) load without it."""
    if name == "ServedModel":
        from .model import ServedModel

        return ServedModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
