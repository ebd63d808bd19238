"""The package's shape: imports run one way with no circle, nothing outside the package touched, a small top level.

The parts, from the bottom up (a module may import its own part and the parts below it):

    base      _io, errors, extras, _version, apiclient, registry (no part of the package)
    data      data/                                    the home, the vignette sets and their rewrites
    scoring   scoring/                                 prompts, models, batching, the engine, its self-check
    stats     stats/                                   the numbers: from P(Yes) to a report's analysis, its intervals,
                                                       paired changes, the sequential looks, the logged metrics
    rundir    rundir/                                  what a run leaves on disk: the history, the JSON report, the
                                                       precision records compare by, the run's record, its hand-off
                                                       queue, its checkpoints
    views     views/                                   what a reader meets: a report as text, a history as curves, a
                                                       dashboard's rows, two reports or steps compared
    trackers  trackers/                                where a history line goes: TensorBoard, wandb, accelerate
    probe     probe/, config.py, loading.py,           Probe, AdaptiveProbe (a probe that stops when it knows
              benchmark/                               enough), make_probe, evaluate, ProbeConfig, loading a model:
                                                       the composition; the slow benchmark beside it
    uses      training/, follow/, figures/, steering/  the callback and ProbeLogger; sweep and watch; plots; steering
    cli       cli/ and the __main__ modules            the tinymcf command
    init      __init__.py                              the public names, resolved lazily

and ``prepare/``, the offline preparation, beside them: on ``base`` and ``data`` only; only the
command line uses it. ``testing.py`` (models for tests and the demo) imports no part of the package.

An import is any tie a reader or a tool can follow: ``import``/``from`` statements at the top, inside
functions or under ``TYPE_CHECKING``, and a string naming a module of the package
(``importlib.import_module(".rundir.report", ...)``, a table of lazy exports). A lazy entry of one of the
package's tables (``"tinymcf_callback.follow.sharded:load_fsdp"``, a weight format's loader, resolved by
``registry.resolve`` when the record is used) is a tie too, unless the module it names imports the one naming it:
then it is that table's plug-in (the implementation depends on the record, never the record on it at import), the
way lm-evaluation-harness's registry names its models. Every lazy entry must name something that is there.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tinymcf_callback

PACKAGE = Path(tinymcf_callback.__file__).resolve().parent
LAYERS = ("base", "data", "scoring", "stats", "rundir", "views", "trackers", "probe", "uses", "cli", "init")
PART_OF = {"_io": "base", "errors": "base", "extras": "base", "_version": "base", "apiclient": "base",
           "registry": "base",
           "data": "data", "scoring": "scoring", "stats": "stats", "rundir": "rundir", "views": "views",
           "trackers": "trackers",
           "probe": "probe", "config": "probe", "loading": "probe", "benchmark": "probe",
           "training": "uses", "follow": "uses", "figures": "uses", "steering": "uses", "cli": "cli", "__main__": "cli",
           "prepare": "prepare",
           "testing": "testing", "__init__": "init",
           "served": "scoring"}  # a served model is scored beside the engine: the same layer
MAY_IMPORT = {"prepare": {"base", "data", "prepare"}, "testing": set(),
              **{layer: set(LAYERS[:i + 1]) for i, layer in enumerate(LAYERS)}}
MAY_IMPORT["cli"] |= {"prepare"}
MAY_IMPORT["init"] |= {"prepare"}  # show_rewrites, a public name


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        yield ".".join(("tinymcf_callback", *rel.parts)).removesuffix(".__init__"), path


def part(module: str) -> str:
    if module.endswith(".__main__"):
        return "cli"  # python -m tinymcf_callback.prepare: the command line under the design's name
    first = module.split(".")[1] if "." in module else "__init__"
    return PART_OF[first]


def _resolve(package: str, name: str, level: int) -> str:
    if not level:
        return name
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([name] if name else []))


def imported(module: str, path: Path) -> set[str]:
    """Every tinymcf_callback module ``module`` ties itself to: imports anywhere, and strings naming a module."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(package, node.module or "", node.level)
            if target.startswith("tinymcf_callback"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}"))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("tinymcf_callback"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and not _lazy_entry(node.value):
            out.update(_named_module(package, node.value))
    return {t for t in out if t != "tinymcf_callback"}


def _lazy_entry(text: str) -> str | None:
    """The module a lazy table entry ``"tinymcf_callback.x.y:attribute"`` names, or None for any other string."""
    name, colon, attribute = text.partition(":")
    if not colon or not name.startswith("tinymcf_callback.") or not attribute.isidentifier():
        return None
    return name if _is_module(name) else None


def lazy_entries(path: Path) -> set[str]:
    """Every lazy table entry written in the module at ``path``."""
    return {node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _lazy_entry(node.value)}


def lazy_ties(module: str, path: Path, static: dict[str, set[str]]) -> set[str]:
    """The modules ``module``'s lazy entries name that are not its plug-ins (``static``: the imports' ties)."""
    named = {_lazy_entry(entry) for entry in lazy_entries(path)}
    return {target for target in named if module not in static.get(target, set())}


def _named_module(package: str, text: str) -> set[str]:
    """A string that names a module of the package: ``"tinymcf_callback.x.y"``, ``".x.y"``, ``"..x:attr"``, or,
    in the root package's table of lazy exports, ``"x.y"``."""
    name = text.split(":", 1)[0]
    if not name or any(c in name for c in " /\\-") or not name.replace(".", "").replace("_", "").isalnum():
        return set()
    level = len(name) - len(name.lstrip("."))
    if name.startswith("tinymcf_callback"):
        target = name
    elif level:
        target = _resolve(package, name[level:], level)
    elif package == "tinymcf_callback" and "." in name:
        target = f"tinymcf_callback.{name}"
    else:
        return set()
    return {target} if _is_module(target) else set()


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def graph() -> dict[str, set[str]]:
    static = {module: imported(module, path) for module, path in modules()}
    return {module: static[module] | lazy_ties(module, path, static) for module, path in modules()}


def test_imports_run_one_way():
    wrong = []
    for module, targets in graph().items():
        mine = part(module)
        for target in targets:
            theirs = part(target)
            if theirs not in MAY_IMPORT[mine] and theirs != mine:
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert wrong == [], "\n".join(wrong)


def test_no_import_circle_between_modules():
    """A module's package ``__init__`` is not an edge of its own (Python imports it first anyway)."""
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph().items()}
    found, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(" -> ".join([*trail[trail.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("code, seen", [
    ("def f():\n    from ..training.callback import MoralProbeCallback\n", "tinymcf_callback.training.callback"),
    ("import importlib\nm = importlib.import_module('..follow.sweep', __package__)\n", "tinymcf_callback.follow.sweep"),
    ("EXPORTS = {'main': '..cli.main:main'}\n", "tinymcf_callback.cli.main"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..probe import Probe\n", "tinymcf_callback.probe"),
])
def test_the_layering_check_sees_every_kind_of_tie(tmp_path, code, seen):
    """Guard: an upward tie inside a function, through importlib, in a string export or for type checkers."""
    bad = tmp_path / "engine.py"
    bad.write_text(code)
    assert imported("tinymcf_callback.scoring.engine", bad) == {seen}
    assert part(seen) not in MAY_IMPORT["scoring"]


def test_a_lazy_entry_is_a_tie_unless_it_names_a_plug_in(tmp_path):
    """Guard: a lazy entry naming a higher module that does not import the one naming it is an upward tie."""
    bad = tmp_path / "engine.py"
    bad.write_text('LOADER = "tinymcf_callback.cli.main:main"\n')
    assert imported("tinymcf_callback.scoring.engine", bad) == set()
    engine, cli = "tinymcf_callback.scoring.engine", "tinymcf_callback.cli.main"
    assert lazy_ties(engine, bad, {cli: set()}) == {cli}
    assert lazy_ties(engine, bad, {cli: {engine}}) == set()  # cli.main imports the engine: a plug-in of its table


def test_every_lazy_entry_names_what_is_there():
    from tinymcf_callback.registry import resolve

    entries = {entry for _, path in modules() for entry in lazy_entries(path)}
    assert entries, "no lazy entries found: the check would pass on nothing"
    for entry in sorted(entries):
        assert callable(resolve(entry)), entry


def test_the_circle_check_finds_a_circle(monkeypatch):
    fake = {"tinymcf_callback.a": {"tinymcf_callback.b"}, "tinymcf_callback.b": {"tinymcf_callback.a"}}
    monkeypatch.setattr(sys.modules[__name__], "graph", lambda: fake)
    with pytest.raises(AssertionError, match="tinymcf_callback.a -> tinymcf_callback.b -> tinymcf_callback.a"):
        test_no_import_circle_between_modules()


def test_the_top_level_holds_only_the_composition_and_the_base():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "_io", "_version", "apiclient", "config", "errors", "extras", "loading",
                   "registry", "testing"]


def test_the_public_names_are_the_lazy_table_and_each_resolves():
    from tinymcf_callback import _EXPORTS

    assert sorted(tinymcf_callback.__all__) == sorted(_EXPORTS)
    for name in tinymcf_callback.__all__:
        assert getattr(tinymcf_callback, name) is not None


def test_importing_the_package_touches_nothing_outside_it():
    code = ("import sys\nbefore = list(sys.meta_path), list(sys.path_hooks)\nimport tinymcf_callback\n"
            "assert (list(sys.meta_path), list(sys.path_hooks)) == before\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'pandas')]\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("argv, shows", [
    (["-m", "tinymcf_callback", "--help"], "eval,sweep,compare,plot,prepare,validate,show"),
    (["-m", "tinymcf_callback.prepare", "--help"], "usage: tinymcf prepare"),
])
def test_the_command_and_the_prepare_step_answer(argv, shows):
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
