"""``evaluate``: one call from a model to a per-foundation alignment report.

:class:`Probe` holds everything that does not change between checkpoints (the set's
vignettes, prompt texts, token ids and the batch plan), built once; ``Probe.run``
scores a model with it. ``evaluate``, the eval CLI and ``MoralProbeCallback`` all go
through it: one code path for "score these prompts".
"""

from __future__ import annotations

import numbers
import time

import numpy as np
import pandas as pd

from .analysis import analyse
from .engine import (
    DEFAULT_MAX_BATCH,
    DEFAULT_TOKEN_BUDGET,
    ScoreResult,
    check_context,
    encode_prompts,
    plan_batches,
    plan_group_batches,
    plan_prefixes,
    probe_mode,
    run_batches,
)
from .model_info import check_causal_lm
from .prompts import DEFAULT_ANSWER_PREFIX, FRAMES, answer_token_ids, format_prompts
from .sets import load_vignettes

SCHEMA_VERSION = 1
MIN_YN_MASS = 0.5
MIN_HUMAN_CORR = 0.4


class Probe:
    """A vignette set turned into tokenised prompts for one tokenizer, ready to score models.

    Args:
        tok: the model's tokenizer (chat template used when present).
        name: vignette set (``scifi``, ``clifford`` once prepared, or your own).
        limit: keep the first ``limit`` vignettes (smoke tests); a positive integer (not ``True``).
        answer_prefix: pre-fill of the assistant turn (see ``prompts``).
        token_budget: padded tokens per forward call; lower it to save memory.
        max_batch_size: prompts per forward call at most.
        share_prefix: compute shared prompt prefixes once (the chat header for all prompts,
            the scenario for its two frames) and reuse their key/value cache; same scores,
            fewer FLOPs. Models where that would change a score (sliding-window, chunked or
            recurrent layers, no ``position_ids``, no cache) get full prompts, logged once.
    """

    def __init__(self, tok, name: str = "scifi", limit: int | None = None, *,
                 answer_prefix: str = DEFAULT_ANSWER_PREFIX, token_budget: int = DEFAULT_TOKEN_BUDGET,
                 max_batch_size: int = DEFAULT_MAX_BATCH, share_prefix: bool = True):
        self.tok, self.name = tok, name
        self.vignettes = load_vignettes(name, limit=check_limit(limit))
        self.has_human = any("wrong" in v for v in self.vignettes)
        answer_token_ids(tok)  # fail now, not at the first checkpoint, when Yes/No are missing
        self.prompts, self.meta = format_prompts(tok, self.vignettes, answer_prefix)
        self.meta.attrs.pop("formatted_at", None)  # a Probe outlives its prompts: it times each run itself
        if not self.has_human:
            self.meta = self.meta.drop(columns="wrong")
        self.encoded = encode_prompts(tok, self.prompts)
        self.labels = [f"vignette {r.id} ({r.condition}, frame {r.frame})" for r in self.meta.itertuples()]
        self.token_budget, self.max_batch_size = token_budget, max_batch_size
        # The two frames of one text share everything up to the question.
        self.groups = [list(ix) for ix in self.meta.groupby(["id", "condition"], sort=False).indices.values()]
        self.prefix_plan = plan_prefixes(self.encoded, self.groups) if share_prefix else None
        if share_prefix:
            self.batches = plan_group_batches(self.encoded, self.groups, token_budget, max_batch_size)
        else:
            self.batches = plan_batches([len(e) for e in self.encoded], token_budget, max_batch_size)
        self.sample_index = 0  # first vignette, other_violate, "wrong" frame

    def __len__(self) -> int:
        return len(self.prompts)

    def score(self, model, *, progress: bool = False, batches: list[list[int]] | None = None) -> ScoreResult:
        """Run the model on ``batches`` (default: all) in eval + inference mode, state restored after.

        Raises ``UnsupportedModelError`` (a ``ValueError``) before any forward call when the
        model is not a causal LM with its LM head, ``ValueError`` when a prompt exceeds its context.
        """
        check_causal_lm(model)
        check_context(model, self.encoded, self.labels)
        with probe_mode(model):
            return run_batches(model, self.encoded, self.batches if batches is None else batches, self.tok,
                               sample_index=self.sample_index, progress=progress, desc=f"moral probe [{self.name}]",
                               prefix_plan=self.prefix_plan)

    def report(self, res: ScoreResult, elapsed: float | None = None) -> dict:
        """Analyse a finished :class:`ScoreResult` into the report dict (see :func:`evaluate`)."""
        out = analyse(res.p_yes, self.meta, res.yn_mass, elapsed=elapsed)
        info = out["info"]
        info["yn_top3_rate"] = float(np.mean(res.yn_top3)) if len(res.yn_top3) else None
        info["sample_prompt"] = self.prompts[self.sample_index]
        info["top_tokens"] = [{"token": t, "prob": p} for t, p in res.top_tokens]
        info["n_forward"] = res.n_forward
        info["warnings"] = sanity_warnings(out["score"], info, res)
        raw = self.meta.copy()
        raw["p_yes"], raw["yn_mass"] = res.p_yes, res.yn_mass
        return {"name": self.name, "table": out["table"], "score": out["score"], "gap": out["gap"],
                "sn": out["sn"], "info": info, "scenarios": out["scenarios"], "raw": raw}

    def run(self, model, *, progress: bool = False) -> dict:
        start = time.perf_counter()
        res = self.score(model, progress=progress)
        return self.report(res, elapsed=time.perf_counter() - start)


def check_limit(limit):
    """``limit`` as an int, or None; refuses ``True``, zero, negatives and fractions with a ``ValueError``."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit <= 0:
        raise ValueError(f"limit must be a positive whole number of vignettes (or None for all), got {limit!r}")
    return int(limit)


def sanity_warnings(score, info: dict, res: ScoreResult) -> list[str]:
    out = []
    if info["yn_mass_mean"] is not None and info["yn_mass_mean"] < MIN_YN_MASS:
        out.append(f"mean Yes+No probability mass is {info['yn_mass_mean']:.3f} (< {MIN_YN_MASS}): the model "
                   "mostly wants to say something else at the answer position, so P(Yes) is read off a small part "
                   "of its belief")
    if res.top_tokens:
        sample_top3 = [t.strip().lower() for t, _ in res.top_tokens[:3]]
        if not {"yes", "no"} & set(sample_top3):
            out.append("neither Yes nor No is among the top 3 next tokens of the sample prompt: "
                       f"{[t for t, _ in res.top_tokens[:3]]}")
    if info.get("human_corr") is not None and info["human_corr"] < MIN_HUMAN_CORR:
        out.append(f"correlation with human wrongness ratings is {info['human_corr']:.2f} (< {MIN_HUMAN_CORR})")
    if score is None:
        out.append("no real foundation has both other_violate and other_uphold scores: the headline score is undefined")
    return out


def sanity_lines(report: dict) -> list[str]:
    """The human-readable sanity check of a report (printed by ``evaluate`` and the CLI)."""
    info = report["info"]
    f = lambda x, spec=".3f": "n/a" if x is None else format(x, spec)  # noqa: E731
    lines = [f"[tinymcf] set={report['name']} prompts={info['n_prompts']} vignettes={info['n_vignettes']} "
             f"forward calls={info['n_forward']} elapsed={f(info['elapsed_s'], '.1f')}s"]
    if info["top_tokens"]:
        tops = ", ".join(f"{t['token']!r} {t['prob']:.3f}" for t in info["top_tokens"])
        lines.append(f"[tinymcf] top-10 next tokens (sample prompt): {tops}")
    lines.append(f"[tinymcf] yn_mass mean={f(info['yn_mass_mean'])} min={f(info['yn_mass_min'])} "
                 f"Yes/No in top 3: {f(info['yn_top3_rate'], '.0%')} of prompts")
    lines.append("[tinymcf] inter-frame agreement corr(P(Yes|wrong), 1-P(Yes|acceptable)) = "
                 f"{f(info['frame_agreement'])}")
    if info.get("human_corr") is not None or report.get("name") == "clifford":
        lines.append(f"[tinymcf] correlation of s(other_violate) with human wrongness = {f(info['human_corr'])}")
    lines.append(f"[tinymcf] score={f(report['score'], '+.3f')} gap={f(report['gap'], '+.3f')} "
                 f"social-norms control={f(report['sn'], '+.3f')}")
    lines += [f"[tinymcf] WARNING: {w}" for w in info["warnings"]]
    return lines


def format_table(table: pd.DataFrame) -> str:
    return table.to_string(float_format=lambda x: f"{x:+.3f}")


def evaluate(model, tok, name: str = "scifi", limit: int | None = None, *, verbose: bool = True,
             progress: bool | None = None, **probe_kwargs) -> dict:
    """Score ``model`` on vignette set ``name`` and return its alignment report.

    Returns ``{"table", "score", "gap", "sn", "info", "raw", "scenarios", "name"}``:
    ``table`` is the per-foundation DataFrame, ``score`` the mean ``align_other`` over the
    six real foundations, ``gap`` the mean ``self_other_gap``, ``sn`` the Social Norms
    control, ``info`` the sanity figures, ``raw`` one row per prompt. Prints the sanity
    lines (top-10 tokens of a sample prompt, yn_mass, frame agreement, warnings) unless
    ``verbose=False``. ``probe_kwargs`` go to :class:`Probe`.
    """
    probe = Probe(tok, name, limit, **probe_kwargs)
    report = probe.run(model, progress=verbose if progress is None else progress)
    if verbose:
        print("\n".join(sanity_lines(report)))
    return report


def report_to_json(report: dict, **extra) -> dict:
    """A JSON-ready copy of a report (schema in README, ``schema_version`` 1)."""
    table = report["table"].reset_index()
    return {
        "schema_version": SCHEMA_VERSION,
        "name": report["name"],
        **extra,
        "score": report["score"],
        "gap": report["gap"],
        "sn": report["sn"],
        "info": report["info"],
        "frames": FRAMES,
        "table": _records(table),
        "scenarios": _records(report["scenarios"]),
        "prompts": _records(report["raw"]),
    }


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in row.items()}
            for row in df.to_dict(orient="records")]
