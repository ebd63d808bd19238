"""The one place a probe's settings decide which probe it is (:func:`make_probe`), and ``evaluate``: from a model to
its report in one call.
"""

from __future__ import annotations

from ..config import ProbeConfig, make_config
from ..views.text import sanity_lines
from .adaptive import AdaptiveProbe
from .fixed import Probe


def make_probe(tok, name: str | None = None, limit: int | None = None, *, config: ProbeConfig | None = None,
               vignettes: list[dict] | None = None, **settings) -> Probe | AdaptiveProbe:
    """The probe the settings ask for: an :class:`AdaptiveProbe` with ``until``, else a :class:`Probe`; the same
    arguments as both (``config`` and any :class:`~tinymcf_callback.config.ProbeConfig` field), the settings built
    once here and handed on.

    Example::

        probe = make_probe(tok, "scifi", until="change", width=0.05)   # an AdaptiveProbe
        probe = make_probe(tok, config=ProbeConfig(per_foundation=2))  # a Probe
    """
    config = make_config(config, name, limit, **settings)
    kind = Probe if config.until is None else AdaptiveProbe
    return kind(tok, config=config, vignettes=vignettes)


def evaluate(model, tok, name: str | None = None, limit: int | None = None, *, config: ProbeConfig | None = None,
             verbose: bool = True, progress: bool | None = None, **settings) -> dict:
    """Score ``model`` on vignette set ``name`` and return its alignment report.

    Returns ``{"table", "score", "gap", "sn", "score_minus_sn", "info", "raw", "scenarios", "name", ...}``:
    ``table`` is the per-foundation DataFrame (with ``<metric>_lo``/``_hi`` interval columns),
    ``score`` the mean ``align_other`` over the six real foundations, ``gap`` the mean
    ``self_other_gap``, ``sn`` the Social Norms control, ``score_minus_sn`` their difference,
    each with ``<name>_lo``/``<name>_hi`` bounds; ``level``, ``n_resamples``, ``seed`` say how
    the intervals were made, ``prompt_digest`` which prompts were asked; ``model``, ``dtype``,
    ``autocast``, ``device`` what was scored and in which precision; ``info`` holds the sanity
    figures, the strategy and its self-check; ``raw`` one row per prompt, ``answer_format`` the
    format asked (``"yesno"``: ``p_yes`` is P(Yes), ``yn_mass`` the Yes+No mass; ``"json"``: P(true)
    and the true+false mass). Prints the sanity lines (top-10 tokens of a sample prompt, answer
    mass, frame agreement, the headline with intervals, warnings) unless ``verbose=False``.
    ``config`` and ``settings`` are :class:`~tinymcf_callback.config.ProbeConfig`'s (``answer_format``,
    ``level``, ``n_resamples`` (0: no intervals), ``seed``, ``answer_prefix``, ``until``, ...).
    """
    probe = make_probe(tok, name, limit, config=config, **settings)
    report = probe.run(model, progress=verbose if progress is None else progress)
    if verbose:
        print("\n".join(sanity_lines(report)))
    return report
