"""A served model's own self-check, at every probe: a few prompts drawn from the probe's own rotation, each asked twice
more among the probe's other requests (in the same form later in the queue, and in a second form), their differences
held to the tolerance; with a ``reference``, also scored by the local forward pass. What each catches: docs/served.md.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..errors import ServedError
from ..scoring.selfcheck import Rotation, SelfCheck
from .answers import answer, difference
from .forms import Reading

DEFAULT_TOLERANCE = 1e-3  # two requests for the same prompt to one server: what they may differ by


def pick(rotation: Rotation, signature: tuple, rows: list[int], n_prompts: int, k: int) -> list[int]:
    """The next ``k`` of the prompts ``rows`` asked (of the probe's ``n_prompts``) in the rotation's seeded order for
    this server and form (``signature``)."""
    if not k or not rows:
        return []
    rotation.start(signature)
    among = None if len(rows) == n_prompts else rows
    return sorted(rotation.pick([[]] * n_prompts, [], signature[-1], None, min(k, len(rows)), among))


def check(rotation: Rotation, checked: list[int], main: dict[int, Reading], repeat: dict[int, Reading],
          second: dict[int, Reading], yes: list[int], no: list[int], *, form: str, second_form: str,
          tolerance: float, n_prompts: int, requests: int, started: float, labels: list[str], shown: str,
          concurrency: int) -> SelfCheck:
    """The check's record; :class:`ServedError` when a checked prompt's readings differ by more than ``tolerance``."""
    pairs = [difference(main[i], other, yes, no) for i in checked for other in (repeat[i], second[i])]
    max_diff, max_mass = (float(max(column)) for column in zip(*pairs, strict=True))
    rotation.note(checked)
    record = SelfCheck(strategy=form, checked=list(checked), max_diff=max_diff, max_mass_diff=max_mass,
                       tolerance=tolerance, precision="served",
                       reference=f"{second_form} form, and {form} again later in the queue",
                       resolution=max(max_diff, 1e-7), coverage=rotation.coverage(n_prompts), n_forward=requests,
                       seconds=float(time.perf_counter() - started))
    if max_diff > tolerance or max_mass > tolerance:
        apart = np.array([max(pair) for pair in pairs]).reshape(len(checked), 2)
        worst = checked[int(np.argmax(apart.max(axis=1)))]
        again, across = float(apart[:, 0].max()), float(apart[:, 1].max())
        if again <= tolerance:  # the same form agrees with itself: the two routes give two distributions
            raise ServedError(
                f"the served self-check failed: the server at {shown} answers one prompt ({labels[worst]}) with two "
                f"distributions, {across:.3g} apart in P(Yes) or log Yes+No mass, in the {form} form and the "
                f"{second_form} form, while the {form} form asked again later agrees within {again:.2g}: the numbers "
                f"the {form} form reads are not the model's own distribution. Something between the model and the "
                "answer changes it: a sampling setting forced on every request by the server's defaults or by a "
                "proxy in front of it (a temperature, top-p, top-k, min-p or a penalty: vLLM's --generation-config "
                "and --override-generation-config, SGLang's --preferred-sampling-params, the proxy's request "
                "rewriting) on a server that returns processed log-probabilities (vLLM --logprobs-mode); check what "
                "reaches the server, or score with --form echo (the prompt's own log-probabilities)")
        raise ServedError(f"the served self-check failed: the server at {shown} gave one prompt ({labels[worst]}) two "
                          f"answers {max_diff:.3g} apart in P(Yes) (log mass {max_mass:.3g}) when asked again later "
                          f"in the same form, above the tolerance {tolerance:g} with {concurrency} request(s) in "
                          "flight: its numbers depend on request order, batching or prompt caching (llama.cpp: "
                          "--concurrency 1; vLLM: --no-enable-prefix-caching); raise --self-check-tolerance to accept "
                          "that resolution")
    return record


def local_differences(reference, probe, main: dict[int, Reading], indices: list[int], yes: list[int],
                      no: list[int]) -> tuple[float, float]:
    """The largest ``(|ΔP(Yes)|, |Δ log Yes+No mass|)`` between the server's readings of the prompts ``indices`` and
    the local forward pass of ``reference`` on each of them alone."""
    import torch

    from ..scoring.engine import score_alone
    from ..scoring.mode import probe_mode

    with probe_mode(reference), torch.inference_mode():
        scored, _ = score_alone(reference, probe.encoded, indices, probe.tok, probe.answer_format)
    diffs, mass = [], []
    for k, i in enumerate(indices):
        p, m = answer(main[i], yes, no)
        diffs.append(abs(p - float(scored.p_yes[k])))
        mass.append(abs(math.log(m) - math.log(float(scored.yn_mass[k]))) if m > 0 else math.inf)
    return float(max(diffs)), float(max(mass))


def compare_local(record: SelfCheck, reference, probe, main: dict[int, Reading], yes: list[int], no: list[int],
                  tolerance: float | None) -> None:
    """Score the checked prompts with the local forward pass of ``reference`` too; the difference into ``record``,
    :class:`ServedError` when it is above ``tolerance`` (given)."""
    record.scored_diff, record.scored_mass_diff = local_differences(reference, probe, main, record.checked, yes, no)
    record.scored_tolerance = tolerance
    record.replay_note = f"the checked prompts also scored by the local forward pass of {model_label(reference)}"
    if tolerance is not None and max(record.scored_diff, record.scored_mass_diff) > tolerance:
        raise ServedError(f"the served model differs from the local forward pass of {model_label(reference)} by "
                          f"{record.scored_diff:.3g} in P(Yes) (log mass {record.scored_mass_diff:.3g}), above "
                          f"--reference-tolerance {tolerance:g}: not the same weights, or another precision or "
                          "quantisation")


def model_label(model) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "name_or_path", None) or type(model).__name__
