"""The flat layout's module paths, kept working: ``tinymcf_callback.engine`` is ``tinymcf_callback.scoring.engine``.

The package was one folder of 28 modules; it is now one subpackage per reason to change. Code
written against the old paths (``from tinymcf_callback.stats import paired_change``) still
imports: a finder on ``sys.meta_path`` hands out the module at its new place under its old name
too (the same module object, not a copy). The old ``python -m`` commands are real modules
(``eval``, ``validate``, ``plot`` and the ``prepare`` package), thin aliases of ``tinymcf``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "analysis": "results.analysis", "callback": "training.callback", "clifford": "prepare.clifford",
    "comparison": "results.comparison", "distributed": "scoring.ranks", "engine": "scoring.engine",
    "home": "data.home", "llm": "prepare.llm", "model_info": "scoring.model_info", "prepare_cli": "cli.prepare",
    "prompts": "scoring.prompts", "request_loop": "prepare.request_loop", "rewrites": "prepare.rewrites",
    "rows": "prepare.rows", "rules": "prepare.rules", "selfcheck": "scoring.selfcheck", "sets": "data.sets",
    "show": "prepare.show", "stats": "results.stats", "store": "prepare.store", "sweep": "tools.sweep",
    "userset": "prepare.userset",
}
PACKAGE = __name__.rsplit(".", 1)[0]


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``tinymcf_callback.<old name>`` and loads it as the module at its new place."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname[len(PACKAGE) + 1:] if fullname.startswith(PACKAGE + ".") else None
        if old in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{PACKAGE}.{MOVED[spec.name[len(PACKAGE) + 1:]]}")

    def exec_module(self, module):
        pass  # the module at its new place is already executed


def install() -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
