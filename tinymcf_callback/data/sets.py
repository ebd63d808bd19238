"""Vignette sets and the rewrite cache: the data layer under everything else. A set's vignettes are the
``other_violate`` condition; the other three conditions' rewrites are keyed by the md5 of the original text.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path

from .._io import read_jsonl
from ..errors import ProbeDataError
from .home import HOME_VAR, JUDGEMENTS_FILE, folders, shipped_dir

FOUNDATIONS = ("Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty", "Social Norms")
REAL_FOUNDATIONS = FOUNDATIONS[:-1]
CONTROL = "Social Norms"
CONDITIONS = ("other_violate", "other_uphold", "self_violate", "self_uphold")
REWRITE_CONDITIONS = CONDITIONS[1:]

_MD5_RE = re.compile(r"^[0-9a-f]{32}$")


def md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()


def prepare_command(name: str) -> str:
    return f"tinymcf prepare --name {name}"


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ProbeDataError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None


def builtin_sets() -> dict[str, dict]:
    """The sets shipped with the package (``configs/sets.json``)."""
    return _json(shipped_dir("configs") / "sets.json")


def registry() -> dict[str, dict]:
    """All known sets: the shipped ``configs/sets.json`` plus the sets prepared in the home."""
    sets = builtin_sets()
    udir = folders().sets
    if udir.is_dir():
        for meta in sorted(udir.glob("*.json")):
            if meta.stem not in sets:
                sets[meta.stem] = _json(meta)
    return sets


def set_path(name: str) -> Path:
    """The vignette file of set ``name``: shipped for bundled sets, else in the home."""
    sets = registry()
    if name not in sets:
        raise ProbeDataError(
            f"unknown vignette set {name!r}; available: {', '.join(sorted(sets))}. Prepared sets are read from "
            f"{folders().sets} (set {HOME_VAR} or pass --home DIR to read another home). "
            f"To add your own: tinymcf prepare --name {name} --source FILE.csv"
        )
    spec = sets[name]
    if spec.get("source") == "bundled":
        return shipped_dir("configs") / spec["file"]
    return folders().set_file(name)


class RewriteCache:
    """Rewrites keyed by ``(md5 of the original text, condition)``, read from every ``*.jsonl`` of ``dirs`` (default:
    the home's :attr:`Folders.rewrite_dirs`); a later folder's entry for the same key wins."""

    FIELDS = ("source_md5", "condition", "text", "producer", "rules_version")

    def __init__(self, dirs: list[Path] | None = None):
        if dirs is None:
            dirs = folders().rewrite_dirs
        self.dirs = [Path(d) for d in dirs]
        self.entries: dict[tuple[str, str], dict] = {}
        for d in self.dirs:
            if d.is_dir():
                for path in sorted(d.glob("*.jsonl")):
                    if path.name != JUDGEMENTS_FILE:
                        self._load(path)

    def _load(self, path: Path) -> None:
        try:
            lines = read_jsonl(path, torn_tail=True)  # appended one entry at a time: a crash may tear the last
        except ValueError as e:
            raise ProbeDataError(f"malformed rewrite cache line: {e}") from None
        for lineno, obj in lines:
            missing = [k for k in self.FIELDS if k not in obj]
            if missing:
                raise ProbeDataError(f"{path}:{lineno}: rewrite cache entry lacks {', '.join(missing)}")
            if not _MD5_RE.match(str(obj["source_md5"])):
                raise ProbeDataError(f"{path}:{lineno}: source_md5 {obj['source_md5']!r} is not an md5 hex digest")
            if obj["condition"] not in REWRITE_CONDITIONS:
                raise ProbeDataError(
                    f"{path}:{lineno}: unknown condition {obj['condition']!r} "
                    f"(expected one of {', '.join(REWRITE_CONDITIONS)})"
                )
            if not isinstance(obj["text"], str) or not obj["text"].strip():
                raise ProbeDataError(f"{path}:{lineno}: empty rewrite text")
            self.entries[(obj["source_md5"], obj["condition"])] = {**obj, "_file": str(path), "_line": lineno}

    def get(self, source_md5: str, condition: str) -> dict | None:
        return self.entries.get((source_md5, condition))

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)


def read_set_file(path: Path, name: str) -> list[dict]:
    """Parse and check a vignette-set JSONL file (one vignette per line)."""
    if not path.exists():
        raise ProbeDataError(
            f"vignette set {name!r} is not prepared on this machine ({path} is missing). "
            f"Run: {prepare_command(name)}"
        )
    try:
        lines = read_jsonl(path)
    except ValueError as e:
        raise ProbeDataError(f"malformed vignette set line: {e}") from None
    out = []
    for lineno, obj in lines:
        for key in ("id", "foundation", "foundation_coarse", "text"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                raise ProbeDataError(f"{path}:{lineno}: vignette lacks a {key!r} string")
        if obj["id"] != md5(obj["text"]):
            raise ProbeDataError(f"{path}:{lineno}: id {obj['id']} is not the md5 of the text ({md5(obj['text'])})")
        if obj["foundation_coarse"] not in FOUNDATIONS:
            raise ProbeDataError(
                f"{path}:{lineno}: unknown coarse foundation {obj['foundation_coarse']!r} "
                f"(expected one of {', '.join(FOUNDATIONS)})"
            )
        out.append(obj)
    if not out:
        raise ProbeDataError(f"{path}: the vignette set {name!r} is empty")
    return out


def load_vignettes(name: str = "scifi", limit: int | None = None, cache: RewriteCache | None = None, *,
                   per_foundation: int | None = None, subset_seed: int = 0) -> list[dict]:
    """The vignettes of set ``name`` with their four condition texts.

    Returns one dict per vignette, in the set's stored order: ``id``, ``foundation``,
    ``foundation_coarse``, ``other_violate`` (the original), ``other_uphold``,
    ``self_violate``, ``self_uphold`` and, where the set has human ratings, ``wrong``
    (mean wrongness, 0-4). ``limit=N`` keeps the first N; ``per_foundation=N`` keeps N of
    each coarse foundation (:func:`balanced_subset`). Raises ``ProbeDataError``
    naming the vignette, the condition and the command that fills a missing rewrite.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    if limit is not None and per_foundation is not None:
        raise ValueError("limit and per_foundation both choose a subset: give one")
    rows = read_set_file(set_path(name), name)
    if limit is not None:
        rows = rows[:limit]
    elif per_foundation is not None:
        rows = balanced_subset(rows, per_foundation, subset_seed)
    cache = cache if cache is not None else _default_cache()
    out = []
    for row in rows:
        v = {
            "id": row["id"],
            "foundation": row["foundation"],
            "foundation_coarse": row["foundation_coarse"],
            "other_violate": row["text"],
        }
        for cond in REWRITE_CONDITIONS:
            entry = cache.get(row["id"], cond)
            if entry is None:
                raise ProbeDataError(
                    f"vignette {row['id']} of set {name!r} has no {cond} rewrite in the cache "
                    f"({', '.join(str(d) for d in cache.dirs)}). Run: {prepare_command(name)}"
                )
            v[cond] = entry["text"]
        if row.get("wrong") is not None:
            v["wrong"] = float(row["wrong"])
        out.append(v)
    return out


def balanced_subset(rows: list[dict], per_foundation: int, seed: int = 0) -> list[dict]:
    """``per_foundation`` rows of each coarse foundation, in stored order; all of a foundation that has fewer.

    Which rows: within each foundation, those with the smallest ``md5("<seed>:<id>")``. So the choice
    depends only on the seed and the ids: the same in every run and process, unchanged when the set's
    file is reordered, and a vignette added to the set displaces an earlier pick only where its hash
    ranks lower.
    """
    if isinstance(per_foundation, bool) or not isinstance(per_foundation, int) or per_foundation <= 0:
        raise ValueError(f"per_foundation must be a positive integer, got {per_foundation!r}")
    kept: set[str] = set()
    for foundation in FOUNDATIONS:
        ids = [r["id"] for r in rows if r["foundation_coarse"] == foundation]
        kept.update(sorted(ids, key=lambda i: balanced_rank(seed, i))[:per_foundation])
    return [r for r in rows if r["id"] in kept]


def balanced_rank(seed: int, vignette_id: str) -> str:
    """Where a vignette comes in its foundation's seeded order (smaller first): what ``per_foundation`` keeps the
    first N of, and the order a probe with a precision target asks in (``stats.sequential``)."""
    return md5(f"{seed}:{vignette_id}")


def subset_notes(name: str, vignettes: list[dict], *, limit: int | None = None,
                 per_foundation: int | None = None) -> list[str]:
    """What a subset leaves out that changes what the numbers mean: whole foundations, the control, a spread (``[]``
    for the whole set)."""
    if limit is None and per_foundation is None:
        return []
    every = dict.fromkeys(r["foundation_coarse"] for r in read_set_file(set_path(name), name))
    present = {v["foundation_coarse"] for v in vignettes}
    missing = [f for f in every if f not in present]
    notes = []
    if limit is not None and missing:
        real = [f for f in missing if f != CONTROL]
        left = ", ".join(real) if real else "no real foundation"
        control = (" and the Social Norms control (so score - control is undefined)" if CONTROL in missing else "")
        kept = ", ".join(f for f in every if f in present)
        notes.append(f"limit={limit} keeps the first {len(vignettes)} vignettes of {name!r} ({kept}): it leaves out "
                     f"{left}{control}; the score is the mean over {kept} only. For a cheap probe of every "
                     f"foundation and the control use per_foundation=2 (--per-foundation 2) instead")
    if per_foundation is not None:
        short = [f"{f} ({sum(v['foundation_coarse'] == f for v in vignettes)})" for f in every
                 if sum(v["foundation_coarse"] == f for v in vignettes) < per_foundation]
        if short:
            notes.append(f"per_foundation={per_foundation}: {', '.join(short)} of {name!r} "
                         f"{'has' if len(short) == 1 else 'have'} fewer vignettes than that; all of them are kept")
        if per_foundation == 1:
            notes.append("per_foundation=1: one vignette per foundation leaves no spread to measure, so every "
                         "interval is undefined; use 2 or more")
    return notes


def _default_cache() -> RewriteCache:
    # Re-read when a user folder changes (prepare may have added rewrites since).
    dirs = folders().rewrite_dirs
    stamp = tuple(
        (str(p), p.stat().st_mtime_ns, p.stat().st_size)
        for d in dirs[1:] if d.is_dir() for p in sorted(d.glob("*.jsonl"))
    )
    return _cached_default(tuple(str(d) for d in dirs), stamp)


@lru_cache(maxsize=4)
def _cached_default(dirs: tuple[str, ...], stamp: tuple) -> RewriteCache:
    return RewriteCache([Path(d) for d in dirs])
