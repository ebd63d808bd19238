"""What a training loop already has, as a :class:`~.sinks.Sink`: an Accelerator, a wandb run, a SummaryWriter, a
callable (``ProbeLogger(to=...)``)."""

from __future__ import annotations

from ..errors import ConfigError
from ..extras import available
from .sinks import Sink, line_metrics
from .tensorboard import TensorBoardWriter
from .wandb import WandbTracker


def as_sink(target) -> Sink:
    """A :class:`Sink` for an ``accelerate.Accelerator``, a wandb run, a TensorBoard ``SummaryWriter`` (torch's or
    tensorboardX's) or a callable ``fn(metrics, step)``; :class:`~tinymcf_callback.errors.ConfigError` otherwise."""
    if isinstance(target, Sink):
        return target
    module = type(target).__module__ or ""
    if module.startswith("accelerate") and callable(getattr(target, "log", None)):
        return Sink("accelerate.Accelerator.log", lambda point: target.log(line_metrics(point.line), step=point.step))
    if module.startswith("wandb") and callable(getattr(target, "log", None)):
        return WandbTracker(target)  # into the loop's own run, which the loop finishes
    if callable(getattr(target, "add_scalar", None)):
        return Sink(f"the {type(target).__name__}", TensorBoardWriter(target).send, figure=True)
    if callable(target) and not isinstance(target, type):
        return Sink(getattr(target, "__name__", type(target).__name__),
                    lambda point: target(line_metrics(point.line), point.step))
    hint = " (wandb is installed)" if available("wandb") else ""
    raise ConfigError(f"cannot send metrics to a {type(target).__name__}: pass an accelerate.Accelerator, a wandb "
                      f"run{hint}, a TensorBoard SummaryWriter or a callable fn(metrics, step)")
