"""Where the tool reads and writes user data: one home, ``$TINYMCF_HOME`` (the ``--home DIR`` option), else the
platform's user data folder. :func:`folders` builds every path in it; no other module puts a user folder together.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import platformdirs

HOME_VAR = "TINYMCF_HOME"
JUDGEMENTS_FILE = "judgements.jsonl"  # judge verdicts (validate), kept beside the rewrites, not rewrites

_PKG = Path(__file__).resolve().parents[1]  # the package: tinymcf_callback/


def shipped_dir(kind: str) -> Path:
    """``configs`` or ``cache`` as shipped: inside the wheel, or at the checkout's top level."""
    for base in (_PKG / "_data", _PKG.parent):
        if (base / kind).is_dir():
            return base / kind
    raise FileNotFoundError(f"the package's {kind}/ folder is missing; reinstall tinymcf_callback")


@dataclass(frozen=True)
class Folders:
    """The home's folders and the order in which rewrites are looked up."""

    home: Path

    @property
    def sets(self) -> Path:
        return self.home / "sets"

    @property
    def raw(self) -> Path:
        return self.home / "raw"

    @property
    def cache(self) -> Path:
        return self.home / "cache"

    @property
    def rewrite_dirs(self) -> list[Path]:
        """Rewrite folders in lookup order; a later folder's entry for the same key wins."""
        return [shipped_dir("cache"), self.cache]

    def set_file(self, name: str) -> Path:
        return self.sets / f"{name}.jsonl"

    def set_meta(self, name: str) -> Path:
        return self.sets / f"{name}.json"

    def raw_file(self, name: str, fmt: str) -> Path:
        return self.raw / f"{name}.{fmt}"

    def rewrites_file(self, name: str) -> Path:
        return self.cache / f"{name}.jsonl"

    @property
    def judgements_file(self) -> Path:
        return self.cache / JUDGEMENTS_FILE


def folders() -> Folders:
    """The folders of the current home: ``$TINYMCF_HOME``, else the platform's user data folder."""
    env = os.environ.get(HOME_VAR, "").strip()
    return Folders(Path(env).expanduser() if env else Path(platformdirs.user_data_dir("tinymcf_callback",
                                                                                       appauthor=False)))


@contextmanager
def using_home(path: str | os.PathLike | None):
    """``TINYMCF_HOME=path`` in the environment while the block runs (the ``--home DIR`` option), so subprocesses
    agree on one home too; no change for ``None``."""
    if path is None:
        yield
        return
    old = os.environ.get(HOME_VAR)
    os.environ[HOME_VAR] = str(Path(path).expanduser().absolute())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(HOME_VAR, None)
        else:
            os.environ[HOME_VAR] = old
