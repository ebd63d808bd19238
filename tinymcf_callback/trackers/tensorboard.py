"""TensorBoard: the probe's events in a folder of their own inside the Trainer's, its margin charts and its figure.

A folder of its own, because a second writer in the Trainer's folder stops a live TensorBoard showing the training's
later points: docs/dashboards.md ("TensorBoard").
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from ..errors import ConfigError
from ..extras import require
from ..stats.metrics import dashboard_names
from .sinks import Point, by_step, line_metrics, line_probe_key
from .tracker import Tracker

logger = logging.getLogger(__name__)

HEADLINE_CHARTS = (("score", "score"), ("social_norms", "Social Norms control"),
                   ("score_minus_sn", "score minus the control"), ("gap", "self-other gap"),
                   ("score_change", "change of the score since step 0"),
                   ("selectivity", "selectivity of the target foundation"))


def probe_folder(logging_dir: str | os.PathLike, key: str) -> Path:
    """The probe's own TensorBoard folder inside the Trainer's logging folder: ``<logging_dir>/moral_probe_<key>``."""
    return Path(logging_dir) / f"moral_probe_{key}"


def margin_layout(key: str, metrics: dict[str, float]) -> dict:
    """The custom-scalars layout of probe ``key`` for the dashboard names in ``metrics``: a margin chart (value,
    lower, upper) for each value logged with both bounds, a plain chart for one logged without (``n_resamples=0``).
    ``{category: {chart title: [kind, tags]}}``, as ``SummaryWriter.add_custom_scalars`` takes it."""
    prefix = f"eval/moral_{key}"
    headline = {title: _chart(f"{prefix}/{name}", metrics) for name, title in HEADLINE_CHARTS
                if f"{prefix}/{name}" in metrics}
    foundations = {}
    for tag in metrics:
        if tag.startswith(f"{prefix}/") and tag.endswith("/align_other"):
            foundation = tag[len(prefix) + 1:-len("/align_other")]
            foundations[f"{foundation} align_other"] = _chart(tag, metrics)
    level = "with its interval" if any(kind == "Margin" for kind, _ in headline.values()) else "(no intervals)"
    layout = {f"moral probe {key}: headline {level}": headline}
    if foundations:
        layout[f"moral probe {key}: per foundation {level}"] = foundations
    return layout


def _chart(tag: str, metrics: dict) -> list:
    if f"{tag}_lo" in metrics and f"{tag}_hi" in metrics:
        return ["Margin", [tag, f"{tag}_lo", f"{tag}_hi"]]
    return ["Multiline", [f"^{re.escape(tag)}$"]]  # a multiline chart's tags are regular expressions: this one only


class TensorBoardWriter:
    """One probe's points into one ``SummaryWriter``: the scalars (``metrics``), the layout once (again when it grows)
    and the figure, each at the point's step, then a flush, so that a write the disk refuses raises here (the
    writer's own thread holds the error until the next write or flush)."""

    def __init__(self, writer, *, metrics: bool = True):
        self.writer, self.metrics = writer, metrics
        self._charts: dict[str, set] = {}  # probe key -> the chart tags its written layout holds

    def send(self, point: Point) -> None:
        values = line_metrics(point.line)
        step = point.step
        if self.metrics:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, global_step=step)
        key = line_probe_key(point.line)
        if key is not None:
            layout = margin_layout(key, values)
            charts = {tuple(tags) for category in layout.values() for _, tags in category.values()}
            if not charts <= self._charts.get(key, set()):
                self.writer.add_custom_scalars(layout)
                self._charts[key] = charts | self._charts.get(key, set())
            if point.figure is not None:
                self.writer.add_image(f"eval/moral_{key}/figure", point.figure, global_step=step, dataformats="HWC")
        if callable(getattr(self.writer, "flush", None)):
            self.writer.flush()


def tensorboard_folder(run_dir: Path, recorded: dict | None, given: str | None = None) -> tuple[Path, str]:
    """Where the Trainer's TensorBoard events are, and how that was decided (said when the trackers open): given (a
    folder that is not there is refused: a typo creates nothing); recorded by the callback (moved along with a run
    folder that was copied: the recorded folder inside the recorded output folder is taken inside ``run_dir``);
    ``TENSORBOARD_LOGGING_DIR``; the newest ``<run>/runs/*``; or a new ``<run>/runs/tinymcf``."""
    if given:
        if not Path(given).is_dir():
            raise ConfigError(f"--tensorboard-dir {given}: no such folder (give the Trainer's logging folder, "
                              f"RUN_DIR/runs/<time>_<host>, or leave the option out; mkdir -p {given} if a new one "
                              f"is meant)")
        return Path(given), "--tensorboard-dir"
    if recorded and recorded.get("dir"):
        folder, why = _recorded(run_dir, Path(recorded["dir"]), recorded.get("output_dir"))
        return folder, why if folder.is_dir() else f"{why}; it is not there: created"
    if os.environ.get("TENSORBOARD_LOGGING_DIR"):
        return Path(os.environ["TENSORBOARD_LOGGING_DIR"]), "TENSORBOARD_LOGGING_DIR"
    runs = sorted((p for p in (run_dir / "runs").glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if runs:
        return runs[-1], "the newest logging folder of the run"
    return run_dir / "runs" / "tinymcf", "no logging folder found in the run: a new one"


def _recorded(run_dir: Path, recorded: Path, output_dir: str | None) -> tuple[Path, str]:
    here = run_dir.resolve()
    origin = Path(output_dir).resolve() if output_dir else None
    if origin is not None and origin != here and recorded.resolve().is_relative_to(origin):
        moved = here / recorded.resolve().relative_to(origin)
        return moved, (f"the run's record names {recorded}, in {origin}; this folder is a copy of that run, so its "
                       f"own logging folder is written to")
    if origin is None and not recorded.resolve().is_relative_to(here) and (here / "runs" / recorded.name).is_dir():
        return here / "runs" / recorded.name, (f"the run's record names {recorded}, outside this folder, which holds "
                                               f"a logging folder of that name: written there")
    if not recorded.resolve().is_relative_to(here):
        return recorded, "the run's record names it (outside the run folder)"
    return recorded, "the run's record names it"


def training_logging_dir(args, trainer=None) -> str:
    """The folder the Trainer's ``TensorBoardCallback`` writes to: the callback's own (set at its ``on_train_begin``)
    when the Trainer is given; else from what every callback is handed: ``args.logging_dir`` (transformers 4),
    ``TENSORBOARD_LOGGING_DIR``, else the newest ``<output_dir>/runs/*`` (the reporter made it at train begin, before
    this package's callback, which comes after the reporters)."""
    for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", ()):
        if type(cb).__name__ == "TensorBoardCallback" and getattr(cb, "logging_dir", None):
            return os.path.abspath(cb.logging_dir)
    if getattr(args, "logging_dir", None):
        return os.path.abspath(args.logging_dir)
    return os.path.abspath(tensorboard_folder(Path(args.output_dir), None)[0])


class TensorBoardTracker(Tracker):
    """The probe's events in its own folder inside the Trainer's TensorBoard logging folder (see the module).

    The record keeps ``{"dir": the Trainer's logging folder, "output_dir": the run folder}`` (a copied run folder
    writes into its own). The writer is made at the first point (no folder for a run never probed)."""

    name = "tensorboard"
    option = ("--tensorboard-dir", "DIR", "the TensorBoard logging folder the probe's own folder goes in (default: "
              "the Trainer's, as the run records it, else the newest RUN_DIR/runs/*); it must exist")

    def __init__(self, folder: Path, why: str | None = None, *, metrics: bool = True):
        super().__init__(f"TensorBoard ({folder}{'; ' + why if why else ''})")
        self.folder, self.metrics = Path(folder), metrics
        self._writer: TensorBoardWriter | None = None

    # ---- the training process ------------------------------------------------------------------------------
    @classmethod
    def recorded(cls, args, trainer=None) -> dict | None:
        return {"dir": training_logging_dir(args, trainer), "output_dir": os.path.abspath(args.output_dir)}

    @classmethod
    def in_training(cls, args, key: str, run: dict | None, *, numbers: bool) -> TensorBoardTracker | None:
        """The layout and the figure (with ``numbers``, the scalars too) in the probe's own folder inside the
        Trainer's, never a second file in the Trainer's own folder."""
        require("tensorboard")
        return cls(probe_folder(run["dir"] if run else training_logging_dir(args), key), metrics=numbers)

    # ---- another process -----------------------------------------------------------------------------------
    @classmethod
    def reopen(cls, run_dir: Path, recorded: dict | None, given: str | None, key: str) -> TensorBoardTracker:
        require("tensorboard")
        folder, why = tensorboard_folder(run_dir, recorded, given)
        tracker = cls(probe_folder(folder, key), why)
        tracker._open()
        return tracker

    # ---- points --------------------------------------------------------------------------------------------
    def send(self, point: Point) -> None:
        self._open().send(point)

    def held(self, name: str) -> dict[int, list[float]] | None:
        """The values of ``name`` in the probe's own folder, read by TensorBoard's reader (float32, as it stores
        them)."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        if not self.folder.is_dir():
            return {}
        tag = next(iter(dashboard_names({name: 0.0})))
        events = EventAccumulator(str(self.folder), size_guidance={"scalars": 0, "images": 1, "tensors": 1})
        events.Reload()
        return by_step((e.step, e.value) for e in events.Scalars(tag)) if tag in events.Tags()["scalars"] else {}

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.writer.close()

    def _open(self) -> TensorBoardWriter:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=str(self.folder), filename_suffix=".tinymcf")
            self._writer = TensorBoardWriter(writer, metrics=self.metrics)
        return self._writer
