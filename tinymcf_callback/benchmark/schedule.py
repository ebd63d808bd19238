"""When a run's benchmark is scored: ``start``, ``middle``, ``end`` (the default), ``all``, or a list of steps.

- **start**: step 0, the run's starting weights (the probe's baseline);
- **end**: the last saved checkpoint: the one at the run's planned length (``max_steps``) once it is saved, else,
  once the run is over, its newest save;
- **middle**: the saved checkpoint nearest half the run's planned length (ties to the earlier); when the length is
  not known, the one nearest half the newest save once the run is over;
- **all**: every save; **steps** (``0,500,1000``): those saves.

Pure functions of step numbers: the sweep and the watcher give the saves they know of (present, recorded, or
predicted from ``save_steps``), the callback those its ``TrainingArguments`` will make.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ConfigError

ROLES = ("start", "middle", "end")
DEFAULT_AT = "start,middle,end"
ALL = "all"


@dataclass(frozen=True)
class At:
    """Which steps a run's benchmark is scored at: some of :data:`ROLES`, every save, or given steps."""

    roles: tuple[str, ...] = ()
    every: bool = False
    steps: tuple[int, ...] = ()

    def __str__(self) -> str:
        return ALL if self.every else ",".join([*self.roles, *map(str, self.steps)])


def parse_at(text, what: str = "at") -> At:
    """``start,middle,end`` (any of them), ``all``, or steps (``0,500``), mixed with roles if wished."""
    items = [t.strip() for t in str(text).split(",") if t.strip()] if isinstance(text, str) else None
    if not items:
        raise ConfigError(f"{what} takes start, middle, end (comma-separated), all, or steps such as 0,500; got "
                          f"{text!r}")
    if ALL in items:
        if len(items) > 1:
            raise ConfigError(f"{what} {text}: all is every save already; give it alone")
        return At(every=True)
    roles, steps = [], []
    for item in items:
        if item in ROLES:
            roles.append(item)
        elif item.isdigit():
            steps.append(int(item))
        else:
            raise ConfigError(f"{what} {text}: {item!r} is neither start, middle, end, all nor a step number")
    return At(tuple(dict.fromkeys(roles)), False, tuple(sorted(set(steps))))


def predicted_saves(length: int | None, every: int | None) -> list[int]:
    """The steps a Trainer saving every ``every`` steps saves over ``length`` steps (its last step included)."""
    if not length or not every or every <= 0:
        return []
    return sorted(set(range(every, length + 1, every)) | {length})


def nearest(saves: Iterable[int], target: float) -> int | None:
    """The save nearest ``target`` (ties to the earlier), leaving out step 0."""
    later = sorted(s for s in saves if s > 0)
    return min(later, key=lambda s: (abs(s - target), s)) if later else None


def roles_of(at: At, saves: Iterable[int], *, length: int | None, ended: bool) -> dict[int, tuple[str, ...]]:
    """The steps to score and why (see the module), of the run's saves as known (``saves``), its planned length
    (``length``: ``max_steps``, None when not known) and whether it is over (``ended``). Step 0 is always known."""
    saves = sorted(set(saves) | {0})
    out: dict[int, list[str]] = {}

    def add(step: int | None, role: str) -> None:
        if step is not None:
            out.setdefault(step, []).append(role)

    if at.every:
        for s in saves:
            add(s, "step")
        return {s: tuple(r) for s, r in out.items()}
    if "start" in at.roles:
        add(0, "start")
    later = [s for s in saves if s > 0]
    if "middle" in at.roles:
        if length is not None and later and later[-1] >= length:
            add(nearest(later, length / 2), "middle")
        elif ended and later:
            add(nearest(later, later[-1] / 2), "middle")
    if "end" in at.roles:
        if length is not None and length in later:
            add(length, "end")
        elif ended and later:
            add(later[-1], "end")
    for s in at.steps:
        if s in saves:
            add(s, "step")
    return {s: tuple(dict.fromkeys(r)) for s, r in sorted(out.items())}
