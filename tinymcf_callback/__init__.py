"""tinymcf_callback: a fast moral-foundations probe for Hugging Face models and training runs.

The package, one folder per reason to change, imports running one way
(``data`` -> ``scoring`` -> ``results`` -> ``probe`` and ``config`` -> ``training``, ``tools`` -> ``cli``;
``prepare`` beside them, on ``data`` only):

- ``data/``: where user data lives (``home``) and the vignette sets with their rewrite cache (``sets``);
- ``scoring/``: prompt text (``prompts``), what a model is and takes (``model_info``), batch planning
  (``batching``), the strategies that run the model (``engine``), its self-check (``selfcheck``), the
  probe's mode and precision (``mode``), several processes (``ranks``);
- ``results/``: pure pandas/numpy from P(Yes) to the report (``analysis``, ``stats``, ``readout``,
  ``text``), the files (``report``, ``history``), the logged names (``metrics``), ``comparison``, ``curves``;
- ``probe.py`` (``Probe``, ``evaluate``) and ``config.py`` (``ProbeConfig``): the composition of the above;
  ``steering.py``: the probe under a family of interventions (dose-response, random-direction control);
- ``training/``: the Trainer callback (``callback``), the probe in a loop of one's own (``logger``), the
  callback's saved state and writers;
- ``tools/``: the checkpoint sweep and the plots;
- ``cli/``: the ``tinymcf`` command;
- ``prepare/``: the offline preparation of sets (download, rewrites, judge, spot check).

Public names are imported lazily, so ``tinymcf prepare`` and the data layer start without loading
torch or transformers.
"""

from __future__ import annotations

import importlib

from . import _aliases

__version__ = "0.1.0"

_EXPORTS = {
    "analyse": "results.analysis",
    "AnswerScores": "scoring.engine",
    "compare": "results.comparison",
    "CompareError": "errors",
    "ConfigError": "errors",
    "EngineMismatchError": "errors",
    "load_report": "results.report",
    "MoralProbeCallback": "training.callback",
    "ProbeLogger": "training.logger",
    "ResidualSteering": "steering",
    "DoseResponse": "steering",
    "random_directions": "steering",
    "residual_direction": "steering",
    "score_prompts": "scoring.engine",
    "Probe": "probe",
    "ProbeConfig": "config",
    "evaluate": "probe",
    "encode_batch": "scoring.engine",
    "FRAMES": "scoring.prompts",
    "format_prompt": "scoring.prompts",
    "format_prompts": "scoring.prompts",
    "CONDITIONS": "data.sets",
    "FOUNDATIONS": "data.sets",
    "ProbeDataError": "errors",
    "TinymcfError": "errors",
    "available_sets": "data.sets",
    "load_vignettes": "data.sets",
    "show_rewrites": "prepare.show",
    "UnsupportedModelError": "errors",
    "unwrap_model": "scoring.model_info",
}

__all__ = sorted(_EXPORTS)

_aliases.install()  # the modules' paths of the flat layout (tinymcf_callback.engine, ...) keep working


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tinymcf_callback' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
