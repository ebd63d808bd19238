"""Scoring a model that lives in an inference server (vLLM, SGLang, llama.cpp, any OpenAI-compatible one).

:class:`ServedModel` stands where a local model would: ``Probe.run``, ``evaluate``, the callback, the
sweep and the watcher take it. See ``docs/served.md``.
"""

from .backend import ServedModel
from .forms import FORMS

__all__ = ["FORMS", "ServedModel"]
