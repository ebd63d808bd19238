"""What following a run is told: one settings object for the sweep and the watcher, checked once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..benchmark.config import BenchmarkConfig
from ..config import ProbeConfig
from ..errors import ConfigError
from ..rundir.curve import Curve
from ..rundir.history import history_path
from ..rundir.layouts import SETTLE_S
from ..rundir.precision import AUTOCASTS, COMPUTES, Precision
from ..rundir.record import DEAD_AFTER_S
from ..served.config import ServedConfig
from ..stats.metrics import probe_key
from ..trackers.table import resolve

DTYPE_CHOICES = ("auto", *COMPUTES)  # --dtype: auto (the run's own), or a precision (tf32: float32 weights, TF32)


@dataclass(frozen=True)
class RunSettings:
    """What to score in a run folder and how: the probe, the starting model, the precision, the dashboards."""

    run_dir: Path
    probe: ProbeConfig = field(default_factory=ProbeConfig)  # the set, subset, answer format, intervals, ...
    base_model: str | None = None  # the run's starting weights (step 0), and what adapters apply to
    force_base_model: bool = False  # score on base_model even where the run or an adapter names another
    tokenizer: str | None = None  # default: each checkpoint's own tokenizer files, else the base model's
    device: str | None = None  # default: this process's device (accelerate's PartialState)
    dtype: str = "auto"  # auto: the history's precision, else what the run trains in, else the checkpoints'
    autocast: str | None = None  # score under torch.autocast in this dtype (as a bf16 Trainer's callback did)
    progress: bool = True
    baseline: bool = True  # score the starting weights as step 0 and log the change since them
    report_to: tuple[str, ...] = ()  # the run's dashboards to log each line into (trackers.table's names, auto)
    # tracker name -> the run it logs into, named on the command line (--mlflow-run RUN_ID, --tensorboard-dir DIR,
    # ...) for a run whose moral_probe_run.json does not name it
    runs: dict[str, str] = field(default_factory=dict)
    figure: bool = True  # a figure of the curve so far into each dashboard at every line (--no-figure: none)
    restart: bool = False  # set the history and its baseline report aside (renamed, kept) and start them again
    served: ServedConfig | None = None  # score through a server (--endpoint, --reload) instead of loading each
    settle: float = SETTLE_S  # a save without a completion marker counts once its files are this long unchanged
    benchmark: BenchmarkConfig | None = None  # preference pairs and lm-eval tasks at the run's start, middle and end

    def __post_init__(self):
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        if self.autocast is not None and self.autocast not in AUTOCASTS:
            raise ConfigError(f"--autocast must be one of {', '.join(AUTOCASTS)}, got {self.autocast!r}")
        if not isinstance(self.settle, (int, float)) or self.settle < 0:
            raise ConfigError(f"--settle must be a number of seconds >= 0, got {self.settle!r}")
        resolve(self.report_to, None)  # an unknown tracker is refused before anything is looked at
        if self.autocast is not None and self.dtype not in ("auto", "float32"):
            raise ConfigError(f"--autocast runs float32 weights under autocast: pass --dtype float32 (or leave it "
                              f"out) with --autocast {self.autocast}, not --dtype {self.dtype}")

    @property
    def name(self) -> str:
        return self.probe.name

    @property
    def consumer(self) -> str:
        """This probe as a consumer of the run's hand-off queue: ``scifi``, ``scifi_json``."""
        return probe_key(self.probe.name, self.probe.answer_format)

    @property
    def history(self) -> Path:
        return Path(history_path(str(self.run_dir), self.probe.name, self.probe.answer_format))

    def curve(self) -> Curve:
        """The run's curve of this probe: its history and baseline report, written through one writer."""
        return Curve(self.run_dir, self.probe.name, self.probe.answer_format)

    @property
    def requested(self) -> Precision | None:
        """The precision ``--dtype`` / ``--autocast`` ask for (None: decided from the run)."""
        return Precision.requested(self.dtype, self.autocast)


@dataclass(frozen=True)
class WatchSettings:
    """The run's settings, and when to look and when to stop."""

    run: RunSettings
    poll: float = 10.0  # seconds between two looks at the run folder
    idle_timeout: float | None = None  # stop when no new checkpoint came for this long (None: wait for the end)
    stop_at: int | None = None  # stop once the checkpoint of this step (or a later one) is done
    dead_after: float = DEAD_AFTER_S  # a training on another machine silent this long is taken for dead
    retries: int = 4  # a checkpoint that cannot be read is tried again this many times ...
    backoff: float = 2.0  # ... after 2, 4, 8, 16 s (doubling from this)
