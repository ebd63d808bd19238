"""What every tracker is: one class with the same methods, registered by its ``report_to`` name (:mod:`.table`).

A tracker is the probe's side of one experiment tracker (TensorBoard, W&B, MLflow, trackio, ...), over the whole
life of a run, the way lm-evaluation-harness keeps one class per logger and transformers one callback per
integration:

- **in the training** (the callback, main process, once at train begin): :meth:`Tracker.recorded` says which run
  the Trainer's own reporter has open (what ``moral_probe_run.json`` keeps under the tracker's name), and
  :meth:`Tracker.in_training` gives that run what the probe shows besides its numbers (the figure, the tables, a
  layout) and, when the callback was given no Trainer to log them through, the numbers too, at the Trainer's step;
- **in another process** (``tinymcf sweep``, ``tinymcf watch``): :meth:`Tracker.reopen` opens that run again from
  what the record keeps (or the run named on the command line, the tracker's :attr:`Tracker.option`), never a new
  one;
- **at each point**: :meth:`~.sinks.Sink.send`; :meth:`~.sinks.Sink.held` says which points the run already holds, so
  that a restarted follower sends none twice; :meth:`~.sinks.Sink.finish` ends what opening it started.

A tracker of one's own is a subclass registered with :func:`~.table.register`: the callback, the sweep, the watcher
and the ``--report-to`` option then use it like the built-in ones.
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
