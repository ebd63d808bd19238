"""Paired change between two probe reports of the same vignettes: :func:`compare` (``tinymcf compare A.json B.json``).

What cannot be paired is refused with the reason (:func:`check_comparable`; the rules: docs/cli.md, ``tinymcf
compare``). Pandas and numpy only, no torch.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pandas as pd

from ..data.sets import CONDITIONS
from ..errors import CompareError
from ..rundir.precision import Precision
from ..rundir.report import PRECISION_FIELDS, check_report, load_report
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT, where_prompts_part
from ..stats.analysis import HEADLINE_FIELDS, INTERVAL_SETTINGS, finite
from ..stats.bootstrap import (
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    HEADLINE,
    METRICS,
    paired_change,
    selectivity,
    vignette_scores,
)
from ..stats.metrics import answer_format
from .text import with_bounds

HEADLINE_LABELS = {"score": "score", "gap": "gap", "sn": "sn (control)", "score_minus_sn": "score - sn"}
_SHOWN_IDS = 3
_AGREE = 1e-9  # a report's own numbers and those recomputed from its vignettes must agree this closely


def _ids(report: dict) -> list[str]:
    return list(dict.fromkeys(str(i) for i in pd.DataFrame(report["scenarios"])["id"]))


def _table_rows(report: dict) -> dict[str, dict]:
    """``{foundation: row}`` from a report's table (a DataFrame indexed by foundation, or JSON records)."""
    table = report["table"]
    if isinstance(table, pd.DataFrame):
        table = table.reset_index() if "foundation" not in table.columns else table
        table = table.to_dict(orient="records")
    return {str(row["foundation"]): row for row in table}


def _value(x) -> float:
    return math.nan if x is None else float(x)


def _headline_value(report: dict, name: str) -> float:
    if name == "score_minus_sn" and report.get(name) is None:  # schema 1 has no score_minus_sn: derive it
        return _value(report.get("score")) - _value(report.get("sn"))
    return _value(report.get(name))


# ---- refusing what cannot be paired ---------------------------------------------------------------
def check_comparable(a: dict, b: dict, labels: tuple[str, str] = ("A", "B"),
                     allow_precision_change: bool = False) -> list[str]:
    """Refuse (:class:`CompareError`) two reports that did not ask the same questions; return the warnings.

    Two reports scored in different precisions (the weights' dtype, or an autocast) are refused too
    unless ``allow_precision_change``: the change would mix the model's change with the precision's
    (the same weights in float32 and under bfloat16 autocast differ by up to 0.03 in P(Yes) on
    SmolLM2-135M); allowed, it is a warning naming both.
    """
    la, lb = labels
    if a["name"] != b["name"]:
        raise CompareError(f"{la} is a report of set {a['name']!r} and {lb} of set {b['name']!r}: a paired change "
                           f"needs two reports of the same set (--name)")
    if answer_format(a) != answer_format(b):
        raise CompareError(f"{la} was scored with answer format {answer_format(a)!r} and {lb} with "
                           f"{answer_format(b)!r}: P(Yes) and P(true) are read off different questions and tokens, so "
                           f"their change is not the model's; score both with the same --answer-format")
    ids_a, ids_b = _ids(a), _ids(b)
    adaptive = [(r.get("info") or {}).get("adaptive") for r in (a, b)]
    if set(ids_a) != set(ids_b) and all(adaptive) and adaptive[0]["order"] == adaptive[1]["order"]:
        k = min(x["per_foundation"] for x in adaptive)
        raise CompareError(
            f"{la} and {lb} are probes with a precision target that stopped after {adaptive[0]['vignettes']} and "
            f"{adaptive[1]['vignettes']} vignettes of one order: each history line's change since the baseline is "
            f"already paired over the vignettes both asked; to compare these two, score both with --per-foundation "
            f"{k} --subset-seed {adaptive[0]['order_seed']} (the vignettes both asked)")
    if set(ids_a) != set(ids_b):
        only_a, only_b = [i for i in ids_a if i not in set(ids_b)], [i for i in ids_b if i not in set(ids_a)]
        raise CompareError(
            f"{la} and {lb} score different vignettes of {a['name']!r} ({len(ids_a)} and {len(ids_b)}; "
            f"{_some(only_a)} only in {la}, {_some(only_b)} only in {lb}): a paired change needs the same "
            f"vignettes; score both with the same --limit (or none)")
    notes = _precision_notes(a, b, labels, allow_precision_change)
    digest_a, digest_b = a.get("prompt_digest"), b.get("prompt_digest")
    if digest_a and digest_b:
        if digest_a != digest_b:
            raise CompareError(
                f"{la} and {lb} score the same {len(ids_a)} vignettes of {a['name']!r} with different prompt texts "
                f"(prompt_digest {digest_a[:12]}... in {la}, {digest_b[:12]}... in {lb}"
                f"{_first_difference(a, b, labels)}): another answer prefix or another tokenizer's chat template "
                f"changes what the model is asked, so the change would mix the model's change with the prompts'. "
                f"Score both with the same tokenizer and answer_prefix")
        return notes
    old = [label for label, r in ((la, a), (lb, b)) if not r.get("prompt_digest")]
    return notes + [f"{' and '.join(old)} {'has' if len(old) == 1 else 'have'} no prompt_digest (schema-1 report"
            f"{'s' * (len(old) > 1)}): the vignettes match but the prompts could not be checked; make sure both "
            f"were scored with the same tokenizer and answer prefix"]


def _precision_notes(a: dict, b: dict, labels: tuple[str, str], allow: bool) -> list[str]:
    pa, pb = Precision.of(a), Precision.of(b)
    if pa is None or pb is None or pa == pb:
        return []
    what = (f"{labels[0]} was scored in {pa} and {labels[1]} in {pb}: the "
            f"change mixes the model's change with the precision's")
    if not allow:
        raise CompareError(f"{what}; score both in one precision (eval --dtype, "
                           f"MoralProbeCallback(keep_autocast=...)), or pass --allow-precision-change "
                           f"(allow_precision_change=True) to compare them anyway")
    return [what]


def _some(ids: list[str]) -> str:
    if not ids:
        return "none"
    more = f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else ""
    return f"{len(ids)} ({', '.join(ids[:_SHOWN_IDS])}{more})"


def _first_difference(a: dict, b: dict, labels: tuple[str, str]) -> str:
    """Where the two sample prompts (the first prompt of each report) part, when both reports hold one."""
    pa, pb = (r.get("info", {}).get("sample_prompt") for r in (a, b))
    parted = where_prompts_part(pa, pb) if isinstance(pa, str) and isinstance(pb, str) else None
    if parted is None:
        return ""
    start, in_a, in_b = parted
    return f"; the first prompt reads {in_a!r} in {labels[0]} and {in_b!r} in {labels[1]} from character {start}"


# ---- a history line as a report -------------------------------------------------------------------------
def line_report(line: dict, label: str) -> dict:
    """A probe's history line as a report :func:`compare` takes: its per-vignette ``s`` (``scores``) as the scenario
    rows, its headline, table, precision and prompt digest as they are; :class:`CompareError` for a line without
    them (a gap, or a line written before lines held them)."""
    scores = line.get("scores")
    if not isinstance(scores, dict) or not scores.get("id"):
        raise CompareError(f"{label} holds no per-vignette scores (a gap, or a line written before history lines held "
                           "them): compare the reports instead (the step-0 baseline report beside the history, a "
                           "checkpoint's moral_probe_<name>.json), or score the step again")
    scenarios = [{"id": i, "foundation_coarse": f, "condition": c, "s": value}
                 for i, f, row in zip(scores["id"], scores["foundation_coarse"], scores["s"], strict=True)
                 for c, value in zip(CONDITIONS, row, strict=True) if value is not None]
    fields = ("name", "answer_format", *PRECISION_FIELDS, *HEADLINE_FIELDS, *INTERVAL_SETTINGS, "prompt_digest")
    return check_report({**{k: line.get(k) for k in fields if k in line}, "info": line.get("info") or {},
                         "table": line["table"], "scenarios": scenarios}, label)


# ---- the comparison --------------------------------------------------------------------------------
def compare(report_a, report_b, *, level: float = DEFAULT_LEVEL, n_resamples: int = DEFAULT_RESAMPLES,
            seed: int | None = 0, labels: tuple[str, str] = ("A", "B"), allow_precision_change: bool = False,
            target: str | None = None) -> dict:
    """The paired change ``B - A`` of every headline and per-foundation metric between two reports.

    ``report_a``/``report_b``: report dicts (``evaluate``, or a loaded JSON report of schema 1 or
    2) or paths to JSON reports. Returns ``{"name", "answer_format", "n_vignettes", "level", "n_resamples", "seed",
    "method", "headline", "table", "warnings"}``: ``headline`` maps ``score``, ``gap``, ``sn`` and
    ``score_minus_sn`` to ``{"a", "b", "change", "lo", "hi", "p"}`` (``None`` where undefined);
    ``table`` is a DataFrame with one row per present foundation and metric (``foundation``,
    ``metric``, ``n``, ``a``, ``b``, ``change``, ``lo``, ``hi``, ``p``; NaN where undefined).
    ``p`` is two-sided, for "no change"; it is below ``1 - level`` exactly when the interval
    excludes 0. ``labels`` name the two reports in messages (the CLI passes the file names).
    Raises :class:`CompareError` (a ``ValueError``) for reports that cannot be paired, and for
    reports of two precisions unless ``allow_precision_change``; warns (``UserWarning``) when the
    prompts could not be checked or the precisions differ (allowed).

    ``target``: the real foundation a training run or a steering vector aims at. The result then
    also holds ``"selectivity"``: ``{"target", "off_target_foundations", "on_target", "off_target",
    "selectivity"}``, each of the last three ``{"change", "lo", "hi", "p"}``: the target's
    ``align_other`` change, the mean change of the other real foundations, and their difference
    (:func:`~tinymcf_callback.stats.bootstrap.selectivity`, the same paired resamples).
    """
    a, b = (load_report(r) if isinstance(r, (str, Path)) else check_report(r, label)
            for r, label in zip((report_a, report_b), labels, strict=True))
    notes = check_comparable(a, b, labels, allow_precision_change)
    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    try:
        result = paired_change(vignette_scores(a["scenarios"]), vignette_scores(b["scenarios"]), level=level,
                               n_resamples=n_resamples, seed=seed)
    except ValueError as e:
        raise CompareError(str(e)) from None
    headline = {name: _row(_headline_value(a, name), _headline_value(b, name), result["headline"][name], name, labels)
                for name in HEADLINE}
    rows_a, rows_b = _table_rows(a), _table_rows(b)
    table = []
    for foundation, n in result["n"].items():
        if not n:
            continue
        for metric in METRICS:
            va = _value(rows_a.get(foundation, {}).get(metric))
            vb = _value(rows_b.get(foundation, {}).get(metric))
            row = _row(va, vb, result["foundations"][foundation][metric], f"{foundation} {metric}", labels)
            table.append({"foundation": foundation, "metric": metric, "n": n,
                          **{k: _value(v) for k, v in row.items()}})
    out = {"name": a["name"], "answer_format": answer_format(a), "n_vignettes": sum(result["n"].values()),
           **{k: result[k] for k in ("level", "n_resamples", "seed", "method")},
           "headline": headline, "table": pd.DataFrame(table), "warnings": notes}
    if target is not None:
        try:
            sel = selectivity(vignette_scores(a["scenarios"]), vignette_scores(b["scenarios"]), target, level=level,
                              n_resamples=n_resamples, seed=seed)
        except ValueError as e:
            raise CompareError(f"selectivity of {target!r}: {e}") from None
        out["selectivity"] = {"target": target, "off_target_foundations": sel["off_target_foundations"],
                              **{k: {f: finite(getattr(sel[k], f)) for f in ("change", "lo", "hi", "p")}
                                 for k in ("on_target", "off_target", "selectivity")}}
    return out


def _row(va: float, vb: float, change, what: str, labels: tuple[str, str]) -> dict:
    """One metric's A, B and paired change; refuses when the reports' own numbers disagree with their vignettes."""
    reported = vb - va
    if math.isfinite(reported) != math.isfinite(change.change) or (
            math.isfinite(reported) and abs(reported - change.change) > _AGREE):
        raise CompareError(f"{what}: {labels[1]} - {labels[0]} is {reported} from the reports' own numbers but "
                           f"{change.change} from their per-vignette scores; a report was edited or damaged: "
                           f"score the models again")
    return {"a": finite(va), "b": finite(vb), "change": finite(change.change), "lo": finite(change.lo),
            "hi": finite(change.hi), "p": finite(change.p)}


# ---- printing --------------------------------------------------------------------------------------
def format_comparison(result: dict, labels: tuple[str, str] = ("A", "B")) -> str:
    """The comparison as text: a header, the headline rows and the per-foundation rows (change, interval, p)."""
    level = f"{result['level']:.0%}"
    fmt = result.get("answer_format", DEFAULT_ANSWER_FORMAT)
    answers = "" if fmt == DEFAULT_ANSWER_FORMAT else f", {fmt} answers"
    lines = [f"[tinymcf] compare {result['name']} ({result['n_vignettes']} vignettes{answers}): A = {labels[0]}, "
             f"B = {labels[1]}",
             f"[tinymcf] change B - A with {level} intervals and two-sided p-values (paired bootstrap over "
             f"vignettes, {result['n_resamples']} resamples, seed {result['seed']})"]
    lines += [f"[tinymcf] WARNING: {w}" for w in result["warnings"]]
    head = pd.DataFrame([{"headline": HEADLINE_LABELS[k], **{c: _value(v) for c, v in r.items()}}
                         for k, r in result["headline"].items()])
    lines += ["", _text(head, "headline", level)]
    if len(result["table"]):
        lines += ["", _text(result["table"], ["foundation", "metric", "n"], level)]
    if result.get("selectivity"):
        sel = result["selectivity"]
        others = ", ".join(sel["off_target_foundations"])
        rows = pd.DataFrame([{"selectivity": what, **{c: _value(v) for c, v in sel[key].items()}, "a": math.nan,
                              "b": math.nan}
                             for key, what in (("on_target", f"{sel['target']} align_other"),
                                               ("off_target", "mean of the others"),
                                               ("selectivity", "on - off target"))])
        lines += ["", f"[tinymcf] selectivity of {sel['target']}: its align_other change minus the mean change of "
                      f"{others}", _text(rows, "selectivity", level).replace("n/a", "   ")]
    return "\n".join(lines)


def _text(df: pd.DataFrame, keys, level: str) -> str:
    shown = df.set_index(keys)
    out = pd.DataFrame(index=shown.index)
    out["A"], out["B"], out["change"] = (shown[c].map(lambda x: with_bounds(x, None, None, False))
                                         for c in ("a", "b", "change"))
    out[f"{level} interval"] = [_interval(lo, hi) for lo, hi in zip(shown["lo"], shown["hi"], strict=True)]
    out["p"] = shown["p"].map(_p)
    return out.to_string()


def _interval(lo: float, hi: float) -> str:
    return "n/a" if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:+.3f}, {hi:+.3f}]"


def _p(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"
