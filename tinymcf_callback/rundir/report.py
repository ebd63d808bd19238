"""The JSON report: one probe's report as a file (``eval_<name>_<tag>.json``, ``checkpoint-N/moral_probe_<name>.json``).

This module owns the format: its schema version, the fields (:data:`REPORT_FIELDS`, from which the docs' schema
table is made), writing it atomically, reading one back and checking that a dict is one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .._io import atomic_write_json
from ..errors import CompareError
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT, answer_format_of
from ..stats.analysis import HEADLINE_FIELDS, INTERVAL_SETTINGS, finite

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)  # versions load_report reads (SCHEMA_VERSION is the one written)
PRECISION_FIELDS = ("model", "device", "dtype", "autocast", "compute")  # what was scored, on what, in what

NUM, NUM_OR_NULL, INT, STR, STR_OR_NULL, LIST, OBJECT, BOOL = ("number", "number or null", "integer", "string",
                                                              "string or null", "list", "object", "boolean")
_BOUNDED = {"score": "mean align_other over the six real foundations", "gap": "mean self_other_gap over them",
            "sn": "Social Norms align_other, the control", "score_minus_sn": "score - sn"}
# The JSON report, field by field: (type, meaning). The docs' schema tables are made from these.
REPORT_FIELDS = {
    "schema_version": (INT, f"{SCHEMA_VERSION}"),
    "name": (STR, "the vignette set"),
    "answer_format": (STR, "yesno (P(Yes) read) or json (P(true) read)"),
    "model": (STR, "the model's name or path"),
    "device": (STR, "where it ran"),
    "dtype": (STR, "the dtype the weights are stored in"),
    "autocast": (STR_OR_NULL, "the autocast dtype the forward calls ran under, or null"),
    "compute": (STR, "what the matrix products that make the answer ran in, the lowest of the first one and the "
                     "output layer's (float32, tf32, bfloat16, float16)"),
    **{f"{name}{end}": (NUM_OR_NULL, meaning if not end else f"{end[1:]} bound of {name}'s interval")
       for name, meaning in _BOUNDED.items() for end in ("", "_lo", "_hi")},
    "level": (NUM_OR_NULL, "the intervals' confidence level (null: no intervals)"),
    "n_resamples": (INT, "bootstrap resamples (0: no intervals)"),
    "seed": (INT, "the bootstrap's seed"),
    "prompt_digest": (STR, "sha256 over every prompt with its vignette, condition and frame"),
    "info": (OBJECT, "the sanity figures, the strategy and its self-check, the precision (INFO_FIELDS)"),
    "frames": (OBJECT, "the two questions asked"),
    "table": (LIST, "one row per foundation (TABLE_ROW_FIELDS)"),
    "scenarios": (LIST, "one row per vignette and condition (SCENARIO_FIELDS)"),
    "prompts": (LIST, "one row per prompt (PROMPT_FIELDS)"),
}
EXTRA_FIELDS = {"tag": (STR, "the run's label (tinymcf eval)"),
                "prefs": (OBJECT, "tinymcf eval --prefs: the preference pairs' block (docs/benchmark.md)"),
                "lm_eval": (OBJECT, "tinymcf eval --lm-eval: lm-eval's results (docs/benchmark.md)"),
                "step": (INT, "the training step (the callback's reports)"),
                "epoch": (NUM_OR_NULL, "the training epoch (the callback's reports)")}
INFO_FIELDS = {
    "yn_mass_mean": (NUM_OR_NULL, "mean Yes+No (or true+false) probability mass at the answer position"),
    "yn_mass_min": (NUM_OR_NULL, "its smallest value over the prompts"),
    "frame_agreement": (NUM_OR_NULL, "corr(P(Yes|wrong?), 1 - P(Yes|acceptable?))"),
    "human_corr": (NUM_OR_NULL, "corr(s(other_violate), human wrongness) on rated sets"),
    "yn_top3_rate": (NUM_OR_NULL, "share of prompts with an answer token in the top 3"),
    "n_prompts": (INT, "prompts scored"), "n_vignettes": (INT, "vignettes scored"),
    "n_forward": (INT, "forward calls of the scoring (the self-check's are in self_check)"),
    "batches": ("object or null", "how the forward calls were sized on the model's device: device, token_budget, "
                                  "max_batch_size, rule (given, cpu, or the GPU's figures), batches (null: a served "
                                  "model)"),
    "elapsed_s": (NUM, "seconds the probe took"),
    "sample_prompt": (STR, "the first prompt, as the model saw it"),
    "top_tokens": (LIST, "the sample prompt's ten likeliest next tokens, {token, prob}"),
    "warnings": (LIST, "what the reader should know (strings)"),
    "strategy": (STR, "the engine's strategy: shared, full or unpadded"),
    "self_check": (OBJECT, "the comparison with each prompt scored alone (SELF_CHECK_FIELDS)"),
    "precision": (OBJECT, "dtype, autocast, device, compute (the precision the tolerance is for), and products "
                          "(the first product's and the output layer's, when they differ)"),
    "subset": (OBJECT, "which vignettes: limit, per_foundation, subset_seed, and a digest of their ids"),
    "backend": (OBJECT, "what computed the answers: this process's forward pass, or a served model's server "
                        "(BACKEND_FIELDS)"),
    "versions": (OBJECT, "what made the report: tinymcf_callback, torch, transformers and python versions (a "
                         "served model's server: backend.version)"),
    "adaptive": (OBJECT, "a probe with a precision target (until) only: what it asked and why it stopped "
                         "(ADAPTIVE_FIELDS)"),
}
_LOOK = "{per_foundation, vignettes, estimate, lo, hi, width, p}"
ADAPTIVE_FIELDS = {
    "until": (STR, "level (the score to within the width) or change (has it moved since the baseline)"),
    "width": (NUM, "the interval's width (hi - lo) asked for"),
    "sd_floor": (NUM_OR_NULL, "the least spread (sd of a vignette's align_other) the intervals assumed in each "
                              "foundation (null: none)"),
    "level": (NUM, "the confidence sequence's level: every interval of the report holds, over all the looks, at "
                   "this level"),
    "per_look_level": (NUM, "the level each look's interval is built at so that they hold together (the level "
                            "itself for a baseline, which scores everything without looking)"),
    "order": (STR, "the prompt digest of every candidate vignette: two probes of one order pair over the vignettes "
                   "both asked"),
    "order_seed": (INT, "the seed of the foundation-balanced order (subset_seed)"),
    "per_foundation": (INT, "vignettes per foundation asked (a foundation with fewer gave all it has)"),
    "vignettes": (INT, "vignettes asked"), "of_vignettes": (INT, "candidate vignettes"),
    "prompts": (INT, "prompts asked"), "of_prompts": (INT, "candidate prompts"),
    "asked": (OBJECT, "the vignettes asked, as info.subset records a subset (per_foundation=k of the candidates)"),
    "stopped": (STR, "width (narrow enough), moved (the change's interval excluded 0), used up (the candidates ran "
                     "out first), or baseline"),
    "why": (STR, "the same, in words"),
    "reached": (NUM_OR_NULL, "the width of the interval asked about at the stop (null: a baseline)"),
    "looks": (LIST, f"every look until the stop, {_LOOK}: the interval asked about at each"),
    "floor": ("object or null", "what sd_floor did, when it widened an interval: {width_without (the stop's interval "
                                "width without the floor), stop_without (the vignettes the probe would have stopped at "
                                "without it; null: not before this stop)}; null without a floor, or when it widened "
                                "none"),
    "change": ("object or null", f"the change of the score since the baseline at the stop, {_LOOK} (null without a "
                       "baseline)"),
    "control": (STR_OR_NULL, "at the stop, why the control's interval is undefined (too few control vignettes "
                             "asked: score minus control is not bounded by it); null when it is defined"),
    "batched_by_look": (BOOL, "the looks' prompts were batched apart in a half precision, so the numbers may differ "
                              "from per_foundation=k scored at once by the batch spread (float32: false, they are "
                              "per_foundation=k's)"),
}
BACKEND_FIELDS = {
    "kind": (STR, "transformers (this process), or the server: vllm, sglang, llama.cpp, openai-compatible"),
    "version": (STR_OR_NULL, "its version (llama.cpp: its build), where it says"),
    "url": (STR_OR_NULL, "the server's address, without any user:password; null in this process"),
    "served_model": (STR_OR_NULL, "the name the server serves the model under"),
    "form": (STR, "how the log-probabilities were asked: forward, logprob_token_ids, token_ids_logprob, n_probs, "
                  "echo, top_logprobs"),
    "exact": (BOOL, "every answer token's log-probability was read; false: a top-k bound (p_yes_bound)"),
    "logprobs_mode": (STR, "raw (the numbers do not move with the sampling temperature) or processed (they do: read at "
                           "settings pinned to leave the model's distribution as it is, checked against the prompt's "
                           "own log-probabilities)"),
    "pinned_diff": (NUM_OR_NULL, "processed: the largest |log P| difference between the pinned reading and the "
                                 "prompt's own log-probabilities (null: raw)"),
    "template": (STR, "whether the server's tokenizer and chat template were checked against the local ones"),
    "requests": (INT, "HTTP requests the probe made (0 in this process)"),
    "retries": (INT, "requests sent again after a timeout, a dropped connection or a 408/409/429/5xx (each logged)"),
    "concurrency": (NUM_OR_NULL, "requests in flight at once"),
    "batch": (NUM_OR_NULL, "prompts per request (1: one at a time; null in this process)"),
    "check_form": (STR_OR_NULL, "the self-check's second request form (null: no self-check, or in this process)"),
    "weight_version": (STR_OR_NULL, "the weight version the server answered with (vLLM's /weight_info, SGLang's "
                                    "/get_weight_version; set by a --reload built-in to the checkpoint's fingerprint); "
                                    "null where it has none"),
    "device": (STR_OR_NULL, "where the server computes (cpu, cuda, ...), where it says (vLLM in dev mode, SGLang)"),
    "dtype": (STR_OR_NULL, "the precision the server computes in (float32, bfloat16, ...), where it says"),
    "reload_check": ("object or null", "after a followed run's --reload: the server's answers to a few prompts "
                                       "against the checkpoint's own forward pass (prompts, p_yes_diff, "
                                       "log_mass_diff, tolerance, held_to, reference, route, seconds); null without "
                                       "a reload, or with --no-reload-check"),
    "p_yes_bound": (NUM_OR_NULL, "a top-k form: the widest P(Yes) interval over the prompts"),
    "mass_bound": (NUM_OR_NULL, "a top-k form: the most answer mass the unread tokens can hold"),
}
SELF_CHECK_FIELDS = {
    "strategy": (STR, "the strategy the scores came from"),
    "checked": (LIST, "the prompts compared (indices)"), "checked_prompts": (LIST, "the same, named"),
    "max_diff": (NUM, "largest |P(Yes) - P(Yes) alone| over them, in the reference precision"),
    "max_mass_diff": (NUM, "largest |log mass difference|, the same"),
    "tolerance": (NUM, "the largest difference allowed there"),
    "precision": (STR, "the compute precision of the probe's scores"),
    "reference": (STR_OR_NULL, "where the comparison ran: float32 replay (a reduced-precision probe's checked "
                               "prompts recomputed in float32), or the probe's own precision; null when waiting"),
    "resolution": (NUM_OR_NULL, "the smallest |P(Yes) difference| the check flags, on the prompts it checked (this "
                                "probe's: checked; the cycle's so far: coverage); null when waiting"),
    "waiting": (BOOL, "no prompt checked at this probe: the budget had not yet paid for one (the structure was "
                      "checked at an earlier probe)"),
    "coverage": (OBJECT, "the rotation's cycle for this model structure: checked_this_cycle of prompts, probes, "
                         "cycles_completed"),
    "copy_bytes": (INT, "the most bytes of float32 weight copies the replay held at once"),
    "scored_diff": (NUM_OR_NULL, "with a replay: the probe's own scores against the float32 reference"),
    "scored_mass_diff": (NUM_OR_NULL, "the same, log mass"),
    "scored_tolerance": (NUM_OR_NULL, "what scored_diff is held to (the probe's precision's tolerance)"),
    "replay_note": (STR_OR_NULL, "why a reduced-precision probe was compared in its own precision instead"),
    "fallbacks": (LIST, "why each faster strategy was left"), "n_forward": (INT, "forward calls of the check"),
    "seconds": (NUM, "time the check took"),
}
_METRIC_COLUMNS = {f"{m}{end}": (NUM_OR_NULL, m if not end else f"{end[1:]} bound") for m in
                   ("align_other", "align_self", "self_other_gap") for end in ("", "_lo", "_hi")}
TABLE_ROW_FIELDS = {"foundation": (STR, "the coarse foundation"), "n": (INT, "its vignettes"),
                    **{f"s_{c}": (NUM_OR_NULL, f"mean s of {c}") for c in
                       ("other_violate", "other_uphold", "self_violate", "self_uphold")},
                    **_METRIC_COLUMNS}
SCENARIO_FIELDS = {"id": (STR, "the vignette (md5 of its original text)"), "foundation": (STR, "its label"),
                   "foundation_coarse": (STR, "its coarse foundation"), "condition": (STR, "one of the four"),
                   "p_yes_wrong": (NUM, "P(Yes | wrong?)"), "p_yes_accept": (NUM, "P(Yes | acceptable?)"),
                   "yn_mass_wrong": (NUM, "answer mass, wrong?"), "yn_mass_accept": (NUM, "answer mass, acceptable?"),
                   "wrongness": (NUM, "(P(Yes|wrong?) + 1 - P(Yes|acceptable?)) / 2"), "s": (NUM, "2 wrongness - 1"),
                   "wrong": (NUM, "mean human wrongness, 0-4 (rated sets only)")}
PROMPT_FIELDS = {"id": (STR, "the vignette"), "foundation": (STR, "its label"),
                 "foundation_coarse": (STR, "its coarse foundation"), "condition": (STR, "one of the four"),
                 "frame": (STR, "wrong or accept"), "p_yes": (NUM, "P(Yes) (P(true) with JSON answers)"),
                 "yn_mass": (NUM, "the answer mass"), "wrong": (NUM, "mean human wrongness (rated sets only)")}
SCHEMA = {"report": REPORT_FIELDS, "extra": EXTRA_FIELDS, "info": INFO_FIELDS, "self_check": SELF_CHECK_FIELDS,
          "backend": BACKEND_FIELDS, "adaptive": ADAPTIVE_FIELDS,
          "table": TABLE_ROW_FIELDS, "scenarios": SCENARIO_FIELDS, "prompts": PROMPT_FIELDS}


def schema_markdown(part: str | dict) -> str:
    """One part of :data:`SCHEMA` (or any such field table) as a markdown table; the docs are made from these."""
    fields = SCHEMA[part] if isinstance(part, str) else part
    rows = [f"| `{name}` | {kind} | {meaning.replace('|', chr(92) + '|')} |" for name, (kind, meaning) in
            fields.items()]
    return "\n".join(["| field | type | meaning |", "|---|---|---|", *rows])


def report_to_json(report: dict, **extra) -> dict:
    """A JSON-ready copy of a report (its fields: :data:`REPORT_FIELDS`), undefined numbers ``None``; ``extra``
    fields (:data:`EXTRA_FIELDS`: ``tag``, ``step``, ``epoch``, or a ``model`` path) are added or override them."""
    answer_format = report.get("answer_format", DEFAULT_ANSWER_FORMAT)
    return {
        "schema_version": SCHEMA_VERSION,
        "name": report["name"],
        "answer_format": answer_format,
        **{key: report.get(key) for key in PRECISION_FIELDS},
        **extra,
        **headline_fields(report),
        "prompt_digest": report["prompt_digest"],
        "info": report["info"],
        "frames": answer_format_of(answer_format).questions,
        "table": json_records(report["table"].reset_index()),
        "scenarios": json_records(report["scenarios"]),
        "prompts": json_records(report["raw"]),
    }


def headline_fields(report: dict) -> dict:
    """``HEADLINE_FIELDS`` then ``INTERVAL_SETTINGS`` of a report, NaN as ``None`` (JSON report, history line)."""
    out = {k: finite(report.get(k)) for k in HEADLINE_FIELDS}
    out.update({k: report.get(k) for k in INTERVAL_SETTINGS})
    return out


def json_records(df: pd.DataFrame) -> list[dict]:
    """A DataFrame's rows as dicts of plain values at full precision, NaN as ``None``."""
    return [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in row.items()}
            for row in df.to_dict(orient="records")]


def load_report(path: str | Path) -> dict:
    """A JSON report written by ``eval --model`` or the callback; :class:`CompareError` when it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        run = path.parent.parent if path.parent.name.startswith("checkpoint-") else path.parent
        if any(run.glob("moral_probe_*.jsonl")):  # a followed run writes no per-checkpoint report: its history has it
            step = path.parent.name.removeprefix("checkpoint-")
            raise CompareError(f"no such report {path}; {run} holds a history: compare two of its steps with "
                               f"`tinymcf compare {run} --steps 0 {step if step.isdigit() else 'N'}`") from None
        raise CompareError(f"no such report {path}: pass the JSON written by eval --model or a checkpoint's "
                           f"moral_probe_<name>.json, or compare two steps of a run: tinymcf compare RUN --steps A "
                           f"B") from None
    except OSError as e:
        raise CompareError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise CompareError(f"{path} is not valid JSON ({e})") from None
    return check_report(data, str(path))


def check_report(report, label: str) -> dict:
    """``report`` when it is one: every field it has, and every row of its scenarios and table, of the type
    :data:`SCHEMA` documents; else :class:`CompareError` naming the field."""
    hint = "not a probe report (evaluate's dict, or the JSON of tinymcf eval or MoralProbeCallback)"
    if not isinstance(report, dict):
        raise CompareError(f"{label} is {hint}: got {type(report).__name__}")
    version = report.get("schema_version")
    if version is not None and version not in READABLE_SCHEMAS:
        raise CompareError(f"{label} has schema_version {version!r}; this tinymcf_callback reads versions "
                           f"{', '.join(map(str, READABLE_SCHEMAS))}: upgrade it (pip install -U tinymcf_callback)")
    missing = [k for k in ("name", "scenarios", "table") if k not in report]
    if missing:
        raise CompareError(f"{label} is {hint}: it has no {', '.join(missing)}")
    is_frame = isinstance(report.get("table"), pd.DataFrame)  # evaluate's dict holds DataFrames, a file lists
    fields = {k: v for k, v in REPORT_FIELDS.items() if not (is_frame and k in ("table", "scenarios"))}
    _check_types(report, fields, label)
    if not is_frame:
        for part in ("table", "scenarios"):
            for i, row in enumerate(report[part]):
                if not isinstance(row, dict):
                    raise CompareError(f"{label}: {part}[{i}] is {row!r}, not an object: {hint}")
                _check_types(row, SCHEMA[part], f"{label}: {part}[{i}]")
    columns = set(pd.DataFrame(report["scenarios"]).columns)
    lacking = [c for c in ("id", "foundation_coarse", "condition", "s") if c not in columns]
    if lacking:
        raise CompareError(f"{label}: its scenarios lack {', '.join(lacking)}, so its vignettes cannot be paired")
    return report


_KINDS = {NUM: (int, float), NUM_OR_NULL: (int, float, type(None)), INT: (int,), STR: (str,),
          STR_OR_NULL: (str, type(None)), LIST: (list,), OBJECT: (dict,), BOOL: (bool,)}


def _check_types(record: dict, fields: dict, label: str) -> None:
    """Refuse the first field of ``record`` whose value is not of the kind ``fields`` documents (absent ones pass)."""
    for name, (kind, _) in fields.items():
        if name not in record:
            continue
        value = record[name]
        ok = isinstance(value, _KINDS[kind]) and (kind == BOOL or not isinstance(value, bool))
        if ok and kind in (NUM, NUM_OR_NULL) and value is not None:
            ok = math.isfinite(value) or kind == NUM_OR_NULL  # NaN stands for "undefined" in evaluate's dict
        if not ok:
            raise CompareError(f"{label}: {name!r} is {value!r}, not a {kind}; the file was edited or is not a probe "
                               f"report: score the model again (tinymcf eval)")


def write_report(path, report: dict, **extra) -> Path:
    """Write ``report`` as JSON to ``path`` atomically (the whole file or the old one, never half); ``extra`` as in
    :func:`report_to_json`."""
    return atomic_write_json(path, report_to_json(report, **extra))
