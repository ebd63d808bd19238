"""The probe's logged metrics: their names, a report flattened into them, and the change since a baseline.

The step-0 baseline is kept as per-vignette scores (:func:`baseline_record`), so a later probe's change since it is
a paired comparison over the same vignettes (:func:`change_metrics`).
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings

import numpy as np

from ..data.sets import REAL_FOUNDATIONS
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT, answer_format_of, where_prompts_part
from .bootstrap import VignetteScores, paired_change, selectivity, vignette_scores
from .sequential import by_id

BASELINE_EVENT = "train_begin"  # the event of the step-0 baseline: a history line that starts a run

LOGGED_HEADLINE = {"score": "score", "gap": "gap", "social_norms": "sn", "score_minus_sn": "score_minus_sn"}
SANITY_KEYS = ("yn_mass", "yn_mass_min", "frame_agreement", "human_corr", "elapsed_s", "self_check_fallbacks",
               "vignettes", "width_reached")  # vignettes asked; with a precision target, the width it stopped at
# since the step-0 baseline (logged when the run has one); score_change_p_run: the run-level p (run_level_p)
CHANGE_KEYS = ("score_change", "score_change_lo", "score_change_hi", "score_change_p", "score_change_p_run")
# with a target foundation and a baseline: the target's change minus the other real foundations' mean change
SELECTIVITY_KEYS = ("selectivity", "selectivity_lo", "selectivity_hi", "selectivity_p")
# per foundation (eval_moral_<name>/<foundation>/...): align_other with its bounds (a band in every dashboard)
FOUNDATION_KEYS = ("align_other", "align_other_lo", "align_other_hi", "align_self", "self_other_gap")


def slug(text: str) -> str:
    """A name as it appears in a metric name: a foundation ``"Social Norms"`` is ``social_norms``."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def probe_key(name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """The set's name in metric and file names: ``scifi`` for Yes/No answers, ``scifi_json`` for JSON ones."""
    answer_format_of(answer_format)
    suffix = "" if answer_format == DEFAULT_ANSWER_FORMAT else f"_{answer_format}"
    return slug(name) + suffix


def answer_format(record: dict) -> str:
    """The answer format a report or a history line was scored in; those written before formats existed are Yes/No."""
    return record.get("answer_format", DEFAULT_ANSWER_FORMAT)


def metric_names(name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> dict[str, str]:
    """Documented logged-metric names for set ``name`` (prefix ``eval_moral_<name>/``, ``eval_moral_<name>_json/``)."""
    headline = [key + suffix for key in LOGGED_HEADLINE for suffix in ("", "_lo", "_hi")]
    prefix = f"eval_moral_{probe_key(name, answer_format)}"
    return {key: f"{prefix}/{key}" for key in (*headline, *CHANGE_KEYS, *SELECTIVITY_KEYS, *SANITY_KEYS)}


def dashboard_names(metrics: dict[str, float]) -> dict[str, float]:
    """The logged names as the dashboards show them (what ``rewrite_logs`` makes of them): ``eval_moral_<name>/score``
    -> ``eval/moral_<name>/score``."""
    return {("eval/" + k[len("eval_"):] if k.startswith("eval_") else k): v for k, v in metrics.items()}


def report_metrics(name: str, report: dict) -> dict[str, float]:
    """Flatten a probe report into the logged scalar metrics (finite values only); per foundation only ``align_other``
    comes with its bounds (the others' are in the history line's table and the checkpoint report)."""
    names = metric_names(name, answer_format(report))
    info, check = report["info"], report["info"].get("self_check")
    values = {names[key + suffix]: report.get(field + suffix)
              for key, field in LOGGED_HEADLINE.items() for suffix in ("", "_lo", "_hi")}
    values.update({
        names["yn_mass"]: info["yn_mass_mean"], names["yn_mass_min"]: info["yn_mass_min"],
        names["frame_agreement"]: info["frame_agreement"], names["human_corr"]: info["human_corr"],
        names["elapsed_s"]: info["elapsed_s"],
        # how many faster strategies the self-check left at this probe (0: the fast path held; None: the check was
        # off): a curve that leaves 0 says the engine met a model it could not score the fast way (docs/engine.md)
        names["self_check_fallbacks"]: float(len(check.get("fallbacks") or [])) if isinstance(check, dict) else None,
        names["vignettes"]: info.get("n_vignettes"),
        names["width_reached"]: (info.get("adaptive") or {}).get("reached"),
    })
    prefix = names["score"].rsplit("/", 1)[0]
    for foundation, row in report["table"].iterrows():
        for col in FOUNDATION_KEYS:
            values[f"{prefix}/{slug(foundation)}/{col}"] = row.get(col)
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


# ---- the step-0 baseline: what the change since the start of training is measured from ---------------
def order_digest(obj: dict) -> str | None:
    """What decides whether two probes pair: the prompts of the candidates they ask from. A report's (or a
    :func:`baseline_record`'s) own prompt digest, or, for a probe with a precision target, the digest of every
    candidate it orders (``info.adaptive.order``): two probes of one order pair over the vignettes both asked."""
    if "order" in obj:  # a baseline record
        return obj["order"]
    adaptive = obj["info"].get("adaptive") if isinstance(obj.get("info"), dict) else None
    return adaptive["order"] if adaptive else obj.get("prompt_digest")


def baseline_record(report: dict, step: int) -> dict:
    """A report's per-vignette ``s`` and prompt digest as plain JSON values (kept in ``trainer_state.json``);
    ``order``: :func:`order_digest`."""
    scores = vignette_scores(report["scenarios"])
    return {"step": step, "prompt_digest": report["prompt_digest"], "order": order_digest(report),
            "score": report["score"], "name": report.get("name"), "answer_format": report.get("answer_format"),
            "sample_prompt": (report.get("info") or {}).get("sample_prompt"),
            "id": [str(i) for i in scores.id], "foundation_coarse": [str(f) for f in scores.foundation_coarse],
            "s": [[None if not math.isfinite(x) else float(x) for x in row] for row in scores.s.tolist()]}


def as_baseline(obj: dict) -> dict:
    """The baseline record of ``obj``: a report as loaded (at its own ``step``, 0 when it records none), or a
    :func:`baseline_record` as it is. Every place that takes "a baseline" (a file, a report, a saved record)
    turns it into the record here."""
    if "order" in obj and "s" in obj:  # a baseline record already
        return obj
    return baseline_record(obj, int(obj.get("step") or 0))


def pairs(baseline: dict, digest: str | None) -> bool:
    """The pairing rule: a baseline measures a probe's change when both asked from the same candidates (their
    :func:`order_digest`; ``digest`` is the probe's). The one place it is decided; :func:`why_unpaired` says why
    not, :func:`change_metrics` pairs over the vignettes both asked."""
    return order_digest(baseline) == digest


def why_unpaired(record, digest: str | None) -> str | None:
    """Why a baseline record cannot measure the change of a probe whose :func:`order_digest` is ``digest`` (None:
    it can): other prompts (:func:`pairs`), or a record that cannot be read."""
    if not isinstance(record, dict) or not pairs(record, digest):
        return ("its prompts differ from this probe's (another subset, tokenizer, answer prefix or answer format): "
                "no change since the baseline is logged")
    try:
        baseline_scores(record)
    except (KeyError, TypeError, ValueError) as e:
        return f"it cannot be read ({e}): no change since the baseline is logged"
    return None


def pairing_difference(record: dict, probe) -> str | None:
    """What differs between a baseline record and ``probe`` when they do not :func:`pairs`, in words that name it
    (the set, the answer format, where the wording parts, or the candidates); None when they pair."""
    if pairs(record, probe.prompt_digest):
        return None
    for field, what in (("name", "the vignette set"), ("answer_format", "the answer format")):
        theirs, ours = record.get(field), getattr(probe, field)
        if theirs is not None and theirs != ours:
            return f"{what} differs: the baseline's is {theirs}, this probe's {ours}"
    sample = record.get("sample_prompt")
    if isinstance(sample, str) and sample not in probe.prompts:
        # this probe's prompt of the same vignette, condition and frame (the one whose text the sample holds)
        vignettes = {str(v["id"]): v for v in probe.vignettes}
        same = [probe.prompts[i] for i, row in enumerate(probe.meta.itertuples())
                if row.frame == "wrong" and vignettes[str(row.id)][row.condition] in sample]
        if same:
            start, theirs, ours = where_prompts_part(sample, same[0])
            return (f"its prompts are worded otherwise (another tokenizer's chat template, or another answer prefix):"
                    f" from character {start} the baseline's first prompt reads {theirs!r} where this probe's reads "
                    f"{ours!r}; score both with one tokenizer (--tokenizer names the one the baseline was scored "
                    "with)")
    return ("it asked from other candidate vignettes or prompts (another limit, subset, tokenizer or answer prefix); "
            "score the baseline again with this probe's settings")


def baseline_scores(record: dict) -> VignetteScores:
    """The :class:`VignetteScores` of a :func:`baseline_record` (``None`` back to NaN)."""
    s = [[math.nan if x is None else float(x) for x in row] for row in record["s"]]
    return VignetteScores(record["id"], record["foundation_coarse"], s)


def change_metrics(name: str, baseline: dict | None, report: dict, target: str | None = None) -> dict[str, float]:
    """``score_change`` (this probe's score minus the baseline's) with its bounds and paired two-sided p-value.

    Over the vignettes both asked, when both asked from the same candidates (:func:`order_digest`); a probe with a
    precision target logs the change it measured at its stop (``info.adaptive.change``). With a ``target`` foundation,
    also its ``selectivity`` (``stats.selectivity``). Empty without a baseline that pairs; finite values only.
    """
    if baseline is None or not pairs(baseline, order_digest(report)):
        return {}
    names = metric_names(name, answer_format(report))
    a, b = _common(baseline_scores(baseline), vignette_scores(report["scenarios"]))
    adaptive = (report.get("info") or {}).get("adaptive")
    if adaptive and not adaptive.get("change") and adaptive.get("stopped") != "baseline":
        return {}  # the probe could not pair with this baseline (it says why in its warnings)
    level = adaptive["per_look_level"] if adaptive else report.get("level")
    if not report.get("n_resamples"):
        before, now = _score(a), _score(b)
        values = {names["score_change"]: None if before is None or now is None else now - before}
        if target is not None:
            values[names["selectivity"]] = _plain_selectivity(a, b, target)
    else:
        settings = {"level": level, "n_resamples": report["n_resamples"], "seed": 0}
        if adaptive and adaptive.get("change"):
            c = adaptive["change"]
            change = (c["estimate"], c["lo"], c["hi"], c["p"])
        else:
            change = paired_change(a, b, **settings)["headline"]["score"]
        values = dict(zip((names[k] for k in CHANGE_KEYS[:4]), change, strict=True))
        if target is not None:
            with contextlib.suppress(ValueError):  # the target, or every other foundation, is not in the probed subset
                sel = selectivity(a, b, target, **settings)["selectivity"]
                values.update(zip((names[k] for k in SELECTIVITY_KEYS), sel, strict=True))
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


def _common(a: VignetteScores, b: VignetteScores) -> tuple[VignetteScores, VignetteScores]:
    """Both reports' rows of the vignettes both asked, in ``b``'s order."""
    in_a = {str(i) for i in a.id}
    ids = [i for i in b.id if str(i) in in_a]
    return by_id(a, ids), by_id(b, ids)


def _score(scores: VignetteScores) -> float | None:
    """The score of per-vignette ``s`` (mean ``align_other`` over the real foundations present), as ``analyse``."""
    values = [_align(scores, f) for f in REAL_FOUNDATIONS]
    values = [v for v in values if math.isfinite(v)]
    return float(np.mean(values)) if values else None


def _align(scores: VignetteScores, foundation: str) -> float:
    s = scores.s[scores.foundation_coarse == foundation]
    if not len(s):
        return math.nan
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a condition with no finite score: NaN
        return float(np.nanmean(s[:, 0]) - np.nanmean(s[:, 1]))


# ---- a change flag that holds over a whole run --------------------------------------------------------------
def run_level_p(p: float, test: int) -> float:
    """The run-level p-value of the ``test``-th change test of a run (1 for the first probe after the baseline):
    ``min(1, p * test * (test + 1))``. Test ``j`` may spend ``alpha / (j (j + 1))``, and those spends add up to
    ``alpha`` over any number of tests, so the chance that a run whose score never moved has *any* step with a
    run-level p below ``alpha`` is at most ``alpha``, however long it runs and whatever the tests' dependence."""
    if not math.isfinite(p) or test < 1:
        return math.nan
    return min(1.0, p * test * (test + 1))


def with_run_level(line: dict, name: str, answer_format: str, tests_before: int) -> int:
    """Add ``score_change_p_run`` to a history line's metrics when it carries a change test (a ``score_change_p``;
    the baseline's own line, compared with itself, is none): this test is number ``tests_before + 1`` of its run.
    Returns the tests counted with this one."""
    names = metric_names(name, answer_format)
    p = line["metrics"].get(names["score_change_p"])
    if p is None or line.get("event") == BASELINE_EVENT:
        return tests_before
    line["metrics"][names["score_change_p_run"]] = run_level_p(float(p), tests_before + 1)
    return tests_before + 1


def count_tests(lines: list[dict]) -> int:
    """How many of a run's lines carry a change test (a ``score_change_p``, the baseline's line not counted)."""
    return sum(1 for line in lines if line.get("event") != BASELINE_EVENT
               and any(k.endswith("/score_change_p") for k in (line.get("metrics") or {})))


def _plain_selectivity(a: VignetteScores, b: VignetteScores, target: str) -> float | None:
    """Selectivity without intervals: the target's change minus the others' mean change, from the vignette means."""
    changes = {f: _align(b, f) - _align(a, f) for f in REAL_FOUNDATIONS}
    others = [c for f, c in changes.items() if f != target and math.isfinite(c)]
    if not math.isfinite(changes[target]) or not others:
        return None
    return changes[target] - sum(others) / len(others)
