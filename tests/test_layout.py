"""The package's shape: imports run one way, old paths and commands still work, nothing leaves the top level.

The parts, from the bottom up (a module may import its own part and the parts below it):

    base      _io, errors, extras                     (no part of the package)
    data      data/                                    the home, the vignette sets and their rewrites
    scoring   scoring/                                 prompts, models, batching, the engine and its self-check
    results   results/                                 pandas/numpy from P(Yes) to reports, files, comparisons
    probe     probe.py, config.py, steering.py         Probe, evaluate, ProbeConfig, dose-response: the composition
    uses      training/, tools/                        the callback; the sweep and the plots
    cli       cli/ and the python -m aliases           the tinymcf command

and ``prepare/``, the offline preparation, beside them: on ``base`` and ``data`` only; only the
command line uses it. ``testing.py`` (models for tests and the demo) imports no part of the package.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import tinymcf_callback
from tinymcf_callback import _aliases

PACKAGE = Path(tinymcf_callback.__file__).resolve().parent
LAYERS = ("base", "data", "scoring", "results", "probe", "uses", "cli")
PART_OF = {"_io": "base", "errors": "base", "extras": "base", "_aliases": "base", "data": "data",
           "scoring": "scoring", "results": "results", "probe": "probe", "config": "probe", "steering": "probe",
           "training": "uses", "tools": "uses", "cli": "cli", "eval": "cli", "plot": "cli", "validate": "cli",
           "__main__": "cli",
           "prepare": "prepare", "testing": "testing", "__init__": "init"}
MAY_IMPORT = {"prepare": {"base", "data", "prepare"}, "testing": set(),
              **{layer: set(LAYERS[:i + 1]) for i, layer in enumerate(LAYERS)}}
MAY_IMPORT["cli"] |= {"prepare"}
MAY_IMPORT["init"] = {"base"}  # the package's __init__ imports its public names lazily, by name


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        yield ".".join(("tinymcf_callback", *rel.parts)).removesuffix(".__init__"), path


def part(module: str) -> str:
    if module.endswith(".__main__"):
        return "cli"  # python -m tinymcf_callback.prepare: an alias of the command line
    first = module.split(".")[1] if "." in module else "__init__"
    return PART_OF[first]


def imported(module: str, path: Path) -> set[str]:
    """Every tinymcf_callback module ``module`` imports, at the top or inside a function."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("tinymcf_callback"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}"))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("tinymcf_callback"))
    return {t for t in out if t != "tinymcf_callback"}


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def test_imports_run_one_way():
    wrong = []
    for module, path in modules():
        mine = part(module)
        for target in imported(module, path):
            theirs = part(target)
            if theirs not in MAY_IMPORT[mine] and theirs != mine:
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert wrong == [], "\n".join(wrong)


def test_the_layering_check_sees_an_import_against_the_direction(tmp_path):
    """Guard: the check finds an upward import inside a function body too."""
    bad = tmp_path / "engine.py"
    bad.write_text("def f():\n    from ..training.callback import MoralProbeCallback\n")
    targets = imported("tinymcf_callback.scoring.engine", bad)
    assert targets == {"tinymcf_callback.training.callback"}
    assert part("tinymcf_callback.training.callback") not in MAY_IMPORT["scoring"]


def test_the_top_level_holds_only_the_composition_and_the_aliases():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "_aliases", "_io", "config", "errors", "eval", "extras", "plot", "probe",
                   "steering", "testing", "validate"]


@pytest.mark.parametrize("old, new", sorted(_aliases.MOVED.items()))
def test_every_module_path_of_the_flat_layout_still_imports(old, new):
    assert importlib.import_module(f"tinymcf_callback.{old}") is importlib.import_module(f"tinymcf_callback.{new}")


def test_the_documented_imports_still_work():
    from tinymcf_callback.stats import paired_change  # noqa: F401

    from tinymcf_callback import (  # noqa: F401 - the README's and the docs' imports
        CONDITIONS,
        FOUNDATIONS,
        FRAMES,
        MoralProbeCallback,
        Probe,
        ProbeConfig,
        analyse,
        compare,
        evaluate,
        format_prompts,
        load_vignettes,
        score_prompts,
        show_rewrites,
    )
    from tinymcf_callback.plot import load_history, plot_histories  # noqa: F401


@pytest.mark.slow
@pytest.mark.parametrize("argv, shows", [
    (["-m", "tinymcf_callback", "--help"], "eval,sweep,compare,plot,prepare,validate,show"),
    (["-m", "tinymcf_callback.eval", "--help"], "usage: tinymcf eval"),
    (["-m", "tinymcf_callback.eval", "--run-dir", "x", "--help"], "usage: tinymcf sweep"),
    (["-m", "tinymcf_callback.eval", "--compare", "a", "b", "--help"], "usage: tinymcf compare"),
    (["-m", "tinymcf_callback.prepare", "--help"], "usage: tinymcf prepare"),
    (["-m", "tinymcf_callback.prepare", "--validate", "--help"], "usage: tinymcf validate"),
    (["-m", "tinymcf_callback.prepare", "--show", "3", "--help"], "usage: tinymcf show"),
    (["-m", "tinymcf_callback.validate", "--help"], "usage: tinymcf validate"),
    (["-m", "tinymcf_callback.plot", "--help"], "usage: tinymcf plot"),
])
def test_the_command_and_every_old_python_m_form_answer(argv, shows):
    p = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert shows in p.stdout or all(c in p.stdout for c in shows.split(",")), p.stdout


@pytest.mark.slow
def test_the_console_script_lists_the_subcommands():
    tinymcf = Path(sys.executable).with_name("tinymcf")
    if not tinymcf.exists():
        pytest.skip("the tinymcf console script is not installed in this environment (pip install -e .)")
    p = subprocess.run([str(tinymcf), "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0
    for command in ("eval", "sweep", "compare", "plot", "prepare", "validate", "show"):
        assert f"    {command} " in p.stdout
