"""The trackers a run folder names, opened for probes scored outside the training process (sweep, watch): each
reopens the training's run from what ``moral_probe_run.json`` keeps under its name, or the run named on the command
line. A tracker named but not installed is an error before anything is scored; one that fails later is a warning
and a missed step (:class:`~.sinks.Trackers`): the history is the record.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..rundir.record import RunRecord
from .sinks import Trackers
from .table import TRACKERS, resolve


def open_trackers(run_dir: Path, report_to, key: str, *, record: RunRecord | None = None,
                  runs: dict[str, str] | None = None, figure: Callable[[list[dict]], object] | None = None) -> Trackers:
    """The trackers of ``report_to`` opened for probe ``key`` of the run in ``run_dir``: each reopens the run the
    record keeps under its name, or the one ``runs`` names (tracker name -> its option's value); ``auto`` adds the
    ones the record names (nothing when there is none). A tracker that is not installed is a
    :class:`~tinymcf_callback.errors.MissingExtraError`, one whose run is not named a
    :class:`~tinymcf_callback.errors.SweepError`; one that cannot be reached now (a wandb service) a warning."""
    record = record if record is not None else RunRecord.read(run_dir)
    runs = runs or {}
    opened = []
    try:
        for name in resolve(report_to, record.report_to if record else None):
            recorded = record.trackers.get(name) if record else None
            tracker = TRACKERS[name].reopen(run_dir, recorded, runs.get(name), key)
            if tracker is not None:
                opened.append(tracker)
    except BaseException:
        Trackers(opened).close()  # what was opened before the one that failed
        raise
    return Trackers(opened, figure=figure)
