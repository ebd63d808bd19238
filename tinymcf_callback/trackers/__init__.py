"""Trackers: where a probe's history line goes besides the history file (TensorBoard, W&B, MLflow, trackio, ...).

One layer below everything that logs, the way lm-evaluation-harness keeps its ``loggers/``: a sink takes the history
line that is already written, and nothing here rebuilds a report. The modules: docs/development.md.
"""
