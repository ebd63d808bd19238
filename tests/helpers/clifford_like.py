"""A made-up file with the shape of the Clifford et al. (2015) CSV, for tests on machines without the real one.

Same columns, 132 rows, the same fine and coarse foundation label counts, percentage
reason shares and 0-4 ratings written the same way (every field quoted, ``\\n`` line
ends), and the real file's two quirks (a scenario without its final full stop, one with
an unbalanced quote). The texts are invented and say so; none is a real vignette. Its
sha256 differs from ``configs/sets.json``, so ``prepare`` needs ``--allow-checksum-change``,
and the shipped rewrites (keyed by the real texts' md5) do not cover it:
:meth:`GeneratedClifford.install_rewrites` writes rule-passing rewrites for its texts.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from collections import Counter
from pathlib import Path

COLUMNS = ("Scenario", "Foundation", "Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty",
           "Not Wrong", "Wrong")
REASONS = COLUMNS[2:9]
FINE_COUNTS = {"Care (e)": 16, "Care (p, a)": 9, "Care (p, h)": 7, "Fairness": 17, "Loyalty": 16, "Authority": 17,
               "Sanctity": 17, "Liberty": 17, "Social Norms": 16}
COARSE_COUNTS = {"Care": 32, "Fairness": 17, "Loyalty": 16, "Authority": 17, "Sanctity": 17, "Liberty": 17,
                 "Social Norms": 16}
ACTORS = ("clerk", "neighbour", "coach", "baker", "pilot", "tailor", "student", "farmer", "porter", "painter", "nurse")
PLACES = ("a made-up harbour town", "an invented hill village", "a fictional market", "an imaginary office")


def _text(i: int, label: str, rng: random.Random) -> str:
    actor, place = rng.choice(ACTORS), rng.choice(PLACES)
    return f"You see a {actor} in {place} doing invented act number {i} against the {label} rule."


def _shares(label: str, rng: random.Random) -> dict[str, int]:
    """Percent of raters per reason, summing to 100, most on the label's own reason."""
    main = "Not Wrong" if label == "Social Norms" else label.split(" (")[0]
    shares = {r: 0 for r in REASONS}
    shares[main] = rng.randint(40, 90)
    for _ in range(100 - shares[main]):
        shares[rng.choice(REASONS)] += 1
    return shares


def clifford_like_rows(seed: int = 0) -> list[dict]:
    """``{"Scenario", "Foundation", reasons (percent ints), "Wrong" (one decimal)}`` for 132 invented rows."""
    rng = random.Random(seed)
    rows = []
    for label, n in FINE_COUNTS.items():
        for _ in range(n):
            i = len(rows)
            wrong = round(rng.uniform(0.0, 0.8), 1) if label == "Social Norms" else round(rng.uniform(1.5, 3.8), 1)
            rows.append({"Scenario": _text(i, label, rng), "Foundation": label, **_shares(label, rng),
                         "Wrong": f"{wrong:.1f}"})
    # the first row as the tests of the real file know it: Care 83 %, Not Wrong 0 %, rated 3.4
    rows[0].update({r: 0 for r in REASONS})
    rows[0].update({"Care": 83, "Liberty": 10, "Authority": 7, "Wrong": "3.4"})
    # the real file's quirks, kept verbatim by prepare: no final full stop, an unbalanced quote; and a comma
    rows[5]["Scenario"] = rows[5]["Scenario"].rstrip(".")
    rows[40]["Scenario"] = 'You see a porter in an imaginary office greeting a guest with "good day, invented act 40.'
    return rows


class GeneratedClifford:
    """The generated CSV at ``path``, the rows ``prepare`` should make of it, and rewrites for its texts."""

    def __init__(self, path: Path, seed: int = 0):
        self.path = Path(path)
        self.rows = clifford_like_rows(seed)
        buf = io.StringIO()
        w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in self.rows:
            w.writerow([r["Scenario"], r["Foundation"], *(f"{r[c]} %" for c in REASONS), r["Wrong"]])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(buf.getvalue(), encoding="utf-8")
        assert Counter(r["Foundation"] for r in self.rows) == FINE_COUNTS and len(self.rows) == 132

    def expected(self) -> list[dict]:
        """What ``normalize_clifford`` must return for this file (computed here independently)."""
        out = []
        for r in self.rows:
            text = r["Scenario"]
            out.append({"id": hashlib.md5(text.encode()).hexdigest(), "foundation": r["Foundation"],
                        "foundation_coarse": r["Foundation"].split(" (")[0], "text": text,
                        "wrong": float(r["Wrong"]), "reasons": {c: r[c] / 100 for c in REASONS}})
        return out

    def rewrites(self) -> list[dict]:
        """Three rule-passing rewrites per text, in the cache's format."""
        out = []
        for r in self.expected():
            tag = r["id"][:8]
            texts = {"other_uphold": f"You see the same person keeping to the rule instead, case {tag}.",
                     "self_violate": f"You do the same invented act yourself, case {tag}.",
                     "self_uphold": f"You keep to the rule yourself, case {tag}."}
            out += [{"source_md5": r["id"], "condition": c, "text": t, "producer": "test:generated",
                     "rules_version": 1} for c, t in texts.items()]
        return out

    def install_rewrites(self, folder: Path) -> Path:
        """Write :meth:`rewrites` into ``folder`` (a cache folder), standing in for the shipped ones."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "clifford-generated.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in self.rewrites()), encoding="utf-8")
        return path
