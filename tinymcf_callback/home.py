"""Where the tool reads and writes user data: one home, chosen by one setting.

Everything ``prepare``, ``validate`` and the probe write, and read back, lives in the
*home*: ``$TINYMCF_HOME``, else the platform's user data folder (``~/.local/share/
tinymcf_callback`` on Linux). The ``--home DIR`` option of ``prepare``, ``validate`` and
``eval`` means ``TINYMCF_HOME=DIR`` for that command. Inside the home, ``sets/`` holds the
prepared sets, ``raw/`` the downloaded files and ``cache/`` new rewrites and judge
verdicts. The shipped ``configs/`` and ``cache/`` are always read too. :func:`folders`
builds every one of these paths; no other module puts a user folder together.

Deprecated: ``$TINYMCF_CACHE_DIR`` and ``prepare --cache-dir`` named a separate rewrite
folder. Such a *legacy* folder is still read (after the shipped cache, before the home's
own), never written; ``prepare`` copies the set's rewrites found only there into the home.
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import platformdirs

HOME_VAR = "TINYMCF_HOME"
LEGACY_CACHE_VAR = "TINYMCF_CACHE_DIR"
JUDGEMENTS_FILE = "judgements.jsonl"  # judge verdicts (validate), kept beside the rewrites, not rewrites

_PKG = Path(__file__).resolve().parent
_warned: set[str] = set()  # legacy folders already warned about in this process


def shipped_dir(kind: str) -> Path:
    """``configs`` or ``cache`` as shipped: inside the wheel, or at the checkout's top level."""
    for base in (_PKG / "_data", _PKG.parent):
        if (base / kind).is_dir():
            return base / kind
    raise FileNotFoundError(f"the package's {kind}/ folder is missing; reinstall tinymcf_callback")


def home_dir() -> Path:
    """The home: ``$TINYMCF_HOME``, else the platform's user data folder."""
    env = os.environ.get(HOME_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("tinymcf_callback", appauthor=False))


@dataclass(frozen=True)
class Folders:
    """The home's folders and the order in which rewrites are looked up."""

    home: Path
    legacy: tuple[Path, ...] = ()  # deprecated rewrite folders: read, never written

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
        return [shipped_dir("cache"), *self.legacy, self.cache]

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


def folders(legacy_cache: str | os.PathLike | None = None) -> Folders:
    """The folders of the current home, plus any legacy rewrite folder still to read.

    ``legacy_cache`` is ``prepare --cache-dir``'s folder; ``$TINYMCF_CACHE_DIR`` is added
    with a deprecation warning (once per folder and process).
    """
    home = home_dir()
    candidates = []
    env = os.environ.get(LEGACY_CACHE_VAR, "").strip()
    if env:
        candidates.append(Path(env).expanduser())
        _warn_legacy_env_once(candidates[-1], home)
    if legacy_cache:
        candidates.append(Path(legacy_cache).expanduser())
    legacy: list[Path] = []
    for c in candidates:
        if not any(_same(c, d) for d in [home / "cache", *legacy]):
            legacy.append(c)
    return Folders(home, tuple(legacy))


@contextmanager
def using_home(path: str | os.PathLike | None):
    """``TINYMCF_HOME=path`` while the block runs (the ``--home DIR`` option); no change for ``None``.

    Set in the environment, so every lookup in the command (and any subprocess it starts)
    agrees on one home; the previous value comes back afterwards.
    """
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


def _same(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()


def _warn_legacy_env_once(folder: Path, home: Path) -> None:
    key = str(folder)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(
        f"{LEGACY_CACHE_VAR} is deprecated: the rewrites in {folder} are still read, but new ones go to "
        f"{home / 'cache'}; set {HOME_VAR} (or pass --home DIR) to choose the one folder for all user data. "
        f"`python -m tinymcf_callback.prepare --name NAME` copies a set's rewrites from {folder} into the home; "
        f"then unset {LEGACY_CACHE_VAR}.",
        FutureWarning,
        stacklevel=3,
    )
