"""After a reload: whether the server now computes the checkpoint it was given, checked on the probe's own answers.

A weight version proves that a reload was asked for, not that every weight went in, so the follower loads the
checkpoint here too, in float32, scores a few of the probe's prompts with its forward pass, each alone, and holds the
server's answers to them (read by the probe itself) to :data:`FRESH_SPREAD`; a step that does not agree is left
unscored (:class:`~tinymcf_callback.errors.CheckpointUnusable`). What this can see, by precision: docs/served.md,
"What a reload verifies".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import CheckpointUnusable, ServedError
from .forms import Reading
from .reload import RESTART
from .selfcheck import local_differences

# (P(Yes), log Yes+No mass): the largest differences between a server started fresh on a checkpoint and that
# checkpoint's float32 forward pass, each prompt alone, rounded up (measured: benchmarks/reload_cost.json,
# docs/served.md "What a reload verifies"). float16 is held as bfloat16.
FRESH_SPREAD = {"float32": (1e-5, 3e-5), "bfloat16": (0.1, 0.1), "float16": (0.1, 0.1)}
UNKNOWN = "bfloat16"  # a server that does not say its precision is held to the widest spread measured


@dataclass
class Loaded:
    """What the follower just loaded into the server (step ``step``, from ``folder``, by ``route``) and that
    checkpoint's own model, loaded here (``reference``, described by ``where``: ``float32 on cpu``)."""

    step: int
    folder: str
    route: str
    reference: object
    where: str
    seconds: float = 0.0  # what loading it here added after the server's reload was in (both run at once)
    passing: str | None = None  # why a disagreement may pass when tried again (then not final), else None


def check(loaded: Loaded, server, probe, main: dict[int, Reading], indices: list[int], yes: list[int], no: list[int],
          *, tolerance: float | None, shown: str) -> dict:
    """The reload check's record for ``info.backend.reload_check``; :class:`CheckpointUnusable` when the server's
    answers to ``indices`` (``main``) are further from ``loaded.reference``'s than ``tolerance`` (default: the fresh
    spread of the server's precision)."""
    started = time.perf_counter()
    p_diff, mass_diff = local_differences(loaded.reference, probe, main, indices, yes, no)
    precision = server.dtype if server.dtype in FRESH_SPREAD else None
    held_p, held_mass = ((tolerance, tolerance) if tolerance is not None else
                         FRESH_SPREAD[precision or UNKNOWN])
    why = ("--reference-tolerance" if tolerance is not None else
           f"a fresh {precision} server's spread" if precision else
           f"the server does not say its precision: a fresh {UNKNOWN} server's spread")
    record = {"prompts": list(indices), "p_yes_diff": p_diff, "log_mass_diff": mass_diff, "tolerance": held_p,
              "mass_tolerance": held_mass, "held_to": why, "reference": f"{loaded.folder}, {loaded.where}",
              "route": loaded.route, "seconds": round(loaded.seconds + time.perf_counter() - started, 3)}
    if p_diff <= held_p and mass_diff <= held_mass:
        return record
    apart = (f"{p_diff:.2g} in P(Yes) and {mass_diff:.2g} in log Yes+No mass, where {why} is {held_p:g} and "
             f"{held_mass:g}")
    if loaded.passing is not None:
        raise ServedError(
            f"the server at {shown} does not answer step {loaded.step} as {loaded.folder}'s own forward pass does "
            f"({loaded.where}): up to {apart}; {loaded.passing}")
    raise CheckpointUnusable(
        f"the server at {shown} does not compute step {loaded.step} after {loaded.route}: its answers to "
        f"{len(indices)} prompts differ from {loaded.folder}'s own forward pass ({loaded.where}) by up to {apart}: "
        "it serves other or partly old weights, and the step is not scored (restart the server on each checkpoint "
        f"instead: --reload \"{RESTART} ...\", docs/served.md)")
