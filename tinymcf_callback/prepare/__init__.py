"""The offline preparation of vignette sets: download and check, register users' files, have rewrites made, judge them.

Nothing here runs when the probe scores a model: the probe reads what this prepared (the home's
``sets/`` and ``cache/``). It depends only on the data layer (:mod:`tinymcf_callback.data`) and
the package's base modules, never on scoring or stats. The command line is ``tinymcf prepare``,
``tinymcf validate`` and ``tinymcf show`` (:mod:`tinymcf_callback.cli`); ``python -m
tinymcf_callback.prepare`` is ``tinymcf prepare``.

One job per module: ``rows`` (labels to vignette rows) -> ``clifford`` (the Clifford CSV),
``userset`` (your files); ``store`` (writes into the home); ``llm`` (the client) ->
``request_loop`` (ask, keep each good answer) -> ``rewrites`` (the rewrite prompt and its rules
check), ``judge`` (validate); ``show`` (the spot check); ``rules`` (what every rewrite must
satisfy); ``pipeline`` (a set made ready, start to end).
"""
