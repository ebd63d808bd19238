"""What every tracker is: one class with the same methods, registered by its ``report_to`` name (:mod:`.table`).

A tracker of one's own is a subclass registered with :func:`~.table.register` (docs/dashboards.md, "A tracker of
your own").
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from .sinks import Sink


class Tracker(Sink):
    """One tracker (see the module). Subclasses set :attr:`name` and implement :meth:`reopen` and ``send``; the
    methods of the training process are optional (a tracker without them gets the numbers only through
    ``Trainer.log``: from a callback given ``trainer=``).
    """

    name: ClassVar[str] = ""  # its name in report_to (TrainingArguments' and --report-to)
    # the command-line option naming its run, for a run whose record does not: (option, metavar, help); None: none
    option: ClassVar[tuple[str, str, str] | None] = None

    def __init__(self, what: str, *, figure: bool = True):
        super().__init__(what, self.send, figure=figure)

    # ---- the training process ------------------------------------------------------------------------------
    @classmethod
    def recorded(cls, args, trainer=None) -> dict | None:
        """The run the Trainer's reporter has open in this process (its id, where it is: never a secret), as the run's
        record keeps it for a follower; None when there is none. Called once, at train begin, with the Trainer's
        ``TrainingArguments`` and, when the callback was given it, the Trainer; else the tracker's library says (its
        current run)."""
        return None

    @classmethod
    def in_training(cls, args, key: str, run: dict | None, *, numbers: bool) -> Tracker | None:
        """What the callback's probe ``key`` gives the run ``run`` (:meth:`recorded`'s): what it shows besides the
        numbers and, with ``numbers``, the numbers too (the callback has no Trainer whose ``log`` reaches the
        reporter); None: nothing."""
        return None

    # ---- another process -----------------------------------------------------------------------------------
    @classmethod
    def reopen(cls, run_dir: Path, recorded: dict | None, given: str | None, key: str) -> Tracker | None:
        """The training's run opened again for probe ``key`` in a follower: ``given`` (the value of :attr:`option`)
        else ``recorded`` (what the record keeps). A run that is not named, or a package that is not installed, is
        an error naming the fix; None (warned): the tracker cannot be reached now, the others go on."""
        raise NotImplementedError(f"{cls.__name__} cannot be opened outside the training")

    def send(self, point) -> None:  # noqa: D102 - see Sink.send
        raise NotImplementedError
