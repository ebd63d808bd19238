"""The spot check: a seeded random sample of a set's vignettes, their four conditions side by side.

The original project's advice: read about ten random rewrites before trusting an eval. ``tinymcf show --name NAME
[-n 10] [--seed S]`` prints them for a terminal, in columns wrapped to its width; :func:`show_rewrites` returns the
same sample as a DataFrame for a notebook. Where ``tinymcf validate`` has judged the texts, each shows the judge's
verdict, and a flagged rewrite says why. It reads only local files: no key, no network.
"""

from __future__ import annotations

import random
import shutil
import textwrap
from collections import Counter
from collections.abc import Callable

import pandas as pd

from ..data.home import folders
from ..data.sets import (
    CONDITIONS,
    REWRITE_CONDITIONS,
    ProbeDataError,
    RewriteCache,
    load_vignettes,
    md5,
    prepare_command,
    read_set_file,
    set_path,
)
from .judge import judge_records, load_judgements

LABELS = {"other_violate": "other_violate (the original)", "other_uphold": "other_uphold",
          "self_violate": "self_violate", "self_uphold": "self_uphold"}
GUTTER = " | "
MIN_COLUMN = 28  # narrower than this, the four columns become two rows of two (violate | uphold)


# --------------------------------------------------------------------------- the sample


def sample_vignettes(name: str, n: int, seed: int = 0, *, limit: int | None = None,
                     cache: RewriteCache | None = None) -> tuple[list[dict], int]:
    """``n`` vignettes of set ``name`` drawn with ``seed`` (in stored order), and how many there were to draw from.

    Raises :class:`ProbeDataError` for an unknown or unprepared set, or when rewrites are
    missing (naming how many and the command that makes them).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    cache = cache if cache is not None else RewriteCache(folders().rewrite_dirs)
    rows = read_set_file(set_path(name), name)[:limit]
    missing = [(r["id"], c) for r in rows for c in REWRITE_CONDITIONS if (r["id"], c) not in cache]
    if missing:
        first_id, first_cond = missing[0]
        raise ProbeDataError(f"set {name!r} lacks {len(missing)} of its {3 * len(rows)} rewrites (first: {first_id} "
                             f"{first_cond}); make them first: {prepare_command(name)}")
    vignettes = load_vignettes(name, limit=limit, cache=cache)
    picked = sorted(random.Random(seed).sample(range(len(vignettes)), min(n, len(vignettes))))
    return [vignettes[i] for i in picked], len(vignettes)


def verdicts(vignettes: list[dict], known: dict, judge: str | None) -> dict[tuple[str, str], dict]:
    """The judge's record (see :func:`~.judge.judge_records`) per ``(id, condition)`` that it has judged."""
    if judge is None:
        return {}
    records = judge_records(vignettes, known, judge, {})
    return {(r["id"], r["condition"]): r for r in records if r["judged_foundation"] is not None}


def verdict_text(record: dict | None) -> str | None:
    """``"Loyalty, uphold"``, with ``FLAGGED: why`` for a rewrite the judge flags; ``None`` when not judged."""
    if record is None:
        return None
    text = f"{record['judged_foundation']}, {record['judged_valence']}"
    if record["flagged"]:
        text += f" FLAGGED: {record['flag_reason']}"
    elif record["condition"] == "other_violate" and not (record["foundation_ok"] and record["valence_ok"]):
        text += f" (expected {record['expected_foundation']}, violate)"
    return text


def show_rewrites(name: str = "scifi", n: int = 10, seed: int = 0, *, judge_model: str | None = None,
                  limit: int | None = None) -> pd.DataFrame:
    """The spot check for a notebook: ``n`` seeded random vignettes of set ``name``, one row each.

    Columns: ``id``, ``foundation``, ``foundation_coarse``, the four condition texts, ``wrong``
    where the set has human ratings, and, where ``--validate`` has judged the texts,
    ``<condition>_verdict`` (``"Loyalty, uphold"``, ``FLAGGED: why`` for a flagged rewrite).
    ``judge_model`` picks the judge (default: the one with the most verdicts);
    ``df.attrs["judge"]`` names it. The same sample as ``tinymcf show -n n --seed seed``.
    """
    f = folders()
    sample, _ = sample_vignettes(name, n, seed, limit=limit)
    judge, found, _ = judged(sample, f, judge_model)
    return sample_frame(sample, judge, found)


def judged(sample: list[dict], f, judge_model: str | None) -> tuple[str | None, dict, list[str]]:
    """``(judge, verdicts, judges)`` for the sample from the judgement caches of folders ``f``: ``judge_model``, else
    the judge with the most verdicts on the sample's texts (None: there is none); ``judges``: every judge with a
    verdict on one of them."""
    known = load_judgements([f.cache])
    hashes = {md5(v[c]) for v in sample for c in CONDITIONS}
    counts = Counter(j for h, j in known if h in hashes)
    judge = judge_model or (min(counts, key=lambda j: (-counts[j], j)) if counts else None)
    return judge, verdicts(sample, known, judge), sorted(counts)


def sample_frame(sample: list[dict], judge: str | None, found: dict) -> pd.DataFrame:
    """One row per vignette: its texts side by side, then the verdicts when there are any."""
    rows = []
    for v in sample:
        row = {k: v[k] for k in ("id", "foundation", "foundation_coarse", *CONDITIONS)}
        if "wrong" in v:
            row["wrong"] = v["wrong"]
        if found:
            row.update({f"{c}_verdict": verdict_text(found.get((v["id"], c))) for c in CONDITIONS})
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["judge"] = judge if found else None
    return df


# --------------------------------------------------------------------------- the terminal


def layout(width: int) -> list[list[str]]:
    """The conditions in rows of columns: all four in one row when each column gets ``MIN_COLUMN``, else 2 x 2."""
    if width - 2 - 3 * len(GUTTER) >= 4 * MIN_COLUMN:
        return [list(CONDITIONS)]
    return [["other_violate", "other_uphold"], ["self_violate", "self_uphold"]]


def side_by_side(cells: list[list[str]], width: int) -> list[str]:
    """Columns of wrapped paragraphs (one list of paragraphs per column) printed next to each other."""
    col = (width - 2 - (len(cells) - 1) * len(GUTTER)) // len(cells)
    wrapped = [[line for para in paras for line in (textwrap.wrap(para, col) or [""])] for paras in cells]
    height = max(len(w) for w in wrapped)
    return ["  " + GUTTER.join(w[i].ljust(col) if i < len(w) else " " * col for w in wrapped).rstrip()
            for i in range(height)]


def vignette_block(i: int, total: int, v: dict, found: dict, width: int) -> list[str]:
    """A vignette's heading (number, foundation label, id prefix, rating) and its conditions in columns."""
    rating = f", rated {v['wrong']:.1f} wrong (0-4)" if "wrong" in v else ""
    lines = textwrap.wrap(f"[{i}/{total}] {v['foundation']} - {v['id'][:8]}{rating}", width)
    for row in layout(width):
        cells = []
        for c in row:
            paras = [LABELS[c], v[c]]
            verdict = verdict_text(found.get((v["id"], c)))
            if found:
                paras.append(f"judge: {verdict}" if verdict else "judge: not judged")
            cells.append(paras)
        lines += side_by_side(cells, width)
    return lines


def print_sample(name: str, sample: list[dict], pool: int, seed: int, judged_by: tuple[str | None, dict, list[str]],
                 say: Callable[[str], None], width: int | None = None) -> None:
    """The spot check for a terminal (``width``: the terminal's, at least 60)."""
    width = max(60, width or shutil.get_terminal_size((100, 24)).columns)
    judge, found, judges = judged_by
    head = [f"{name}: {len(sample)} of {pool} vignettes, drawn with seed {seed} (another --seed draws others)"]
    if found:
        flagged = sum(r["flagged"] for r in found.values())
        head.append(f"judge {judge}: {len(found)} of {len(sample) * len(CONDITIONS)} texts judged, {flagged} "
                    f"rewrites flagged")
    elif judges:
        head.append(f"no verdicts by {judge} on these texts; judges with verdicts: {', '.join(judges)} (choose one "
                    f"with --judge-model)")
    else:
        head.append(f"no judge verdicts on these texts (tinymcf validate --name {name} "
                    f"asks a judge)")
    for line in head:
        say(textwrap.fill(line, width, subsequent_indent="  "))
    for i, v in enumerate(sample, 1):
        say("")
        for line in vignette_block(i, len(sample), v, found, width):
            say(line)


def show_set(args, secrets: list, say: Callable[[str], None]) -> int:
    """``tinymcf show -n N``: print N seeded random vignettes of ``--name`` with their four conditions."""
    f = folders()
    sample, pool = sample_vignettes(args.name, args.show, args.seed, limit=args.limit)
    print_sample(args.name, sample, pool, args.seed, judged(sample, f, args.judge_model), say)
    return 0
