"""Every error the package raises on purpose: one root, :class:`TinymcfError`, and one class per kind of problem.

A ``TinymcfError`` is bad input or an unusable setup, and its message names what is wrong and the
command or option that fixes it: the ``tinymcf`` command prints it as one ``error: ...`` line and
exits with status 2. Any other exception is a bug and is shown with its traceback (status 1).
The classes that stood for "bad value" before they had a common root stay ``ValueError``s too, so
``except ValueError`` keeps catching them.
"""

from __future__ import annotations


def one_line(error: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, cut at ``limit`` characters (loader and compiler messages run over many)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


class TinymcfError(Exception):
    """Bad input or an unusable setup; the message says what is wrong and how to fix it."""


class ConfigError(TinymcfError, ValueError):
    """A setting of the probe (:class:`~tinymcf_callback.config.ProbeConfig`) has a value it cannot take."""


class ProbeDataError(TinymcfError, ValueError):
    """A vignette set, config or cache entry is missing or malformed."""


class UnsupportedModelError(TinymcfError, ValueError):
    """The model is not a causal language model with its LM head, so the probe cannot read an answer."""


class PromptError(TinymcfError, ValueError):
    """The prompts cannot be asked of this model: one is longer than its context, or an answer has no token."""


class EngineMismatchError(TinymcfError, RuntimeError):
    """Even the safest strategy disagrees with each prompt scored alone: the probe would report a wrong number."""


class CompareError(TinymcfError, ValueError):
    """Two reports that cannot be compared, or a file that is not a probe report; the message says why."""


class HistoryError(TinymcfError, ValueError):
    """A history file that cannot be read or drawn: missing, empty, malformed, or mixed with another set's."""


class PlotOptionError(TinymcfError, ValueError):
    """A figure option (metric, panel group, x axis, width) that cannot be used; the message lists the choices."""


class SweepError(TinymcfError):
    """Bad input or an unusable run folder for the checkpoint sweep."""


class PrepareError(TinymcfError):
    """Bad input or an unusable setup while preparing a set (files, the LLM endpoint, the home)."""


class MissingExtraError(TinymcfError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


class BenchmarkError(TinymcfError, ValueError):
    """The slow benchmark beside the probe cannot run as asked: an lm-eval task that does not exist or whose data
    cannot be read, a setting of the preference pairs or of when to score them that cannot be used."""


class LoadError(TinymcfError):
    """A model or tokenizer named on the command line cannot be loaded, or a folder cannot be written."""


class ServedError(TinymcfError):
    """A served model cannot be scored: the server is down, does not serve that model, refused a request,
    or failed the served self-check (another template, processed log-probabilities, an order dependence)."""


class CheckpointUnusable(TinymcfError):
    """A checkpoint that trying again within this command cannot fix: a server asked to load it did not take it, or
    does not compute it after the reload. Its step is left unscored at once, in one line (a new sweep or watch tries
    again)."""


class CheckpointIncomplete(TinymcfError):
    """A weight file of a checkpoint is cut short or half-written (a save interrupted, or a copy still in progress).
    Its weights are never loaded nor handed to a server; the follower reads its headers again after its back-off, and
    a file that stays short is a gap with this cause."""


class RegistryError(TinymcfError, ValueError):
    """A name given twice to one of the package's tables (:class:`~tinymcf_callback.registry.Registry`), or looked up
    and not there; the message lists the names registered."""
