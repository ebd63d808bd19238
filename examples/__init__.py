"""The example scripts, each run from a clone (``python examples/demo.py``); a package so that the tests import them
(``from examples import demo``)."""
