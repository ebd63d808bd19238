"""tinymcf_callback: a fast moral-foundations probe for Hugging Face models and training runs.

``__all__`` is what a user calls; everything else stays importable from its own module (the layout:
docs/development.md). The names are imported lazily, so ``tinymcf prepare`` and the data layer start without torch or
transformers; the same imports under ``TYPE_CHECKING`` let editors and type checkers resolve each of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._version import __version__ as __version__

_EXPORTS = {
    # the probe in training
    "MoralProbeCallback": "training.callback",
    "ProbeLogger": "training.logger",
    "ServedModel": "served.model",  # the policy in an inference server (endpoint=)
    # one model, one report
    "Probe": "probe",
    "AdaptiveProbe": "probe",  # a precision target (until=)
    "make_probe": "probe",  # whichever of the two the settings ask for
    "ProbeConfig": "config",
    "evaluate": "probe",
    "compare": "views.comparison",
    "load_report": "rundir.report",
    # the slow benchmark beside the probe: preference pairs and lm-eval tasks
    "Benchmark": "benchmark.runner",
    "BenchmarkConfig": "benchmark.config",
    "evaluate_benchmark": "benchmark.runner",
    "compare_steps": "benchmark.steps",
    # steering
    "ResidualSteering": "steering.hooks",
    "random_directions": "steering.directions",
    "residual_direction": "steering.directions",
    "dose_response": "steering.dose",
    "DoseResponse": "steering.dose",
    # the vignettes
    "load_vignettes": "data.sets",
    "show_rewrites": "prepare.show",
    # the lower level: your own forward pass
    "FRAMES": "scoring.prompts",
    "format_prompt": "scoring.prompts",
    "format_prompts": "scoring.prompts",
    "score_prompts": "scoring.answers",
    "analyse": "stats.analysis",
    # the root of every error the package raises (each kind: tinymcf_callback.errors)
    "TinymcfError": "errors",
}

__all__ = [  # what a user calls; the same names as _EXPORTS (a test holds them equal)
    "AdaptiveProbe",
    "analyse",
    "Benchmark",
    "BenchmarkConfig",
    "compare",
    "compare_steps",
    "dose_response",
    "DoseResponse",
    "evaluate",
    "evaluate_benchmark",
    "format_prompt",
    "format_prompts",
    "FRAMES",
    "load_report",
    "load_vignettes",
    "make_probe",
    "MoralProbeCallback",
    "Probe",
    "ProbeConfig",
    "ProbeLogger",
    "random_directions",
    "residual_direction",
    "ResidualSteering",
    "score_prompts",
    "ServedModel",
    "show_rewrites",
    "TinymcfError",
]

if TYPE_CHECKING:
    from .benchmark.config import BenchmarkConfig
    from .benchmark.runner import Benchmark, evaluate_benchmark
    from .benchmark.steps import compare_steps
    from .config import ProbeConfig
    from .data.sets import load_vignettes
    from .errors import TinymcfError
    from .prepare.show import show_rewrites
    from .probe import AdaptiveProbe, Probe, evaluate, make_probe
    from .rundir.report import load_report
    from .scoring.answers import score_prompts
    from .scoring.prompts import FRAMES, format_prompt, format_prompts
    from .served.model import ServedModel
    from .stats.analysis import analyse
    from .steering.directions import random_directions, residual_direction
    from .steering.dose import DoseResponse, dose_response
    from .steering.hooks import ResidualSteering
    from .training.callback import MoralProbeCallback
    from .training.logger import ProbeLogger
    from .views.comparison import compare


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tinymcf_callback' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
