"""One probe's curve in a run folder: the history file and the baseline report beside it, written one way by all.

The callback and :class:`~tinymcf_callback.training.logger.ProbeLogger` (inside the training), the sweep and the
watcher (outside it) all write a run's curve through a :class:`Curve`, so each decision about it is made here, once.
Neither numbering nor appending re-reads the history, so a line costs the same at line 10,000 as at line 10. A line
that cannot be written is kept and written first at the next append; the caller hears of it (:class:`Unwritten`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HistoryError
from ..stats.metrics import as_baseline, why_unpaired, with_run_level
from .history import (
    CurrentRun,
    append_line,
    baseline_path,
    current_run,
    gap_line,
    history_path,
    is_point,
    read_lines,
    resume_line,
    resume_marks,
    set_aside,
)
from .precision import Precision
from .report import load_report, write_report

logger = logging.getLogger("tinymcf_callback")


class Unwritten(OSError):
    """Lines (and a baseline report) that could not be written: kept by the curve, written first at its next append.
    ``steps`` are the steps still unwritten, ``path`` the file that refused, ``reason`` why."""

    def __init__(self, path: Path, reason: str, steps: list[int]):
        super().__init__(f"could not write to {path} ({reason}); step(s) {', '.join(map(str, steps))} not written")
        self.path, self.reason, self.steps = path, reason, steps


@dataclass
class HistoryView:
    """The history as it is now: the current run's lines (its current branch) and its resume marks."""

    lines: list[dict] = field(default_factory=list)
    marks: list[dict] = field(default_factory=list)  # info.resumed of every resume line

    def newest(self) -> dict[int, dict]:
        """The newest line of each step."""
        return {line["step"]: line for line in self.lines}

    def precision(self) -> Precision | None:
        """The precision the history's lines were scored in (the last one that records it), or None."""
        return next((p for p in map(Precision.of, reversed(self.lines)) if p is not None), None)

    def gaps(self) -> list[int]:
        """The steps whose newest line is a gap (a saved checkpoint deleted before it was scored, or unreadable)."""
        return sorted(step for step, line in self.newest().items() if not is_point(line))

    def resume_line(self, name: str, answer_format: str, *, from_step: int, started: float | None) -> dict | None:
        """The resume line to write for a training attempt that resumed from ``from_step`` (started at ``started``),
        or None: when the history holds no later step, or already marks this attempt."""
        if from_step <= 0:
            return None
        if started is not None and any(mark.get("attempt_started") == started for mark in self.marks):
            return None
        later = sorted(line["step"] for line in self.lines if line["step"] > from_step)
        if not later:
            return None
        return resume_line(name, answer_format, step=from_step, started=started, superseded=later)


class Curve:
    """The history and the baseline report of probe ``name`` (``answer_format``) in ``run_dir`` (see the module)."""

    def __init__(self, run_dir: str | os.PathLike, name: str, answer_format: str):
        self.run_dir, self.name, self.answer_format = Path(run_dir), name, answer_format
        self.path = Path(history_path(str(run_dir), name, answer_format))
        self.baseline_path = Path(baseline_path(str(run_dir), name, answer_format))
        self.pending: list[tuple[dict, tuple | None]] = []  # (line, its baseline report) kept back by a failed write
        self.run = CurrentRun(self.path)  # the current run, read as far as the last look

    # ---- reading -------------------------------------------------------------------------------------------
    def read(self) -> HistoryView:
        """What the history holds now (nothing yet: an empty view); :class:`HistoryError` for a malformed line."""
        if not self.path.exists():
            return HistoryView()
        try:
            numbered = read_lines(self.path)
        except HistoryError as e:
            if "is empty" in str(e):
                return HistoryView()
            raise HistoryError(f"{e}: the history is only ever appended to; repair or move that line") from None
        return HistoryView([line for _, line in current_run(self.path, numbered, warn=False)], resume_marks(numbered))

    def baseline_record(self) -> tuple[dict | None, str | None]:
        """``(record, None)``: the per-vignette scores of the baseline report beside the history (its prompts not yet
        checked); else ``(None, why)``, why no change since step 0 can be logged."""
        path = self.baseline_path
        if not path.exists():
            return None, f"{path.name} is not beside the history: no change since the baseline is logged"
        try:
            return as_baseline(load_report(path)), None
        except Exception as e:  # noqa: BLE001 - an unreadable baseline costs the change, not the run
            return None, f"{path} cannot be read ({type(e).__name__}: {e}): no change since the baseline is logged"

    def number(self, line: dict) -> dict:
        """Give a line its run-level change p (``score_change_p_run``): its change test is the next of the current
        run's, the tests of steps a resume set aside included (each spends its own share of alpha, once)."""
        with_run_level(line, self.name, self.answer_format, self.tests())
        return line

    def tests(self) -> int:
        """How many change tests the history's current run holds now; :class:`HistoryError` for a malformed line."""
        try:
            return self.run.catch_up().tests
        except HistoryError as e:
            raise HistoryError(f"{e}: the history is only ever appended to; repair or move that line") from None

    def saved_baseline(self, prompt_digest: str) -> tuple[dict | None, str | None]:
        """:meth:`baseline_record`, used only when it asked these prompts (``prompt_digest``); else ``(None, why)``."""
        record, why = self.baseline_record()
        if record is not None:
            why = why_unpaired(record, prompt_digest)
        return (record, None) if why is None else (None, why if record is None else f"{self.baseline_path}: {why}")

    # ---- writing -------------------------------------------------------------------------------------------
    def append(self, line: dict, *, once: bool = False, baseline: tuple | None = None) -> bool:
        """Write what earlier appends kept back, then ``line`` (with ``baseline``, ``(report, step, epoch)``: its
        baseline report first); False as :func:`~tinymcf_callback.rundir.history.append_line` says, :class:`Unwritten`
        when something could not be written (kept for the next append)."""
        self.pending.append((line, baseline))
        return self._write(once_for=line if once else None)

    def flush(self) -> bool:
        """Write what is kept back; True when nothing is left, else a warning naming the steps and False."""
        try:
            self._write()
        except Unwritten as e:
            logger.warning("moral probe [%s]: %s", self.name, e)
            return False
        return True

    def _write(self, once_for: dict | None = None) -> bool:
        written = True
        while self.pending:
            line, report = self.pending[0]
            target = self.baseline_path if report is not None else self.path
            try:
                if report is not None:
                    self._keep_baseline_report(*report)
                    self.pending[0] = (line, None)
                    target = self.path
                written = append_line(self.path, line, once=line is once_for, run=self.run)
            except OSError as e:
                steps = [pending["step"] for pending, _ in self.pending]
                raise Unwritten(target, e.strerror or str(e), steps) from None
            self.pending.pop(0)
        return written

    def give_up(self) -> list[int]:
        """Say (a warning) which steps are lost because their lines were never written; forget them."""
        lost = [line["step"] for line, _ in self.pending]
        if lost:
            logger.warning("moral probe [%s]: the history line(s) of step(s) %s were never written (%s): they are "
                           "lost; their reports are in the checkpoints that were saved", self.name,
                           ", ".join(map(str, lost)), self.path)
        self.pending.clear()
        return lost

    def gap(self, *, step: int, epoch, why: str, event: str) -> dict:
        """A gap line of this curve (a saved step that will not be scored, and why)."""
        return gap_line(self.name, self.answer_format, step=step, epoch=epoch, why=why, event=event)

    def _keep_baseline_report(self, report: dict, step: int, epoch) -> None:
        """The report of the line that starts the current run, beside the history (one already there set aside)."""
        path = self.baseline_path
        for target in set_aside(path):
            logger.info("moral probe [%s]: %s, the baseline report of an earlier scoring, is set aside as %s",
                        self.name, path.name, target.name)
        write_report(path, report, step=step, epoch=epoch)
