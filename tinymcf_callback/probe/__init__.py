"""The probe: a vignette set turned into prompts for one tokenizer, and models scored with it.

``fixed`` (:class:`Probe`: a fixed set of vignettes, formatted and tokenised once), ``adaptive``
(:class:`AdaptiveProbe`: a precision target, its looks slices of one Probe's encoding) and ``make``
(:func:`make_probe`, the one place the settings choose between them, and :func:`evaluate`).
"""

from .adaptive import AdaptiveProbe, Asked
from .fixed import Probe, ScoresElsewhere, scorer_of
from .make import evaluate, make_probe

__all__ = ["AdaptiveProbe", "Asked", "Probe", "ScoresElsewhere", "evaluate", "make_probe", "scorer_of"]
