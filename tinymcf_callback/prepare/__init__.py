"""The offline preparation of vignette sets: download and check, register users' files, have rewrites made, judge them.

Nothing here runs when the probe scores a model: the probe reads what this prepared (the home's
``sets/`` and ``cache/``). It depends only on the data layer (:mod:`tinymcf_callback.data`) and
the package's base modules, never on scoring or results. The command line is ``tinymcf prepare``,
``tinymcf validate`` and ``tinymcf show`` (:mod:`tinymcf_callback.cli`); ``python -m
tinymcf_callback.prepare`` still works.

One job per module: ``rows`` (labels to vignette rows) -> ``clifford`` (the Clifford CSV),
``userset`` (your files); ``store`` (writes into the home); ``llm`` (the client) ->
``request_loop`` (ask, keep each good answer) -> ``rewrites`` (the rewrite prompt and its rules
check), ``judge`` (validate); ``show`` (the spot check); ``rules`` (what every rewrite must
satisfy); ``pipeline`` (a set made ready, start to end).
"""

import importlib

_EXPORTS = {"PrepareError": "..errors", "main": "..cli.legacy:prepare_main", "normalize_clifford": ".clifford",
            "read_user_source": ".userset", "rewrite_messages": ".rewrites", "run_prepare": ".pipeline"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = _EXPORTS[name].partition(":")
    value = getattr(importlib.import_module(module, __name__), attr or name)
    globals()[name] = value
    return value
