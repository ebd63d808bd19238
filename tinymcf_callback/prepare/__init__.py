"""The offline preparation of vignette sets: download and check, register users' files, have rewrites made, judge them.

Nothing here runs when the probe scores a model: the probe reads what this prepared (the home's ``sets/`` and
``cache/``). It depends only on the data layer and the package's base modules, never on scoring or stats. The command
line is ``tinymcf prepare``, ``validate`` and ``show``; its modules, one job each: docs/development.md.
"""
