"""The history file: ``<output_dir>/moral_probe_<name>.jsonl``, one line per probe, the run's whole curve.

This module owns the format; every writer (the callback, the sweep, the watcher) and reader (the plot, the sweep)
goes through it. The fields and every reader's rules: docs/formats.md, "The history".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path

from filelock import FileLock, Timeout

from .._io import append_jsonl, read_jsonl
from ..errors import HistoryError
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT, answer_format_of
from ..stats.analysis import HEADLINE_FIELDS, INTERVAL_SETTINGS
from ..stats.metrics import (
    BASELINE_EVENT,
    answer_format,
    baseline_record,
    change_metrics,
    count_tests,
    probe_key,
    report_metrics,
)
from .precision import Precision
from .report import PRECISION_FIELDS, REPORT_FIELDS, headline_fields, json_records

logger = logging.getLogger("tinymcf_callback")

SWEEP_EVENT = "sweep"  # the event of a line written by the checkpoint sweep
WATCH_EVENT = "watch"  # the event of a line written by tinymcf watch while the run trains
DELETED_EVENT = "deleted"  # a saved checkpoint that was deleted before it could be scored: a gap in the curve
UNREADABLE_EVENT = "unreadable"  # a checkpoint that could not be read, tries and waits included: a gap too
GAP_EVENTS = (DELETED_EVENT, UNREADABLE_EVENT)  # lines without numbers that mark a gap in the curve
RESUMED_EVENT = "resumed"  # the training resumed from this step: earlier lines of later steps are set aside
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
    "scores": ("object", "each vignette's s: id, foundation_coarse and s (one row of the four conditions per "
                         "vignette): what tinymcf compare RUN --steps A B pairs two lines over"),
    "fingerprint": ("string or null", "what was scored: a digest of the checkpoint's weight files (null: a live model "
                                      "between saves, or a model that is not a folder)"),
}


def history_path(output_dir: str, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """``<output_dir>/moral_probe_<name>.jsonl``: the run's curve of set ``name`` (also appended to by the sweep).

    ``moral_probe_<name>_json.jsonl`` with JSON answers: one history holds one answer format.
    """
    return os.path.join(output_dir, f"moral_probe_{probe_key(name, answer_format)}.jsonl")


# The dose-response history (tinymcf_callback.steering.dose): the same lines, with these fields added.
DOSE_EVENT = "dose"  # a steered line; the unsteered line (c = 0) is a baseline line (event train_begin)
DOSE_DIRECTIONS = ("none", "real", "random")  # unsteered (c = 0), the direction studied, a random control one
DOSE_LINE_FIELDS = {
    "coefficient": ("number", "the intervention's coefficient c (0: the unsteered model)"),
    "direction": ("string", "none (the unsteered line), real (the direction studied) or random (a control)"),
    "direction_index": ("integer", "which random direction (0 to k-1); 0 for none and real"),
    "answering": ("boolean", "the mean Yes+No mass is at least 0.5 (false: the steered model stops answering)"),
}


# A line that scores a checkpoint saved again with other weights carries this field too.
SUPERSEDING_LINE_FIELDS = {
    "replaces": ("string", "the fingerprint of the earlier line of this step that this one supersedes"),
}

# A line scored outside the training process (tinymcf sweep, tinymcf watch) carries this field too. A gap line
# (event "deleted" or "unreadable") carries no numbers, an empty table and metrics, and info[event] (why); a
# resume line (event "resumed") the same, with info.resumed (from_step, attempt_started, superseded).
OUTSIDE_LINE_FIELDS = {
    "by": ("string", "the command that scored it outside the training process: sweep or watch"),
}


def dose_history_path(output_dir: str | os.PathLike, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> Path:
    """``<output_dir>/moral_probe_<name>_dose.jsonl``: a dose-response's lines (``..._<name>_json_dose.jsonl``)."""
    return Path(output_dir) / f"moral_probe_{probe_key(name, answer_format)}_dose.jsonl"


def is_dose_history(path: str | os.PathLike) -> bool:
    """Whether ``path`` is named like a dose-response history (``moral_probe_<key>_dose.jsonl``)."""
    name = Path(path).name
    return name.startswith("moral_probe_") and name.endswith("_dose.jsonl")


def history_line(name: str, report: dict, metrics: dict, *, step: int, epoch, event: str) -> dict:
    """One probe as a history line (its fields: :data:`LINE_FIELDS`, ``None`` where undefined); ``event`` says what
    triggered it."""
    return {"step": step, "epoch": epoch, "event": event, "name": name, "answer_format": answer_format(report),
            **{key: report.get(key) for key in PRECISION_FIELDS},
            **headline_fields(report),
            "prompt_digest": report["prompt_digest"], "metrics": metrics,
            "info": {k: v for k, v in report["info"].items() if k != "sample_prompt"},
            "table": json_records(report["table"].reset_index()), "scores": vignette_s(report), "fingerprint": None}


def vignette_s(report: dict) -> dict:
    """Each vignette's ``s`` in the four conditions (``CONDITIONS`` order), as plain values: a history line holds
    them so that any two of its steps compare paired, as two reports do
    (:func:`~tinymcf_callback.views.comparison.line_report`)."""
    record = baseline_record(report, 0)
    return {k: record[k] for k in ("id", "foundation_coarse", "s")}


def probe_line(name: str, report: dict, *, baseline: dict | None = None, target: str | None = None, step: int,
               epoch, event: str) -> dict:
    """A probe's history line with its metrics: the report's own and the change since ``baseline`` (with a
    ``target`` foundation, its selectivity); the one recipe for the callback, the sweep and the dose-response."""
    metrics = {**report_metrics(name, report), **change_metrics(name, baseline, report, target)}
    return history_line(name, report, metrics, step=step, epoch=epoch, event=event)


def gap_line(name: str, answer_format: str, *, step: int, epoch, why: str, event: str = DELETED_EVENT) -> dict:
    """A saved checkpoint that was not scored (deleted before it could be, or unreadable after every try): a plot
    shows the gap and says why."""
    return _mark(name, answer_format, step, epoch, event, {event: why})


def resume_line(name: str, answer_format: str, *, step: int, started: float | None, superseded: list[int]) -> dict:
    """The training resumed from ``checkpoint-<step>``: readers set the earlier lines of later steps aside
    (:func:`current_run`); ``started`` names the attempt, so that it is marked once."""
    return _mark(name, answer_format, step, None, RESUMED_EVENT,
                 {"resumed": {"from_step": step, "attempt_started": started, "superseded": superseded}})


def _mark(name: str, answer_format: str, step: int, epoch, event: str, info: dict) -> dict:
    """A line without numbers (a gap, a resume mark): every headline number null, no metrics, no table."""
    return {"step": step, "epoch": epoch, "event": event, "name": name, "answer_format": answer_format,
            **{key: None for key in HEADLINE_FIELDS}, "metrics": {}, "info": info, "table": [], "fingerprint": None}


def is_point(line: dict) -> bool:
    """A line that scored something (not a gap, not a resume mark)."""
    return line.get("event") not in (*GAP_EVENTS, RESUMED_EVENT)


def append_line(path: str | os.PathLike, line: dict, *, once: bool = False, run: CurrentRun | None = None) -> bool:
    """Append one line to the history at ``path`` under ``.<file name>.lock``, so that two writers cannot tear it.

    ``once``: append nothing and return False when the current run's newest line of the step already records the
    same thing (:func:`same_record`); ``run``: the history's :class:`CurrentRun` (else the whole history is read).
    Raises ``OSError`` naming the file when it cannot be written whole.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(f".{path.name}.lock")), timeout=LOCK_TIMEOUT_S):
        if once and path.exists():
            newest = (run or CurrentRun(path)).catch_up().newest
            if same_record(newest.get(line["step"]), line):
                return False
        append_jsonl(path, line)
    return True


class CurrentRun:
    """The current run of the history at ``path`` (:func:`current_run`'s rules), kept up to date by reading only the
    bytes appended since the last look; a history that shrank or was replaced is read again from its start."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._reset()

    def _reset(self) -> None:
        self.lines: list[tuple[int, dict]] = []  # the current run on its current branch, resume lines left out
        self.marks: list[dict] = []  # every resume line's info.resumed, in file order
        self.newest: dict[int, dict] = {}  # the newest line of each step of the current run
        self.tests = 0  # the current run's lines that carry a change test (metrics.count_tests)
        self._offset, self._lineno, self._file = 0, 0, None

    def catch_up(self) -> CurrentRun:
        """Read what was appended since the last look; :class:`HistoryError` for a line that is not a history line."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._reset()
            return self
        except OSError as e:
            raise HistoryError(f"cannot read the history {self.path}: {e.strerror}") from None
        if (stat.st_dev, stat.st_ino) != self._file or stat.st_size < self._offset:
            self._reset()
            self._file = (stat.st_dev, stat.st_ino)
        if stat.st_size == self._offset:
            return self
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                new = f.read(stat.st_size - self._offset)
        except OSError as e:
            raise HistoryError(f"cannot read the history {self.path}: {e.strerror}") from None
        whole = new[:new.rfind(b"\n") + 1]  # a torn last line waits (the next append drops it)
        self._offset += len(whole)
        for data in whole.split(b"\n")[:-1]:
            self._lineno += 1
            if data.strip():
                self._add(self._lineno, self._parse(data))
        return self

    def _parse(self, data: bytes) -> dict:
        try:
            line = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise HistoryError(f"malformed history line: {self.path}:{self._lineno}: not a JSON line ({e})") from None
        if not isinstance(line, dict):
            raise HistoryError(f"malformed history line: {self.path}:{self._lineno}: not a JSON object")
        check_line(self.path, self._lineno, line)
        return line

    def _add(self, lineno: int, line: dict) -> None:
        """:func:`current_run`'s rules, one line at a time."""
        event = line.get("event")
        if event == RESUMED_EVENT:
            if isinstance(line["info"].get("resumed"), dict):
                self.marks.append(line["info"]["resumed"])
            if any(kept["step"] > line["step"] for _, kept in self.lines):  # the abandoned branch: set aside
                self.lines = [(n, kept) for n, kept in self.lines if kept["step"] <= line["step"]]
                self.newest = {kept["step"]: kept for _, kept in self.lines}
                # self.tests keeps the tests of the steps set aside: each spent its share of the run's alpha, once
            return
        if event == BASELINE_EVENT:  # a new run starts here
            self.lines, self.newest, self.tests = [], {}, 0
        self.lines.append((lineno, line))
        self.newest[line["step"]] = line
        self.tests += count_tests([line])


def set_aside(*paths: Path) -> list[Path]:
    """Rename each of ``paths`` that exists ``<file>.set-aside-<time>`` (``-<n>`` added when a name is taken), never
    replacing a file; the new names."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moving = [Path(p) for p in paths if Path(p).exists()]
    moved, n = [], 1
    while moving:
        suffix = f".set-aside-{stamp}" + (f"-{n}" if n > 1 else "")
        targets = [p.with_name(p.name + suffix) for p in moving]
        if not any(t.exists() for t in targets):
            for path, target in zip(list(moving), targets, strict=True):
                if _move_unless_taken(path, target):
                    moved.append(target)
                    moving.remove(path)
        n += 1
    return moved


def _move_unless_taken(path: Path, target: Path) -> bool:
    """Rename ``path`` to ``target`` unless ``target`` exists (a hard link: the check and the move are one step)."""
    try:
        os.link(path, target)
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: the check, then the move
        if target.exists():
            return False
        os.rename(path, target)
        return True
    os.unlink(path)
    return True


def same_record(old: dict | None, new: dict) -> bool:
    """Whether ``new`` says nothing ``old`` (the newest line of its step) does not: both gaps, or both scores of
    the same weights (equal fingerprints, or one of them unknown)."""
    if old is None or is_point(old) != is_point(new):
        return False
    a, b = old.get("fingerprint"), new.get("fingerprint")
    return a is None or b is None or a == b


@contextlib.contextmanager
def sole_writer(path: str | os.PathLike, command: str):
    """Hold ``.<file name>.writer.lock`` beside the history for a whole sweep or watch: a second writer (which would
    write each step twice) is refused at once (:class:`HistoryError`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path.with_name(f".{path.name}.writer.lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise HistoryError(f"another sweep or watch is writing {path} (it holds {lock.lock_file}): wait for it to "
                           f"end, then run `{command}` again; it picks up the steps still missing") from None
    try:
        yield
    finally:
        # the lock file goes while it is still held (a refused or finished command leaves nothing behind); a second
        # writer that opened it just before is refused at once (it never waits), so none can hold a stale copy long
        with contextlib.suppress(OSError):
            os.unlink(lock.lock_file)
        lock.release()


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
    """The history's ``(line number, line)`` pairs, every line checked (:func:`check_line`); refuses what is not one.
    A torn last line (an append cut short) is skipped with a warning: the next append removes it."""
    try:
        lines = read_jsonl(path, torn_tail=True)
    except ValueError as e:
        raise HistoryError(f"malformed history line: {e}") from None
    except OSError as e:
        raise HistoryError(f"cannot read the history {path}: {e.strerror}") from None
    if lines.torn is not None:
        logger.warning("%s:%d: skipped an unterminated last line (an append cut short); reading the lines before it",
                       path, lines.torn)
    if not lines:
        raise HistoryError(f"the history {path} is empty: no probe has been logged into it yet")
    for lineno, line in lines:
        check_line(path, lineno, line)
    return lines


def check_line(path: Path, lineno: int, line: dict) -> None:
    """Refuse a line that is not a probe record in the callback's schema, naming the file, line and field."""
    hint = ("not a moral-probe history line (MoralProbeCallback writes moral_probe_<name>.jsonl); repair or remove "
            "that line")
    for field, kind in (("step", int), ("name", str), ("info", dict), ("table", list), ("metrics", dict)):
        value = line.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise HistoryError(f"{path}:{lineno}: {hint}: {field!r} is {value!r}")
    for field in ("epoch", *HEADLINE_FIELDS):
        value = line.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise HistoryError(f"{path}:{lineno}: {hint}: {field!r} is {value!r}, not a number")
    if line["step"] < 0:
        raise HistoryError(f"{path}:{lineno}: step {line['step']} is negative")
    try:
        answer_format_of(answer_format(line))
    except ValueError:
        raise HistoryError(f"{path}:{lineno}: {hint}: unknown answer_format {line['answer_format']!r}") from None
    for row in line["table"]:
        if not isinstance(row, dict) or not isinstance(row.get("foundation"), str):
            raise HistoryError(f"{path}:{lineno}: {hint}: a table row without a 'foundation' name: {row!r}")
    for field in ("fingerprint", *SUPERSEDING_LINE_FIELDS):
        if line.get(field) is not None and not isinstance(line[field], str):
            raise HistoryError(f"{path}:{lineno}: {hint}: {field!r} is {line[field]!r}, not a string")


def current_run(path: Path, lines: list[tuple[int, dict]], warn: bool = True) -> list[tuple[int, dict]]:
    """The lines of the newest run (from its last ``train_begin`` line), on its current branch (a ``resumed`` line
    at step K sets aside the earlier lines of steps after K), resume lines left out."""
    starts = [i for i, (_, line) in enumerate(lines) if line.get("event") == BASELINE_EVENT]
    first = starts[-1] if starts else 0
    if first and warn:
        logger.warning("%s:%d: a new run starts here (a %s baseline); the %d line(s) above it belong to an earlier run "
                       "in the same output folder and are not drawn", path, lines[first][0], BASELINE_EVENT, first)
    kept: list[tuple[int, dict]] = []
    for lineno, line in lines[first:]:
        if line.get("event") == RESUMED_EVENT:
            dropped = [s for _, s in kept if s["step"] > line["step"]]
            kept = [(n, s) for n, s in kept if s["step"] <= line["step"]]
            if dropped and warn:
                logger.info("%s:%d: the training resumed from step %d here; %d line(s) of later steps above belong "
                            "to the branch it abandoned and are set aside", path, lineno, line["step"], len(dropped))
            continue
        kept.append((lineno, line))
    return kept


def resume_marks(lines: list[tuple[int, dict]]) -> list[dict]:
    """The resume lines' ``info.resumed`` records, in file order."""
    return [line["info"]["resumed"] for _, line in lines
            if line.get("event") == RESUMED_EVENT and isinstance(line.get("info", {}).get("resumed"), dict)]


def last_line_per_step(path: Path, lines: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """One line per step, in step order: when a step was logged more than once, the last line in the file wins (a
    line that ``replaces`` another is said apart from a step simply logged twice)."""
    by_step: dict[int, tuple[int, dict]] = {}
    repeated, replaced = [], []
    for lineno, line in lines:
        if line["step"] in by_step:
            (replaced if line.get("replaces") else repeated).append(line["step"])
        by_step[line["step"]] = (lineno, line)
    for steps, why in ((repeated, "logged more than once (a resumed run re-probes the steps after its checkpoint)"),
                       (replaced, "scored again: their checkpoints were saved again with other weights")):
        if steps:
            shown = ", ".join(str(s) for s in sorted(set(steps))[:_SHOWN_STEPS])
            more = "" if len(set(steps)) <= _SHOWN_STEPS else ", ..."
            logger.warning("%s: step(s) %s%s %s; drawing the last line of each", path, shown, more, why)
    return [by_step[s] for s in sorted(by_step)]


def line_precisions(kept: list[tuple[int, dict]]) -> dict[Precision, int]:
    """Each precision the lines record, with the first step scored in it (lines that record none are left out)."""
    out: dict[Precision, int] = {}
    for _, line in kept:
        key = Precision.of(line)
        if key is not None:
            out.setdefault(key, line["step"])
    return out
