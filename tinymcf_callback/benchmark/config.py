"""What the slow benchmark beside the probe is, in one settings object: :class:`BenchmarkConfig`, checked once.

``tinymcf eval --prefs ... --lm-eval ...``, ``tinymcf sweep``/``watch`` with the same options, ``MoralProbeCallback
(prefs=..., lm_eval=...)`` and :func:`~.runner.evaluate_benchmark` all build one; each option is one field here.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError
from ..stats.bootstrap import DEFAULT_LEVEL, DEFAULT_RESAMPLES, check_level, check_resamples
from .pairs import DEFAULT_SPLIT
from .schedule import DEFAULT_AT, parse_at


def _names(value, what: str) -> tuple[str, ...]:
    """A comma-separated string or a list of names as a tuple (blanks dropped)."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(item, str) for item in items):
        raise ConfigError(f"{what} must be names (a comma-separated string or a list of strings), got {value!r}")
    return tuple(item.strip() for item in items if item.strip())


def _count(value, what: str, unit: str):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ConfigError(f"{what} must be a positive whole number of {unit}, or None for all; got {value!r}")
    return int(value)


@dataclass(frozen=True)
class BenchmarkConfig:
    """The preference pairs and lm-eval tasks scored beside the probe, and when (at least one of the two).

    Args:
        prefs: the pairs' source: a local ``.jsonl``/``.json``/``.parquet``/``.csv`` file, a dataset folder or a
            Hugging Face dataset name (``wassname/ethics_expression_preferences``).
        configs: the configs to keep (a file's ``config`` column, a dataset's configs); default all.
        split: a dataset's split (default ``test``).
        revision: a Hub dataset's revision.
        limit: the first ``limit`` pairs of each config.
        per_config: that many pairs drawn from each config (seeded by ``seed``).
        seed: the draw's and the intervals' seed.
        level, n_resamples: the intervals' confidence level and bootstrap resamples.
        lm_eval: lm-evaluation-harness task names (``ethics_cm``, ``hendrycks_ethics``, a local folder's).
        lm_eval_include: a folder of lm-eval task files (lm-eval's ``include_path``).
        lm_eval_limit: documents per lm-eval task.
        at: when a run is scored (sweep, watch, callback): ``start,middle,end``, ``all``, or steps.
        self_check: hold the pairs' fast path to each sequence scored alone.
        token_budget, max_batch_size: the size of a forward call (default: sized to the device, as the probe's).
    """

    prefs: str | None = None
    configs: tuple[str, ...] = ()
    split: str = DEFAULT_SPLIT
    revision: str | None = None
    limit: int | None = None
    per_config: int | None = None
    seed: int = 0
    level: float = DEFAULT_LEVEL
    n_resamples: int = DEFAULT_RESAMPLES
    lm_eval: tuple[str, ...] = ()
    lm_eval_include: str | None = None
    lm_eval_limit: int | None = None
    at: str = DEFAULT_AT
    self_check: bool = True
    token_budget: int | None = None
    max_batch_size: int | None = None
    names: dict = field(default_factory=dict, compare=False, repr=False)  # option names for messages (the CLI's)

    def __post_init__(self):
        say = lambda name: self.names.get(name, name)  # noqa: E731
        if self.prefs is not None and (not isinstance(self.prefs, str) or not self.prefs.strip()):
            raise ConfigError(f"{say('prefs')} must name the pairs' source (a file, a dataset folder or a Hub "
                              f"dataset), got {self.prefs!r}")
        object.__setattr__(self, "configs", _names(self.configs, say("configs")))
        object.__setattr__(self, "lm_eval", _names(self.lm_eval, say("lm_eval")))
        if not self.prefs and not self.lm_eval:
            raise ConfigError(f"the benchmark needs {say('prefs')} (preference pairs) or {say('lm_eval')} (lm-eval "
                              "tasks), or both")
        if self.limit is not None and self.per_config is not None:
            raise ConfigError(f"{say('limit')} and {say('per_config')} both choose a subset: give one")
        object.__setattr__(self, "limit", _count(self.limit, say("limit"), "pairs per config"))
        object.__setattr__(self, "per_config", _count(self.per_config, say("per_config"), "pairs per config"))
        object.__setattr__(self, "lm_eval_limit", _count(self.lm_eval_limit, say("lm_eval_limit"), "documents"))
        object.__setattr__(self, "token_budget", _count(self.token_budget, say("token_budget"), "tokens"))
        object.__setattr__(self, "max_batch_size", _count(self.max_batch_size, say("max_batch_size"), "sequences"))
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0:
            raise ConfigError(f"{say('seed')} must be a whole number >= 0, got {self.seed!r}")
        check_level(self.level, say("level"))
        check_resamples(self.n_resamples, say("n_resamples"), allow_off=False)
        if not isinstance(self.split, str) or not self.split:
            raise ConfigError(f"{say('split')} must name a split (train, validation, test), got {self.split!r}")
        parse_at(self.at, say("at"))
        if (self.configs or self.limit or self.per_config) and not self.prefs:
            raise ConfigError(f"{say('configs')}, {say('limit')} and {say('per_config')} choose preference pairs: "
                              f"they go with {say('prefs')}")
        if (self.lm_eval_include or self.lm_eval_limit) and not self.lm_eval:
            raise ConfigError(f"{say('lm_eval_include')} and {say('lm_eval_limit')} go with {say('lm_eval')} (the "
                              "tasks to run)")

    def as_dict(self) -> dict:
        """The settings as plain values (saved in a callback's state, recorded in a history line)."""
        out = asdict(self)
        out.pop("names")
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
