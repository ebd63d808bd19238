"""The hand-off queue: ``<output_dir>/.moral_probe_queue/``, checkpoints kept for their followers.

With ``MoralProbeCallback(hand_off=True)`` each checkpoint's model files are hard-linked here at every save (no copy),
so ``save_total_limit`` cannot delete one before it is scored; an entry goes once every registered consumer has
scored it (docs/formats.md, "The hand-off queue").
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from filelock import FileLock

QUEUE = ".moral_probe_queue"
SKIPPED = ("optimizer", "scheduler", "rng_state", "scaler", "training_args")  # not the model: not linked
MODEL_FOLDERS = ("pytorch_model_fsdp_", "global_step")  # a sharded checkpoint's model lives in one of these
_CONSUMERS = ".consumers"
_SCORED = ".scored-"


def queue_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / QUEUE


class HandOffQueue:
    """The run's queue of handed-off checkpoints, and who must score each before it goes."""

    def __init__(self, run_dir: str | os.PathLike):
        self.folder = queue_dir(run_dir)

    def entry(self, step: int) -> Path:
        return self.folder / f"checkpoint-{step}"

    def register(self, consumer: str) -> None:
        """Say that ``consumer`` follows the run: no entry goes before it has scored it (OSError to the caller)."""
        (self.folder / _CONSUMERS).mkdir(parents=True, exist_ok=True)
        (self.folder / _CONSUMERS / consumer).touch()

    def consumers(self) -> set[str]:
        folder = self.folder / _CONSUMERS
        return {p.name for p in folder.iterdir()} if folder.is_dir() else set()

    def link(self, step: int, checkpoint: str | os.PathLike) -> Path:
        """Hard-link the checkpoint's model files into its entry, whole or not at all (built beside it, then renamed,
        under the entry's lock: two callbacks handing off one save leave one whole entry). An entry of the same files
        is kept; one of other files (a resumed run saves a step again) is replaced."""
        target = self.entry(step)
        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.folder / f".{target.name}.lock"), timeout=300):
            if target.is_dir() and _same_files(Path(checkpoint), target):
                return target
            building = self.folder / f".{target.name}.building-{os.getpid()}"
            shutil.rmtree(building, ignore_errors=True)
            try:
                _link_tree(Path(checkpoint), building)
                if target.exists():
                    shutil.rmtree(target)
                os.rename(building, target)
            except OSError:
                shutil.rmtree(building, ignore_errors=True)
                raise
        return target

    def scored(self, step: int, consumer: str) -> bool:
        """``consumer`` has scored the entry of ``step``: mark it, and remove the entry when every consumer has.
        True when the entry is gone."""
        entry = self.entry(step)
        if not entry.is_dir():
            return True
        try:
            (entry / f"{_SCORED}{consumer}").touch()
        except OSError:
            return False
        if self.consumers() - self.scored_by(step):
            return False
        shutil.rmtree(entry, ignore_errors=True)
        return not entry.exists()

    def scored_by(self, step: int) -> set[str]:
        entry = self.entry(step)
        return {p.name[len(_SCORED):] for p in entry.glob(f"{_SCORED}*")} if entry.is_dir() else set()

    def waiting_for(self) -> dict[str, list[int]]:
        """For each registered consumer, the entries it has not scored yet (what keeps them on disk)."""
        steps = sorted(int(p.name.rsplit("-", 1)[1]) for p in self.folder.glob("checkpoint-*")
                       if p.name.rsplit("-", 1)[1].isdigit())
        return {c: [s for s in steps if c not in self.scored_by(s)] for c in sorted(self.consumers())}

    def remove_if_empty(self) -> None:
        """The run is over and nothing waits: the queue (its consumer list included) goes."""
        if not any(self.folder.glob("checkpoint-*")):
            shutil.rmtree(self.folder, ignore_errors=True)


def _linked(source: Path, *, top: bool = True):
    """``(relative path, inode)`` of every file the hand-off links from ``source``."""
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        if entry.is_file() and not entry.name.startswith(SKIPPED):
            yield entry.name, entry.inode()
        elif entry.is_dir() and (not top or entry.name.startswith(MODEL_FOLDERS)):
            for name, inode in _linked(Path(entry.path), top=False):
                yield f"{entry.name}/{name}", inode


def _same_files(source: Path, entry: Path) -> bool:
    """Whether ``entry`` already links every file the hand-off takes from ``source`` (the same inodes)."""
    try:
        return dict(_linked(source)) == {k: v for k, v in _linked(entry) if not k.startswith(_SCORED)}
    except OSError:
        return False


def _link_tree(source: Path, target: Path) -> None:
    """Hard-link every file the hand-off takes from ``source`` (:func:`_linked`) into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for name, _ in _linked(source):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        os.link(source / name, target / name)  # the same blocks on disk: no copy, no time
