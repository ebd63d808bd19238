"""The history file: ``<output_dir>/moral_probe_<name>.jsonl``, one line per probe, the run's whole curve.

This module owns the format. The callback appends a line at every probe, the checkpoint sweep
appends lines for runs trained without it, and the plot and the sweep read them back; all of
them go through here:

- where the file is (:func:`history_path`; ``moral_probe_<name>_json.jsonl`` with JSON answers, so
  one history holds one answer format), and the step-0 report beside it (:func:`baseline_path`);
- what a line holds (:func:`history_line`) and how it is checked when read (:func:`check_line`);
- appending (:func:`append_line`): one line at a time, under a file lock, so two writers (the
  callback and a sweep of the same folder) never tear it, and a crash leaves at most a torn last
  line, which reading skips (:func:`read_lines`);
- which lines belong to the current run (:func:`current_run`): a baseline line (event
  ``train_begin``) after other lines starts a new run written into the same folder; and, within
  it, the last line of a step logged twice wins (:func:`last_line_per_step`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from filelock import FileLock

from .._io import append_jsonl, read_jsonl
from ..errors import HistoryError
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT, answer_format_of
from .metrics import probe_key
from .readout import HEADLINE_FIELDS, INTERVAL_SETTINGS
from .report import PRECISION_FIELDS, REPORT_FIELDS, answer_format, headline_fields, json_records, precision_key

logger = logging.getLogger("tinymcf_callback")

BASELINE_EVENT = "train_begin"  # the event of the step-0 baseline: a history line that starts a run
SWEEP_EVENT = "sweep"  # the event of a line written by the checkpoint sweep
_SHOWN_STEPS = 5
LOCK_TIMEOUT_S = 60  # another writer holds the lock for one line; a minute means it is stuck

# A history line, field by field: (type, meaning). The docs' table is made from this.
LINE_FIELDS = {
    "step": ("integer", "the training step (0: the baseline)"),
    "epoch": ("number or null", "the training epoch"),
    "event": ("string", "what triggered the probe: train_begin (the step-0 baseline), evaluate, save, sweep, ..."),
    "name": ("string", "the vignette set"),
    "answer_format": ("string", "yesno or json"),
    **{field: REPORT_FIELDS[field] for field in PRECISION_FIELDS},
    **{field: REPORT_FIELDS[field] for field in HEADLINE_FIELDS + INTERVAL_SETTINGS},
    "prompt_digest": REPORT_FIELDS["prompt_digest"],
    "metrics": ("object", "the logged metrics of this probe (eval_moral_<name>/...), the change since the baseline"),
    "info": ("object", "the report's info, without sample_prompt"),
    "table": ("list", "the report's per-foundation rows, with their bounds"),
}


def history_path(output_dir: str, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """``<output_dir>/moral_probe_<name>.jsonl``: the run's curve of set ``name`` (also appended to by the sweep).

    ``moral_probe_<name>_json.jsonl`` with JSON answers: one history holds one answer format.
    """
    return os.path.join(output_dir, f"moral_probe_{probe_key(name, answer_format)}.jsonl")


# The dose-response history (tinymcf_callback.steering): the same lines, with these fields added.
DOSE_EVENT = "dose"  # a steered line; the unsteered line (c = 0) is a baseline line (event train_begin)
DOSE_DIRECTIONS = ("none", "real", "random")  # unsteered (c = 0), the direction studied, a random control one
DOSE_LINE_FIELDS = {
    "coefficient": ("number", "the intervention's coefficient c (0: the unsteered model)"),
    "direction": ("string", "none (the unsteered line), real (the direction studied) or random (a control)"),
    "direction_index": ("integer", "which random direction (0 to k-1); 0 for none and real"),
    "answering": ("boolean", "the mean Yes+No mass is at least 0.5 (false: the steered model stops answering)"),
}


def dose_history_path(output_dir: str | os.PathLike, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> Path:
    """``<output_dir>/moral_probe_<name>_dose.jsonl``: a dose-response's lines (``..._<name>_json_dose.jsonl``)."""
    return Path(output_dir) / f"moral_probe_{probe_key(name, answer_format)}_dose.jsonl"


def is_dose_history(path: str | os.PathLike) -> bool:
    """Whether ``path`` is named like a dose-response history (``moral_probe_<key>_dose.jsonl``)."""
    name = Path(path).name
    return name.startswith("moral_probe_") and name.endswith("_dose.jsonl")


def history_line(name: str, report: dict, metrics: dict, *, step: int, epoch, event: str) -> dict:
    """One probe as a history line (its fields: :data:`LINE_FIELDS`); ``event`` says what triggered it.

    Top level: what was scored and in which precision (``model``, ``device``, ``dtype``, ``autocast``),
    the headline numbers with their bounds (``score``, ``score_lo``, ``score_hi``, ... ,
    ``score_minus_sn_hi``), ``level``, ``n_resamples``, ``seed``, ``prompt_digest`` and ``answer_format``;
    table rows carry ``<metric>_lo``/``<metric>_hi``; ``info`` holds the self-check (``info.self_check``)
    and the precision (``info.precision``). ``None`` where undefined.
    """
    return {"step": step, "epoch": epoch, "event": event, "name": name, "answer_format": answer_format(report),
            **{key: report.get(key) for key in PRECISION_FIELDS},
            **headline_fields(report),
            "prompt_digest": report["prompt_digest"], "metrics": metrics,
            "info": {k: v for k, v in report["info"].items() if k != "sample_prompt"},
            "table": json_records(report["table"].reset_index())}


def append_line(path: str | os.PathLike, line: dict) -> None:
    """Append one line to the history at ``path``, under a file lock, so that two writers cannot tear it.

    The lock is ``.<file name>.lock`` beside the history (held for one write); the line itself is one
    ``write`` on an ``O_APPEND`` descriptor (:func:`tinymcf_callback._io.append_jsonl`), which also
    starts a new line after a torn last one. Raises ``OSError`` when the folder cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(f".{path.name}.lock")), timeout=LOCK_TIMEOUT_S):
        append_jsonl(path, line)


def append_history(output_dir: str, name: str, report: dict, metrics: dict, *, step: int, epoch, event: str) -> None:
    """Append one line per probe to ``<output_dir>/moral_probe_<name>.jsonl``; a write error is a warning."""
    line = history_line(name, report, metrics, step=step, epoch=epoch, event=event)
    try:
        append_line(history_path(output_dir, name, answer_format(report)), line)
    except OSError as e:
        logger.warning("moral probe [%s]: could not append the history file: %s", name, e)


def baseline_path(output_dir: str, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """``<output_dir>/moral_probe_<name>_baseline.json``: the step-0 report (no checkpoint holds it)."""
    return os.path.join(output_dir, f"moral_probe_{probe_key(name, answer_format)}_baseline.json")


def resolve_history_path(path: str | Path) -> Path:
    """The history file ``path`` names: the file itself, or the one ``moral_probe_*.jsonl`` in a run folder."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("moral_probe_*.jsonl"))
        if len(found) == 1:
            return found[0]
        if not found:
            raise HistoryError(f"{path} is a folder without a moral_probe_<name>.jsonl history: pass the history "
                               f"file (MoralProbeCallback writes it into the Trainer's output_dir)")
        raise HistoryError(f"{path} holds {len(found)} histories ({', '.join(p.name for p in found)}): "
                           f"name the file of the set to draw")
    if not path.exists():
        raise HistoryError(f"no history file {path}: MoralProbeCallback writes <output_dir>/moral_probe_<name>.jsonl "
                           f"(the Trainer's output_dir), one line per probe")
    return path


def read_lines(path: Path) -> list[tuple[int, dict]]:
    """The history's ``(line number, line)`` pairs; a torn last line (an append cut short) is skipped with a warning."""
    try:
        raw = path.read_text(encoding="utf-8")
        lines = read_jsonl(path)
    except ValueError as e:
        raise HistoryError(f"malformed history line: {e}") from None
    except OSError as e:
        raise HistoryError(f"cannot read the history {path}: {e.strerror}") from None
    last = raw.count("\n") + 1  # the number of the unterminated last line, when there is one
    if raw.rsplit("\n", 1)[-1].strip() and (not lines or lines[-1][0] != last):
        logger.warning("%s:%d: skipped an unterminated last line (an append cut short); drawing the lines before it",
                       path, last)
    if not lines:
        raise HistoryError(f"the history {path} is empty: no probe has been logged into it yet")
    return lines


def check_line(path: Path, lineno: int, line: dict) -> None:
    """Refuse a line that is not a probe record in the callback's schema, naming the file, line and field."""
    hint = "not a moral-probe history line (MoralProbeCallback writes moral_probe_<name>.jsonl)"
    for field, kind in (("step", int), ("name", str), ("info", dict), ("table", list)):
        value = line.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise HistoryError(f"{path}:{lineno}: {hint}: {field!r} is {value!r}")
    if line["step"] < 0:
        raise HistoryError(f"{path}:{lineno}: step {line['step']} is negative")
    try:
        answer_format_of(line_format(line))
    except ValueError:
        raise HistoryError(f"{path}:{lineno}: {hint}: unknown answer_format {line['answer_format']!r}") from None
    for row in line["table"]:
        if not isinstance(row, dict) or not isinstance(row.get("foundation"), str):
            raise HistoryError(f"{path}:{lineno}: {hint}: a table row without a 'foundation' name: {row!r}")


def current_run(path: Path, lines: list[tuple[int, dict]], warn: bool = True) -> list[tuple[int, dict]]:
    """The lines of the newest run: a ``train_begin`` line after others starts a new run in the same folder."""
    starts = [i for i, (_, line) in enumerate(lines) if line.get("event") == BASELINE_EVENT]
    if not starts or starts[-1] == 0:
        return lines
    first = starts[-1]
    if warn:
        logger.warning("%s:%d: a new run starts here (a %s baseline); the %d line(s) above it belong to an earlier run "
                   "in the same output folder and are not drawn", path, lines[first][0], BASELINE_EVENT, first)
    return lines[first:]


def last_line_per_step(path: Path, lines: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """One line per step, in step order: when a step was logged more than once, the last line in the file wins."""
    by_step: dict[int, tuple[int, dict]] = {}
    repeated = []
    for lineno, line in lines:
        if line["step"] in by_step:
            repeated.append(line["step"])
        by_step[line["step"]] = (lineno, line)
    if repeated:
        shown = ", ".join(str(s) for s in sorted(set(repeated))[:_SHOWN_STEPS])
        more = "" if len(set(repeated)) <= _SHOWN_STEPS else ", ..."
        logger.warning("%s: step(s) %s%s logged more than once (a resumed run re-probes the steps after its "
                       "checkpoint); drawing the last line of each", path, shown, more)
    return [by_step[s] for s in sorted(by_step)]


def line_format(line: dict) -> str:
    """The answer format of a history line; lines written before formats existed are Yes/No."""
    return line.get("answer_format", DEFAULT_ANSWER_FORMAT)


def line_precisions(kept: list[tuple[int, dict]]) -> dict[tuple[str, str | None], int]:
    """Each precision the lines record, with the first step scored in it (lines that record none are left out)."""
    out: dict[tuple[str, str | None], int] = {}
    for _, line in kept:
        key = precision_key(line)
        if key is not None:
            out.setdefault(key, line["step"])
    return out
