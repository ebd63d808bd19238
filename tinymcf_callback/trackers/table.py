"""The table of trackers: a ``report_to`` name -> its :class:`~.tracker.Tracker` class, as transformers keeps its
``INTEGRATION_TO_CALLBACK``; a tracker of one's own is added with :func:`register`.
"""

from __future__ import annotations

import logging

from ..errors import ConfigError
from ..registry import Registry
from .accelerated import accelerate_trackers
from .mlflow import MlflowTracker
from .tensorboard import TensorBoardTracker
from .tracker import Tracker
from .trackio import TrackioTracker
from .wandb import WandbTracker

logger = logging.getLogger(__name__)

AUTO = "auto"  # the Trainer's own reporters, as the run's moral_probe_run.json records them
TRACKERS: Registry[type[Tracker]] = Registry("tracker")


def register(cls: type[Tracker]) -> type[Tracker]:
    """Add ``cls`` to the table under its :attr:`~.tracker.Tracker.name` (a name taken already is a
    :class:`~tinymcf_callback.errors.RegistryError`); usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Tracker)) or not cls.name:
        raise ConfigError(f"register takes a Tracker subclass with a name, got {cls!r}")
    TRACKERS.register(cls.name, cls)
    return cls


for _tracker in (TensorBoardTracker, WandbTracker, MlflowTracker, TrackioTracker, *accelerate_trackers()):
    register(_tracker)


def requested(report_to) -> list[str]:
    """The names ``report_to`` asks for, each once, in order: a string (comma-separated) or a list of them; ``none``
    and empty names are nothing."""
    if report_to is None:
        return []
    parts = [report_to] if isinstance(report_to, str) else list(report_to)
    names = [n.strip() for part in parts for n in str(part).split(",")]
    return list(dict.fromkeys(n for n in names if n and n != "none"))


def resolve(report_to, recorded: list[str] | None) -> list[str]:
    """:func:`requested`, with ``auto`` replaced by ``recorded`` after the names given (the Trainer's reporters, as
    the run's record keeps them: those no tracker of the table writes to are left out, said). A name asked outright
    that the table does not have is a :class:`ConfigError` listing the known ones."""
    names = requested(report_to)
    unknown = [n for n in names if n != AUTO and n not in TRACKERS]
    if unknown:
        raise ConfigError(f"--report-to: unknown tracker(s) {', '.join(unknown)}; choose from {AUTO}, "
                          f"{', '.join(TRACKERS)} (comma-separated) or none")
    if AUTO not in names:
        return names
    names.remove(AUTO)
    trainer = [n for n in requested(recorded) if n not in names]
    left = [n for n in trainer if n not in TRACKERS]
    if left:
        logger.info("the Trainer also reports to %s, which tinymcf does not write to: left out", ", ".join(left))
    return names + [n for n in trainer if n in TRACKERS]
