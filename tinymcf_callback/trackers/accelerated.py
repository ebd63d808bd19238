"""The trackers accelerate knows that this package does not write to itself (``comet_ml``, ``aim``, ``clearml``,
``dvclive``, ``swanlab``): a follower logs each line's numbers through ``accelerate.Accelerator(log_with=...)``, into
a run named after the run folder (accelerate opens a new one: it has no way to reopen the training's)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .sinks import Point, line_metrics
from .tracker import Tracker

NAMES = ("comet_ml", "aim", "clearml", "dvclive", "swanlab")  # each also the package to install for it


class AccelerateTracker(Tracker):
    """One of accelerate's trackers (its :attr:`name` is accelerate's, and the package to install), numbers only."""

    def __init__(self, accelerator):
        super().__init__(f"accelerate's {self.name} tracker", figure=False)
        self.accelerator = accelerator

    @classmethod
    def reopen(cls, run_dir: Path, recorded: dict | None, given: str | None, key: str) -> AccelerateTracker:
        from accelerate import Accelerator

        accelerator = Accelerator(log_with=[cls.name], project_dir=str(run_dir))
        accelerator.init_trackers(run_dir.name)
        if not accelerator.trackers:
            raise ConfigError(f"--report-to {cls.name}: accelerate found no {cls.name} tracker (the {cls.name} "
                              f"package is not installed): pip install {cls.name}")
        return cls(accelerator)

    def send(self, point: Point) -> None:
        self.accelerator.log(line_metrics(point.line), step=point.step)

    def finish(self) -> None:
        self.accelerator.end_training()


def accelerate_trackers() -> list[type[AccelerateTracker]]:
    """A tracker class per name of :data:`NAMES`."""
    return [type(f"{name.title().replace('_', '')}Tracker", (AccelerateTracker,), {"name": name}) for name in NAMES]
