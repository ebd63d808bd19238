"""Small file helpers: every file the probe writes appears whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``.

    A reader (or a crash) never sees a half-written file: either the old content or
    the new one. Raises ``OSError`` with the path when the folder cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, _file_mode(path))  # mkstemp makes 0600; keep the old file's mode, else what open() gives
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _file_mode(path: Path) -> int:
    """The mode ``path`` keeps (if it exists) or a new file gets under the process's umask."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """UTF-8 ``text`` written atomically (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=_jsonable) + "\n")


def append_jsonl(path: str | os.PathLike, obj: Any) -> None:
    """Append one JSON line with a single ``write`` on an O_APPEND descriptor, then fsync.

    One line is written by one system call, so concurrent appenders do not interleave, and a
    crash leaves at most an unterminated last line, which the readers in this package skip
    (see :func:`read_jsonl`). The next append drops such a fragment first (it was never a whole
    record): appending after it would leave it as a malformed line in the middle of the file,
    which every reader would then refuse.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(obj, ensure_ascii=False, default=_jsonable) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _drop_torn_tail(fd)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_torn_tail(fd: int) -> None:
    """Truncate the file after its last newline when it does not end with one (an append cut short)."""
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return
    end, chunk = size, 1 << 16
    while end > 0:
        start = max(0, end - chunk)
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at != -1:
            os.ftruncate(fd, start + at + 1)
            return
        end = start
    os.ftruncate(fd, 0)  # one fragment and nothing before it


def read_jsonl(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """Read a JSON Lines file as ``[(line_number, object), ...]``.

    Blank lines are ignored. An unterminated final line that does not parse is the
    trace of an interrupted append and is skipped; any other line that is not a JSON
    object raises ``ValueError`` naming the file and line number.
    """
    path = Path(path)
    raw = path.read_text(encoding="utf-8")
    lines = raw.split("\n")
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) and not raw.endswith("\n"):
                continue  # torn tail of an interrupted append
            raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{i}: expected a JSON object, got {type(obj).__name__}")
        out.append((i, obj))
    return out


def _jsonable(o: Any):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
