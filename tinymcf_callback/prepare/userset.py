"""Users' own vignette files: a CSV (``Scenario``/``text``, ``Foundation``, optional ``Wrong``) or JSONL.

Every row goes through :func:`tinymcf_callback.prepare.rows.vignette_row`; an unknown label, an
empty text, a duplicate scenario, a missing column or a rating given for some rows but
not all is an error naming the file and the row.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .._io import read_jsonl
from ..errors import PrepareError
from .rows import REASON_COLUMNS, decode_text, looks_like_html, parse_number, vignette_row


def read_user_source(path: str | Path) -> list[dict]:
    """A user's scenarios (CSV with ``Scenario``/``text`` and ``Foundation`` columns, or JSONL)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise PrepareError(f"--source {path}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        rows = _read_csv(path, "\t" if suffix == ".tsv" else ",")
    elif suffix in (".jsonl", ".ndjson"):
        rows = _read_jsonl(path)
    else:
        raise PrepareError(f"--source {path}: unsupported format {suffix or '(none)'}; use .csv or .jsonl")
    if not rows:
        raise PrepareError(f"{path}: no vignettes in the file")
    rated = [r for r in rows if "wrong" in r]
    if rated and len(rated) != len(rows):
        first = next(r for r in rows if "wrong" not in r)
        raise PrepareError(f"{first.pop('_where')}: no human rating, but other rows have one "
                           f"(give a rating for every vignette or for none)")
    seen: dict[str, str] = {}
    for r in rows:
        where = r.pop("_where")
        if r["id"] in seen:
            raise PrepareError(f"{where}: the same scenario as {seen[r['id']]}")
        seen[r["id"]] = where
    return rows


def _pick(keys, *names):
    """The first of ``names`` among ``keys``, compared without case or surrounding spaces."""
    low = {str(k).strip().lower(): k for k in keys}
    return next((low[n] for n in names if n in low), None)


def _user_row(obj: dict, where: str, text_key, label_key, wrong_key) -> dict:
    text = obj.get(text_key)
    text = text.strip() if isinstance(text, str) else text
    wrong = obj.get(wrong_key) if wrong_key is not None else None
    empty = wrong is None or (isinstance(wrong, str) and not wrong.strip())
    wrong = None if empty else parse_number(wrong, where, "rating")
    reasons = {}
    for r in REASON_COLUMNS:
        k = _pick(obj.keys(), r.lower())
        if k is not None and k not in (label_key, text_key) and str(obj[k]).strip():
            reasons[r] = parse_number(obj[k], where, f"{r!r} share")
    label = obj.get(label_key)
    row = vignette_row(text, label.strip() if isinstance(label, str) else label, where, wrong, reasons or None)
    row["_where"] = where  # for the file-wide checks in read_user_source; removed there
    return row


def _read_csv(path: Path, delimiter: str) -> list[dict]:
    data = path.read_bytes()
    if looks_like_html(data):
        raise PrepareError(f"{path}: an HTML page, not a CSV file")
    reader = csv.DictReader(io.StringIO(decode_text(data, str(path)), newline=""), delimiter=delimiter)
    fields = reader.fieldnames or []
    text_key, label_key = _pick(fields, "scenario", "text"), _pick(fields, "foundation")
    if text_key is None or label_key is None:
        raise PrepareError(f"{path}: missing column(s) {'Scenario (or text)' if text_key is None else ''}"
                           f"{' and ' if text_key is None and label_key is None else ''}"
                           f"{'Foundation' if label_key is None else ''} (found: {', '.join(fields) or 'none'})")
    wrong_key = _pick(fields, "wrong")
    out = []
    for i, obj in enumerate(reader, start=1):
        if not any((v or "").strip() for v in obj.values() if isinstance(v, str)):
            continue
        if None in obj or None in obj.values():
            raise PrepareError(f"{path}: row {i} (line {reader.line_num}): the number of fields differs from "
                               f"the header's {len(fields)} (a comma inside an unquoted field?)")
        out.append(_user_row(obj, f"{path}: row {i} (line {reader.line_num})", text_key, label_key, wrong_key))
    return out


def _read_jsonl(path: Path) -> list[dict]:
    try:
        lines = read_jsonl(path)  # a file the user wrote: a cut-off last line is refused, not skipped
    except ValueError as e:
        raise PrepareError(str(e)) from None
    out = []
    for lineno, obj in lines:
        where = f"{path}: line {lineno}"
        text_key, label_key = _pick(obj.keys(), "text", "scenario"), _pick(obj.keys(), "foundation")
        if text_key is None or label_key is None:
            raise PrepareError(f"{where}: needs the keys 'text' and 'foundation' (found: {', '.join(obj)})")
        out.append(_user_row(obj, where, text_key, label_key, _pick(obj.keys(), "wrong")))
    return out
