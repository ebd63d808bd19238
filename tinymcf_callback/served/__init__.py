"""Scoring a model that lives in an inference server (vLLM, SGLang, llama.cpp, any OpenAI-compatible one).

:class:`ServedModel` stands where a local model would: ``Probe.run``, ``evaluate``, the callback, the
sweep and the watcher take it. See ``docs/served.md``. The package by job: ``config`` (one
:class:`ServedConfig`, built once from the options), ``client`` (the HTTP client and its one-line failures),
``server`` (what the server is, and the checks before scoring), ``forms`` (each request form as a pure
payload/parse pair), ``transport`` (batched requests through a bounded pool), ``answers`` (readings to scores),
``selfcheck`` (the served self-check), ``model`` (:class:`ServedModel`, composing them), ``reload`` (a checkpoint
loaded into the server).
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
