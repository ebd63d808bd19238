"""tinymcf_callback: a fast moral-foundations probe for Hugging Face models and training runs.

Public names are imported lazily, so ``python -m tinymcf_callback.prepare`` and the data
layer start without loading torch or transformers.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "analyse": "analysis",
    "AnswerScores": "engine",
    "compare": "comparison",
    "CompareError": "comparison",
    "load_report": "comparison",
    "MoralProbeCallback": "callback",
    "score_prompts": "engine",
    "Probe": "probe",
    "evaluate": "probe",
    "FRAMES": "prompts",
    "format_prompt": "prompts",
    "format_prompts": "prompts",
    "CONDITIONS": "sets",
    "FOUNDATIONS": "sets",
    "ProbeDataError": "sets",
    "available_sets": "sets",
    "load_vignettes": "sets",
    "show_rewrites": "show",
    "UnsupportedModelError": "model_info",
    "unwrap_model": "model_info",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tinymcf_callback' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
