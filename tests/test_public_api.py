"""The public surface as an editor sees it: every name of ``tinymcf_callback.__all__`` resolves for a type checker.

The names load lazily (``tinymcf prepare`` starts without torch); a lazy name that a type checker could not
follow would be ``Any`` in the user's editor: no completion, no signature, no check. mypy reads a small
user file here the way an editor's checker does (third-party packages skipped, so that only this
package's own annotations count) and every revealed type must be the package's, never ``Any``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import tinymcf_callback

MYPY_INI = """[mypy]
follow_imports = skip
ignore_missing_imports = True
[mypy-tinymcf_callback]
follow_imports = silent
[mypy-tinymcf_callback.*]
follow_imports = silent
"""


def revealed(tmp_path, names: list[str]) -> dict[str, str]:
    user = tmp_path / "user.py"
    reveals = "".join(f"reveal_type({n})\n" for n in names)
    user.write_text(f"from tinymcf_callback import {', '.join(names)}\n{reveals}")
    (tmp_path / "mypy.ini").write_text(MYPY_INI)
    p = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir",
                        str(tmp_path / "cache"), "--no-error-summary", str(user)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    types = {}
    for line in p.stdout.splitlines():
        m = re.match(r".*user\.py:(\d+): note: Revealed type is \"(.*)\"$", line)
        if m:
            types[names[int(m.group(1)) - 2]] = m.group(2)
    assert len(types) == len(names), p.stdout + p.stderr
    return types


def test_an_editor_resolves_every_public_name(tmp_path):
    types = revealed(tmp_path, list(tinymcf_callback.__all__))
    unresolved = {name: t for name, t in types.items() if t == "Any"}
    assert unresolved == {}
    assert types["Probe"].endswith("-> tinymcf_callback.probe.fixed.Probe")
    assert types["make_probe"].endswith("-> tinymcf_callback.probe.fixed.Probe | tinymcf_callback.probe.adaptive"
                                        ".AdaptiveProbe")
    assert types["MoralProbeCallback"].endswith("-> tinymcf_callback.training.callback.MoralProbeCallback")


def test_the_check_sees_a_name_an_editor_cannot_resolve(tmp_path, monkeypatch):
    """Guard: a lazy name with no import a checker can follow is reported as Any."""
    pkg = tmp_path / "site" / "lazy_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("def __getattr__(name):\n    return 1\n")
    (pkg / "py.typed").write_text("")
    user = tmp_path / "user.py"
    user.write_text("from lazy_pkg import thing\nreveal_type(thing)\n")
    p = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), str(user)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={"MYPYPATH": str(tmp_path / "site"), "PATH": ""})
    assert 'Revealed type is "Any"' in p.stdout, p.stdout + p.stderr
