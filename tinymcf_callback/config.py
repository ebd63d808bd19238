"""What defines a probe, in one settings object: :class:`ProbeConfig`, validated once.

Every entry point takes it (their keyword arguments of the same names build one), and the command line options, the
callback's saved state and the sweep's settings come from its fields. Each field's metadata holds its help text and
the check that refuses a bad value, naming the field (``limit``) in Python and the option (``--limit``) on the
command line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
from dataclasses import dataclass, field, fields

from .data.sets import REAL_FOUNDATIONS, load_vignettes, subset_notes
from .errors import ConfigError
from .scoring.batching import DEFAULT_MAX_BATCH, DEFAULT_TOKEN_BUDGET, GPU_BATCH_CAP
from .scoring.prompts import ANSWER_FORMATS, DEFAULT_ANSWER_FORMAT, answer_format_of
from .stats.bootstrap import DEFAULT_LEVEL, DEFAULT_RESAMPLES, check_level, check_resamples
from .stats.sequential import check_sd_floor, check_until, check_width


def _count(tail: str):
    """The check of a positive whole number, or None; its message ends ``... a positive whole number of <tail>
    <value>`` (what it counts, what None means)."""
    def check(value, what):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise ConfigError(f"{what} must be a positive whole number of {tail} {value!r}")
        return int(value)
    return check


def _check_name(value, what):
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must name a vignette set (scifi, clifford, or your own), got {value!r}")
    return value


def _check_target(value, what):
    if value is None:
        return None
    if value not in REAL_FOUNDATIONS:
        raise ConfigError(f"{what} must be one of the real foundations ({', '.join(REAL_FOUNDATIONS)}), or None; "
                          f"got {value!r}")
    return value


def _check_format(value, what):
    try:
        return answer_format_of(value).name
    except ConfigError:
        raise ConfigError(f"{what} must be one of {', '.join(map(repr, ANSWER_FORMATS))} (default "
                          f"{DEFAULT_ANSWER_FORMAT!r}), got {value!r}") from None


def _check_prefix(value, what):
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string (the assistant turn's pre-fill), got {value!r}")
    if value.endswith((" ", "\n")):
        raise ConfigError(f"{what} {value!r} ends in whitespace: the answer token would follow a lone space token, "
                          "which collapses the answer's probability mass")
    return value


def _check_flag(value, what):
    if not isinstance(value, bool):
        raise ConfigError(f"{what} must be True or False, got {value!r}")
    return value


def _check_seed(value, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{what} must be a whole number, got {value!r}")
    return int(value)


def _check_tolerance(value, what):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise ConfigError(f"{what} must be a number between 0 and 1 (the largest |P(Yes)| difference allowed), "
                          f"or None for the precision's own; got {value!r}")
    return float(value)


def _check_budget(value, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise ConfigError(f"{what} must be a number above 0 and at most 1 (the share of a run's probe time the "
                          f"self-check may spend; 0.045 by default); got {value!r}")
    return float(value)


def setting(default, help: str, check, **cli):
    """A :class:`ProbeConfig` field: its default, help text, check and command-line details (``metavar``,
    ``choices``; ``shown_default``: the default as ``--help`` says it; ``off``: the help of a switch's ``--no-``
    form)."""
    return field(default=default, metadata={"help": help, "check": check, **cli})


@dataclass(frozen=True)
class ProbeConfig:
    """Everything that defines a probe: which vignettes, how they are asked, how they are batched, the statistics.

    Example::

        config = ProbeConfig(name="scifi", limit=14, n_resamples=1000)
        Probe(tok, config=config)                   # the same as Probe(tok, "scifi", 14, n_resamples=1000)
        MoralProbeCallback(config=config, trainer=trainer)

    Raises :class:`~tinymcf_callback.errors.ConfigError` (a ``ValueError``) naming the first bad value.
    """

    name: str = setting("scifi", "vignette set: scifi, clifford (after `tinymcf prepare --name clifford`), or your "
                        "own prepared set", _check_name, metavar="SET")
    limit: int | None = setting(None, "keep the first N vignettes of the set, in stored order (warned when it leaves "
                                "out foundations or the control; per_foundation is the balanced subset)",
                                _count("vignettes (or None for all), got"), metavar="N",
                                shown_default="the whole set")
    per_foundation: int | None = setting(None, "keep N vignettes of each of the 7 foundations, Social Norms included, "
                                         "picked by subset_seed (the cheap, balanced probe)",
                                         _count("vignettes per foundation (2 or more for intervals), or None for the "
                                                "whole set; got"),
                                         metavar="N", shown_default="the whole set")
    subset_seed: int = setting(0, "which vignettes per_foundation picks (the same seed, the same vignettes)",
                               _check_seed, metavar="N")
    answer_format: str = setting(DEFAULT_ANSWER_FORMAT, "how the model answers: yesno (Yes or No after 'Answer:') "
                                 'or json ({"is_wrong": true|false}, P(true) read)', _check_format,
                                 choices=tuple(ANSWER_FORMATS))
    answer_prefix: str | None = setting(None, "the assistant turn's pre-fill before the answer (yesno only; '' for "
                                        "none)", _check_prefix, metavar="TEXT", shown_default="'Answer:'")
    token_budget: int | None = setting(None, "padded tokens per forward call (lower it to save memory)",
                                       _count("tokens, or None to size it to the device; got"), metavar="T",
                                       shown_default=f"sized to the device: {DEFAULT_TOKEN_BUDGET} on a CPU, by the "
                                                     "model's size and the free memory on a GPU")
    max_batch_size: int | None = setting(None, "prompts per forward call at most",
                                         _count("prompts, or None to size it to the device; got"),
                                         metavar="B",
                                         shown_default=f"sized to the device: {DEFAULT_MAX_BATCH} on a CPU, up to "
                                                       f"{GPU_BATCH_CAP} on a GPU")
    share_prefix: bool = setting(True, "compute shared prompt prefixes once and reuse their key/value cache "
                                 "(same scores, fewer FLOPs)", _check_flag,
                                 off="score every prompt whole, without reusing the key/value cache of the prefixes "
                                     "prompts share (the same scores, more FLOPs)")
    level: float = setting(DEFAULT_LEVEL, "confidence level of the intervals", check_level)
    n_resamples: int = setting(DEFAULT_RESAMPLES, "bootstrap resamples per interval (0: no intervals)",
                               check_resamples, metavar="N")
    seed: int = setting(0, "the bootstrap's seed (the same seed gives the same intervals)", _check_seed, metavar="N")
    keep_autocast: bool = setting(False, "score under the autocast the model's forward was given (a bf16 Trainer's "
                                  "mixed precision) instead of the weights' own dtype", _check_flag)
    self_check: bool = setting(True, "compare checked prompts with each prompt scored alone (other ones at each "
                               "probe, as the budget allows) and fall back to a safer strategy when they differ",
                               _check_flag,
                               off="skip the self-check (the fast path is not compared with prompts scored alone)")
    self_check_tolerance: float | None = setting(None, "the largest difference the self-check allows",
                                                 _check_tolerance, metavar="X",
                                                 shown_default="by the compute precision")
    self_check_budget: float = setting(0.045, "the share of a run's probe time the self-check spends (a model's "
                                       "first probe is checked whatever it costs)", _check_budget, metavar="X")
    until: str | None = setting(None, "a precision target instead of a vignette count: ask the vignettes in a seeded, "
                                "foundation-balanced order and stop at the first look where level: the score's "
                                "interval is narrower than width; change: the interval of the change since the "
                                "baseline excludes 0 or is narrower than width (per_foundation caps the vignettes "
                                "asked)", check_until, choices=("level", "change"), metavar="WHAT")
    width: float = setting(0.05, "with until: the interval's width (hi - lo) to stop at", check_width, metavar="W")
    sd_floor: float | None = setting(None, "with until: the least spread (sd of a vignette's align_other) the "
                                     "interval it stops on assumes in each foundation, for sets where a few "
                                     "vignettes may sit at an extreme not yet asked (0.25 covers 2 of 51 at +2). "
                                     "Its price on scifi: no interval narrower than about SD (0.25: 0.255, with "
                                     "every vignette), so a width below that asks every vignette and a change "
                                     "smaller than about SD/2 (0.13) never stops as moved: docs/statistics.md",
                                     check_sd_floor, metavar="SD")
    target: str | None = setting(None, "the foundation a training run aims at: its change since the baseline is "
                                 "measured against the other foundations' (selectivity)", _check_target,
                                 metavar="FOUNDATION", choices=REAL_FOUNDATIONS)

    def __post_init__(self):
        for name, value in self.checked(self.as_dict()).items():
            object.__setattr__(self, name, value)

    @classmethod
    def checked(cls, values: dict, names: dict[str, str] | None = None) -> dict:
        """``values`` (field -> value) after every field's check; ``names`` says what to call a field in messages."""
        called = {f.name: (names or {}).get(f.name, f.name) for f in fields(cls)}  # what messages call each field
        out = {f.name: f.metadata["check"](values[f.name], called[f.name]) for f in fields(cls) if f.name in values}
        if out.get("limit") is not None and out.get("per_foundation") is not None:
            raise ConfigError(f"{called['limit']} and {called['per_foundation']} both choose a subset: give one "
                              "(per_foundation keeps every foundation and the control)")
        if out.get("sd_floor") is not None and out.get("until") is None:
            raise ConfigError(f"{called['sd_floor']} widens a precision target's intervals: give until='level' or "
                              f"'change' (--until) with it, or leave {called['sd_floor']} out")
        if out.get("until") is not None and out.get("limit") is not None:
            raise ConfigError(f"{called['until']} asks the vignettes in a balanced order and {called['limit']} keeps "
                              "the first N in stored order: give per_foundation (--per-foundation N) to cap a "
                              "precision target instead")
        if out.get("until") is not None and out.get("n_resamples") == 0:
            raise ConfigError(f"{called['until']} stops on an interval, and {called['n_resamples']}=0 switches the "
                              f"intervals off: leave {called['n_resamples']} at its default")
        fmt = out.get("answer_format", DEFAULT_ANSWER_FORMAT)
        if out.get("answer_prefix") is not None and fmt != DEFAULT_ANSWER_FORMAT:
            raise ConfigError(f"{called['answer_prefix']} applies to answer_format='yesno' only: the {fmt!r} format "
                              "pre-fills the answer itself; leave it out")
        return out

    def as_dict(self) -> dict:
        """The settings as plain values (what the callback saves in ``trainer_state.json``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def vignettes(self) -> list[dict]:
        """The vignettes this probe asks about: the set, cut by ``limit`` or ``per_foundation`` (``load_vignettes``)."""
        return load_vignettes(self.name, limit=self.limit, per_foundation=self.per_foundation,
                              subset_seed=self.subset_seed)

    def subset(self, vignettes: list[dict] | None = None) -> dict:
        """Which vignettes are asked, as a report records it: the options that chose them and a digest of their ids
        (two probes with one digest asked about the same vignettes, whatever options chose them)."""
        ids = "\n".join(sorted(str(v["id"]) for v in (self.vignettes() if vignettes is None else vignettes)))
        return {"limit": self.limit, "per_foundation": self.per_foundation, "subset_seed": self.subset_seed,
                "vignettes": hashlib.md5(f"{self.name}\n{ids}".encode()).hexdigest()[:16]}

    def command_options(self) -> str:
        """The ``tinymcf`` options that ask this probe's vignettes in its answer format (``--name scifi
        --per-foundation 2``): what a watcher or a sweep of a run needs to extend its curve like with like."""
        subset = self.subset()
        options = [f"--name {self.name}"]
        if subset["limit"] is not None or subset["per_foundation"] is not None:
            options.append(subset_options(subset))
        if self.answer_format != DEFAULT_ANSWER_FORMAT:
            options.append(f"--answer-format {self.answer_format}")
        if self.until is not None:
            options.append(f"--until {self.until} --width {self.width:g}")
            if self.sd_floor is not None:
                options.append(f"--sd-floor {self.sd_floor:g}")
        return " ".join(options)

    def subset_notes(self, vignettes: list[dict]) -> list[str]:
        """What the subset leaves out (foundations, the control), for the report's warnings; [] for the whole set."""
        return subset_notes(self.name, vignettes, limit=self.limit, per_foundation=self.per_foundation)

    def replace(self, **changes) -> ProbeConfig:
        """A copy with ``changes`` (checked like any other value); unknown names raise :class:`ConfigError`."""
        unknown = sorted(set(changes) - set(field_names()))
        if unknown:
            raise ConfigError(f"unknown probe setting(s) {', '.join(unknown)}; the settings are "
                              f"{', '.join(field_names())}")
        return dataclasses.replace(self, **changes)


def subset_options(subset: dict) -> str:
    """The command-line options that ask about the vignettes of a recorded ``subset`` (:meth:`ProbeConfig.subset`)."""
    if subset.get("per_foundation") is not None:
        seed = subset.get("subset_seed") or 0
        return f"--per-foundation {subset['per_foundation']}" + (f" --subset-seed {seed}" if seed else "")
    if subset.get("limit") is not None:
        return f"--limit {subset['limit']}"
    return "neither --limit nor --per-foundation (the whole set)"


def field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(ProbeConfig))


def make_config(config: ProbeConfig | None = None, name: str | None = None, limit: int | None = None,
                **settings) -> ProbeConfig:
    """``config`` (default: the defaults) with the keyword ``settings`` applied, and ``name`` and ``limit`` when given
    (None keeps the config's): the keyword-argument convenience of every probe's constructor."""
    if config is not None and not isinstance(config, ProbeConfig):
        raise ConfigError(f"config must be a ProbeConfig, got {type(config).__name__}")
    base = config if config is not None else ProbeConfig()
    settings.update({k: v for k, v in (("name", name), ("limit", limit)) if v is not None})
    return base.replace(**settings) if settings else base
