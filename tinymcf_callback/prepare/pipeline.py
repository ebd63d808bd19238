"""A vignette set made ready for the probe, start to end (``tinymcf prepare``; once, offline after).

``--name clifford`` downloads, checks and stores the Clifford CSV (:mod:`~tinymcf_callback.prepare.clifford`; its
rewrites are shipped); ``--name myset --source my.csv`` registers your own set (:mod:`~.userset`) and has its missing
rewrites made (:mod:`~.rewrites`). The steps and their options: docs/preparing.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ..data.home import folders
from ..data.sets import builtin_sets, read_set_file, registry, set_path
from ..errors import PrepareError
from .clifford import check_checksum, fetch, normalize_clifford
from .rewrites import make_rewrites
from .store import check_writable, store_raw, store_set
from .userset import read_user_source

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def prepare_downloaded_set(name: str, spec: dict, args, say: Callable[[str], None]) -> list[dict]:
    """Get (download, ``--source`` or the stored copy), check and store a downloadable built-in set."""
    f = folders()
    raw_path = f.raw_file(name, spec.get("format", "csv"))
    data, origin, from_raw = fetch(name, spec, raw_path, source=args.source, url=args.url,
                                   force=args.force_download, allow_checksum_change=args.allow_checksum_change,
                                   timeout=args.timeout, say=say)
    rows = normalize_clifford(data, origin, spec.get("rows"))
    check_checksum(data, spec, origin, allow_change=args.allow_checksum_change, say=say)
    if args.dry_run:
        say(f"dry run: {origin} is valid ({len(rows)} vignettes); would store it in {raw_path} and "
            f"{f.set_file(name)}")
        return rows
    check_writable(f.home)
    if not from_raw:
        store_raw(raw_path, data)
    path = store_set(name, rows)
    say(f"{name}: {len(rows)} vignettes checked and stored in {path}")
    return rows


def prepare_user_set(name: str, args, say: Callable[[str], None]) -> list[dict]:
    """Read and check a user's file, then register it in the home as set ``name``."""
    src = Path(args.source).expanduser()
    rows = read_user_source(src)
    odd = sum(not r["text"].startswith("You see ") for r in rows)
    if odd:
        say(f"note: {odd} of {len(rows)} vignettes do not start with 'You see' like the built-in sets; "
            f"the probe still works, but third-person rewrites will start that way")
    human = all("wrong" in r for r in rows)
    if args.dry_run:
        say(f"dry run: {src} is valid ({len(rows)} vignettes); would register set {name!r} in {folders().sets}")
        return rows
    check_writable(folders().home)
    meta = {
        "description": args.description or f"user set prepared from {src.name} ({len(rows)} vignettes)",
        "source": "user",
        "human_ratings": human,
        "created_from": str(src.resolve()),
        "rows": len(rows),
        "format": "jsonl",
    }
    path = store_set(name, rows, meta)
    say(f"{name}: {len(rows)} vignettes registered in {path}" + (" (with human ratings)" if human else ""))
    return rows


def set_rows(name: str, args, say: Callable[[str], None]) -> list[dict]:
    """The vignettes of set ``name``, prepared first when ``--source`` or a download asks for it."""
    builtins = builtin_sets()
    if name in builtins:
        spec = builtins[name]
        if spec.get("source") == "download":
            return prepare_downloaded_set(name, spec, args, say)
        if args.source:
            raise PrepareError(f"{name!r} is a built-in set shipped with the package; choose another --name "
                               f"for your own set (built-in: {', '.join(sorted(builtins))})")
        return read_set_file(set_path(name), name)
    if args.url:
        raise PrepareError(f"--url only applies to downloadable built-in sets "
                           f"({', '.join(n for n, s in builtins.items() if s.get('source') == 'download')})")
    if args.source:
        return prepare_user_set(name, args, say)
    if name in registry():
        return read_set_file(set_path(name), name)
    raise PrepareError(f"unknown set {name!r} (known: {', '.join(sorted(registry()))}); to make your own, "
                       f"pass --source FILE.csv or FILE.jsonl with Scenario/text and Foundation columns")


def run_prepare(args, secrets: list, say: Callable[[str], None]) -> int:
    """Make set ``args.name`` ready: its vignettes in the home, then every rewrite they lack."""
    if not _NAME_RE.match(args.name or ""):
        raise PrepareError(f"bad set name {args.name!r}: use letters, digits, '-' and '_' (at most 64)")
    rows = set_rows(args.name, args, say)
    return make_rewrites(args.name, rows, args, secrets, say)
