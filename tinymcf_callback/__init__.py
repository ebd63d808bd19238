"""tinymcf_callback: a fast moral-foundations probe for Hugging Face models and training runs."""

from .analysis import analyse
from .callback import MoralProbeCallback
from .engine import score_prompts
from .evaluate import Probe, evaluate
from .prompts import FRAMES, format_prompt, format_prompts
from .sets import CONDITIONS, FOUNDATIONS, ProbeDataError, available_sets, load_vignettes

__version__ = "0.1.0"

__all__ = [
    "CONDITIONS", "FOUNDATIONS", "FRAMES", "MoralProbeCallback", "Probe", "ProbeDataError", "analyse", "available_sets", "evaluate",
    "format_prompt", "format_prompts", "load_vignettes", "score_prompts",
]
