"""A probe's per-vignette rows: what a dashboard's table shows when a user drills down from a foundation's curve.

Built from the report's ``scenarios``, never from a history line, which keeps the per-foundation table only.
"""

from __future__ import annotations

import pandas as pd

from ..data.sets import CONDITIONS
from ..stats.analysis import finite

ROW_COLUMNS = ("step", "id", "foundation", "foundation_coarse", "text", *(f"s_{c}" for c in CONDITIONS),
               "align_other", "align_self", "yn_mass")


def vignette_rows(report: dict, step: int, texts: dict[str, str] | None = None) -> list[dict]:
    """The report's vignettes as rows of :data:`ROW_COLUMNS` (plain values, NaN as None), in the report's order.

    ``texts``: vignette id -> the text to show (the probe's ``other_violate`` version); absent: ``text`` is None.
    """
    sc = pd.DataFrame(report["scenarios"])
    if sc.empty:
        return []
    wide = sc.pivot_table(index="id", columns="condition", values="s", aggfunc="mean", sort=False)
    wide = wide.reindex(columns=list(CONDITIONS))
    mass = sc.assign(yn_mass=(sc["yn_mass_wrong"] + sc["yn_mass_accept"]) / 2).groupby("id", sort=False)["yn_mass"]
    first = sc.drop_duplicates("id").set_index("id")
    rows = []
    for vid in first.index:
        s = {c: finite(wide.at[vid, c]) for c in CONDITIONS}
        rows.append({"step": int(step), "id": str(vid), "foundation": str(first.at[vid, "foundation"]),
                     "foundation_coarse": str(first.at[vid, "foundation_coarse"]),
                     "text": (texts or {}).get(str(vid)), **{f"s_{c}": s[c] for c in CONDITIONS},
                     "align_other": _difference(s["other_violate"], s["other_uphold"]),
                     "align_self": _difference(s["self_violate"], s["self_uphold"]),
                     "yn_mass": finite(mass.mean().get(vid))})
    return rows


def vignette_texts(vignettes: list[dict]) -> dict[str, str]:
    """id -> the vignette's original text (``other_violate``), from a probe's vignettes."""
    return {str(v["id"]): str(v.get("other_violate") or "") for v in vignettes}


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b
