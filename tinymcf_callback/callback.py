"""``MoralProbeCallback``: the probe inside Hugging Face training.

    trainer.add_callback(MoralProbeCallback(name="scifi", trainer=trainer))

At the start of training (a step-0 baseline) and on each evaluation and/or save, the
callback scores the live model on a vignette set, through the same :class:`Probe` as
``evaluate`` (split across processes by :func:`score_across_ranks`), and logs the alignment
metrics through the Trainer's own logging path, so they reach every reporter in
``report_to`` (wandb, tensorboard, ...) at the right global step and land in
``state.log_history``. The class decides *when* to probe and *where* the result goes; the
writers below (history line, checkpoint report, wandb table) do the writing.

Each probe logs the headline numbers with their interval bounds and, when the run has a
step-0 baseline, the paired change of the score since it (``score_change``, ``score_change_p``).
The baseline's per-vignette scores are kept in the callback's saved state, so a resumed run
(even into another output folder) measures its change from the same baseline.

With ``answer_format="json"`` (true/false answers) everything the callback writes carries the
format in its name: metrics under ``eval/moral_<name>_json/``, ``moral_probe_<name>_json.jsonl``,
``moral_probe_<name>_json.json``; Yes/No (the default) keeps the plain names. So two formats never
share a curve, a file or a dashboard panel, and both can probe one run side by side.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import re
import time

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ._io import append_jsonl, atomic_write_json
from .distributed import score_across_ranks
from .model_info import UnsupportedModelError, check_causal_lm
from .probe import (
    DEFAULT_ANSWER_FORMAT,
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    PRECISION_FIELDS,
    Probe,
    check_uncertainty,
    format_table,
    headline_fields,
    json_records,
    report_to_json,
    sanity_lines,
)
from .prompts import answer_format_of
from .sets import load_vignettes
from .stats import VignetteScores, paired_change, vignette_scores

logger = logging.getLogger("tinymcf_callback")

EVENTS = ("evaluate", "save")
BASELINE_EVENT = "train_begin"  # the event of the step-0 baseline: a history line that starts a run
# logged headline key -> the report's field; each also logged with _lo / _hi bounds
LOGGED_HEADLINE = {"score": "score", "gap": "gap", "social_norms": "sn", "score_minus_sn": "score_minus_sn"}
SANITY_KEYS = ("yn_mass", "yn_mass_min", "frame_agreement", "human_corr", "elapsed_s")
CHANGE_KEYS = ("score_change", "score_change_p")  # since the step-0 baseline (logged when the run has one)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def probe_key(name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """The set's name in metric and file names: ``scifi`` for Yes/No answers, ``scifi_json`` for JSON ones."""
    answer_format_of(answer_format)
    suffix = "" if answer_format == DEFAULT_ANSWER_FORMAT else f"_{answer_format}"
    return _slug(name) + suffix


def _format(report: dict) -> str:
    return report.get("answer_format", DEFAULT_ANSWER_FORMAT)


def metric_names(name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> dict[str, str]:
    """Documented logged-metric names for set ``name`` (prefix ``eval_moral_<name>/``, ``eval_moral_<name>_json/``).

    ``rewrite_logs`` in the reporters turns ``eval_x`` into ``eval/x``: the probe's curves
    show as ``eval/moral_<name>/score`` etc., never under ``train/``. With JSON answers
    ``yn_mass`` is the true+false mass (the name stays, so dashboards read both formats alike).
    """
    headline = [key + suffix for key in LOGGED_HEADLINE for suffix in ("", "_lo", "_hi")]
    prefix = f"eval_moral_{probe_key(name, answer_format)}"
    return {key: f"{prefix}/{key}" for key in (*headline, *CHANGE_KEYS, *SANITY_KEYS)}


def report_metrics(name: str, report: dict) -> dict[str, float]:
    """Flatten a probe report into the logged scalar metrics (finite values only).

    Headline numbers come with their interval bounds; per-foundation numbers without (their
    bounds are in the table of the history line, the checkpoint report and the wandb table).
    """
    names = metric_names(name, _format(report))
    info = report["info"]
    values = {names[key + suffix]: report.get(field + suffix)
              for key, field in LOGGED_HEADLINE.items() for suffix in ("", "_lo", "_hi")}
    values.update({
        names["yn_mass"]: info["yn_mass_mean"], names["yn_mass_min"]: info["yn_mass_min"],
        names["frame_agreement"]: info["frame_agreement"], names["human_corr"]: info["human_corr"],
        names["elapsed_s"]: info["elapsed_s"],
    })
    prefix = f"eval_moral_{probe_key(name, _format(report))}"
    for foundation, row in report["table"].iterrows():
        for col in ("align_other", "align_self", "self_other_gap"):
            values[f"{prefix}/{_slug(foundation)}/{col}"] = row[col]
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


# ---- the step-0 baseline: what the change since the start of training is measured from ---------------
def baseline_record(report: dict, step: int) -> dict:
    """A report's per-vignette ``s`` and prompt digest as plain JSON values (kept in ``trainer_state.json``)."""
    scores = vignette_scores(report["scenarios"])
    return {"step": step, "prompt_digest": report["prompt_digest"], "score": report["score"],
            "id": [str(i) for i in scores.id], "foundation_coarse": [str(f) for f in scores.foundation_coarse],
            "s": [[None if not math.isfinite(x) else float(x) for x in row] for row in scores.s.tolist()]}


def baseline_scores(record: dict) -> VignetteScores:
    """The :class:`VignetteScores` of a :func:`baseline_record` (``None`` back to NaN)."""
    s = [[math.nan if x is None else float(x) for x in row] for row in record["s"]]
    return VignetteScores(record["id"], record["foundation_coarse"], s)


def change_metrics(name: str, baseline: dict | None, report: dict) -> dict[str, float]:
    """``score_change`` (this probe's score minus the baseline's) and its paired two-sided p-value.

    The p-value comes from a paired bootstrap over vignettes at the report's ``n_resamples`` and
    ``level`` (``stats.paired_change``, seed 0); with intervals off (``n_resamples=0``) only the change
    is logged. Empty without a baseline; finite values only.
    """
    if baseline is None:
        return {}
    names = metric_names(name, _format(report))
    if not report.get("n_resamples"):
        before, now = baseline.get("score"), report["score"]
        values = {names["score_change"]: None if before is None or now is None else now - before}
    else:
        change = paired_change(baseline_scores(baseline), vignette_scores(report["scenarios"]),
                               level=report["level"], n_resamples=report["n_resamples"], seed=0)["headline"]["score"]
        values = {names["score_change"]: change.change, names["score_change_p"]: change.p}
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


# ---- writers: where a finished probe goes besides Trainer.log (main process only) -----------------
def history_path(output_dir: str, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """``<output_dir>/moral_probe_<name>.jsonl``: the run's curve of set ``name`` (also appended to by the sweep).

    ``moral_probe_<name>_json.jsonl`` with JSON answers: one history holds one answer format.
    """
    return os.path.join(output_dir, f"moral_probe_{probe_key(name, answer_format)}.jsonl")


def history_line(name: str, report: dict, metrics: dict, *, step: int, epoch, event: str) -> dict:
    """One probe as a history line (schema in the README); ``event`` says what triggered it.

    Top level: what was scored and in which precision (``model``, ``device``, ``dtype``, ``autocast``),
    the headline numbers with their bounds (``score``, ``score_lo``, ``score_hi``, ... ,
    ``score_minus_sn_hi``), ``level``, ``n_resamples``, ``seed``, ``prompt_digest`` and ``answer_format``;
    table rows carry ``<metric>_lo``/``<metric>_hi``; ``info`` holds the self-check (``info.self_check``)
    and the precision (``info.precision``). ``None`` where undefined.
    """
    return {"step": step, "epoch": epoch, "event": event, "name": name, "answer_format": _format(report),
            **{key: report.get(key) for key in PRECISION_FIELDS},
            **headline_fields(report),
            "prompt_digest": report["prompt_digest"], "metrics": metrics,
            "info": {k: v for k, v in report["info"].items() if k != "sample_prompt"},
            "table": json_records(report["table"].reset_index())}


def append_history(output_dir: str, name: str, report: dict, metrics: dict, *, step: int, epoch, event: str) -> None:
    """Append one line per probe to ``<output_dir>/moral_probe_<name>.jsonl`` (the run's whole curve)."""
    line = history_line(name, report, metrics, step=step, epoch=epoch, event=event)
    try:
        append_jsonl(history_path(output_dir, name, _format(report)), line)
    except OSError as e:
        logger.warning("moral probe [%s]: could not append the history file: %s", name, e)


def baseline_path(output_dir: str, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """``<output_dir>/moral_probe_<name>_baseline.json``: the step-0 report (no checkpoint holds it)."""
    return os.path.join(output_dir, f"moral_probe_{probe_key(name, answer_format)}_baseline.json")


def write_baseline(output_dir: str, name: str, report: dict, *, step: int, epoch) -> None:
    """The baseline's full report, for ``eval --compare`` against any checkpoint's ``moral_probe_<name>.json``."""
    try:
        atomic_write_json(baseline_path(output_dir, name, _format(report)),
                          report_to_json(report, step=step, epoch=epoch))
    except OSError as e:
        logger.warning("moral probe [%s]: could not write the baseline report: %s", name, e)


def write_checkpoint(folder: str, name: str, state, report: dict | None) -> None:
    """Add the probe to a checkpoint the Trainer has just written.

    Writes ``moral_probe_<name>.json`` (``moral_probe_<name>_json.json`` for JSON answers; the full
    report) when this step was probed, and
    rewrites ``trainer_state.json``: the Trainer wrote it before ``on_save``, so without the
    refresh it would miss this step's log entry and this save's callback counters.
    """
    if not os.path.isdir(folder):
        return
    try:
        if report is not None:
            atomic_write_json(os.path.join(folder, f"moral_probe_{probe_key(name, _format(report))}.json"),
                              report_to_json(report, step=state.global_step, epoch=state.epoch))
        if os.path.exists(os.path.join(folder, "trainer_state.json")):
            state.save_to_json(os.path.join(folder, "trainer_state.json"))
    except OSError as e:
        logger.warning("moral probe [%s]: could not write the checkpoint report: %s", name, e)


def reports_to_wandb(args) -> bool:
    """Did the user ask the Trainer for wandb (``report_to``)? An active run alone is not consent."""
    report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    return "wandb" in report_to


def active_wandb_run():
    """The current wandb run, or None (wandb not installed, or no run started)."""
    try:
        import wandb
    except ImportError:
        return None
    return getattr(wandb, "run", None)


def define_wandb_metrics(run, name: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> None:
    """Plot every ``eval/moral_<name>/...`` key against the Trainer's step (once per run)."""
    run.define_metric(f"eval/moral_{probe_key(name, answer_format)}/*", step_metric="train/global_step")


def record_wandb_precision(run, name: str, report: dict) -> None:
    """The probe's precision in the run's config (``moral_<name>/dtype``, ``/autocast``, ``/device``)."""
    key = f"moral_{probe_key(name, _format(report))}"
    run.config.update({f"{key}/{field}": report.get(field) for field in ("dtype", "autocast", "device")},
                      allow_val_change=True)


def log_wandb_table(run, name: str, report: dict, step: int) -> None:
    """Log the per-foundation table as ``eval/moral_<name>/table`` at ``step``."""
    import wandb

    table = wandb.Table(dataframe=report["table"].reset_index())
    run.log({f"eval/moral_{probe_key(name, _format(report))}/table": table, "train/global_step": step})


# ---- the callback's counters in trainer_state.json ------------------------------------------------
def _entries(stateful_callbacks: dict | None, key: str) -> list:
    stored = (stateful_callbacks or {}).get(key)
    return stored if isinstance(stored, list) else [stored] if stored else []


def _mine(entries: list, name: str, answer_format: str) -> list[int]:
    # Several callbacks of one class share a key (a list, appended to at each save): match the set name and the
    # answer format (states saved before formats existed are Yes/No).
    return [i for i, e in enumerate(entries) if isinstance(e, dict) and e.get("args", {}).get("name") == name
            and e["args"].get("answer_format", DEFAULT_ANSWER_FORMAT) == answer_format]


def stored_counters(stateful_callbacks: dict | None, key: str, name: str,
                    answer_format: str = DEFAULT_ANSWER_FORMAT) -> dict | None:
    """The newest saved state of the ``key`` callback probing set ``name`` in ``answer_format``, or None."""
    entries = _entries(stateful_callbacks, key)
    mine = _mine(entries, name, answer_format)
    return entries[mine[-1]] if mine else None


def record_counters(stateful_callbacks: dict, key: str, name: str, saved: dict,
                    answer_format: str = DEFAULT_ANSWER_FORMAT) -> None:
    """Replace (or add) the saved state of the ``key`` callback probing set ``name`` in ``answer_format``.

    One entry is kept per set and answer format.

    With several callbacks of one class the Trainer appends all their states at every save; older
    entries of this set are dropped, so ``trainer_state.json`` (which holds the baseline's scores)
    does not grow with the number of saves.
    """
    entries = _entries(stateful_callbacks, key)
    mine = _mine(entries, name, answer_format)
    if mine:
        entries[mine[-1]] = saved
        entries = [e for i, e in enumerate(entries) if i not in mine[:-1]]
    else:
        entries.append(saved)
    stateful_callbacks[key] = entries[0] if len(entries) == 1 else entries


class MoralProbeCallback(TrainerCallback, ExportableState):
    """Log per-checkpoint moral-foundations alignment of the model being trained.

    Scores a fixed vignette set on the live model at the answer position (two frames answered
    Yes/No, or true/false in JSON; four conditions) and logs ``eval/moral_<name>/score`` (mean align_other over
    the six real foundations), ``gap``, the Social Norms control and ``score_minus_sn``, each
    with interval bounds (``_lo``, ``_hi``), the change of the score since the step-0 baseline
    with its p-value, sanity figures and per-foundation ``align_other`` / ``align_self`` /
    ``self_other_gap``.

    Example (``trainer=`` first: the callback then logs through that Trainer):

        trainer = Trainer(model, args, train_dataset=ds, processing_class=tok)
        trainer.add_callback(MoralProbeCallback(name="scifi", trainer=trainer))
        trainer.train()

    Without ``trainer=`` (``Trainer(..., callbacks=[MoralProbeCallback(name="scifi")])``)
    the callback finds the Trainer that holds it by walking the call stack once, at
    ``on_train_begin``; that fails when another callback forwards the events to it.

    Its counters (events seen for ``every``, the last probed and attempted steps, whether
    the baseline ran) and the baseline's per-vignette scores are saved in each checkpoint's
    ``trainer_state.json``; a run resumed from a checkpoint probes on the same steps as an
    uninterrupted run, without a second baseline, and measures its change from the first one.

    Args:
        name: vignette set (``scifi``; ``clifford`` after ``python -m tinymcf_callback.prepare --name clifford``).
        events: which Trainer events trigger a probe: ``"evaluate"``, ``"save"`` or both.
        every: probe on every N-th triggering step (default 1: each one).
        baseline: probe once at ``on_train_begin`` (step 0) so every curve starts from the untrained model
            (not when resuming from a checkpoint).
        tokenizer: tokenizer to use; default: the Trainer's ``processing_class``.
        trainer: the Trainer whose ``log`` reaches the reporters (recommended); default: found on the call stack.
        limit: keep only the first N vignettes (faster, noisier).
        strict: raise instead of warning when the probe fails (default: warn and let training go on).
        token_budget: padded tokens per forward call of the probe (memory knob).
        verbose: print the sanity lines and the table at every probe on the main process.
        level: the intervals' confidence level (default 0.95).
        n_resamples: bootstrap resamples per probe (default 2000, a few milliseconds); 0: no intervals
            and no p-value.
        answer_format: ``"yesno"`` (default) or ``"json"`` (asks for ``{"is_wrong": true|false}``, reads
            P(true)); a JSON probe logs under ``eval/moral_<name>_json/`` and writes
            ``moral_probe_<name>_json.jsonl``, so both formats can watch one run.
        keep_autocast: score under the Trainer's mixed precision (``bf16=True``/``fp16=True`` autocast);
            default False: in the weights' own dtype, so the number at step N is ``eval`` of
            ``checkpoint-N``. Every report and history line records the precision either way.
    """

    def __init__(self, name: str = "scifi", *, events=EVENTS, every: int = 1, baseline: bool = True,
                 tokenizer=None, trainer=None, limit: int | None = None, strict: bool = False,
                 token_budget: int | None = None, verbose: bool = True, level: float = DEFAULT_LEVEL,
                 n_resamples: int = DEFAULT_RESAMPLES, answer_format: str = DEFAULT_ANSWER_FORMAT,
                 keep_autocast: bool = False):
        events = (events,) if isinstance(events, str) else tuple(events)
        unknown = [e for e in events if e not in EVENTS]
        if unknown or not events:
            raise ValueError(f"unknown event(s) {unknown or events!r} for MoralProbeCallback; choose from {EVENTS}")
        if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
            raise ValueError(f"every must be a positive integer (probe on every N-th event), got {every!r}")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        if trainer is not None and not callable(getattr(trainer, "log", None)):
            raise ValueError(f"trainer= must be the transformers Trainer the callback is added to, got "
                             f"{type(trainer).__name__} (no log method)")
        check_uncertainty(level, n_resamples)
        answer_format_of(answer_format)
        if tokenizer is None:
            load_vignettes(name, limit=limit)  # an unprepared set fails here, not at step 500
        self.name, self.events, self.every, self.baseline = name, events, every, baseline
        self.limit, self.strict, self.verbose = limit, strict, verbose
        self.token_budget, self.level, self.n_resamples = token_budget, level, n_resamples
        self.answer_format, self.keep_autocast = answer_format, bool(keep_autocast)
        self._tokenizer, self._trainer = tokenizer, trainer
        self.probe: Probe | None = None
        self.names = metric_names(name, answer_format)
        self.last_metrics: dict[str, float] = {}
        self.last_report: dict | None = None
        self._wandb_run_id: str | None = None  # the wandb run whose metrics are defined
        self._start_counting()
        if tokenizer is not None:
            self._build_probe(tokenizer)

    # ---- saved in checkpoints (transformers' ExportableState) ------------------------------------
    def state(self) -> dict:
        """Settings and counters stored in ``trainer_state.json`` under ``stateful_callbacks``."""
        return {
            "args": {"name": self.name, "events": list(self.events), "every": self.every, "baseline": self.baseline,
                     "limit": self.limit, "strict": self.strict, "token_budget": self.token_budget,
                     "verbose": self.verbose, "level": self.level, "n_resamples": self.n_resamples,
                     "answer_format": self.answer_format, "keep_autocast": self.keep_autocast},
            "attributes": {"event_count": self.event_count, "last_step": self.last_step,
                           "attempted_step": self.attempted_step, "baseline_done": self.baseline_done,
                           "baseline_record": self.baseline_record},
        }

    def _start_counting(self) -> None:
        self.event_count = 0  # triggering steps seen, for `every`
        self.last_step: int | None = None  # last step with a logged probe
        self.attempted_step: int | None = None  # last step a probe was tried (failed ones too)
        self.baseline_done = False
        self.baseline_record: dict | None = None  # the step-0 probe's per-vignette s (baseline_record)

    # ---- when ------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if self.probe is None:
            self._ensure_probe(kwargs)  # a missing tokenizer is a setup error: raise now, at step 0
        if kwargs.get("model") is not None:
            check_causal_lm(kwargs["model"])  # a model the probe cannot read is a setup error too
        self._find_trainer()
        if state.global_step > 0:
            self._resume_counting(state)  # resumed: that step's probe is already on the curve
            return
        self._start_counting()  # a run from step 0 (also each hyperparameter-search trial)
        if self.baseline:
            self.baseline_done = True
            self._probe(args, state, kwargs.get("model"), BASELINE_EVENT)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if "evaluate" in self.events:
            self._maybe_probe(args, state, kwargs, "evaluate")
        if metrics is not None and self.last_step == state.global_step and self.last_metrics:
            metrics.update(self.last_metrics)  # seen by metric_for_best_model / EarlyStopping; same on every rank

    def on_save(self, args, state, control, **kwargs):
        if "save" in self.events:
            self._maybe_probe(args, state, kwargs, "save")
        # The Trainer stored the counters just before this event: store them as they are now.
        record_counters(state.stateful_callbacks, type(self).__name__, self.name, self.state(), self.answer_format)
        if args.should_save:
            report = self.last_report if self.last_step == state.global_step else None
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            write_checkpoint(folder, self.name, state, report)

    def _maybe_probe(self, args, state, kwargs, event):
        if self.attempted_step == state.global_step:
            return  # at most once per global step (evaluate and save both fire), failed attempts included
        self.event_count += 1
        if self.event_count % self.every:
            return
        if self.probe is None:
            self._ensure_probe(kwargs)
        self._probe(args, state, kwargs.get("model"), event)

    def _probe(self, args, state, model, event):
        if model is None:
            return
        self.attempted_step = state.global_step
        try:
            start = time.perf_counter()
            report = self.probe.report(score_across_ranks(self.probe, model), elapsed=time.perf_counter() - start)
        except UnsupportedModelError:
            raise  # a setup error (not a causal LM), already refused at on_train_begin
        except Exception as e:  # noqa: BLE001 - a failed probe must never stop the training it observes
            if self.strict:
                raise
            logger.warning("moral probe [%s] failed at step %d (%s): %s: %s; training continues, nothing logged",
                           self.name, state.global_step, event, type(e).__name__, e)
            return
        if event == BASELINE_EVENT:
            self.baseline_record = baseline_record(report, state.global_step)
        metrics = {**report_metrics(self.name, report), **change_metrics(self.name, self.baseline_record, report)}
        self.last_step, self.last_metrics, self.last_report = state.global_step, metrics, report
        self._publish(args, state, report, metrics, event)

    # ---- where to log ----------------------------------------------------------------------------
    def _publish(self, args, state, report, metrics, event):
        """Reporters and log_history on every rank (Trainer.log), then the main process's own outputs."""
        trainer = self._find_trainer()
        if trainer is not None:
            trainer.log(dict(metrics))  # reporters + state.log_history, at this global step
        else:
            state.log_history.append({**metrics, "step": state.global_step})
            logger.warning("moral probe [%s]: no Trainer found to reach the reporters; metrics kept in "
                           "state.log_history only (pass trainer= to MoralProbeCallback)", self.name)
        if not state.is_world_process_zero:
            return
        if self.verbose:
            print(f"[tinymcf] step {state.global_step} ({event})")
            print("\n".join(sanity_lines(report)))
            print(format_table(report["table"]))
        append_history(args.output_dir, self.name, report, metrics, step=state.global_step, epoch=state.epoch,
                       event=event)
        if event == BASELINE_EVENT and args.should_save:
            write_baseline(args.output_dir, self.name, report, step=state.global_step, epoch=state.epoch)
        if reports_to_wandb(args):
            self._log_wandb(state, report)

    def _log_wandb(self, state, report):
        run = active_wandb_run()
        if run is None:
            return
        try:
            if self._wandb_run_id != run.id:
                define_wandb_metrics(run, self.name, self.answer_format)
                record_wandb_precision(run, self.name, report)
                self._wandb_run_id = run.id
            log_wandb_table(run, self.name, report, state.global_step)
        except Exception as e:  # noqa: BLE001 - the dashboard extra must not break training
            logger.warning("moral probe [%s]: wandb table not logged: %s", self.name, e)

    # ---- plumbing ----------------------------------------------------------------------------------
    def _build_probe(self, tok) -> None:
        kw = {"token_budget": self.token_budget} if self.token_budget else {}
        self.probe = Probe(tok, self.name, self.limit, level=self.level, n_resamples=self.n_resamples,
                           answer_format=self.answer_format, keep_autocast=self.keep_autocast,
                           **kw)  # tokenised once, reused at every probe

    def _ensure_probe(self, kwargs) -> None:
        tok = self._tokenizer or kwargs.get("processing_class") or kwargs.get("tokenizer")
        if tok is not None and not hasattr(tok, "apply_chat_template") and hasattr(tok, "tokenizer"):
            tok = tok.tokenizer  # a processor wrapping a tokenizer
        if tok is None:
            raise ValueError("MoralProbeCallback found no tokenizer: pass processing_class=tok to the Trainer "
                             "or MoralProbeCallback(tokenizer=tok)")
        self._build_probe(tok)

    def _find_trainer(self):
        """The Trainer to log through: ``trainer=`` if given, else the one whose handler holds this callback."""
        if self._trainer is not None:
            return self._trainer
        # Fallback: callback events receive no trainer argument, but the Trainer is a caller of this event.
        frame = inspect.currentframe()
        try:
            while frame is not None:
                obj = frame.f_locals.get("self")
                handler = getattr(obj, "callback_handler", None)
                if handler is not None and any(cb is self for cb in getattr(handler, "callbacks", ())):
                    self._trainer = obj
                    return obj
                frame = frame.f_back
        finally:
            del frame
        return None

    def _resume_counting(self, state) -> None:
        """Take the counters from the checkpoint the run resumed from.

        The Trainer restores callbacks itself only with ``restore_callback_states_from_checkpoint=True``
        (and then into a new instance); reading the state here makes resuming right by default.
        """
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
        self.baseline_record = self._usable_baseline(self.baseline_record)

    def _usable_baseline(self, record) -> dict | None:
        """The saved baseline when it scored this probe's prompts; else None (no change logged), with a warning."""
        if record is None:
            return None
        why = None
        if not isinstance(record, dict) or record.get("prompt_digest") != self.probe.prompt_digest:
            why = "its prompts differ from this run's (another limit, tokenizer, answer prefix or answer format)"
        else:
            try:
                baseline_scores(record)
            except (KeyError, TypeError, ValueError) as e:
                why = f"it cannot be read ({e})"
        if why is None:
            return record
        logger.warning("moral probe [%s]: the checkpoint's step-0 baseline is not used: %s; score_change is not "
                       "logged in this run", self.name, why)
        return None
