"""The probe: a vignette set turned into prompts for one tokenizer, and models scored with it (:class:`Probe`,
:class:`AdaptiveProbe`, and :func:`make_probe`, the one place the settings choose between them)."""

from .adaptive import AdaptiveProbe, Asked
from .fixed import Probe, ScoresElsewhere, scorer_of
from .make import evaluate, make_probe

__all__ = ["AdaptiveProbe", "Asked", "Probe", "ScoresElsewhere", "evaluate", "make_probe", "scorer_of"]
