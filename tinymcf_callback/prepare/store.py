"""Everything ``prepare`` and ``validate`` write into the home, each file whole or not at all.

Sets and their metadata and the raw downloads are written atomically (temporary file +
rename); cache entries are appended one line at a time (:func:`tinymcf_callback._io.append_jsonl`),
so an interrupted run keeps every finished entry and a rerun adds only what is missing.
A failure is a :class:`PrepareError` naming the file and ``--home``.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

from .._io import append_jsonl, atomic_write_bytes, atomic_write_text
from ..data.home import HOME_VAR, folders
from ..errors import PrepareError


def check_writable(folder: Path) -> None:
    """Raise :class:`PrepareError` unless files can be created in ``folder`` (made if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-", delete=True):
            pass
    except OSError as e:
        raise PrepareError(f"the folder {folder} is not writable ({e.strerror or e}); pass --home DIR "
                           f"(or set {HOME_VAR}) with a folder you can write") from None


def store_set(name: str, rows: list[dict], meta: dict | None = None) -> Path:
    """Write set ``name`` into the home's ``sets/`` (one JSON line per vignette), then its metadata.

    The metadata file is what registers a user's set, so it is written last: a set is
    listed only once its vignettes are in place.
    """
    path = folders().set_file(name)
    write_jsonl(path, rows, "the set file ")
    if meta is not None:
        meta_path = folders().set_meta(name)
        with _writing(meta_path):
            atomic_write_text(meta_path, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    return path


def write_jsonl(path: Path, rows: list[dict], what: str = "") -> None:
    """``rows`` as a JSON Lines file, written atomically."""
    with _writing(path, what):
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def store_raw(path: Path, data: bytes) -> None:
    """The downloaded file as its exact bytes: their sha256 is checked when the copy is reused."""
    with _writing(path):
        atomic_write_bytes(path, data)


def append_entry(path: Path, entry: dict) -> None:
    with _writing(path, verb="append to"):
        append_jsonl(path, entry)


@contextlib.contextmanager
def _writing(path: Path, what: str = "", verb: str = "write"):
    """An ``OSError`` inside the block as a :class:`PrepareError` naming the file."""
    try:
        yield
    except OSError as e:
        raise PrepareError(f"cannot {verb} {what}{path} ({e.strerror or e})") from None
