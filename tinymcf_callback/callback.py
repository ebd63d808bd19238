"""``MoralProbeCallback``: the probe inside Hugging Face training.

    trainer.add_callback(MoralProbeCallback(name="scifi"))

At the start of training (a step-0 baseline) and on each evaluation and/or save, the
callback scores the live model on a vignette set, through the same :class:`Probe`
as ``evaluate``, and logs the alignment metrics through the Trainer's own logging
path, so they reach every reporter in ``report_to`` (wandb, tensorboard, ...) at the
right global step and land in ``state.log_history``.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import re
import time

from transformers import TrainerCallback

from ._io import append_jsonl, atomic_write_json
from .probe import Probe, format_table, report_to_json, sanity_lines
from .sets import load_vignettes

logger = logging.getLogger("tinymcf_callback")

EVENTS = ("evaluate", "save")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def metric_names(name: str) -> dict[str, str]:
    """Documented logged-metric names for set ``name`` (prefix ``eval_moral_<name>/``).

    ``rewrite_logs`` in the reporters turns ``eval_x`` into ``eval/x``: the probe's curves
    show as ``eval/moral_<name>/score`` etc., never under ``train/``.
    """
    return {key: f"eval_moral_{_slug(name)}/{key}" for key in
            ("score", "gap", "social_norms", "yn_mass", "yn_mass_min", "frame_agreement", "human_corr", "elapsed_s")}


def report_metrics(name: str, report: dict) -> dict[str, float]:
    """Flatten a probe report into the logged scalar metrics (finite values only)."""
    names = metric_names(name)
    info = report["info"]
    values = {
        names["score"]: report["score"], names["gap"]: report["gap"], names["social_norms"]: report["sn"],
        names["yn_mass"]: info["yn_mass_mean"], names["yn_mass_min"]: info["yn_mass_min"],
        names["frame_agreement"]: info["frame_agreement"], names["human_corr"]: info["human_corr"],
        names["elapsed_s"]: info["elapsed_s"],
    }
    prefix = f"eval_moral_{_slug(name)}"
    for foundation, row in report["table"].iterrows():
        for col in ("align_other", "align_self", "self_other_gap"):
            values[f"{prefix}/{_slug(foundation)}/{col}"] = row[col]
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


class MoralProbeCallback(TrainerCallback):
    """Log per-checkpoint moral-foundations alignment of the model being trained.

    Scores a fixed vignette set on the live model at the answer position (two Yes/No
    frames, four conditions) and logs ``eval/moral_<name>/score`` (mean align_other over
    the six real foundations), ``gap``, the Social Norms control, sanity figures and
    per-foundation ``align_other`` / ``align_self`` / ``self_other_gap``.

    Example:

        trainer = Trainer(model, args, train_dataset=ds, processing_class=tok)
        trainer.add_callback(MoralProbeCallback(name="scifi"))
        trainer.train()

    Args:
        name: vignette set (``scifi``; ``clifford`` after ``python -m tinymcf_callback.prepare --name clifford``).
        events: which Trainer events trigger a probe: ``"evaluate"``, ``"save"`` or both.
        every: probe on every N-th triggering step (default 1: each one).
        baseline: probe once at ``on_train_begin`` (step 0) so every curve starts from the untrained model
            (not when resuming from a checkpoint).
        tokenizer: tokenizer to use; default: the Trainer's ``processing_class``.
        trainer: the Trainer, optional: without it the callback finds the Trainer that calls it.
        limit: keep only the first N vignettes (faster, noisier).
        strict: raise instead of warning when the probe fails (default: warn and let training go on).
        token_budget: padded tokens per forward call of the probe (memory knob).
        verbose: print the sanity lines and the table at every probe on the main process.
    """

    def __init__(self, name: str = "scifi", *, events=EVENTS, every: int = 1, baseline: bool = True,
                 tokenizer=None, trainer=None, limit: int | None = None, strict: bool = False,
                 token_budget: int | None = None, verbose: bool = True):
        events = (events,) if isinstance(events, str) else tuple(events)
        unknown = [e for e in events if e not in EVENTS]
        if unknown or not events:
            raise ValueError(f"unknown event(s) {unknown or events!r} for MoralProbeCallback; choose from {EVENTS}")
        if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
            raise ValueError(f"every must be a positive integer (probe on every N-th event), got {every!r}")
        if limit is not None and (not isinstance(limit, int) or limit <= 0):
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        if tokenizer is None:
            load_vignettes(name, limit=limit)  # an unprepared set fails here, not at step 500
        self.name, self.events, self.every, self.baseline = name, events, every, baseline
        self.limit, self.strict, self.verbose = limit, strict, verbose
        self.token_budget = token_budget
        self._tokenizer, self._trainer = tokenizer, trainer
        self.probe: Probe | None = None
        self.names = metric_names(name)
        self.last_step: int | None = None
        self.last_metrics: dict[str, float] = {}
        self.last_report: dict | None = None
        self._event_count = 0
        self._attempted_step: int | None = None
        if tokenizer is not None:
            self._build_probe(tokenizer)

    # ---- plumbing -------------------------------------------------------------------
    def _build_probe(self, tok) -> None:
        kw = {"token_budget": self.token_budget} if self.token_budget else {}
        self.probe = Probe(tok, self.name, self.limit, **kw)  # tokenised once, reused at every probe

    def _ensure_probe(self, kwargs) -> None:
        if self.probe is not None:
            return
        tok = self._tokenizer or kwargs.get("processing_class") or kwargs.get("tokenizer")
        if tok is not None and not hasattr(tok, "apply_chat_template") and hasattr(tok, "tokenizer"):
            tok = tok.tokenizer  # a processor wrapping a tokenizer
        if tok is None:
            raise ValueError("MoralProbeCallback found no tokenizer: pass processing_class=tok to the Trainer "
                             "or MoralProbeCallback(tokenizer=tok)")
        self._build_probe(tok)

    def _find_trainer(self):
        """The Trainer whose callback handler holds this callback (no trainer argument exists)."""
        if self._trainer is not None:
            return self._trainer
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

    # ---- events ---------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if self.probe is None:
            self._ensure_probe(kwargs)  # a missing tokenizer is a setup error: raise now, at step 0
        self._find_trainer()
        # Resuming from a checkpoint (global_step > 0): that step's probe is already on the curve.
        if self.baseline and state.global_step == 0 and self._attempted_step != 0:
            self._probe(args, state, kwargs.get("model"), "train_begin")

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if "evaluate" in self.events:
            self._maybe_probe(args, state, kwargs, "evaluate")
        if metrics is not None and self.last_step == state.global_step and self.last_metrics:
            metrics.update(self.last_metrics)  # seen by metric_for_best_model / EarlyStopping; same on every rank

    def on_save(self, args, state, control, **kwargs):
        if "save" in self.events:
            self._maybe_probe(args, state, kwargs, "save")
        if self.last_step == state.global_step and self.last_report is not None:
            self._write_checkpoint_report(args, state)

    def _maybe_probe(self, args, state, kwargs, event):
        if self._attempted_step == state.global_step:
            return  # at most once per global step (evaluate and save both fire), failed attempts included
        self._event_count += 1
        if self._event_count % self.every:
            return
        if self.probe is None:
            self._ensure_probe(kwargs)
        self._probe(args, state, kwargs.get("model"), event)

    # ---- the probe --------------------------------------------------------------------
    def _probe(self, args, state, model, event):
        if model is None:
            return
        self._attempted_step = state.global_step
        try:
            report = self._score(model)
        except Exception as e:  # noqa: BLE001 - a failed probe must never stop the training it observes
            if self.strict:
                raise
            logger.warning("moral probe [%s] failed at step %d (%s): %s: %s; training continues, nothing logged",
                           self.name, state.global_step, event, type(e).__name__, e)
            return
        metrics = report_metrics(self.name, report)
        self.last_step, self.last_metrics, self.last_report = state.global_step, metrics, report
        self._log(args, state, metrics, report, event)

    def _score(self, model) -> dict:
        from accelerate import PartialState
        from accelerate.utils import gather_object

        start = time.perf_counter()
        dist = PartialState()
        if dist.num_processes == 1:
            res = self.probe.score(model)
        else:
            # Every rank runs the same number of forward calls (sharded models hang otherwise):
            # pad the batch list, score this rank's share, then gather every rank's results.
            batches = self.probe.batches
            with dist.split_between_processes(list(range(len(batches))), apply_padding=True) as mine:
                res = self.probe.score(model, batches=[batches[i] for i in mine])
            done = [j for b in mine for j in batches[b]]
            shards = gather_object([{"idx": done, "p_yes": res.p_yes[done].tolist(), "yn_mass": res.yn_mass[done].tolist(),
                                     "yn_top3": res.yn_top3[done].tolist(), "top": res.top_tokens, "n": res.n_forward}])
            for shard in shards:
                res.p_yes[shard["idx"]] = shard["p_yes"]
                res.yn_mass[shard["idx"]] = shard["yn_mass"]
                res.yn_top3[shard["idx"]] = shard["yn_top3"]
                res.top_tokens = res.top_tokens or shard["top"]
            res.n_forward = sum(s["n"] for s in shards)
        return self.probe.report(res, elapsed=time.perf_counter() - start)

    def _log(self, args, state, metrics, report, event):
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
        line = {"step": state.global_step, "epoch": state.epoch, "event": event, "name": self.name,
                "score": report["score"], "gap": report["gap"], "sn": report["sn"], "metrics": metrics,
                "info": {k: v for k, v in report["info"].items() if k != "sample_prompt"},
                "table": json.loads(report["table"].reset_index().to_json(orient="records"))}
        try:
            append_jsonl(os.path.join(args.output_dir, f"moral_probe_{_slug(self.name)}.jsonl"), line)
        except OSError as e:
            logger.warning("moral probe [%s]: could not append the history file: %s", self.name, e)
        self._log_wandb(state, report)

    def _write_checkpoint_report(self, args, state):
        if not state.is_world_process_zero:
            return
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not os.path.isdir(folder):
            return
        try:
            atomic_write_json(os.path.join(folder, f"moral_probe_{_slug(self.name)}.json"),
                              report_to_json(self.last_report, step=state.global_step, epoch=state.epoch))
            # trainer_state.json was written before on_save; refresh it so it holds this probe's log entry.
            if os.path.exists(os.path.join(folder, "trainer_state.json")):
                state.save_to_json(os.path.join(folder, "trainer_state.json"))
        except OSError as e:
            logger.warning("moral probe [%s]: could not write the checkpoint report: %s", self.name, e)

    def _log_wandb(self, state, report):
        try:
            import wandb
        except ImportError:
            return
        if getattr(wandb, "run", None) is None:
            return
        prefix = f"eval/moral_{_slug(self.name)}"
        try:
            wandb.define_metric("train/global_step")
            wandb.define_metric(f"{prefix}/*", step_metric="train/global_step")
            table = report["table"].reset_index()
            wandb.log({f"{prefix}/table": wandb.Table(dataframe=table), "train/global_step": state.global_step})
        except Exception as e:  # noqa: BLE001 - the dashboard extra must not break training
            logger.warning("moral probe [%s]: wandb table not logged: %s", self.name, e)
