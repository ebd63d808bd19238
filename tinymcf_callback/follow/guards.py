"""The guards that keep one curve one probe: a sweep or a watcher only extends a history with lines of the same
vignettes, answer format and precision; each refuses in one line naming the options that match, or ``--restart``.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ProbeConfig, subset_options
from ..errors import SweepError
from ..rundir.precision import Precision
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT


def check_same_vignettes(lines: list[dict], config: ProbeConfig, path: Path) -> None:
    """Refuse to extend a curve that asked about other vignettes (another subset than the callback's), naming the
    options that reproduce the history's; lines from before subsets were recorded are compared by their count."""
    mine = config.subset()
    for line in lines:
        theirs = line.get("info", {}).get("subset") if isinstance(line.get("info"), dict) else None
        if isinstance(theirs, dict) and theirs.get("vignettes") != mine["vignettes"]:
            raise SweepError(f"{path} holds probes of other vignettes than this {config.name!r} probe would ask "
                             f"(step {line.get('step')} was scored with {subset_options(theirs)}, this one with "
                             f"{subset_options(mine)}): pass {subset_options(theirs)} to extend its curve like with "
                             f"like, or --restart to start the history again")
    n_vignettes = len(config.vignettes())
    # a probe with a precision target asks a prefix of its candidates: its count says how far it went, not which
    seen = {line["info"].get("n_vignettes") for line in lines if config.until is None
            and isinstance(line.get("info"), dict) and not line["info"].get("adaptive")}
    other = sorted(n for n in seen - {None, n_vignettes} if isinstance(n, int))
    if other:
        raise SweepError(f"{path} holds probes of {', '.join(map(str, other))} vignettes per step, this sweep "
                         f"would score {n_vignettes}: pass the subset option the history was written with "
                         f"(--per-foundation N or --limit N; its lines do not record which), or --restart")


def precision_clash(history: Path, recorded: Precision | None, line: dict, folder: str) -> str | None:
    """Why ``line`` may not join a history scored in ``recorded`` (another precision), or None."""
    mine = Precision.of(line)
    if recorded is None or recorded.same_curve(mine):
        return None
    return (f"{folder} was scored in {mine} but {history} holds probes scored in {recorded}: one curve holds one "
            f"precision (the change between them would be the precision's); pass {recorded.options()} to score the "
            f"checkpoints as the history was, or --restart to start the history again in {mine} (the old one is "
            f"kept aside)")


def check_same_format(lines: list[dict], answer_format: str, path: Path) -> None:
    """Refuse to extend a curve read in another answer format (a line without one is Yes/No)."""
    other = sorted({str(line.get("answer_format", DEFAULT_ANSWER_FORMAT)) for line in lines} - {answer_format})
    if other:
        raise SweepError(f"{path} holds probes with answer format {', '.join(map(repr, other))}, this sweep would "
                         f"read {answer_format!r}: one history holds one answer format; pass --answer-format "
                         f"{other[0]} to extend it")
