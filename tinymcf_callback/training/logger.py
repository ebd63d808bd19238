"""``ProbeLogger``: the probe in a training loop of your own (plain PyTorch, accelerate, Lightning-style).

``MoralProbeCallback`` is a ProbeLogger driven by Trainer events (:meth:`ProbeLogger.score`, :meth:`~ProbeLogger.
record`, :meth:`~ProbeLogger.publish`), so the two write the same lines. docs/python.md ("Custom training loops").
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from ..errors import ConfigError, HistoryError, UnsupportedModelError
from ..figures.tracked import probe_figure
from ..probe import AdaptiveProbe, Probe
from ..rundir.curve import Curve, Unwritten
from ..rundir.history import BASELINE_EVENT, history_path, probe_line
from ..scoring.ranks import Ranks
from ..stats.metrics import baseline_record, dashboard_names, why_unpaired, with_run_level
from ..trackers.sinks import Trackers
from ..trackers.targets import as_sink
from ..views.rows import vignette_rows, vignette_texts
from ..views.text import format_table, sanity_lines

logger = logging.getLogger("tinymcf_callback")

LOOP_EVENT = "log"  # the event of a history line written by ProbeLogger.log (the callback's: evaluate, save)


class ProbeLogger:
    """Probe a model at the steps a loop chooses; keep the baseline, the history and the change; feed the trackers.

    Args:
        probe: a :class:`~tinymcf_callback.probe.Probe` or :class:`~tinymcf_callback.probe.AdaptiveProbe` (its set,
            subset, answer format and statistics; :func:`~tinymcf_callback.probe.make_probe` builds either).
        output_dir: the run folder for the history and the baseline's report; None: no files (metrics only).
        to: where the metrics go besides the files, one or a list of: an ``accelerate.Accelerator``, a wandb
            run (``wandb.init()``'s), a TensorBoard ``SummaryWriter``, a callable ``fn(metrics, step)``.
        baseline: the first probe at step 0 is the baseline that ``score_change`` is measured from.
        resume: when the first probe is after step 0, take the baseline from ``output_dir``'s
            ``moral_probe_<name>_baseline.json`` (when it scored the same prompts).
        strict: raise when a probe fails (default: warn, return ``{}``, and let the loop go on).
        verbose: print the sanity lines and the per-foundation table at each probe (main process).
        figure: give the trackers that show images (a wandb run, a ``SummaryWriter``) a figure of the curve so far,
            with its interval bands, at each probe (about 0.2 s; needs matplotlib, the ``[plot]`` extra).

    Raises :class:`~tinymcf_callback.errors.ConfigError` for a ``to=`` it cannot send to.
    """

    def __init__(self, probe: Probe | AdaptiveProbe, output_dir: str | os.PathLike | None = None, *, to=(),
                 baseline: bool = True, resume: bool = True, strict: bool = False, verbose: bool = False,
                 figure: bool = True):
        if not isinstance(probe, (Probe, AdaptiveProbe)):
            raise ConfigError("ProbeLogger needs a Probe or an AdaptiveProbe (tinymcf_callback.make_probe(tok, "
                              f"'scifi', ...)), got {type(probe).__name__}")
        self.probe = probe
        self.output_dir = None if output_dir is None else os.fspath(output_dir)
        # the run's history and baseline report, written through the one curve writer (rundir.curve)
        self.curve = None if output_dir is None else Curve(output_dir, probe.name, probe.answer_format)
        shown = self.curve.path if self.curve is not None else Path(history_path(".", probe.name, probe.answer_format))
        self.trackers = Trackers([as_sink(t) for t in (to if isinstance(to, (list, tuple)) else [to])], strict=strict,
                                 figure=(lambda lines: probe_figure(lines, shown)) if figure else None)
        self._texts = vignette_texts(probe.vignettes)
        self._seeded = False
        self.baseline, self.resume, self.strict, self.verbose = baseline, resume, strict, verbose
        self.baseline_record: dict | None = None  # the baseline's per-vignette s (metrics.baseline_record)
        self.last_step: int | None = None
        self.last_report: dict | None = None
        self.last_metrics: dict[str, float] = {}  # the logged names (eval_moral_<name>/...)
        self.last_line: dict | None = None  # the history line of the last probe
        self._started = False
        self._tests: int | None = None  # change tests of this run so far (the run-level p's count)

    @property
    def name(self) -> str:
        return self.probe.name

    @property
    def history(self) -> str | None:
        """The history file this logger appends to (None without ``output_dir``)."""
        return None if self.curve is None else str(self.curve.path)

    # ---- the loop's one call ----------------------------------------------------------------------
    def log(self, model, step: int, *, epoch: float | None = None, event: str | None = None,
            fingerprint: str | None = None) -> dict[str, float]:
        """Probe ``model`` at ``step`` and log it everywhere; returns the metrics by their dashboard names.

        ``event`` is the history line's (default: ``train_begin`` for the baseline at step 0, else
        ``log``); ``fingerprint`` what was scored, when the loop just saved it
        (:func:`~tinymcf_callback.rundir.checkpoints.fingerprint` of the folder). ``{}`` when the probe failed
        (warned).
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"step must be a whole number >= 0 (the training step), got {step!r}")
        if event is None:
            event = BASELINE_EVENT if step == 0 and self.baseline and self.baseline_record is None else LOOP_EVENT
        report = self.score(model, step=step, event=event)
        if report is None:
            return {}
        metrics = self.record(report, step=step, epoch=epoch, event=event, fingerprint=fingerprint)
        if Ranks.current().is_main:
            self.publish(report)
        return dashboard_names(metrics)

    def publish(self, report: dict) -> bool:
        """Give the trackers the last probe (main process): its history line, its per-vignette rows and the figure of
        the curve so far (the history's earlier lines included, at the first probe of a resumed loop). True when
        every tracker took it; a tracker that fails is a warning (``strict``: the error)."""
        if not self.trackers or self.last_line is None:
            return True
        if not self._seeded:
            self._seeded = True
            if self.curve is not None:
                with contextlib.suppress(OSError, HistoryError):
                    self.trackers.seed(self.curve.read().lines)
        rows = vignette_rows(report, self.last_line["step"], self._texts)
        return self.trackers.send(self.last_line, rows=rows, label=f"moral probe [{self.name}]")

    # ---- the parts, also the callback's ----------------------------------------------------------
    def score(self, model, *, step: int, event: str) -> dict | None:
        """The report of ``model`` (scored across the processes), or None when the probe failed (warned)."""
        self._start(event)  # a resumed loop's baseline first: a precision target measures its change from it
        try:
            # the batches shared among the processes; a precision target measures its change from the baseline
            return self.probe.run(model, ranks=Ranks.current(), baseline=self.baseline_record)
        except UnsupportedModelError:
            raise  # a model the probe cannot read at all: a setup error, not a passing failure
        except Exception as e:  # noqa: BLE001 - a failed probe must never stop the training it observes
            if self.strict:
                raise
            logger.warning("moral probe [%s] failed at step %d (%s): %s: %s; training continues, nothing logged",
                           self.name, step, event, type(e).__name__, e)
            return None

    def record(self, report: dict, *, step: int, epoch: float | None = None, event: str,
               write: bool | None = None, fingerprint: str | None = None) -> dict[str, float]:
        """Turn a report into its metrics (logged names) and, when ``write`` (default: on the main process),
        print it, append its history line and, for the baseline, write the baseline's report.

        The baseline event (``train_begin``) makes this report the baseline; a first probe after step
        0 reads the baseline back from ``output_dir`` (``resume``). Every process computes the same
        metrics.
        """
        self._start(event)
        if event == BASELINE_EVENT:
            self.baseline_record = baseline_record(report, step)
        line = probe_line(self.name, report, baseline=self.baseline_record, target=self.probe.config.target,
                          step=step, epoch=epoch, event=event)
        line["fingerprint"] = fingerprint
        self._number(line)
        metrics = line["metrics"]
        self.last_step, self.last_report, self.last_metrics, self.last_line = step, report, metrics, line
        if write if write is not None else Ranks.current().is_main:
            if self.verbose:
                print(f"[tinymcf] step {step} ({event})")
                print("\n".join(sanity_lines(report)))
                print(format_table(report["table"]))
            if self.output_dir is not None:
                self._write(report, line, step=step, epoch=epoch, event=event)
        return metrics

    def _start(self, event: str) -> None:
        """At the first probe: a loop resumed after step 0 takes the baseline beside the history (``resume``)."""
        if not self._started:
            self._started = True
            if event != BASELINE_EVENT and self.resume and self.baseline_record is None:
                self.baseline_record = self._saved_baseline()

    def _number(self, line: dict) -> None:
        """The line's run-level change p: its test is the next of the run's (counted from the history at the first
        probe, then here; every process counts alike)."""
        if self._tests is None:
            self._tests = 0
            if self.curve is not None and Ranks.current().is_main:
                with contextlib.suppress(OSError, HistoryError):
                    self._tests = self.curve.tests()
            self._tests = Ranks.current().gather(self._tests)[0]
        self._tests = with_run_level(line, self.name, self.probe.answer_format, self._tests)

    def _write(self, report: dict, line: dict, *, step: int, epoch, event: str) -> None:
        """The history line (at the step-0 probe its baseline report first); what fails is kept for the next probe."""
        try:
            self.curve.append(line, baseline=(report, step, epoch) if event == BASELINE_EVENT else None)
        except Unwritten as e:
            what, kept = (("write the baseline report", "it and the line(s)") if e.path == self.curve.baseline_path
                          else ("append to the history", "the line(s)"))
            logger.warning("moral probe [%s]: could not %s %s (%s); %s of step(s) %s are kept and written at the next "
                           "probe; training goes on", self.name, what, e.path, e.reason, kept,
                           ", ".join(map(str, e.steps)))

    def close(self) -> list[int]:
        """At the end of a run: write what a full disk kept back, else say which steps are lost (a warning).

        Returns the lost steps. The callback calls this at ``on_train_end``; a loop of your own may too.
        """
        self.trackers.close()  # what this logger opened (the callback's writers); a loop's own trackers stay open
        for missed in self.trackers.undelivered():
            logger.warning("moral probe [%s]: %s; the history holds those lines", self.name, missed)
        if self.curve is None or self.curve.flush():
            return []
        return self.curve.give_up()

    def resumed_from(self, step: int, *, started: float | None = None) -> list[int]:
        """The loop resumed from its checkpoint of ``step``: the history's lines of later steps belong to the branch
        it abandoned. A resume line sets them aside (the plot and every reader then skip them), and the steps
        probed again from here on take their place. ``started`` names this resumed attempt (the run's record).
        Returns the steps set aside (none: nothing written). Main process only; a failed write is a warning."""
        if self.curve is None or not self.curve.path.exists():
            return []
        try:
            mark = self.curve.read().resume_line(self.name, self.probe.answer_format, from_step=step, started=started)
            if mark is not None:
                self.curve.append(mark)
        except (OSError, HistoryError) as e:
            logger.warning("moral probe [%s]: could not mark the resume from step %d in %s: %s", self.name, step,
                           self.history, e)
            return []
        later = [] if mark is None else mark["info"]["resumed"]["superseded"]
        if later:
            logger.warning("moral probe [%s]: resumed from step %d; the history's lines of step(s) %s belong to the "
                           "branch the training abandoned and are set aside; those steps are probed again as the "
                           "training reaches them", self.name, step, ", ".join(map(str, later)))
        return later

    def use_baseline(self, record: dict | None) -> None:
        """Measure the change from ``record`` (a saved :func:`~tinymcf_callback.stats.metrics.baseline_record`),
        when it scored this probe's prompts; otherwise warn and log no change."""
        self._started = True
        why = None if record is None else why_unpaired(record, self.probe.prompt_digest)
        if why is not None:
            logger.warning("moral probe [%s]: the saved step-0 baseline is not used: %s; score_change is not logged in "
                           "this run", self.name, why)
        self.baseline_record = None if why is not None else record

    # ---- the baseline on disk ---------------------------------------------------------------------
    def _saved_baseline(self) -> dict | None:
        if self.curve is None:
            return None
        record, why = self.curve.saved_baseline(self.probe.prompt_digest)
        if record is None and self.curve.baseline_path.exists():
            logger.warning("moral probe [%s]: %s; score_change is not logged in this run", self.name, why)
        return record
