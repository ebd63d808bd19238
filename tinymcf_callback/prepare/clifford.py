"""The Clifford et al. (2015) CSV: get the bytes, check them, turn them into vignette rows.

Everything is checked before anything is written (the columns, the rows, the labels, the numbers, the sha256 against
``configs/sets.json``). Scenario texts are kept verbatim: the md5 of the exact text keys the shipped rewrites.
"""

from __future__ import annotations

import csv
import hashlib
import io
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ..data.sets import FOUNDATIONS
from ..errors import PrepareError
from .rows import REASON_COLUMNS, decode_text, looks_like_html, parse_number, vignette_row

CLIFFORD_COLUMNS = ("Scenario", "Foundation", "Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty",
                    "Not Wrong", "Wrong")
CLIFFORD_LABELS = {"Care (e)": "Care", "Care (p, a)": "Care", "Care (p, h)": "Care",
                   **{f: f for f in FOUNDATIONS if f != "Care"}}


def normalize_clifford(data: bytes, origin: str, rows_expected: int | None = 132) -> list[dict]:
    """Check the Clifford CSV (columns, row count, labels, numbers) and return the normalized rows."""
    if looks_like_html(data):
        raise PrepareError(f"{origin}: got an HTML page, not the Clifford CSV (a login or error page?)")
    reader = csv.reader(io.StringIO(decode_text(data, origin), newline=""))
    header = next(reader, None)
    if not header:
        raise PrepareError(f"{origin}: the file is empty")
    header = [h.strip() for h in header]
    missing = [c for c in CLIFFORD_COLUMNS if c not in header]
    if missing:
        raise PrepareError(f"{origin}: missing columns {', '.join(missing)} (found: {', '.join(header)})")
    col = {c: header.index(c) for c in CLIFFORD_COLUMNS}
    out, seen = [], {}
    for i, fields in enumerate(reader, start=1):
        if not any(f.strip() for f in fields):
            continue
        where = f"{origin}: row {i} (line {reader.line_num})"
        if len(fields) != len(header):
            raise PrepareError(f"{where}: {len(fields)} fields, the header has {len(header)}")
        label = fields[col["Foundation"]].strip()
        if label not in CLIFFORD_LABELS:
            raise PrepareError(f"{where}: unknown foundation label {label!r} (expected one of "
                               f"{', '.join(CLIFFORD_LABELS)})")
        text = fields[col["Scenario"]]  # verbatim: its md5 keys the shipped rewrites
        reasons = {r: parse_number(fields[col[r]], where, f"{r!r} share") for r in REASON_COLUMNS}
        row = vignette_row(text, label, where, parse_number(fields[col["Wrong"]], where, "'Wrong' rating"), reasons)
        if row["id"] in seen:
            raise PrepareError(f"{where}: the same scenario as row {seen[row['id']]}")
        seen[row["id"]] = i
        out.append(row)
    if rows_expected is not None and len(out) != rows_expected:
        raise PrepareError(f"{origin}: {len(out)} vignette rows, expected {rows_expected}; "
                           f"the file is incomplete or not the Clifford CSV")
    return out


def download(url: str, timeout: float = 60.0) -> bytes:
    """The bytes at ``url`` (urllib); a failure or an HTML page raises :class:`PrepareError`."""
    req = urllib.request.Request(url, headers={"User-Agent": "tinymcf_callback-prepare"})
    hint = "check your connection, or download the file yourself and pass --source PATH"
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = resp.read()
            ctype = resp.headers.get("Content-Type", "") or ""
    except urllib.error.HTTPError as e:
        raise PrepareError(f"download of {url} failed: HTTP {e.code} {e.reason}; {hint}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise PrepareError(f"download of {url} failed: {reason}; {hint}") from None
    if looks_like_html(data, ctype):
        raise PrepareError(f"download of {url} returned an HTML page, not the CSV; {hint}")
    if not data.strip():
        raise PrepareError(f"download of {url} returned an empty file; {hint}")
    return data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(name: str, spec: dict, raw_path: Path, *, source: str | None, url: str | None, force: bool,
          allow_checksum_change: bool, timeout: float, say: Callable[[str], None]) -> tuple[bytes, str, bool]:
    """``(bytes, origin, from_raw)``: ``--source``, else the stored raw copy (while its sha256 still matches), else a
    download."""
    if source:
        src = Path(source).expanduser()
        try:
            return src.read_bytes(), str(src), False
        except OSError as e:
            raise PrepareError(f"--source {src}: cannot read ({e.strerror or e})") from None
    expected = spec.get("sha256")
    if raw_path.is_file() and not url and not force:
        data = raw_path.read_bytes()
        if not expected or sha256(data) == expected or allow_checksum_change:
            return data, str(raw_path), True
    url = url or spec["url"]
    say(f"{name}: downloading {url}")
    return download(url, timeout=timeout), url, False


def check_checksum(data: bytes, spec: dict, origin: str, *, allow_change: bool, say: Callable[[str], None]) -> None:
    """Refuse a file whose sha256 differs from ``configs/sets.json``, unless ``--allow-checksum-change``."""
    expected = spec.get("sha256")
    actual = sha256(data)
    if not expected or actual == expected:
        return
    if not allow_change:
        raise PrepareError(
            f"{origin}: sha256 checksum differs: expected {expected} (configs/sets.json), actual {actual}. "
            f"The file changed upstream or is a different version; rerun with --allow-checksum-change to "
            f"accept it (scenarios whose text changed then need new rewrites, i.e. an API key)"
        )
    say(f"warning: {origin}: sha256 {actual} differs from the expected {expected}; accepted "
        f"(--allow-checksum-change)")
