"""What a training run tells a follower in another process: ``moral_probe_run.json``, as one typed object, kept by
``MoralProbeCallback`` under a lock (:func:`updating`). Its fields: docs/formats.md, "The run's record for a follower".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from .._io import atomic_write_json

RUN_INFO = "moral_probe_run.json"
ALIVE, GONE, QUIET, UNKNOWN, ENDED = "alive", "gone", "quiet", "unknown", "ended"  # what a follower can tell
HEARTBEAT_EVERY_S = 30.0  # the callback refreshes the heartbeat at most this often
DEAD_AFTER_S = 900.0  # a heartbeat older than this, from another machine, means the training is gone


def run_info_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RUN_INFO


@dataclass
class Attempt:
    """One start of the training process: from step 0, or resumed from ``checkpoint-<from_step>``."""

    from_step: int = 0
    started: float = 0.0  # time.time() at on_train_begin
    host: str | None = None
    pid: int | None = None
    boot_id: str | None = None  # the machine's boot (Linux): a pid of an earlier boot is another process
    pid_started: str | None = None  # the process's start time (Linux): a reused pid is another process
    heartbeat: float | None = None  # time.time() at the last sign of life
    saves: list[int] = field(default_factory=list)  # the steps this attempt saved

    @classmethod
    def here(cls, from_step: int) -> Attempt:
        """This process, now."""
        now = time.time()
        return cls(from_step, now, socket.gethostname(), os.getpid(), boot_id(), process_start(os.getpid()), now)

    def liveness(self, now: float | None = None, dead_after: float = DEAD_AFTER_S) -> tuple[str, str]:
        """``(life, why)``: ``alive``, ``gone`` (its process is known gone), ``quiet`` (on another machine, no
        heartbeat for more than ``dead_after`` seconds) or ``unknown``; ``why`` says what was seen, and where."""
        now = time.time() if now is None else now
        where = f"process {self.pid} on {self.host}"
        if self.host == socket.gethostname() and self.pid is not None and self.boot_id == boot_id():
            started = process_start(self.pid)
            if started is None and not pid_exists(self.pid):
                return GONE, f"{where} is gone"
            if started is not None and self.pid_started is not None and started != self.pid_started:
                return GONE, f"{where} is gone (its process id now belongs to another process)"
            return ALIVE, f"{where} is running"
        if self.heartbeat is None:
            return UNKNOWN, f"{where} left no heartbeat"
        age = now - self.heartbeat
        last = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.heartbeat))
        if age > dead_after:
            return QUIET, (f"{where} has given no sign of life for {age:.0f} s (more than {dead_after:g} s; its last "
                           f"heartbeat was at {last})")
        return ALIVE, f"{where} gave a sign of life {age:.0f} s ago"


@dataclass
class RunRecord:
    """The run's ``moral_probe_run.json`` (see the module); :meth:`read` is None when the run has none."""

    hand_off: bool = False
    report_to: list[str] = field(default_factory=list)
    max_steps: int | None = None
    save_steps: float | None = None
    base_model: str | None = None
    dtype: str | None = None  # what the run trains in (its weights' dtype)
    trackers: dict[str, dict] = field(default_factory=dict)  # tracker name -> the run it has open (Tracker.recorded)
    saves: list[int] = field(default_factory=list)
    ended: bool = False
    global_step: int | None = None  # where it ended
    attempts: list[Attempt] = field(default_factory=list)
    hand_off_failures: dict[int, str] = field(default_factory=dict)  # step -> why it was not handed off
    heartbeat_every: float = HEARTBEAT_EVERY_S

    # ---- the file -------------------------------------------------------------------------------------------
    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> RunRecord | None:
        """The run's record, or None when there is none or it cannot be read (a follower then falls back on the
        Trainer's own files). Fields of the wrong type are left at their defaults."""
        try:
            raw = json.loads(run_info_path(run_dir).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return cls.from_json(raw) if isinstance(raw, dict) else None

    @classmethod
    def from_json(cls, raw: dict) -> RunRecord:
        record = cls()
        for f in dataclasses.fields(cls):
            if f.name in ("attempts", "hand_off_failures", "saves") or f.name not in raw:
                continue
            value = raw[f.name]
            if _fits(value, getattr(record, f.name), f.name):
                setattr(record, f.name, value)
        record.saves = [s for s in raw.get("saves") or [] if _is_int(s)]
        failures = raw.get("hand_off_failures") if isinstance(raw.get("hand_off_failures"), dict) else {}
        record.hand_off_failures = {int(k): str(v) for k, v in failures.items() if str(k).isdigit()}
        names = {f.name for f in dataclasses.fields(Attempt)}
        for a in raw.get("attempts") or []:
            if isinstance(a, dict):
                attempt = Attempt(**{k: v for k, v in a.items() if k in names})
                attempt.saves = [s for s in attempt.saves or [] if _is_int(s)]
                record.attempts.append(attempt)
        return record

    def write(self, run_dir: str | os.PathLike) -> None:
        """The whole file, atomically (OSError to the caller)."""
        failures = {str(k): v for k, v in self.hand_off_failures.items()}
        atomic_write_json(run_info_path(run_dir), {**dataclasses.asdict(self), "hand_off_failures": failures})

    # ---- what followers ask ---------------------------------------------------------------------------------
    @property
    def attempt(self) -> Attempt | None:
        """The newest attempt (the one that trains now, or trained last)."""
        return self.attempts[-1] if self.attempts else None

    def liveness(self, now: float | None = None, dead_after: float = DEAD_AFTER_S) -> tuple[str, str]:
        """Whether the training is still going (:meth:`Attempt.liveness`'s states): ``ended`` when the record says
        so; else the newest attempt's process or heartbeat; ``unknown`` when the record names no process."""
        if self.ended:
            return ENDED, "the run ended"
        if self.attempt is None:
            return UNKNOWN, "the run's record names no training process"
        return self.attempt.liveness(now, dead_after)


@contextlib.contextmanager
def updating(run_dir: str | os.PathLike):
    """Read (a new record when the file has none), change and write the record under its lock
    (``.moral_probe_run.json.lock``), so that two callbacks of one run (one per answer format) never undo each other's
    update: ``with updating(d) as record: ...``. OSError (the file cannot be written) to the caller."""
    path = run_info_path(run_dir)
    with FileLock(str(path.with_name(f".{path.name}.lock")), timeout=60):
        record = RunRecord.read(run_dir) or RunRecord()
        yield record
        record.write(run_dir)


# ---- this machine -------------------------------------------------------------------------------------------
def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of ``/proc/<pid>/stat``), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    except OSError:
        return False
    return True


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fits(value, default, name: str) -> bool:
    if value is None:
        return default is None  # "not known" only where the field may not be known
    if name in ("max_steps", "global_step"):
        return _is_int(value)
    if name in ("save_steps", "heartbeat_every"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name in ("base_model", "dtype"):
        return isinstance(value, str)
    if name == "trackers":
        return isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())
    if name == "report_to":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, type(default))
