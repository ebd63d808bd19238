"""Small file helpers: every file the probe writes appears whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``: a reader (or a crash) sees either the
    old content or the new one, never a half-written file."""
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
    """Append one JSON line with a single ``write`` on an O_APPEND descriptor, then fsync; the whole line or an error.

    One line is one system call, so concurrent appenders do not interleave, and a crash leaves at most an
    unterminated last line, which the readers skip (:func:`read_jsonl`) and the next append drops first (appended
    after, it would be a malformed line in the middle). A write the disk cuts short (a full disk) or an fsync that
    fails raises ``OSError`` naming the file, after cutting off what part of the line reached it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(obj, ensure_ascii=False, default=_jsonable) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _drop_torn_tail(fd)
        written = 0
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"only {written} of the line's {len(line)} bytes could be written "
                              "(is the disk full?)", str(path))
            os.fsync(fd)
        except OSError as e:
            _cut_own_tail(fd, written)
            if e.filename is None:
                raise OSError(e.errno, e.strerror, str(path)) from None
            raise
    finally:
        os.close(fd)


def _cut_own_tail(fd: int, written: int) -> None:
    """Remove the ``written`` bytes this descriptor just appended, when they are still the file's end."""
    with contextlib.suppress(OSError):
        end = os.lseek(fd, 0, os.SEEK_CUR)  # after an O_APPEND write: the end of what this call wrote
        if written and os.fstat(fd).st_size == end:
            os.ftruncate(fd, end - written)


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


class JsonLines(list):
    """``[(line_number, object), ...]`` of a JSON Lines file; ``torn``: the number of a skipped torn last line."""

    torn: int | None = None


def read_jsonl(path: str | os.PathLike, *, torn_tail: bool = False) -> JsonLines:
    """Read a JSON Lines file as ``[(line_number, object), ...]``, refusing anything else with its file and line.

    Blank lines are ignored. ``torn_tail=True`` (files this package appends to: a history, a rewrite
    cache) skips an unterminated final line that does not parse, the trace of an interrupted append,
    and records its number in ``.torn``; for a file a user wrote it is refused like any other bad line.
    Raises ``ValueError`` naming the file and line for a line that is not UTF-8 text, not JSON, or not
    a JSON object (a binary file fails at its first line).
    """
    path = Path(path)
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    out = JsonLines()
    for i, data in enumerate(lines, start=1):
        last_unterminated = i == len(lines) and not raw.endswith(b"\n")
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as e:
            if torn_tail and last_unterminated:
                out.torn = i
                continue
            raise ValueError(f"{path}:{i}: not UTF-8 text (byte 0x{data[e.start]:02x} at column {e.start + 1}); "
                             f"a JSON Lines file holds one JSON object per line") from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if last_unterminated:
                if torn_tail:
                    out.torn = i  # torn tail of an interrupted append
                    continue
                raise ValueError(f"{path}:{i}: the last line is cut off (no newline at its end, and not valid JSON: "
                                 f"{e.msg}); complete or remove it") from None
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
