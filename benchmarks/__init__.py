"""The benchmarks: each a module run from the repository's root, ``python -m benchmarks.NAME`` (``make bench`` runs
the timed ones), importing its siblings as ``benchmarks.NAME`` and the tests' helpers as ``tests.helpers.NAME``; the
tests import them the same way (pyproject's ``pythonpath``). benchmarks/README.md lists them."""
