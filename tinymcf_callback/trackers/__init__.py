"""Trackers: where a probe's history line goes besides the history file (TensorBoard, wandb, accelerate, a callable).

One layer below everything that logs (the callback, :class:`~tinymcf_callback.training.logger.ProbeLogger`,
the sweep and the watcher), the way lm-evaluation-harness keeps its ``loggers/``. A sink takes the history
line that is already written (:func:`~tinymcf_callback.results.history.probe_line`): its metrics under the
dashboard names, its step, its per-foundation table and its precision. Nothing here rebuilds a report.

- :mod:`.sinks`: :class:`~.sinks.Sink` (one destination), :class:`~.sinks.Trackers` (several, and what did not
  reach each); :mod:`.targets`: :func:`~.targets.as_sink` (an Accelerator, a wandb run, a SummaryWriter or a
  callable);
- :mod:`.wandb`: the probe in a wandb run (its metric definitions, config and table), and opening a training's
  run by id from another process;
- :mod:`.tensorboard`: the Trainer's TensorBoard folder and a writer beside its own;
- :mod:`.open`: the trackers a run folder names (``--report-to``), opened for the sweep and the watcher.
"""
