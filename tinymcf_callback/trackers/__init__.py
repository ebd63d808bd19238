"""Trackers: where a probe's history line goes besides the history file (TensorBoard, W&B, MLflow, trackio, ...).

One layer below everything that logs (the callback, :class:`~tinymcf_callback.training.logger.ProbeLogger`,
the sweep and the watcher), the way lm-evaluation-harness keeps its ``loggers/``. A sink takes the history
line that is already written (:func:`~tinymcf_callback.rundir.history.probe_line`): its metrics under the
dashboard names, its step, its per-foundation table and its precision. Nothing here rebuilds a report.

- :mod:`.sinks`: :class:`~.sinks.Point` (one line at its step), :class:`~.sinks.Sink` (one destination),
  :class:`~.sinks.Trackers` (several, what did not reach each, and what each holds already);
- :mod:`.tracker`: :class:`~.tracker.Tracker`, one class per tracker with the same methods (what it records of the
  training's run, what it gives that run in the training, how another process reopens it, send, held, finish);
- :mod:`.table`: the table of trackers by ``report_to`` name (:data:`~.table.TRACKERS`, :func:`~.table.register`),
  read by the callback, the sweep, the watcher and the command-line options; ``report_to`` read once;
- one module per tracker: :mod:`.tensorboard`, :mod:`.wandb`, :mod:`.mlflow`, :mod:`.trackio`, and
  :mod:`.accelerated` (accelerate's others, numbers only);
- :mod:`.open`: the trackers a run folder names, opened for the sweep and the watcher; :mod:`.targets`:
  :func:`~.targets.as_sink` (an Accelerator, a wandb run, a SummaryWriter or a callable of a loop of one's own).
"""
