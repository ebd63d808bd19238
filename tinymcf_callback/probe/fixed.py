"""The fixed probe: :class:`Probe`, a vignette set turned into tokenised prompts once, ready to score models at
every checkpoint; every way of scoring (``evaluate``, ``tinymcf eval``, the sweep, the callback) goes through it.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
import transformers

from .._version import __version__
from ..config import ProbeConfig, make_config
from ..errors import ConfigError
from ..rundir.report import BACKEND_FIELDS
from ..scoring.batching import BatchPlan, batch_size_for, encode_prompts, plan_prefixes, plan_probe_batches
from ..scoring.engine import ScoreResult, run_batches
from ..scoring.mode import probe_mode
from ..scoring.model_info import (
    check_causal_lm,
    check_context,
    check_vocabulary,
    device_memory,
    memory_per_token,
    model_device,
    model_name,
)
from ..scoring.prompts import answer_format_of, answer_token_ids, chat_turn, format_prompts, prompt_digest
from ..scoring.ranks import Ranks
from ..scoring.selfcheck import Memory, Rotation, score_checked
from ..stats.analysis import analyse, sanity_warnings

logger = logging.getLogger("tinymcf_callback")

NO_TEMPLATE_NOTE = ("the tokenizer has no chat template, so the prompts use a plain 'Question: ... Answer:' form; "
                    "a chat model's answer mass is usually much lower without its template (load the tokenizer of "
                    "the instruct checkpoint, or set tok.chat_template)")


class Probe:
    """A vignette set turned into tokenised prompts for one tokenizer, ready to score models.

    Args:
        tok: the model's tokenizer (its chat template is used when it has one).
        name: the vignette set (a :class:`~tinymcf_callback.config.ProbeConfig` field, here for brevity).
        limit: keep the first ``limit`` vignettes (also a ``ProbeConfig`` field).
        config: the probe's settings; default :class:`~tinymcf_callback.config.ProbeConfig`'s defaults.
        **settings: any other ``ProbeConfig`` field (``answer_format="json"``, ``token_budget=4096``,
            ``n_resamples=0``, ...), applied on top of ``config``.

    Example::

        probe = Probe(tok, "scifi")            # prompts formatted and tokenised once
        report = probe.run(model)              # the report dict (see evaluate); batched for the model's device
        res = probe.score(model)               # per-prompt P(Yes), Yes+No mass, the self-check

    A precision target (``until=``) is :class:`~tinymcf_callback.probe.adaptive.AdaptiveProbe`'s, refused here:
    :func:`~tinymcf_callback.probe.make_probe` builds whichever of the two the settings ask for.

    Raises :class:`~tinymcf_callback.errors.ConfigError` for a bad setting,
    :class:`~tinymcf_callback.errors.ProbeDataError` for an unknown or unprepared set.
    """

    def __init__(self, tok, name: str | None = None, limit: int | None = None, *, config: ProbeConfig | None = None,
                 vignettes: list[dict] | None = None, **settings):
        self.config = config = make_config(config, name, limit, **settings)
        if config.until is not None:
            raise ConfigError(f"Probe asks a fixed set of vignettes, and until={config.until!r} is a precision "
                              "target: make_probe(tok, config) (or AdaptiveProbe) builds the probe that asks until "
                              "it knows enough")
        self.tok, self.name, self.answer_format = tok, config.name, config.answer_format
        self.vignettes = config.vignettes() if vignettes is None else list(vignettes)
        self.has_human = any("wrong" in v for v in self.vignettes)
        answer_token_ids(tok, config.answer_format)  # fail now, not at the first checkpoint, if an answer has no token
        self.prompts, self.meta = format_prompts(tok, self.vignettes, config.answer_prefix, config.answer_format)
        self.meta.attrs.pop("formatted_at", None)  # a Probe outlives its prompts: it times each run itself
        self.prompt_digest = prompt_digest(self.prompts, self.meta, config.answer_format)
        if not self.has_human:
            self.meta = self.meta.drop(columns="wrong")
        self.encoded = encode_prompts(tok, self.prompts)
        self.labels = [f"vignette {r.id} ({r.condition}, frame {r.frame})" for r in self.meta.itertuples()]
        # The two frames of one text share everything up to the question.
        self.groups = [list(ix) for ix in self.meta.groupby(["id", "condition"], sort=False).indices.values()]
        self.prefix_plan = plan_prefixes(self.encoded, self.groups) if config.share_prefix else None
        # the devices scored on (one per process) -> their plan; and each subset of prompts scored alone on one
        self._plans: dict[tuple, BatchPlan] = {}
        # before any model is scored: what the CPU gets (and any device, when the sizes are given)
        self.plan = self._planned(("cpu",), batch_size_for("cpu", token_budget=config.token_budget,
                                                           max_batch_size=config.max_batch_size), "cpu")
        self.sample_index = 0  # first vignette, other_violate, "wrong" frame
        # which prompts the self-check compares, probe after probe, and when
        self.rotation = Rotation(seed=config.seed, budget=config.self_check_budget)
        self.memory = Memory()  # the forward scored last, the strategy it needed, what was said in the log
        self.notes = config.subset_notes(self.vignettes) + prompt_notes(tok)
        for note in self.notes:  # said once, as the probe is built (it is reused at every checkpoint)
            logger.warning("moral probe: %s", note)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def batches(self) -> list[list[int]]:
        """Which prompts each forward call takes (indices), on the device of the model scored last (before any: the
        CPU's plan). :meth:`plan_for` plans them for a model's device."""
        return self.plan.batches

    def plan_for(self, model, ranks: Ranks | None = None) -> BatchPlan:
        """The batches for the device ``model`` is on: planned when a model is first scored there, kept after.

        The size of a forward call follows the device (:func:`~tinymcf_callback.scoring.batching.batch_size_for`:
        the CPU's plan of 8192 tokens and 64 prompts, a GPU's from the model's size and the memory free there);
        ``token_budget`` and ``max_batch_size`` in the config override it. Kept for every later probe on the same
        device, whatever the free memory is then: in bfloat16 a prompt's P(Yes) moves with the batch it is in, so a
        run's curve keeps one plan. A model moved to another device is planned again there (and its first plan comes
        back if it returns). Under several processes (``ranks``) the ranks plan alike, from the least memory any of
        them has free, since they share the batches out by index.
        """
        ranks = ranks or Ranks()
        device = model_device(model)
        where = tuple(ranks.gather(str(device)))
        if where not in self._plans:
            free = ranks.gather(device_memory(device))
            cost = memory_per_token(model) or (None, 0)
            size = batch_size_for(device.type, None if None in free else min(free), *cost,
                                  token_budget=self.config.token_budget, max_batch_size=self.config.max_batch_size)
            plan = self._planned(where, size, where[0])
            if size.rule != "cpu" and ranks.is_main:
                logger.info("moral probe [%s] on %s: forward calls of at most %d padded tokens and %d prompts (%s): "
                            "%d batches", self.name, device, size.token_budget, size.max_batch_size, size.rule,
                            len(plan.batches))
        self.plan = self._plans[where]
        return self.plan

    def _planned(self, key: tuple, size, device: str, rows: list[int] | None = None) -> BatchPlan:
        """The plan kept under ``key``, planned once."""
        if key not in self._plans:
            self._plans[key] = plan_probe_batches(self.encoded, self.groups if self.prefix_plan else None, size,
                                                  device, rows=rows)
        return self._plans[key]

    def plan_of(self, rows: list[int]) -> BatchPlan:
        """The batches of prompts ``rows`` alone (indices), planned at the size of the device plan in use
        (:meth:`plan_for`) as a probe of those prompts would plan them, and kept: a look of a probe with a precision
        target, scored on its own."""
        return self._planned((self.plan.device, self.plan.size, tuple(rows)), self.plan.size, self.plan.device, rows)

    def turn(self, i: int) -> list[dict]:
        """Prompt ``i``'s chat turn (:func:`~tinymcf_callback.scoring.prompts.chat_turn`): what its text renders."""
        row = self.meta.iloc[i]
        vignette = next(v for v in self.vignettes if v["id"] == row["id"])
        return chat_turn(vignette[row["condition"]], answer_format_of(self.answer_format).questions[row["frame"]])

    def score(self, model, *, progress: bool = False, batches: list[list[int]] | None = None,
              ranks: Ranks | None = None, rows: list[int] | None = None) -> ScoreResult:
        """Score the model in eval + inference mode (state restored after), in the weights' own precision.

        Without ``batches``: every prompt, through :func:`~tinymcf_callback.scoring.selfcheck.score_checked`
        (the fast path checked against each prompt scored alone; ``res.check`` says how), shared
        among ``ranks`` when given (``ranks=Ranks.current()``: every process of a distributed run, each
        scoring its share of the batches, every one ending with the whole result). ``rows``: only these prompts
        (indices), batched on their own (:meth:`plan_of`) and checked among themselves, written at their indices
        into a result of every prompt (NaN elsewhere). With ``batches``: only those, with the model's first
        strategy and no check (a rank's raw share).

        Raises :class:`~tinymcf_callback.errors.UnsupportedModelError` before any forward call when
        the model is not a causal LM with its LM head, :class:`~tinymcf_callback.errors.PromptError`
        when a prompt exceeds its context.
        """
        elsewhere = scorer_of(model)
        if elsewhere is not None:  # the server scores every prompt (each process of a distributed run asks it alike)
            if batches is not None:
                raise ConfigError("a served model is scored whole by its server: batches= does not apply")
            return elsewhere(self, progress=progress, rows=rows)
        check_causal_lm(model)
        answers = answer_token_ids(self.tok, self.answer_format)
        check_vocabulary(model, self.encoded, [*answers[0], *answers[1]])
        check_context(model, self.encoded, self.labels)
        config = self.config
        plan = self.plan_for(model, ranks) if batches is None else None
        if plan is not None and rows is not None:
            plan = self.plan_of(rows)
        with probe_mode(model, keep_autocast=config.keep_autocast) as precision:
            if batches is None:
                res = score_checked(self, model, batches=None if rows is None else plan.batches, ranks=ranks,
                                    precision=precision, progress=progress, tolerance=config.self_check_tolerance,
                                    check=config.self_check)
            else:
                res = run_batches(model, self.encoded, batches, self.tok, sample_index=self.sample_index,
                                  progress=progress, desc=f"moral probe [{self.name}]", prefix_plan=self.prefix_plan,
                                  answer_format=self.answer_format, say=self.memory.say)
        res.precision, res.model = precision.as_dict(), model_name(model)
        res.batch_plan = plan.as_dict() if plan is not None else None
        return res

    def report(self, res: ScoreResult, elapsed: float | None = None, *, level: float | None = None,
               rows: list[int] | None = None, notes: list[str] | None = None) -> dict:
        """Analyse a finished :class:`ScoreResult` into the report dict (see :func:`evaluate`); ``level``: the
        intervals' (default ``config.level``). ``rows``: the report of those prompts only (indices, in the set's
        order: a stopped probe's prefix), as a probe of them alone reports it (their digest, their rows); ``notes``:
        what its warnings say of them in place of the probe's own notes."""
        config = self.config
        idx = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=int)
        meta = self.meta if rows is None else self.meta.iloc[idx].reset_index(drop=True)
        out = analyse(res.p_yes[idx], meta, res.yn_mass[idx], elapsed=elapsed, name=self.name,
                      level=config.level if level is None else level, n_resamples=config.n_resamples,
                      seed=config.seed)
        info = out["info"]
        info["yn_top3_rate"] = float(np.mean(res.yn_top3[idx])) if len(res.yn_top3) else None
        info["sample_prompt"] = self.prompts[self.sample_index]
        info["top_tokens"] = [{"token": t, "prob": p} for t, p in res.top_tokens]
        info["n_forward"] = res.n_forward
        info["batches"] = res.batch_plan
        info["strategy"] = res.strategy
        info["self_check"] = self.check_info(res.check, rows)
        info["precision"] = res.precision
        info["subset"] = config.subset(self.vignettes)
        info["backend"] = res.backend or local_backend()
        info["versions"] = versions()
        info["warnings"] = ((self.notes if notes is None else notes)
                            + sanity_warnings(out["score"], info, res, self.answer_format)
                            + backend_warnings(info["backend"]))
        digest = self.prompt_digest if rows is None else prompt_digest([self.prompts[i] for i in idx], meta,
                                                                       self.answer_format)
        precision = res.precision or {}
        return {**out, "answer_format": self.answer_format, "prompt_digest": digest, "model": res.model,
                **{k: precision.get(k) for k in ("dtype", "autocast", "compute", "device")}}

    def check_info(self, check: dict | None, rows: list[int] | None = None) -> dict | None:
        """The self-check's record with the checked prompts named (``vignette <id> (<condition>, frame <frame>)``);
        ``rows``: a report of those prompts, whose checked prompts are counted among them."""
        if check is None:
            return None
        named = [self.labels[i] for i in check["checked"]]
        if rows is not None:
            at = {int(i): n for n, i in enumerate(rows)}
            check = {**check, "checked": [at[i] for i in check["checked"]]}
        return {**check, "checked_prompts": named}

    def run(self, model, *, progress: bool = False, ranks: Ranks | None = None, baseline: dict | None = None) -> dict:
        """Score ``model`` and return its report: :meth:`score` then :meth:`report`, timed. ``baseline`` applies to a
        probe with a precision target only (its change is measured in its looks); a fixed probe's change is its
        logger's."""
        start = time.perf_counter()
        res = self.score(model, progress=progress, ranks=ranks)
        return self.report(res, elapsed=time.perf_counter() - start)


class ScoresElsewhere(Protocol):
    """A model that scores a probe's prompts itself (:class:`~tinymcf_callback.served.ServedModel`, through its
    server), instead of :meth:`Probe.score`'s forward pass; with ``rows``, NaN outside them."""

    def score_probe(self, probe: Probe, *, progress: bool = False, rows: list[int] | None = None) -> ScoreResult: ...


def scorer_of(model) -> Callable | None:
    """``model.score_probe`` when ``model`` scores a probe itself (:class:`ScoresElsewhere`), else None."""
    method = getattr(model, "score_probe", None)
    return method if callable(method) else None


def local_backend() -> dict:
    """``info["backend"]`` of a probe run in this process: every field of
    :data:`~tinymcf_callback.rundir.report.BACKEND_FIELDS`, null where a server's would say something."""
    return {**dict.fromkeys(BACKEND_FIELDS), "kind": "transformers", "version": transformers.__version__,
            "form": "forward", "exact": True, "logprobs_mode": "raw", "template": "local", "requests": 0, "retries": 0}


def versions() -> dict[str, str]:
    """What made a report: this package's version, torch's, transformers' and Python's (a served report's server
    says its own in ``info.backend.version``)."""
    return {"tinymcf_callback": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def backend_warnings(backend: dict) -> list[str]:
    """What a served report must say: a top-k form's numbers are a bound; the template went unchecked."""
    out = []
    if not backend.get("exact", True):
        out.append(f"served through {backend['form']} (top-k only): an answer token outside the top k was not "
                   f"read, so P(Yes) is known within {backend['p_yes_bound']:.3g} and the Yes+No mass is a lower "
                   f"bound (up to {backend['mass_bound']:.3g} unread); use an exact form (--form) where the server "
                   "has one")
    if str(backend.get("template", "")).startswith("not checked"):
        out.append(f"the server's tokenizer and chat template were {backend['template']}: make sure it serves the "
                   "model of the local tokenizer")
    return out


def prompt_notes(tok) -> list[str]:
    """What the report should say about how the prompts were formatted (today: a missing chat template)."""
    return [] if getattr(tok, "chat_template", None) else [NO_TEMPLATE_NOTE]
