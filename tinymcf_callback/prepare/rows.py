"""From a file's fields to a vignette row: foundation labels, numbers, the checks every source shares.

A vignette row is ``{"id": md5(text), "foundation": label, "foundation_coarse": coarse, "text": text}``
plus ``wrong`` (mean human wrongness, 0-4) and ``reasons`` (the shares of raters per reason)
where the file has them. The Clifford CSV and users' files both go through
:func:`vignette_row`, so the two cannot disagree on what a label means.
"""

from __future__ import annotations

import re

from ..data.sets import FOUNDATIONS, md5
from ..errors import PrepareError

# The reason columns of the Clifford survey ("which reason makes the act wrong"), also read from users' files.
REASON_COLUMNS = ("Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty", "Not Wrong")
_PERCENT_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*%\s*$")


def coarse_of(label: str) -> str | None:
    """The coarse foundation of a label: itself, or the part before `` (`` ("Care (p, a)" -> "Care")."""
    label = " ".join(str(label).split())
    base = label.split(" (", 1)[0] if label.endswith(")") and " (" in label else label
    for f in FOUNDATIONS:
        if base.lower() == f.lower():
            return f
    return None


def parse_number(value, where: str, what: str) -> float:
    """A number, or a percentage such as ``"83 %"`` as a share (0.83); else :class:`PrepareError`."""
    s = str(value).strip()
    m = _PERCENT_RE.match(s)
    try:
        return round(float(m.group(1)) / 100.0, 6) if m else float(s)
    except ValueError:
        raise PrepareError(f"{where}: {what} {value!r} is not a number") from None


def vignette_row(text: str, label: str, where: str, wrong=None, reasons: dict | None = None) -> dict:
    """One checked vignette row; ``where`` (file, row, line) starts every error message."""
    if not isinstance(text, str) or not text.strip():
        raise PrepareError(f"{where}: empty scenario text")
    if not isinstance(label, str) or not label.strip():
        raise PrepareError(f"{where}: missing foundation label")
    coarse = coarse_of(label)
    if coarse is None:
        raise PrepareError(
            f"{where}: unknown foundation label {label!r} (expected one of {', '.join(FOUNDATIONS)}, "
            f"optionally with a detail in brackets such as 'Care (e)')"
        )
    out = {"id": md5(text), "foundation": " ".join(label.split()), "foundation_coarse": coarse, "text": text}
    if wrong is not None:
        out["wrong"] = wrong
    if reasons:
        out["reasons"] = reasons
    return out


def decode_text(data: bytes, origin: str) -> str:
    """UTF-8 text (a leading BOM dropped), or :class:`PrepareError` naming the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PrepareError(f"{origin}: not UTF-8 text (byte {e.start}); is this the right file?") from None


def looks_like_html(data: bytes, content_type: str = "") -> bool:
    """A web page (a login or error page) where a data file was expected."""
    head = data[:512].lstrip().lower()
    return "html" in content_type.lower() or head.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml"))
