"""What the preference pairs say, with intervals: accuracy and margin, per config and over all pairs. Pure numpy.

Per pair: ``margin = log P(chosen | prompt) - log P(rejected | prompt)``; ``accuracy`` is the share of pairs with a
margin above 0 (a tie counts as not preferred). Both come with 95% intervals from resampling pairs within their
config (:func:`~tinymcf_callback.stats.bootstrap.stratified_means`: the probe's t interval on a bootstrap standard
error, vignettes there, pairs here), over all pairs and per config.

The change between two scorings of the same pairs (two checkpoints) is paired: each pair's change (in its margin,
and in whether it is preferred) is resampled, so what a pair always does cancels. lm-eval's tasks change the same
way where lm-eval logged each document's score, else unpaired from the two standard errors lm-eval reports.
:func:`agreement` says whether two changes (the probe's and a benchmark's) agree in sign, disagree, or cannot tell.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from ..errors import CompareError
from ..stats.bootstrap import DEFAULT_LEVEL, DEFAULT_RESAMPLES, Mean, stratified_means

ACCURACY_BOUNDS = (0.0, 1.0)
# the prefs block of a report and a history line, field by field: (type, meaning); the docs' table is made from it
PREFS_FIELDS = {
    "source": ("object", "what was read: source, kind (file or dataset), sha256 (a file's), split, revision, "
                         "cache_hash and datasets (a dataset's), configs, limit, per_config, seed, n_pairs, "
                         "conversational, digest (sha256 of the pairs' texts)"),
    "n_pairs": ("integer", "pairs scored"),
    **{f"{name}{end}": ("number or null", meaning if not end else f"{end[1:]} bound of {name}'s interval")
       for name, meaning in (("accuracy", "share of pairs with margin > 0"),
                             ("margin", "mean log P(chosen | prompt) - log P(rejected | prompt), in nats"))
       for end in ("", "_lo", "_hi")},
    "level": ("number", "the intervals' confidence level"), "n_resamples": ("integer", "bootstrap resamples"),
    "seed": ("integer", "the bootstrap's seed"), "method": ("string", "how the intervals were made"),
    "configs": ("list", "one row per config: config, n, accuracy, margin, each with _lo and _hi"),
    "pairs": ("list", "one row per pair in the data's order: config, row (in its config), chosen_logp, rejected_logp, "
                      "margin"),
    "token_digest": ("string", "sha256 of every pair's token ids: two scorings pair pair by pair when it matches"),
    "template": ("string", "chat (conversational pairs through the chat template) or plain"),
    "strategy": ("string", "the engine's strategy: shared, full or unpadded"),
    "self_check": ("object or null", "the strategy against each sequence alone: strategy, checked, max_diff (nats a "
                                     "token), tolerance, precision, reference, scored_diff, note, fallbacks, "
                                     "n_forward, seconds"),
    "precision": ("object", "dtype, autocast, device, compute: what the forward calls computed in"),
    "n_forward": ("integer", "forward calls, the self-check's included"),
    "sequences": ("object", "distinct prompts and (prompt, continuation) sequences scored, and the shared start"),
    "batches": ("object", "device, token_budget, max_batch_size, rule, batches"),
    "elapsed_s": ("number", "seconds the scoring took"),
}


def _num(x) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _bounded(name: str, m: Mean) -> dict:
    return {name: _num(m.estimate), f"{name}_lo": _num(m.lo), f"{name}_hi": _num(m.hi)}


def summarise(chosen: np.ndarray, rejected: np.ndarray, configs: list[str], *, level: float = DEFAULT_LEVEL,
              n_resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0) -> dict:
    """Accuracy and margin over all pairs and per config, with intervals (see the module), and one row per pair."""
    margin = np.asarray(chosen, dtype=float) - np.asarray(rejected, dtype=float)
    correct = (margin > 0).astype(float)
    acc = stratified_means(correct, configs, level=level, n_resamples=n_resamples, seed=seed, bounds=ACCURACY_BOUNDS)
    mar = stratified_means(margin, configs, level=level, n_resamples=n_resamples, seed=seed)
    table = [{"config": c, "n": acc["n"][c], **_bounded("accuracy", acc["groups"][c][0]),
              **_bounded("margin", mar["groups"][c][0])} for c in acc["groups"]]
    return {"n_pairs": len(margin), **_bounded("accuracy", acc["pooled"][0]), **_bounded("margin", mar["pooled"][0]),
            "level": acc["level"], "n_resamples": acc["n_resamples"], "seed": seed, "method": acc["method"],
            "configs": table}


def pair_rows(chosen: np.ndarray, rejected: np.ndarray, configs: list[str], rows: list[int]) -> list[dict]:
    """One row per pair, in the data's order: its config, its row in the source and its two log-probabilities."""
    return [{"config": c, "row": int(r), "chosen_logp": float(a), "rejected_logp": float(b), "margin": float(a - b)}
            for c, r, a, b in zip(configs, rows, chosen, rejected, strict=True)]


# ---- changes between two steps -----------------------------------------------------------------------------
def _change(a: float | None, b: float | None, m: Mean) -> dict:
    return {"a": _num(a), "b": _num(b), "change": _num(m.estimate), "lo": _num(m.lo), "hi": _num(m.hi),
            "p": _num(m.p)}


def prefs_change(a: dict, b: dict, *, level: float = DEFAULT_LEVEL, n_resamples: int = DEFAULT_RESAMPLES,
                 seed: int | None = 0) -> dict:
    """The paired change ``B - A`` of accuracy and margin between two prefs blocks of the same pairs (equal token
    digests), over all pairs and per config; :class:`~tinymcf_callback.errors.CompareError` for other pairs."""
    if a.get("token_digest") != b.get("token_digest") or len(a.get("pairs") or []) != len(b.get("pairs") or []):
        raise CompareError("the two preference scorings asked different pairs or tokens (another source, subset or "
                           "tokenizer: their token_digest differs): a paired change needs the same pairs")
    if not a.get("pairs"):
        raise CompareError("the preference scorings hold no per-pair rows to pair")
    ma = np.array([r["margin"] for r in a["pairs"]], dtype=float)
    mb = np.array([r["margin"] for r in b["pairs"]], dtype=float)
    configs = [r["config"] for r in a["pairs"]]
    d_acc = (mb > 0).astype(float) - (ma > 0).astype(float)
    acc = stratified_means(d_acc, configs, level=level, n_resamples=n_resamples, seed=seed, bounds=(-1.0, 1.0))
    mar = stratified_means(mb - ma, configs, level=level, n_resamples=n_resamples, seed=seed)
    rows_a = {r["config"]: r for r in a.get("configs") or []}
    rows_b = {r["config"]: r for r in b.get("configs") or []}
    per_config = [{"config": c, "n": acc["n"][c],
                   "accuracy": _change(rows_a.get(c, {}).get("accuracy"), rows_b.get(c, {}).get("accuracy"),
                                       acc["groups"][c][0]),
                   "margin": _change(rows_a.get(c, {}).get("margin"), rows_b.get(c, {}).get("margin"),
                                     mar["groups"][c][0])} for c in acc["groups"]]
    return {"n_pairs": len(ma), "level": level, "method": f"paired: {acc['method']}",
            "accuracy": _change(a.get("accuracy"), b.get("accuracy"), acc["pooled"][0]),
            "margin": _change(a.get("margin"), b.get("margin"), mar["pooled"][0]), "configs": per_config}


def lm_eval_change(a: dict, b: dict, task: str, *, level: float = DEFAULT_LEVEL,
                   n_resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0) -> dict:
    """The change ``B - A`` of one lm-eval task's score between two lm-eval blocks: paired over the documents when
    both logged each document's score (the same documents), else from the two standard errors lm-eval reported
    (a normal interval, unpaired: wider than a paired one)."""
    ta, tb = a["tasks"].get(task), b["tasks"].get(task)
    if ta is None or tb is None:
        raise CompareError(f"lm-eval task {task!r} is not in both scorings")
    docs_a, docs_b = ta.get("docs") or {}, tb.get("docs") or {}
    if docs_a.get("doc_id") and docs_a.get("doc_id") == docs_b.get("doc_id"):
        diff = np.array(docs_b["value"], dtype=float) - np.array(docs_a["value"], dtype=float)
        m = stratified_means(diff, [task] * len(diff), level=level, n_resamples=n_resamples, seed=seed)["pooled"][0]
        return {**_change(ta["value"], tb["value"], m), "metric": ta["metric"], "paired": True, "n": len(diff)}
    se = [t.get("stderr") for t in (ta, tb)]
    change = tb["value"] - ta["value"]
    if any(s is None or not math.isfinite(s) for s in se):
        m = Mean(change, math.nan, math.nan, math.nan)
    else:
        total = math.sqrt(se[0] ** 2 + se[1] ** 2)
        z = NormalDist().inv_cdf(0.5 + level / 2.0)
        p = 2.0 * NormalDist().cdf(-abs(change) / total) if total > 0 else (1.0 if change == 0 else 0.0)
        m = Mean(change, change - z * total, change + z * total, p)
    return {**_change(ta["value"], tb["value"], m), "metric": ta["metric"], "paired": False, "n": ta.get("n")}


# ---- agreement ---------------------------------------------------------------------------------------------
AGREE, DISAGREE, CANNOT_TELL = "agree", "disagree", "cannot tell"


def direction(change: dict) -> int:
    """+1 when the change's interval lies above 0, -1 below, 0 when it holds 0 (or is unknown)."""
    lo, hi = change.get("lo"), change.get("hi")
    if lo is None or hi is None:
        return 0
    return 1 if lo > 0 else -1 if hi < 0 else 0


def agreement(probe: dict, benchmark: dict) -> tuple[str, str]:
    """Whether two changes (each ``{"change", "lo", "hi"}``) agree in sign: ``agree`` when both intervals exclude 0
    on the same side, ``disagree`` on opposite sides, ``cannot tell`` when either holds 0; and why, in words."""
    dp, db = direction(probe), direction(benchmark)
    word = {1: "rose", -1: "fell"}
    if dp and db:
        verdict = AGREE if dp == db else DISAGREE
        return verdict, f"the probe's score {word[dp]} and the benchmark {word[db]}"
    held = [who for who, d in (("the probe's", dp), ("the benchmark's", db)) if not d]
    return CANNOT_TELL, f"{' and '.join(held)} interval{'s hold' if len(held) > 1 else ' holds'} 0"
