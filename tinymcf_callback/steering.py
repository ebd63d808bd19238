"""Steering dose-response: the probe under a family of interventions indexed by a number, with a random control.

    steer = ResidualSteering(model, layer=15, vector=v)                  # add c * v after decoder layer 15
    result = probe.dose_response(model, steer, [-8, -4, 4, 8], n_random=4, output_dir="runs/steer")
    print(result.summary())                                              # per coefficient: change, random spread
    result.table()                                                       # one row per direction and coefficient

``intervene(c)`` is any context manager factory: this module's :class:`ResidualSteering` (activation
addition at every position or at the answer position only, on any HF causal LM), a PEFT adapter's
scale, a steering library's context. For each coefficient the probe gives the full report (with its
intervals) and the paired change against ``c = 0`` (the unsteered model, scored once; the same
vignettes, :func:`~tinymcf_callback.results.stats.paired_change`).

**The random-direction control.** A steering vector moves a model's answers however it was found:
any push of that size on the residual stream shifts P(Yes) somewhere. So the same intervention
is applied along ``k`` random directions of the same norm (seeded, :func:`random_directions`), and
the result says for each coefficient whether the real direction moved the score, and each
foundation's ``align_other``, beyond the spread of the random ones (outside their range; with
``k`` directions the chance of that by luck alone is ``2 / (k + 1)``).

**Where the model stops answering.** At large coefficients a steered model may no longer say Yes or
No; its P(Yes) is then renormalised from a small mass and its numbers are soft. Every coefficient's
Yes+No mass and frame agreement are kept, and a coefficient whose mean mass is below
:data:`~tinymcf_callback.results.readout.MIN_YN_MASS` is flagged (``answering`` false).

The history (``<output_dir>/moral_probe_<name>_dose.jsonl``) holds the usual history lines with
``coefficient``, ``direction`` (``none`` for the unsteered line, ``real``, ``random``) and
``direction_index``; ``tinymcf plot --x coefficient`` draws it, the random band shaded.

Every steered probe goes through the engine's self-check (each prompt scored alone), which
catches a hook that acts differently on the shared-prefix path. :class:`ResidualSteering` at the
answer position only needs each prompt whole in one call, so its probes skip prefix sharing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .errors import ConfigError, UnsupportedModelError
from .results.history import BASELINE_EVENT, DOSE_EVENT, append_line, dose_history_path, history_line
from .results.metrics import baseline_record, change_metrics, report_metrics
from .results.readout import MIN_YN_MASS
from .results.stats import paired_change, vignette_scores
from .scoring.engine import encode_batch
from .scoring.model_info import class_name, unwrap_model
from .scoring.prompts import FRAMES, format_prompt

logger = logging.getLogger("tinymcf_callback")

POSITIONS = ("every", "answer")


# ---- the residual stream ---------------------------------------------------------------------------
def decoder_layers(model) -> torch.nn.ModuleList:
    """The model's list of decoder layers (through any wrappers): ``model.model.layers`` and its kin.

    Tries the decoder's ``layers`` / ``h`` / ``blocks`` / ``block`` / ``decoder.layers``, then the
    longest ``ModuleList`` of identical blocks. Raises :class:`UnsupportedModelError` when there is none.
    """
    base = unwrap_model(model)
    roots = [base]
    get_decoder = getattr(base, "get_decoder", None)
    if callable(get_decoder):
        with contextlib.suppress(Exception):
            roots.insert(0, get_decoder())
    for root in roots:
        for path in ("layers", "h", "blocks", "block", "decoder.layers", "model.layers", "transformer.h"):
            obj = root
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if isinstance(obj, torch.nn.ModuleList) and len(obj):
                return obj
    lists = [m for m in base.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1
             and len({type(x) for x in m}) == 1]
    if lists:
        return max(lists, key=len)
    raise UnsupportedModelError(f"{class_name(model)} has no list of decoder layers to steer (looked for "
                                f"model.layers, transformer.h, ...); write your own intervene(c) context manager")


def hidden_size(model) -> int:
    """The width of the residual stream (``config.hidden_size``, else the input embeddings')."""
    base = unwrap_model(model)
    size = getattr(getattr(base, "config", None), "hidden_size", None)
    if isinstance(size, int):
        return size
    return int(base.get_input_embeddings().weight.shape[-1])


def _hidden(output):
    """The hidden states in a decoder layer's output (a tensor, or the first item of a tuple / ModelOutput)."""
    return output if torch.is_tensor(output) else output[0]


def _with_hidden(output, hidden):
    if torch.is_tensor(output):
        return hidden
    if isinstance(output, tuple):
        return (hidden, *output[1:])
    output[0] = hidden  # a ModelOutput
    return output


class ResidualSteering:
    """``intervene(c)``: add ``c * vector`` to the residual stream after decoder layer ``layer``.

    ``at="every"``: at every position (the common activation-addition recipe); ``"answer"``: at
    the last position of each forward call only, which in the probe is each prompt's answer
    position (the probe then scores each prompt whole: ``needs_full_prompts``). ``vector`` is
    moved to the layer's device and dtype at each call. Usable alone too: ``with steer(4.0):
    model.generate(...)``.
    """

    def __init__(self, model, layer: int, vector, *, at: str = "every", label: str = "real"):
        if at not in POSITIONS:
            raise ConfigError(f"at must be one of {', '.join(POSITIONS)} (where c * v is added), got {at!r}")
        layers = decoder_layers(model)
        if isinstance(layer, bool) or not isinstance(layer, int) or not -len(layers) <= layer < len(layers):
            raise ConfigError(f"layer must be a decoder layer index of {class_name(model)} (0 to {len(layers) - 1}, "
                              f"or negative from the end), got {layer!r}")
        vector = torch.as_tensor(vector).detach().flatten()
        if vector.numel() != hidden_size(model):
            raise ConfigError(f"the steering vector has {vector.numel()} values; {class_name(model)}'s residual "
                              f"stream has {hidden_size(model)}")
        if not torch.isfinite(vector).all():
            raise ConfigError("the steering vector holds NaN or infinite values")
        self.model, self.layer, self.vector, self.at, self.label = model, layer % len(layers), vector, at, label
        self.module = layers[self.layer]

    @property
    def needs_full_prompts(self) -> bool:
        return self.at == "answer"

    @property
    def norm(self) -> float:
        return float(self.vector.float().norm())

    def along(self, vector, label: str) -> ResidualSteering:
        """The same intervention (model, layer, positions) along another direction."""
        return ResidualSteering(self.model, self.layer, vector, at=self.at, label=label)

    @contextlib.contextmanager
    def __call__(self, c: float):
        c = float(c)
        if c == 0.0:
            yield self
            return

        def hook(module, args, output):
            h = _hidden(output)
            push = (c * self.vector).to(device=h.device, dtype=h.dtype)
            if self.at == "every":
                h = h + push
            else:
                h = h.clone()
                h[:, -1] = h[:, -1] + push
            return _with_hidden(output, h)

        handle = self.module.register_forward_hook(hook)
        try:
            yield self
        finally:
            handle.remove()

    def __repr__(self) -> str:
        return f"ResidualSteering(layer={self.layer}, norm={self.norm:.3g}, at={self.at!r}, label={self.label!r})"


def random_directions(vector, k: int, seed: int = 0) -> torch.Tensor:
    """``k`` random directions (uniform on the sphere, seeded) with ``vector``'s norm: shape ``[k, d]``, float32."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ConfigError(f"the number of random directions must be a whole number >= 0, got {k!r}")
    v = torch.as_tensor(vector).detach().flatten().float().cpu()
    g = torch.Generator().manual_seed(int(seed))
    r = torch.randn((k, v.numel()), generator=g)
    return r / r.norm(dim=1, keepdim=True) * v.norm()


def residual_direction(model, tok, positive: list[str], negative: list[str], layer: int, *,
                       question: str = FRAMES["wrong"], batch_size: int = 16) -> torch.Tensor:
    """Mean residual after decoder layer ``layer`` on ``positive`` texts minus that on ``negative`` ones.

    Each text is asked as the probe asks (the chat template, ``question``, the answer prefix) and
    the residual is read at the answer position: a difference-of-means steering direction (float32).
    """
    if not positive or not negative:
        raise ConfigError("residual_direction needs texts on both sides (positive and negative)")
    module = decoder_layers(model)[layer]
    kept: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda m, a, out: kept.append(_hidden(out)[:, -1].float().cpu()))
    means = []
    was_training = unwrap_model(model).training
    try:
        model.eval()
        with torch.inference_mode():
            for texts in (positive, negative):
                kept.clear()
                prompts = [format_prompt(tok, t, question) for t in texts]
                for start in range(0, len(prompts), batch_size):
                    model(**encode_batch(tok, prompts[start:start + batch_size], model))
                means.append(torch.cat(kept).mean(0))
    finally:
        handle.remove()
        model.train(was_training)
    return means[0] - means[1]


# ---- the dose-response ------------------------------------------------------------------------------
@dataclass
class DoseResponse:
    """The probe under ``intervene(c)`` for each coefficient, against the unsteered model and random directions.

    ``reports[(direction, index, c)]``: the report of one probe (``("none", 0, 0.0)`` the unsteered
    one); ``changes[(direction, index, c)]``: its :func:`~tinymcf_callback.results.stats.paired_change`
    against the unsteered report. ``seconds[(direction, index, c)]``: the probe's wall time.
    """

    name: str
    coefficients: list[float]
    reports: dict = field(default_factory=dict)
    changes: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    n_random: int = 0
    history: Path | None = None
    baseline: dict | None = field(default=None, repr=False)  # metrics.baseline_record of the unsteered report

    @property
    def base(self) -> dict:
        return self.reports[("none", 0, 0.0)]

    def table(self) -> pd.DataFrame:
        """One row per (direction, index, coefficient): score with bounds, change since c=0 with bounds and p,
        Yes+No mass, frame agreement, ``answering`` (mass at or above the threshold), seconds."""
        rows = []
        for (direction, index, c), rep in self.reports.items():
            ch = self.changes.get((direction, index, c))
            score = ch["headline"]["score"] if ch else None
            rows.append({"direction": direction, "index": index, "coefficient": c, "score": rep["score"],
                         "score_lo": rep["score_lo"], "score_hi": rep["score_hi"],
                         "change": score.change if score else 0.0, "change_lo": score.lo if score else None,
                         "change_hi": score.hi if score else None, "change_p": score.p if score else None,
                         "yn_mass_mean": rep["info"]["yn_mass_mean"], "frame_agreement": rep["info"]["frame_agreement"],
                         "answering": answering(rep), "seconds": self.seconds.get((direction, index, c))})
        return pd.DataFrame(rows)

    def control(self, metric: str = "score", foundation: str | None = None) -> pd.DataFrame:
        """Per coefficient: the real direction's change of ``metric`` (or a foundation's ``align_other``)
        against the random directions' (their min, median, max), and whether it lies beyond their range.

        ``beyond_random`` is None without random directions. ``rank_p``: the share of the ``k + 1``
        directions (real included) whose change is at least as large in size as the real one's
        (the smallest possible is ``1 / (k + 1)``).
        """
        rows = []
        for c in self.coefficients:
            if c == 0.0:
                continue
            real = _change_of(self.changes.get(("real", 0, c)), metric, foundation)
            rand = np.array([_change_of(self.changes.get(("random", j, c)), metric, foundation)
                             for j in range(self.n_random)], dtype=float)
            rand = rand[np.isfinite(rand)]
            row = {"coefficient": c, "real": real, "real_lo": None, "real_hi": None,
                   "random_min": None, "random_median": None, "random_max": None, "beyond_random": None,
                   "rank_p": None, "answering": answering(self.reports[("real", 0, c)])}
            bounds = _bounds_of(self.changes.get(("real", 0, c)), metric, foundation)
            row["real_lo"], row["real_hi"] = bounds
            if len(rand) and math.isfinite(real):
                row.update(random_min=float(rand.min()), random_median=float(np.median(rand)),
                           random_max=float(rand.max()), beyond_random=bool(real < rand.min() or real > rand.max()),
                           rank_p=float((1 + np.sum(np.abs(rand) >= abs(real))) / (len(rand) + 1)))
            rows.append(row)
        return pd.DataFrame(rows)

    def foundations(self) -> pd.DataFrame:
        """:meth:`control` for every foundation's ``align_other``, one block of rows per foundation."""
        present = list(self.base["table"].index)
        return pd.concat([self.control(foundation=f).assign(foundation=f) for f in present], ignore_index=True)

    def summary(self) -> str:
        """The dose-response as text: per coefficient, the change with its interval, the random spread, flags."""
        lines = [f"[tinymcf] dose-response on {self.name}: unsteered score {_fmt(self.base['score'])}, "
                 f"{self.n_random} random direction(s) of the same norm"]
        for row in self.control().itertuples():
            spread = ("" if row.random_min is None else
                      f"  random [{row.random_min:+.3f}, {row.random_max:+.3f}] -> "
                      f"{'BEYOND' if row.beyond_random else 'within'} the random spread")
            warn = "" if row.answering else "  (Yes+No mass below 0.5: the model stops answering; soft numbers)"
            lines.append(f"  c={row.coefficient:+g}: change {_fmt(row.real)} [{_fmt(row.real_lo)}, "
                         f"{_fmt(row.real_hi)}]{spread}{warn}")
        return "\n".join(lines)


def answering(report: dict) -> bool:
    mass = report["info"].get("yn_mass_mean")
    return mass is not None and mass >= MIN_YN_MASS


def _change_of(change: dict | None, metric: str, foundation: str | None) -> float:
    if change is None:
        return math.nan
    if foundation is None:
        return float(change["headline"][metric].change)
    return float(change["foundations"].get(foundation, {}).get("align_other", (math.nan,))[0])


def _bounds_of(change: dict | None, metric: str, foundation: str | None):
    if change is None:
        return None, None
    c = change["headline"][metric] if foundation is None else change["foundations"].get(foundation, {}).get(
        "align_other")
    if c is None:
        return None, None
    return (None if not math.isfinite(c.lo) else float(c.lo)), (None if not math.isfinite(c.hi) else float(c.hi))


def _fmt(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:+.3f}"


def check_coefficients(coefficients) -> list[float]:
    """The coefficients as sorted floats with 0 (the unsteered model) added; refuses what is not a number."""
    try:
        values = [float(c) for c in coefficients]
    except (TypeError, ValueError):
        raise ConfigError(f"coefficients must be numbers, got {coefficients!r}") from None
    if not values or not all(math.isfinite(c) for c in values):
        raise ConfigError(f"coefficients must be finite numbers, at least one, got {coefficients!r}")
    return sorted(set(values) | {0.0})


def dose_response(probe, model, intervene, coefficients, *, controls=None, n_random: int = 0, seed: int = 0,
                  output_dir: str | os.PathLike | None = None, progress: bool = False) -> DoseResponse:
    """Probe ``model`` under ``intervene(c)`` for each of ``coefficients`` (see :meth:`Probe.dose_response`)."""
    from .probe import Probe

    coefs = check_coefficients(coefficients)
    if controls is None:
        controls = []
        if n_random:
            if not isinstance(intervene, ResidualSteering):
                raise ConfigError("n_random needs a ResidualSteering intervention (it knows its vector's norm); for "
                                  "another intervene(c), pass controls=[...] of the same kind along random directions")
            controls = [intervene.along(v, f"random-{j}") for j, v in enumerate(random_directions(
                intervene.vector, n_random, seed))]
    elif n_random:
        raise ConfigError("give controls=[...] or n_random=k, not both")
    if any(getattr(x, "needs_full_prompts", False) for x in [intervene, *controls]) and probe.config.share_prefix:
        probe = Probe(probe.tok, config=probe.config.replace(share_prefix=False))
    result = DoseResponse(probe.name, coefs, n_random=len(controls))
    if output_dir is not None:
        result.history = dose_history_path(output_dir, probe.name, probe.answer_format)
    plan = [("none", 0, 0.0, None)]
    for direction, index, steer in [("real", 0, intervene), *(("random", j, x) for j, x in enumerate(controls))]:
        plan += [(direction, index, c, steer) for c in coefs if c != 0.0]
    base_scores = None
    for step, (direction, index, c, steer) in enumerate(plan):
        start = time.perf_counter()
        with steer(c) if steer is not None else contextlib.nullcontext():
            report = probe.run(model, progress=progress)
        result.seconds[(direction, index, c)] = time.perf_counter() - start
        result.reports[(direction, index, c)] = report
        if steer is None:
            base_scores = vignette_scores(report["scenarios"])
        else:
            result.changes[(direction, index, c)] = paired_change(
                base_scores, vignette_scores(report["scenarios"]), level=probe.config.level,
                n_resamples=probe.config.n_resamples, seed=probe.config.seed)
        if result.history is not None:
            _append(result, probe, report, step=step, direction=direction, index=index, c=c)
    for c in coefs:
        if c != 0.0 and not answering(result.reports[("real", 0, c)]):
            logger.warning("dose-response [%s]: at c=%+g the Yes+No mass is %.2f (below %.1f): the steered model "
                           "no longer answers Yes or No, and its numbers are soft", probe.name, c,
                           result.reports[("real", 0, c)]["info"]["yn_mass_mean"], MIN_YN_MASS)
    return result


def _append(result: DoseResponse, probe, report: dict, *, step: int, direction: str, index: int, c: float) -> None:
    if result.baseline is None:  # the unsteered report's per-vignette scores, made once for every line
        result.baseline = baseline_record(result.base, 0)
    baseline = result.baseline  # the unsteered line's own change is 0, as the callback's baseline
    metrics = {**report_metrics(probe.name, report),
               **change_metrics(probe.name, baseline, report, probe.config.target)}
    line = history_line(probe.name, report, metrics, step=step, epoch=None,
                        event=BASELINE_EVENT if direction == "none" else DOSE_EVENT)
    line.update({"coefficient": c, "direction": direction, "direction_index": index, "answering": answering(report)})
    try:
        append_line(result.history, line)
    except OSError as e:
        logger.warning("dose-response [%s]: could not append the history %s: %s", probe.name, result.history, e)

