"""The Trainer's reporters, as the callback meets them (main process, once at train begin).

Only a reporter the user asked for in ``report_to`` is written to (an active wandb run alone is not consent); one
whose package, run or writer fails is a warning: the training goes on.
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

from ..trackers.table import TRACKERS, requested
from ..trackers.tracker import Tracker

logger = logging.getLogger("tinymcf_callback")


def reported_runs(args, trainer=None) -> dict[str, dict | None]:
    """The run each tracker of ``args.report_to`` has open in this process, by tracker name (None: none, or it could
    not be read, warned: a follower then needs it named, ``--mlflow-run`` say)."""
    runs = {}
    for name in requested(args.report_to):
        if name not in TRACKERS:
            continue
        try:
            runs[name] = TRACKERS[name].recorded(args, trainer)
        except Exception as e:  # noqa: BLE001 - a run that cannot be read costs the follower's default, not the training
            logger.warning("moral probe: the %s run the Trainer reports to could not be read (%s: %s); a tinymcf watch "
                           "or sweep of this run must be told which it is", name, type(e).__name__, e)
            runs[name] = None
    return runs


def reporter_sinks(runs: dict[str, dict | None], args, key: str, *, numbers: bool) -> list[Tracker]:
    """What probe ``key`` gives each reporter of ``runs`` (:func:`reported_runs`); ``numbers``: its numbers too (no
    ``Trainer.log`` carries them). Without ``numbers``, a reporter of ``report_to`` that gets none of them is said
    once, naming ``trainer=``."""
    sinks, failed = [], set()
    for name, run in runs.items():
        try:
            sink = TRACKERS[name].in_training(args, key, run, numbers=numbers)
        except Exception as e:  # noqa: BLE001 - a dashboard's extras must never stop the training
            logger.warning("moral probe [%s]: %s gets %s (%s: %s)", key, name,
                           "none of the probe's numbers" if numbers else "the probe's numbers only", type(e).__name__,
                           e)
            failed.add(name)
            continue
        if sink is not None:
            sinks.append(sink)
    reached = {sink.name for sink in sinks}
    left = [name for name in requested(args.report_to) if name not in reached | failed and _shows_numbers(name)]
    if numbers and left:
        logger.warning("moral probe [%s]: report_to names %s, which the probe's numbers reach only through "
                       "Trainer.log: pass trainer=trainer to MoralProbeCallback (they are in state.log_history)", key,
                       ", ".join(left))
    return sinks


def _shows_numbers(name: str) -> bool:
    """Whether the Trainer's reporter ``name`` shows logged numbers (codecarbon and flyte take none)."""
    reporter = INTEGRATION_TO_CALLBACK.get(name)
    return reporter is None or reporter.on_log is not TrainerCallback.on_log
