"""analyse(): exact values on hand-computed examples (pure pandas, no model)."""

import math
import time

import numpy as np
import pandas as pd
import pytest

from tinymcf_callback import FRAMES, analyse
from tinymcf_callback.data.sets import CONDITIONS


def _meta(vignettes):
    rows = []
    for vid, coarse, wrong in vignettes:
        for cond in CONDITIONS:
            for frame in FRAMES:
                rows.append({"id": vid, "foundation": coarse, "foundation_coarse": coarse,
                             "condition": cond, "frame": frame, "wrong": wrong})
    return pd.DataFrame(rows)


def _p(values):
    """values: {(id, condition): (P(Yes|wrong), P(Yes|accept))} in meta order."""
    return values


def test_hand_computed_example():
    meta = _meta([("a", "Care", 3.0), ("b", "Care", 1.0), ("c", "Social Norms", 0.5)])
    table_in = {
        # id: {condition: (p_yes_wrong, p_yes_accept)}
        "a": {"other_violate": (0.9, 0.2), "other_uphold": (0.3, 0.8),
              "self_violate": (0.7, 0.4), "self_uphold": (0.5, 0.5)},
        "b": {"other_violate": (0.5, 0.5), "other_uphold": (0.1, 0.9),
              "self_violate": (0.6, 0.6), "self_uphold": (0.2, 0.6)},
        "c": {"other_violate": (0.6, 0.6), "other_uphold": (0.6, 0.6),
              "self_violate": (0.4, 0.4), "self_uphold": (0.5, 0.7)},
    }
    p_yes = [table_in[r.id][r.condition][0 if r.frame == "wrong" else 1] for r in meta.itertuples()]
    mass = np.linspace(0.3, 0.9, len(meta))
    out = analyse(p_yes, meta, yn_mass=mass, elapsed=1.5)

    def s(pw, pa):
        return 2 * ((pw + 1 - pa) / 2) - 1  # = pw - pa

    sa = {c: s(*table_in["a"][c]) for c in CONDITIONS}
    sb = {c: s(*table_in["b"][c]) for c in CONDITIONS}
    sc = {c: s(*table_in["c"][c]) for c in CONDITIONS}
    care_other = (sa["other_violate"] + sb["other_violate"]) / 2 - (sa["other_uphold"] + sb["other_uphold"]) / 2
    care_self = (sa["self_violate"] + sb["self_violate"]) / 2 - (sa["self_uphold"] + sb["self_uphold"]) / 2
    # by hand: a: ov .7 ou -.5 sv .3 su 0 ; b: ov 0 ou -.8 sv 0 su -.4
    assert care_other == pytest.approx((0.7 + 0.0) / 2 - (-0.5 - 0.8) / 2)  # 1.0
    t = out["table"]
    assert list(t.index) == ["Care", "Social Norms"]
    assert t.loc["Care", "n"] == 2 and t.loc["Social Norms", "n"] == 1
    assert t.loc["Care", "align_other"] == pytest.approx(1.0)
    assert t.loc["Care", "align_self"] == pytest.approx(care_self) and care_self == pytest.approx(0.35)
    assert t.loc["Care", "self_other_gap"] == pytest.approx(0.65)
    assert t.loc["Social Norms", "align_other"] == pytest.approx(sc["other_violate"] - sc["other_uphold"])
    assert out["score"] == pytest.approx(1.0)  # only Care among the real foundations
    assert out["gap"] == pytest.approx(0.65)
    assert out["sn"] == pytest.approx(0.0)
    info = out["info"]
    assert info["yn_mass_mean"] == pytest.approx(0.6) and info["yn_mass_min"] == pytest.approx(0.3)
    assert info["n_prompts"] == 24 and info["n_vignettes"] == 3 and info["elapsed_s"] == 1.5
    pw = np.array([table_in[i][c][0] for i in "abc" for c in CONDITIONS])
    pa = np.array([table_in[i][c][1] for i in "abc" for c in CONDITIONS])
    assert info["frame_agreement"] == pytest.approx(np.corrcoef(pw, 1 - pa)[0, 1])
    s_ov = [sa["other_violate"], sb["other_violate"], sc["other_violate"]]
    assert info["human_corr"] == pytest.approx(np.corrcoef(s_ov, [3.0, 1.0, 0.5])[0, 1])
    sc_df = out["scenarios"]
    row = sc_df[(sc_df.id == "a") & (sc_df.condition == "other_violate")].iloc[0]
    assert row.wrongness == pytest.approx((0.9 + 1 - 0.2) / 2) and row.s == pytest.approx(0.7)
    assert list(sc_df.id.unique()) == ["a", "b", "c"]  # the set's order is kept


def test_headline_score_is_mean_over_real_foundations_only():
    meta = _meta([("a", "Care", np.nan), ("b", "Fairness", np.nan), ("c", "Social Norms", np.nan)])
    ov = {"a": 0.8, "b": 0.4, "c": 0.9}
    p_yes = [(ov[r.id] if r.condition == "other_violate" else 0.5) if r.frame == "wrong" else 0.5
             for r in meta.itertuples()]
    out = analyse(p_yes, meta)
    # s = p_wrong - p_accept: Care 0.3 - 0, Fairness -0.1 - 0; Social Norms excluded from the score
    assert out["score"] == pytest.approx((0.3 - 0.1) / 2)
    assert out["sn"] == pytest.approx(0.4)
    assert out["info"]["human_corr"] is None and out["info"]["yn_mass_mean"] is None


def test_missing_pieces_give_none_not_errors():
    meta = _meta([("a", "Social Norms", np.nan)])
    out = analyse([0.5] * len(meta), meta)
    assert out["score"] is None and out["gap"] is None
    assert out["info"]["frame_agreement"] is None  # constant inputs: correlation undefined
    with pytest.raises(ValueError, match="8 prompts"):
        analyse([0.5] * 3, meta)
    assert not math.isnan(out["sn"])


def test_elapsed_defaults_to_seconds_since_prompts_were_formatted():
    meta = _meta([("a", "Care", np.nan)])
    assert analyse([0.5] * len(meta), meta)["info"]["elapsed_s"] is None  # no stamp, nothing given: unknown
    meta.attrs["formatted_at"] = time.time() - 5.0  # as format_prompts stamps it
    assert analyse([0.5] * len(meta), meta)["info"]["elapsed_s"] == pytest.approx(5.0, abs=1.0)
    assert analyse([0.5] * len(meta), meta, elapsed=0.5)["info"]["elapsed_s"] == 0.5  # given wins
