"""``MoralProbeCallback``: the probe inside Hugging Face training.

The class decides *when* to probe and *where* the result goes; :class:`~.logger.ProbeLogger` and the writers do the
writing. docs/callback.md.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..config import ProbeConfig, make_config
from ..errors import ConfigError
from ..probe import AdaptiveProbe, Probe, make_probe, scorer_of
from ..rundir.checkpoints import fingerprint
from ..rundir.history import BASELINE_EVENT
from ..scoring.model_info import check_causal_lm
from ..stats.metrics import metric_names, probe_key
from .benchmark import TrainingBenchmark, benchmark_of
from .keeper import RunKeeper, run_facts
from .logger import ProbeLogger
from .reporters import reported_runs, reporter_sinks
from .state import record_counters, stored_counters
from .writers import write_checkpoint

logger = logging.getLogger("tinymcf_callback")

EVENTS = ("evaluate", "save")


class MoralProbeCallback(TrainerCallback, ExportableState):
    """Log per-checkpoint moral-foundations alignment of the model being trained.

    Scores a fixed vignette set on the live model at the answer position and logs ``eval/moral_<name>/score`` (mean
    align_other over the six real foundations), ``gap``, the Social Norms control and ``score_minus_sn``, each with
    interval bounds, the change since the step-0 baseline with its p-value, sanity figures and per-foundation
    ``align_other`` / ``align_self`` / ``self_other_gap`` (every name: docs/callback.md).

    Example:

        trainer = Trainer(model, args, train_dataset=ds, processing_class=tok)
        trainer.add_callback(MoralProbeCallback(name="scifi"))
        trainer.train()

    Everything it needs comes with the Trainer's events. Without ``trainer=`` the metrics reach the dashboards of
    ``report_to`` through the table of trackers (:mod:`~tinymcf_callback.trackers.table`), a reporter it does not
    know said once; with ``trainer=trainer`` (as TRL's callbacks take it) through ``Trainer.log``. Its counters and
    the baseline's scores are saved in each checkpoint's ``trainer_state.json``, so a resumed run probes on the same
    steps as an uninterrupted one and measures its change from the first baseline; ``<output_dir>/
    moral_probe_run.json`` tells a watcher the run's dashboards, starting model, saves and whether it is alive.

    Args:
        name: vignette set (``scifi``; ``clifford`` after ``tinymcf prepare --name clifford``).
        config: the probe's settings (:class:`~tinymcf_callback.config.ProbeConfig`: set, limit,
            answer format and pre-fill, batching, prefix sharing, intervals, precision, self-check);
            any of its fields can also be passed as a keyword (``limit=14``, ``answer_format="json"``).
        events: which Trainer events trigger a probe: ``"evaluate"``, ``"save"`` or both.
        every: probe on every N-th triggering step (default 1: each one).
        baseline: probe once at ``on_train_begin`` (step 0) so every curve starts from the untrained model
            (not when resuming from a checkpoint).
        tokenizer: tokenizer to use; default: the Trainer's ``processing_class``.
        trainer: the Trainer whose ``log`` carries the metrics to every reporter; default: none, the table of
            trackers carries them to the ones it knows.
        strict: raise instead of warning when the probe fails (default: warn and let training go on).
        verbose: print the sanity lines and the table at every probe on the main process.
        hand_off: probe nothing in this process (the step-0 baseline included) and leave every probe to ``tinymcf
            watch``: each checkpoint's model files are hard-linked into ``<output_dir>/.moral_probe_queue/``, out of
            ``save_total_limit``'s reach until every probe following the run has scored them (docs/watch.md).
        figure: at each probe, give the reporters that show images (TensorBoard, wandb, MLflow, trackio) a figure of
            the curve so far with its interval bands (about 0.2 s a probe, measured; ``False``: none).
        endpoint: a :class:`~tinymcf_callback.served.ServedModel` to score instead of the Trainer's model: the
            inference server an RL trainer syncs the policy's weights into (TRL's GRPO in server mode, verl,
            OpenRLHF), probed at each event at no cost to the training's own devices (see docs/served.md).
        prefs: the slow benchmark beside the probe: preference pairs (a file, a dataset folder or a Hugging Face
            dataset in TRL's preference format) scored at the run's start, middle and end (:mod:`.benchmark`).
        lm_eval: lm-evaluation-harness tasks run at the same steps, through lm-eval on the live model.
        benchmark: every setting of that benchmark (:class:`~tinymcf_callback.BenchmarkConfig`: configs, split,
            per_config, lm_eval_include, at, ...); ``prefs`` and ``lm_eval`` are shortcuts into it.

    With ``answer_format="json"`` everything it writes carries the format in its name (``eval/moral_<name>_json/``,
    ``moral_probe_<name>_json.jsonl``), so two formats can probe one run side by side.
    """

    def __init__(self, name: str | None = None, *, config: ProbeConfig | None = None, events=EVENTS, every: int = 1,
                 baseline: bool = True, tokenizer=None, trainer=None, strict: bool = False, verbose: bool = True,
                 hand_off: bool = False, endpoint=None, figure: bool = True, prefs=None, lm_eval=None,
                 benchmark=None, **settings):
        events = (events,) if isinstance(events, str) else tuple(events)
        unknown = [e for e in events if e not in EVENTS]
        if unknown or not events:
            raise ConfigError(f"unknown event(s) {unknown or events!r} for MoralProbeCallback; choose from {EVENTS}")
        if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
            raise ConfigError(f"every must be a positive integer (probe on every N-th event), got {every!r}")
        if trainer is not None and not callable(getattr(trainer, "log", None)):
            raise ConfigError(f"trainer= must be the transformers Trainer the callback is added to, got "
                              f"{type(trainer).__name__} (no log method)")
        self.config = make_config(config, **({"name": name} if name is not None else {}), **settings)
        if tokenizer is None:
            self.config.vignettes()  # an unprepared set fails here, not at step 500
        self.events, self.every, self.baseline, self.strict, self.verbose = events, every, baseline, strict, verbose
        self.hand_off, self.figure = bool(hand_off), bool(figure)
        if endpoint is not None and scorer_of(endpoint) is None:
            raise ConfigError(f"endpoint= must be a tinymcf_callback.served.ServedModel (the server to probe), got "
                              f"{type(endpoint).__name__}")
        if endpoint is not None and hand_off:
            raise ConfigError("endpoint= and hand_off=True both move the probe elsewhere: choose one")
        self.endpoint = endpoint
        self.benchmark = benchmark_of(prefs, lm_eval, benchmark)
        if self.benchmark is not None and (hand_off or endpoint is not None):
            raise ConfigError("prefs= and lm_eval= score the Trainer's own model in this process: with hand_off=True "
                              "(or endpoint=) pass them to `tinymcf watch RUN --prefs ... --lm-eval ...` instead")
        self.bench = None if self.benchmark is None else TrainingBenchmark(
            self.benchmark, name=self.config.name, answer_format=self.config.answer_format, strict=strict,
            verbose=verbose)
        self.keeper: RunKeeper | None = None  # moral_probe_run.json (and the hand-off queue), on the main process
        self._tokenizer = tokenizer
        self.trainer = trainer  # the Trainer whose log carries the metrics (None: the table of trackers does)
        # the set tokenised once: at construction with tokenizer=, else at train begin
        self.probe: Probe | AdaptiveProbe | None = None
        self.logger: ProbeLogger | None = None  # the run's history, baseline and change: one per run (its output_dir)
        self.runs: dict[str, dict | None] | None = None  # the reporters' open runs, looked up once per train begin
        self.names = metric_names(self.name, self.answer_format)
        self.last_metrics: dict[str, float] = {}
        self.last_report: dict | None = None
        self._start_counting()
        if tokenizer is not None:
            self.probe = make_probe(tokenizer, config=self.config)  # tokenised once, reused at every probe

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def answer_format(self) -> str:
        return self.config.answer_format

    # ---- saved in checkpoints (transformers' ExportableState) ------------------------------------
    def state(self) -> dict:
        """Settings and counters stored in ``trainer_state.json`` under ``stateful_callbacks``: ``args``, this
        callback's keyword arguments (the Trainer rebuilds it from them with ``restore_callback_states_from_checkpoint
        =True`` and sets ``attributes`` on it)."""
        return {
            "args": {**self.config.as_dict(), "events": list(self.events), "every": self.every,
                     "baseline": self.baseline, "strict": self.strict, "verbose": self.verbose,
                     "hand_off": self.hand_off, "figure": self.figure,
                     "benchmark": self.benchmark.as_dict() if self.benchmark is not None else None},
            "attributes": {"event_count": self.event_count, "last_step": self.last_step,
                           "attempted_step": self.attempted_step, "baseline_done": self.baseline_done,
                           "baseline_record": self.baseline_record},
        }

    def _start_counting(self) -> None:
        self.event_count = 0  # triggering steps seen, for `every`
        self.last_step: int | None = None  # last step with a logged probe
        self.attempted_step: int | None = None  # last step a probe was tried (failed ones too)
        self.baseline_done = False
        self.baseline_record: dict | None = None  # the step-0 probe's per-vignette s (metrics.baseline_record)

    # ---- when ------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if self.probe is None:
            self._ensure_probe(kwargs)  # a missing tokenizer is a setup error: raise now, at step 0
        if kwargs.get("model") is not None and self.endpoint is None:
            check_causal_lm(kwargs["model"])  # a model the probe cannot read is a setup error too
        self.runs = reported_runs(args, self.trainer) if state.is_world_process_zero else {}
        if state.is_world_process_zero and args.should_save:
            self.keeper = RunKeeper(self.name, probe_key(self.name, self.answer_format), args.output_dir,
                                    run_facts(args, state, kwargs.get("model"), self.runs), hand_off=self.hand_off,
                                    from_step=state.global_step, options=self.config.command_options())
        if self.bench is not None:
            self.bench.start(args, state, self.probe.tok)  # the pairs and tasks checked now, not at the first save
        if state.global_step > 0:
            self._resume_counting(state)  # resumed: that step's probe is already on the curve
            self._start_logger(args)
            if not self.hand_off and state.is_world_process_zero:
                # the steps after it that the history holds belong to the branch the training abandoned
                started = self.keeper.attempt.started if self.keeper else None
                self.logger.resumed_from(state.global_step, started=started)
            return
        self._start_counting()  # a run from step 0 (also each hyperparameter-search trial)
        self._start_logger(args)
        if self.baseline and not self.hand_off:
            self.baseline_done = True
            self._probe(args, state, kwargs.get("model"), BASELINE_EVENT)
        self._benchmark(args, state, kwargs.get("model"), BASELINE_EVENT)

    def on_step_end(self, args, state, control, **kwargs):
        self._alive()

    on_log = on_prediction_step = on_step_end

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._alive()
        if "evaluate" in self.events and not self.hand_off:
            self._maybe_probe(args, state, kwargs, "evaluate")
        if metrics is not None and self.last_step == state.global_step and self.last_metrics:
            metrics.update(self.last_metrics)  # seen by metric_for_best_model / EarlyStopping; same on every rank

    def on_save(self, args, state, control, **kwargs):
        if "save" in self.events and not self.hand_off:
            self._maybe_probe(args, state, kwargs, "save")
        self._benchmark(args, state, kwargs.get("model"), "save", saved=True)
        # The Trainer stored the counters just before this event: store them as they are now.
        record_counters(state.stateful_callbacks, type(self).__name__, self.name, self.state(), self.answer_format)
        if args.should_save:
            report = self.last_report if self.last_step == state.global_step else None
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            write_checkpoint(folder, self.name, state, report)
            if self.keeper is not None and os.path.isdir(folder):
                self.keeper.saved(state.global_step, folder)
                if self.keeper.announce and self.verbose:
                    print(f"[tinymcf] {self.keeper.announce}")
                self.keeper.announce = None

    def on_train_end(self, args, state, control, **kwargs):
        self._benchmark(args, state, kwargs.get("model"), "train_end", ended=True)  # when the last step was not saved
        if self.logger is not None and state.is_world_process_zero:
            self.logger.close()  # history lines a full disk kept back: written now, or said lost
        if self.keeper is not None:
            self.keeper.ended(state.global_step)  # a watcher stops once it has scored what was saved

    def _alive(self) -> None:
        if self.keeper is not None:
            self.keeper.heartbeat()  # at most every 30 s: a watcher tells a live training from a dead one

    def _maybe_probe(self, args, state, kwargs, event):
        if self.attempted_step == state.global_step:
            return  # at most once per global step (evaluate and save both fire), failed attempts included
        self.event_count += 1
        if self.event_count % self.every:
            return
        if self.probe is None:
            self._ensure_probe(kwargs)
        if self.logger is None:  # an evaluation outside trainer.train()
            self._start_logger(args)
        self._probe(args, state, kwargs.get("model"), event)

    def _probe(self, args, state, model, event):
        if self.endpoint is not None:
            model = self.endpoint  # the server the training syncs its weights into, not the local copy
        if model is None:
            return
        self.attempted_step = state.global_step
        report = self.logger.score(model, step=state.global_step, event=event)
        if report is None:
            return  # warned; training goes on
        metrics = self.logger.record(report, step=state.global_step, epoch=state.epoch, event=event,
                                     write=state.is_world_process_zero, fingerprint=self._saved(args, state, event))
        self.baseline_record = self.logger.baseline_record  # saved in the checkpoints' trainer_state.json
        self.last_step, self.last_metrics, self.last_report = state.global_step, metrics, report
        self._publish(args, state, report, metrics)

    def _benchmark(self, args, state, model, event: str, *, saved: bool = False, ended: bool = False) -> None:
        """The slow benchmark, when this step is due (:class:`~.benchmark.TrainingBenchmark`): its lines into the
        benchmark history, its metrics through the Trainer's logging path at this step."""
        if self.bench is None or model is None:
            return
        why = self.bench.due(state, saved=saved, ended=ended)
        if not why:
            return
        fingerprint_ = self._saved(args, state, "save") if (saved or ended) and state.global_step else None
        lines = self.bench.score(model, state, event=event, why=why, fingerprint=fingerprint_,
                                 write=state.is_world_process_zero)
        if lines:
            self._log(state, {k: v for line in lines for k, v in line["metrics"].items()})
        if lines and self.trainer is None and state.is_world_process_zero and self.logger is not None:
            for line in lines:  # beside the curve, not on it, as a follower sends them
                self.logger.trackers.send(line, label=f"benchmark [{self.name}]")

    def _saved(self, args, state, event) -> str | None:
        """What a probe at ``on_save`` scored: the checkpoint the Trainer has just written (its fingerprint, as a
        watcher reads it); None for other probes (the live model between saves) and on the other processes."""
        if event != "save" or not state.is_world_process_zero:
            return None
        try:
            return fingerprint(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        except OSError:
            return None

    # ---- where to log ----------------------------------------------------------------------------
    def _publish(self, args, state, report, metrics):
        """The metrics into log_history on every rank (:meth:`_log`), then, on the main process, the trackers."""
        self._log(state, metrics)
        if state.is_world_process_zero:
            self.logger.publish(report)  # a tracker's trouble is a warning: the training goes on

    def _log(self, state, metrics: dict) -> None:
        """``Trainer.log`` (every reporter, state.log_history, other callbacks' ``on_log``) with ``trainer=``; else
        ``state.log_history`` as ``Trainer.log`` keeps it (the trackers get the numbers from the history line)."""
        if self.trainer is not None:
            self.trainer.log(dict(metrics))
            return
        epoch = {} if state.epoch is None else {"epoch": state.epoch}
        state.log_history.append({**metrics, **epoch, "step": state.global_step})

    # ---- plumbing ----------------------------------------------------------------------------------
    def _start_logger(self, args) -> None:
        """The history, the baseline and the change for this run: the object a loop of one's own uses, writing
        into ``args.output_dir``. Its baseline is the callback's (restored from ``trainer_state.json``, the
        callback's state), never read back from the output folder."""
        # the main process publishes; with the hand-off the watcher logs every probe
        publishes = getattr(args, "process_index", 0) == 0 and not self.hand_off
        if publishes and self.runs is None:  # an evaluation outside trainer.train(): the reporters' runs now
            self.runs = reported_runs(args, self.trainer)
        key = probe_key(self.name, self.answer_format)
        extras = reporter_sinks(self.runs, args, key, numbers=self.trainer is None) if publishes else []
        self.logger = ProbeLogger(self.probe, args.output_dir, to=extras, baseline=self.baseline, resume=False,
                                  strict=self.strict, verbose=self.verbose, figure=self.figure)
        if self.baseline_record is not None:
            self.logger.use_baseline(self.baseline_record)

    def _ensure_probe(self, kwargs) -> None:
        tok = self._tokenizer or kwargs.get("processing_class") or kwargs.get("tokenizer")
        if tok is not None and not hasattr(tok, "apply_chat_template") and hasattr(tok, "tokenizer"):
            tok = tok.tokenizer  # a processor wrapping a tokenizer
        if tok is None:
            raise ConfigError("MoralProbeCallback found no tokenizer: pass processing_class=tok to the Trainer "
                              "or MoralProbeCallback(tokenizer=tok)")
        self.probe = make_probe(tok, config=self.config)

    def _resume_counting(self, state) -> None:
        """Take the counters from the checkpoint the run resumed from (the Trainer restores callbacks itself only with
        ``restore_callback_states_from_checkpoint=True``, and then into a new instance)."""
        saved = stored_counters(state.stateful_callbacks, type(self).__name__, self.name, self.answer_format)
        if saved is None:
            logger.info("moral probe [%s]: the checkpoint holds no MoralProbeCallback counters; `every` counts "
                        "from step %d", self.name, state.global_step)
            self._start_counting()
            self.baseline_done = True
            return
        known = self.state()["attributes"]
        for attribute, value in saved.get("attributes", {}).items():
            if attribute in known:
                setattr(self, attribute, value)

