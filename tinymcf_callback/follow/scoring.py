"""Scoring one checkpoint of a run into its history line, in the run's one precision (any process).

The weights' fingerprint is read before the model loads and again after the probe: a checkpoint rewritten meanwhile
is a failure to retry, never a line of mixed weights. Through a server (``--endpoint``) each checkpoint is loaded
into it by ``--reload`` and that reload checked on the scores (:mod:`~tinymcf_callback.served.verify`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ..errors import CheckpointIncomplete, CheckpointUnusable, one_line
from ..loading import release_memory
from ..probe import AdaptiveProbe, Probe, make_probe
from ..rundir.checkpoints import FORMATS, Checkpoint, cut_short, fingerprint, tokenizer_fingerprint
from ..rundir.history import probe_line
from ..rundir.precision import Precision
from ..served.reload import Reloader, reloads_adapter
from ..served.verify import Loaded
from ..stats.metrics import baseline_record, order_digest, why_unpaired
from ..views.rows import vignette_rows, vignette_texts
from .planner import Plan, Task
from .settings import RunSettings


@dataclass
class Outcome:
    """One checkpoint's result as plain values (sent between processes): its history line, or why it failed."""

    step: int
    folder: str
    process: int
    line: dict | None = None
    error: str | None = None
    report: dict | None = None  # the baseline's report (step 0 only), for its file beside the history
    baseline: dict | None = None  # its baseline record (step 0 only): the change of every later line is from it
    rows: list[dict] | None = None  # the per-vignette rows, for the dashboards (when the run reports to some)
    gone: bool = False  # its checkpoint was no longer there when it failed (a gap, not a failure)
    notes: list[str] = field(default_factory=list)  # what its line cannot say, and why (said once by the writer)
    bench: list[dict] = field(default_factory=list)  # the benchmark's lines of this step (a due step: follow.benchmark)
    bench_error: str | None = None  # why the benchmark of this step failed (its probe line stands)
    final: bool = False  # trying it again in this run cannot help (CheckpointUnusable): a gap at once
    incomplete: bool = False  # a weight file cut short (CheckpointIncomplete): read again quietly, a copy may finish


class ProbeCache:
    """One :class:`Probe` per distinct tokenizer, built for the first checkpoint that needs it, then reused (its
    self-check's rotation goes on over the run); and, through a server, the run's one served model."""

    def __init__(self, settings: RunSettings):
        config = settings.probe
        if settings.autocast:  # the probe keeps the autocast it is called under (what --autocast asks for)
            config = dataclasses.replace(config, keep_autocast=True)
        self.config = config
        self.served_config = settings.served
        self._probes: dict[str, Probe | AdaptiveProbe] = {}
        self._served = self._served_base = None
        self._reloader: Reloader | None = None

    def __len__(self) -> int:
        return len(self._probes)

    def get(self, source: str) -> Probe | AdaptiveProbe:
        from transformers import AutoTokenizer

        key = tokenizer_fingerprint(source)
        if key not in self._probes:
            self._probes[key] = make_probe(AutoTokenizer.from_pretrained(source), config=self.config)
        return self._probes[key]

    def served(self, *, base: bool = False):
        """The run's :class:`~tinymcf_callback.served.ServedModel` (the served name: ``--served-model``, else the one
        the server lists), built once; ``base``: the model an adapter it serves sits on (a LoRA run's step 0)."""
        from ..served import ServedModel
        from ..served.reload import base_name, served_name

        if self._served is None:
            config = self.served_config
            if not config.model:
                config = config.replace(model=served_name(config.endpoint))
            self._served = ServedModel(config=config)
        if not base:
            return self._served
        if self._served_base is None:
            config = self._served.config
            self._served_base = ServedModel(config=config.replace(model=base_name(config.endpoint, config.model)))
        return self._served_base

    @property
    def reloader(self) -> Reloader:
        """The run's one :class:`~tinymcf_callback.served.reload.Reloader` (what it sent is counted over the run)."""
        if self._reloader is None:  # the served name is asked of the server for an adapter's route only: a command may
            config = self.served_config  # start the server at its first reload
            model = self.served().model if reloads_adapter(config.reload) else config.model
            self._reloader = Reloader(config.reload, config.endpoint, model, timeout=config.reload_timeout)
        return self._reloader


def load_checkpoint(checkpoint: Checkpoint, plan: Plan, device: str, dtype: str | None = None):
    """The checkpoint's model on ``device`` in the run's dtype (or ``dtype``), by its format's loader."""
    return FORMATS[checkpoint.format].load(checkpoint, plan.base_model, dtype=dtype or plan.dtype or "auto",
                                           device=device)


@contextlib.contextmanager
def in_precision(precision: Precision | None, device: str):
    """Run the probe in ``precision``: TF32 matrix products for ``tf32``, under autocast for an autocast one."""
    with contextlib.ExitStack() as stack:
        if precision is not None and precision.compute == "tf32":
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("high")
            stack.callback(torch.set_float32_matmul_precision, before)
        if precision is not None and precision.autocast:
            stack.enter_context(torch.autocast(torch.device(device).type, dtype=getattr(torch, precision.autocast)))
        yield


def score_task(task: Task, settings: RunSettings, plan: Plan, probes: ProbeCache, device: str,
               process: int, bench=None) -> Outcome:
    """Load and score one checkpoint into its history line; any failure becomes the outcome's ``error``. ``bench``:
    the run's :class:`~.benchmark.RunBenchmark` when this step is due for it (scored on the same loaded model)."""
    checkpoint = task.checkpoint
    try:
        before = fingerprint(checkpoint.folder, checkpoint.format) if checkpoint.folder.is_dir() else None
        probe = probes.get(task.tokenizer)
        baseline = None if checkpoint.baseline else plan.baseline  # a precision target measures its change from it
        why = cut_short(checkpoint.folder, checkpoint.format) if checkpoint.folder.is_dir() else None
        if why is not None:  # neither loaded nor handed to a server, which would load half of it
            raise CheckpointIncomplete(f"{why}; not loaded or sent to a server")
        benched, bench_error = [], None
        if settings.served is not None:
            report = score_served(checkpoint, before, probe, baseline, settings, plan, probes, device)
        else:
            model = load_checkpoint(checkpoint, plan, device)
            try:
                with in_precision(plan.precision, device):
                    report = probe.run(model, baseline=baseline)
                    benched, bench_error = score_bench(bench, model, task.tokenizer, checkpoint, before, plan)
            finally:
                del model
                release_memory()
        after = fingerprint(checkpoint.folder, checkpoint.format) if checkpoint.folder.is_dir() else None
        if after != before:
            raise OSError(f"{checkpoint.folder} was written to while it was scored (fingerprint {before} then "
                          f"{after}): its weights changed under the probe")
    except Exception as e:  # noqa: BLE001 - one unreadable checkpoint must not end the run's other scores
        return Outcome(checkpoint.step, checkpoint.name, process, error=one_line(e, 400),
                       gone=not checkpoint.baseline and not checkpoint.folder.exists(),
                       final=isinstance(e, CheckpointUnusable), incomplete=isinstance(e, CheckpointIncomplete))
    if checkpoint.shown_as:
        report["model"] = checkpoint.shown_as
    baseline = baseline_record(report, 0) if checkpoint.baseline else plan.baseline
    notes = []
    if baseline is not None and not checkpoint.baseline:
        why = why_unpaired(baseline, order_digest(report))
        if why is not None:
            notes.append(f"the step-0 baseline of {plan.history.name} is not used for {checkpoint.name}: {why}")
    event = plan.baseline_event if checkpoint.baseline else plan.event
    line = probe_line(settings.name, report, baseline=baseline, target=settings.probe.target, step=checkpoint.step,
                      epoch=checkpoint.epoch, event=event)
    line["fingerprint"], line["by"] = before, plan.by
    if task.replaces:
        line["replaces"] = task.replaces
    rows = vignette_rows(report, checkpoint.step, vignette_texts(probe.vignettes)) if settings.report_to else None
    return Outcome(checkpoint.step, checkpoint.name, process, line=line,
                   report=report if checkpoint.baseline else None, baseline=baseline if checkpoint.baseline else None,
                   rows=rows, notes=notes, bench=benched, bench_error=bench_error)


def score_bench(bench, model, tokenizer: str, checkpoint: Checkpoint, weights: str | None,
                plan: Plan) -> tuple[list[dict], str | None]:
    """The benchmark's lines of a due step on the model the probe has just scored, or why it failed: a benchmark that
    cannot run costs its own result, never the probe's line."""
    if bench is None:
        return [], None
    try:
        return bench.score(model, tokenizer, checkpoint, weights, plan), None
    except (KeyboardInterrupt, torch.OutOfMemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - said by the writer, and the step is tried again at the next sweep or look
        return [], one_line(e, 400)


def score_served(checkpoint: Checkpoint, fingerprint_: str | None, probe: Probe, baseline, settings: RunSettings,
                 plan: Plan, probes: ProbeCache, device: str) -> dict:
    """The checkpoint scored through the run's server: loaded into it by ``--reload``, that reload checked on the
    scores against the checkpoint's own forward pass in float32 (unless ``--no-reload-check``); a LoRA run's step 0
    is the server's base model, checked the same way."""
    config = settings.served
    base = checkpoint.baseline and reloads_adapter(config.reload)  # an adapter's step 0: the server's base model
    where = plan.base_model if checkpoint.baseline else str(checkpoint.folder)
    reloader = probes.reloader if config.reload else None
    checked = reloader is not None and config.reload_check
    # the check's reference is loaded here while the server loads the checkpoint (they wait on different things)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinymcf-reference") if checked else None
    loading = pool.submit(load_checkpoint, checkpoint, plan, device, dtype="float32") if pool else None
    try:
        version = None
        if reloader is not None and not base:  # first: a command may start the server
            version = reloader.load(where, checkpoint.step, fingerprint_ or f"step-{checkpoint.step}")
        started = time.perf_counter()
        reference = loading.result().eval() if loading else None
        waited = time.perf_counter() - started  # what the load added after the reload was in
    finally:
        if pool is not None:
            pool.shutdown(wait=True)  # a reload that failed: the load finishes and is let go
    served = probes.served(base=base)
    served.name, served.expected_version = checkpoint.shown_as or where, version
    if not checked:
        return probe.run(served, baseline=baseline)
    route = reloader.shown if not base else f"{reloader.shown} (the adapters' base, as the server serves it)"
    # a LoRA vLLM on the CPU answers the base wrongly in a batch beside another client's adapter requests (measured:
    # 1.8e-2 in P(Yes) with attention adapters, 0.39 with embedding ones): nothing was sent, so a later try may agree
    passing = ("a vLLM with LoRA adapters answers the base model wrongly while another client's adapter requests "
               "are batched beside it; tried again, and scored once it agrees") if base else None
    served.loaded = Loaded(checkpoint.step, where, route, reference, f"float32 on {device}", seconds=waited,
                           passing=passing)
    try:
        return probe.run(served, baseline=baseline)
    finally:
        served.loaded = None
        del reference
        release_memory()
