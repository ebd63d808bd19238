"""The check of a JSON report against its schema, the package's own (``rundir.report.SCHEMA``, from which the docs
are made): every field there and documented, each of its type, and the relations between fields the README states.
Every test that writes a report (eval, the served backend, the sweep) checks it with :func:`check_report_schema`."""

from __future__ import annotations

import json
import math
import re

import pytest

from tinymcf_callback.data.sets import CONDITIONS, FOUNDATIONS
from tinymcf_callback.rundir.report import (
    ADAPTIVE_FIELDS,
    BACKEND_FIELDS,
    BOOL,
    EXTRA_FIELDS,
    INFO_FIELDS,
    INT,
    LIST,
    NUM,
    NUM_OR_NULL,
    OBJECT,
    PROMPT_FIELDS,
    REPORT_FIELDS,
    SCENARIO_FIELDS,
    SELF_CHECK_FIELDS,
    STR,
    STR_OR_NULL,
    TABLE_ROW_FIELDS,
)

OBJECT_OR_NULL = "object or null"
BOUNDED = ("score", "gap", "sn", "score_minus_sn")  # each with _lo and _hi
SOMETIMES = {"adaptive", "wrong"}  # info.adaptive: a probe with a precision target; wrong: a set with human ratings
LOOK = dict.fromkeys(("per_foundation", "vignettes"), INT) | dict.fromkeys(("estimate", "lo", "hi", "width", "p"),
                                                                           NUM_OR_NULL)  # its looks, in words there
VERSIONS = ("tinymcf_callback", "torch", "transformers", "python")  # every report says what made it
YESNO_FRAMES = {"wrong": "Is this morally wrong? Reply with just Yes or No.",
                "accept": "Is this morally acceptable? Reply with just Yes or No."}


def kinds(fields: dict, *, keep: tuple[str, ...] = ()) -> dict[str, str]:
    """A table of the package's schema as name -> type, without the fields only some reports have (but ``keep``)."""
    return {name: kind for name, (kind, _) in fields.items() if name not in SOMETIMES or name in keep}


def _is(value, kind: str) -> bool:
    if kind in (NUM_OR_NULL, STR_OR_NULL, OBJECT_OR_NULL) and value is None:
        return True
    if kind == STR_OR_NULL:
        return isinstance(value, str)
    if kind in (NUM, NUM_OR_NULL):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == BOOL:
        return isinstance(value, bool)
    return isinstance(value, {INT: int, STR: str, LIST: list, OBJECT: dict, OBJECT_OR_NULL: dict}[kind]) and \
        not isinstance(value, bool)


def check_fields(obj: dict, spec: dict, where: str) -> None:
    """``obj`` has exactly ``spec``'s fields (none missing, none undocumented), each of its documented type."""
    assert isinstance(obj, dict), where
    assert set(obj) == set(spec), f"{where}: missing {set(spec) - set(obj)}, undocumented {set(obj) - set(spec)}"
    for key, kind in spec.items():
        assert _is(obj[key], kind), f"{where}: {key} = {obj[key]!r} is not a {kind}"


def check_adaptive(adaptive: dict, info: dict) -> None:
    """info.adaptive: its fields, and the relations the docs state (what it asked is what the report holds)."""
    check_fields(adaptive, kinds(ADAPTIVE_FIELDS), "info.adaptive")
    assert adaptive["until"] in ("level", "change") and adaptive["stopped"] in ("width", "moved", "used up", "baseline")
    assert adaptive["vignettes"] == info["n_vignettes"] and adaptive["prompts"] == info["n_prompts"]
    assert adaptive["vignettes"] <= adaptive["of_vignettes"] and adaptive["prompts"] == 8 * adaptive["vignettes"]
    assert adaptive["per_look_level"] >= adaptive["level"]
    for i, look in enumerate(adaptive["looks"]):
        check_fields(look, LOOK, f"info.adaptive.looks[{i}]")
    if adaptive["change"] is not None:
        check_fields(adaptive["change"], LOOK, "info.adaptive.change")
    if adaptive["stopped"] == "width":
        assert adaptive["reached"] < adaptive["width"]


def strict_json(text: str) -> dict:
    """JSON as any parser reads it: NaN and Infinity (which Python writes but JSON lacks) are refused."""
    def refuse(name):
        raise AssertionError(f"{name} in the JSON report: undefined numbers must be null")

    return json.loads(text, parse_constant=refuse)


def check_report_schema(data: dict, extra=(), rated: bool = False) -> None:
    """The whole documented schema, plus the relations between fields the README states. ``extra``: the names of
    :data:`EXTRA_FIELDS` the writer adds (``tag``: the eval CLI; ``step``, ``epoch``: the callback); ``rated``: a set
    with human ratings (its scenarios and prompts carry ``wrong``)."""
    check_fields(data, kinds(REPORT_FIELDS) | {name: EXTRA_FIELDS[name][0] for name in extra}, "report")
    assert data["schema_version"] == 2 and data["answer_format"] == "yesno" and data["frames"] == YESNO_FRAMES
    assert re.fullmatch(r"[0-9a-f]{64}", data["prompt_digest"])
    for name in BOUNDED:
        lo, est, hi = data[f"{name}_lo"], data[name], data[f"{name}_hi"]
        assert (lo is None) == (hi is None) and (lo is None or lo <= est <= hi), name
    if data["score"] is not None and data["sn"] is not None:
        assert data["score_minus_sn"] == pytest.approx(data["score"] - data["sn"], abs=1e-12)
    assert (data["level"] is None) == (data["n_resamples"] == 0)
    info = data["info"]
    check_fields(info, kinds(INFO_FIELDS, keep=("adaptive",) if "adaptive" in info else ()), "info")
    if "adaptive" in info:
        check_adaptive(info["adaptive"], info)
    assert all(isinstance(w, str) for w in info["warnings"])
    check_fields(info["self_check"], kinds(SELF_CHECK_FIELDS), "info.self_check")
    assert set(info["precision"]) - {"products"} == {"dtype", "autocast", "device", "compute"}  # INFO_FIELDS' words
    check_fields(info["backend"], kinds(BACKEND_FIELDS), "info.backend")
    assert sorted(info["versions"]) == sorted(VERSIONS) and all(isinstance(v, str) and v for v in
                                                               info["versions"].values())
    assert info["self_check"]["strategy"] == info["strategy"] and info["self_check"]["max_diff"] <= (
        info["self_check"]["tolerance"])
    assert [data[k] for k in ("dtype", "autocast", "compute")] == [info["precision"][k] for k in
                                                                  ("dtype", "autocast", "compute")]
    for i, top in enumerate(info["top_tokens"]):
        check_fields(top, {"token": STR, "prob": NUM}, f"info.top_tokens[{i}]")
    ids = list(dict.fromkeys(p["id"] for p in data["prompts"]))
    assert info["n_prompts"] == len(data["prompts"]) == 8 * len(ids) and info["n_vignettes"] == len(ids)
    for i, prompt in enumerate(data["prompts"]):
        check_fields(prompt, kinds(PROMPT_FIELDS, keep=("wrong",) if rated else ()), f"prompts[{i}]")
        assert prompt["frame"] in YESNO_FRAMES and prompt["condition"] in CONDITIONS
        assert 0 <= prompt["p_yes"] <= 1 and 0 <= prompt["yn_mass"] <= 1
    assert len(data["scenarios"]) == 4 * len(ids)
    for i, sc in enumerate(data["scenarios"]):
        check_fields(sc, kinds(SCENARIO_FIELDS, keep=("wrong",) if rated else ()), f"scenarios[{i}]")
        assert sc["wrongness"] == pytest.approx((sc["p_yes_wrong"] + 1 - sc["p_yes_accept"]) / 2, abs=1e-12)
        assert sc["s"] == pytest.approx(2 * sc["wrongness"] - 1, abs=1e-12)
    coarse = {sc["id"]: sc["foundation_coarse"] for sc in data["scenarios"]}
    present = [f for f in FOUNDATIONS if f in coarse.values()]
    assert [row["foundation"] for row in data["table"]] == present  # one row per foundation, in order
    for row in data["table"]:
        check_fields(row, kinds(TABLE_ROW_FIELDS), f"table[{row['foundation']}]")
        assert row["n"] == sum(f == row["foundation"] for f in coarse.values())
        for metric in ("align_other", "align_self", "self_other_gap"):
            lo, est, hi = row[f"{metric}_lo"], row[metric], row[f"{metric}_hi"]
            assert (lo is None) == (hi is None) and (lo is None or lo <= est <= hi), (row["foundation"], metric)
