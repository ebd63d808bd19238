"""What a run's history already holds, and the guards that keep one curve one probe.

A sweep or a watcher only extends a history (``moral_probe_<name>.jsonl``) with lines that compare
with the ones there: the same vignettes (the subset the history records), the same answer format and
the same precision. Each guard refuses in one line naming the option that reproduces the history's
probe, or ``--restart``. The current run is the history's own rule
(:func:`~tinymcf_callback.results.history.current_run`).
"""

from __future__ import annotations

from pathlib import Path

from ..config import ProbeConfig, subset_options
from ..errors import HistoryError, SweepError
from ..results.history import current_run, read_lines
from ..results.report import describe_precision, precision_key
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT


def current_run_lines(path: Path) -> list[dict]:
    """The lines of the history at ``path`` that belong to the current run ([] when there is no file yet).

    The history's own rule (:func:`~tinymcf_callback.results.history.current_run`): a baseline line after
    other lines starts a new run written into the same output folder, so earlier lines do not count as done.
    """
    if not path.exists():
        return []
    try:
        numbered = read_lines(path)
    except HistoryError as e:
        if "is empty" in str(e):
            return []
        raise SweepError(f"{e}: the sweep only appends to this history; repair or move that line") from None
    return [line for _, line in current_run(path, numbered, warn=False)]


def recorded_steps(lines: list[dict]) -> set[int]:
    return {line["step"] for line in lines if isinstance(line.get("step"), int)}


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
    seen = {line.get("info", {}).get("n_vignettes") for line in lines if isinstance(line.get("info"), dict)}
    other = sorted(n for n in seen - {None, n_vignettes} if isinstance(n, int))
    if other:
        raise SweepError(f"{path} holds probes of {', '.join(map(str, other))} vignettes per step, this sweep "
                         f"would score {n_vignettes}: pass the subset option the history was written with "
                         f"(--per-foundation N or --limit N; its lines do not record which), or --restart")


def history_precision(lines: list[dict]) -> tuple[str, str | None] | None:
    """The precision the history's lines were scored in (their last one that records it), or None."""
    return next((k for k in map(precision_key, reversed(lines)) if k is not None), None)


def precision_clash(history: Path, recorded, line: dict, folder: str) -> str | None:
    """Why ``line`` may not join a history scored in ``recorded`` (another precision), or None."""
    mine = precision_key(line)
    if recorded is None or mine is None or mine == recorded:
        return None
    return (f"{folder} was scored in {describe_precision(mine)} but {history} holds probes scored in "
            f"{describe_precision(recorded)}: one curve holds one precision (the change between them would be the "
            f"precision's); pass --dtype {recorded[0]} to score the checkpoints as the history was, or --restart to "
            f"start the history again in {describe_precision(mine)} (the old one is kept aside)")


def check_same_format(lines: list[dict], answer_format: str, path: Path) -> None:
    """Refuse to extend a curve read in another answer format (a line without one is Yes/No)."""
    other = sorted({str(line.get("answer_format", DEFAULT_ANSWER_FORMAT)) for line in lines} - {answer_format})
    if other:
        raise SweepError(f"{path} holds probes with answer format {', '.join(map(repr, other))}, this sweep would "
                         f"read {answer_format!r}: one history holds one answer format; pass --answer-format "
                         f"{other[0]} to extend it")
