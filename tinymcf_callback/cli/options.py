"""What every subcommand shares: the parser that refuses in one line (:class:`Parser`), the options defined once,
and the one mapping from what happened to the exit status (:func:`run`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import sys
import traceback
from collections.abc import Callable
from dataclasses import Field, fields
from types import MappingProxyType
from typing import get_type_hints

from ..config import ProbeConfig
from ..data.home import HOME_VAR, using_home
from ..errors import ConfigError, TinymcfError
from ..served.config import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, RELOAD_TIMEOUT_S
from ..served.reload import RELOADS
from ..trackers.table import TRACKERS

EXIT_BAD_INPUT, EXIT_BUG, EXIT_INTERRUPTED = 2, 1, 130
# a sweep's and a watcher's outcome (tinymcf sweep / watch): 0 only when every saved step is scored
EXIT_UNSCORED, EXIT_TRAINING_GONE, EXIT_GAPS, EXIT_TRAINING_QUIET = 1, 3, 4, 5
DTYPES = ("auto", "float32", "bfloat16", "float16")


class Parser(argparse.ArgumentParser):
    """An argument parser whose refusals are one ``error: ...`` line naming the command's ``--help``."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see {self.prog} --help)\n")


def add_probe_options(parser, skip: tuple[str, ...] = ()) -> None:
    """One option per ProbeConfig field (less ``skip``), made by transformers' ``HfArgumentParser`` from the field's
    type, default and help: ``--per-foundation`` (and HF's ``--per_foundation``), ``--no-share-prefix`` and
    ``--share-prefix [BOOL]`` for a switch on by default, ``--keep-autocast`` for one off."""
    from transformers import HfArgumentParser  # here: commands without probe options (show) import no transformers

    group = parser.add_argument_group("the probe (any tinymcf_callback.ProbeConfig setting)")
    types = get_type_hints(ProbeConfig)
    for f in fields(ProbeConfig):
        if f.name in skip:
            continue
        before = len(group._group_actions)
        HfArgumentParser._parse_dataclass_field(group, _as_argument(f, types[f.name]))
        added = group._group_actions[before:]
        for action in added:  # the spelling the docs use first: usage lines and messages show it
            action.option_strings.sort(key=lambda option: "_" in option)
        if f.default is True:  # HF gives --no-X the help of --X
            added[-1].help = f"{f.metadata['off']} (default: {f.name.replace('_', ' ')} on)"


def _as_argument(f: Field, kind) -> Field:
    """``f`` as ``HfArgumentParser`` reads a field: its resolved type, and of its metadata what ``add_argument`` takes
    (the help with its default said, metavar, choices)."""
    shown = f.metadata.get("shown_default") or ("none" if f.default is None else f.default)
    if isinstance(f.default, bool):
        shown = "on" if f.default else "off"
    argument = copy.copy(f)
    argument.type = kind
    argument.metadata = MappingProxyType({"help": f"{f.metadata['help']} (default: {shown})",
                                          **{k: f.metadata[k] for k in ("metavar", "choices") if k in f.metadata}})
    return argument


def probe_config(args: argparse.Namespace) -> ProbeConfig:
    """The ProbeConfig of the options (those a subcommand leaves out keep their defaults); a bad value names its
    option."""
    given = {f.name: getattr(args, f.name) for f in fields(ProbeConfig) if hasattr(args, f.name)}
    names = {name: "--" + name.replace("_", "-") for name in given}
    return ProbeConfig(**ProbeConfig.checked(given, names))  # a ConfigError here says --limit, not limit


def add_home(parser) -> None:
    parser.add_argument("--home", metavar="DIR", default=None,
                        help=f"where prepared sets, their rewrites and judgements live (default: ${HOME_VAR}, else "
                             f"the platform's user data folder)")


def add_loading(parser, *, device_help: str | None = None, dtypes: tuple[str, ...] = DTYPES,
                dtype_help: str = "the weights' dtype (default: the checkpoint's own)") -> None:
    """``--device`` and ``--dtype``: where and in what a model is loaded."""
    parser.add_argument("--device", default=None,
                        help=device_help or "cpu, cuda, cuda:1, mps ... (default: cuda if available)")
    parser.add_argument("--dtype", default="auto", choices=dtypes, help=dtype_help)


def add_served(parser, *, run: bool = False) -> None:
    """``--endpoint`` and what goes with it (``run``: the sweep's and the watcher's form, with ``--served-model`` and
    ``--reload``; else ``tinymcf eval``'s)."""
    g = parser.add_argument_group("served model (--endpoint)")
    key = "(API key, if any: $TINYMCF_API_KEY or $OPENAI_API_KEY)"
    if run:
        g.add_argument("--endpoint", default=None, metavar="URL",
                       help=f"score each checkpoint through this OpenAI-compatible server (vLLM, SGLang, llama.cpp) "
                            f"after --reload has loaded it there {key}")
        g.add_argument("--served-model", default=None, metavar="NAME",
                       help="the name the server serves the model under (default: the one it lists)")
        routes = ", ".join(f"{route.name} ({route.summary})" for route in RELOADS.values())
        g.add_argument("--reload", default=None, metavar="CMD",
                       help=f"how each checkpoint is loaded into the server: {routes}, or a shell command that exits "
                            f"0 once the server serves it ({{checkpoint}} and {{step}} are replaced; also "
                            f"$TINYMCF_CHECKPOINT, $TINYMCF_STEP and $TINYMCF_PID, the follower's process)")
        g.add_argument("--reload-timeout", type=float, default=RELOAD_TIMEOUT_S, metavar="S",
                       help=f"seconds a reload may take before the step is left unscored (default "
                            f"{RELOAD_TIMEOUT_S:g})")
        g.add_argument("--no-reload-check", dest="reload_check", action="store_false",
                       help="do not check each reload on the scores (by default the follower loads the checkpoint "
                            "in float32 and holds the server's answers to a few prompts to its forward pass: for a "
                            "model it cannot load)")
        g.add_argument("--reference-tolerance", type=float, default=None, metavar="P",
                       help="what the reload check holds the server to, in P(Yes) and log Yes+No mass (default: "
                            "what a server started fresh on a checkpoint differs by in its precision)")
    else:
        g.add_argument("--endpoint", default=None, metavar="URL",
                       help=f"score the model through this OpenAI-compatible server (vLLM, SGLang, llama.cpp, ...) "
                            f"instead of loading it; --model is then the name it serves {key}")
        g.add_argument("--tokenizer", default=None, metavar="PATH",
                       help="the model's tokenizer (a folder or Hub id; default: --model): for a saved model without "
                            "tokenizer files (save_pretrained of the model alone), or a served model, whose prompts go "
                            "to the server as this tokenizer's token ids")
    g.add_argument("--form", default="auto", metavar="FORM",
                   help="how to ask for log-probabilities: auto (the server's exact form), logprob_token_ids (vLLM), "
                        "token_ids_logprob (SGLang), n_probs (llama.cpp), echo, top_logprobs (a bound)")
    g.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help="requests in flight at once (default: about 8 sequences in flight; 1 on llama.cpp, whose "
                        "batching moves the numbers)")
    g.add_argument("--check-form", default="auto", metavar="FORM",
                   help="the self-check's second request form (default auto: another route through the server than "
                        "the scoring's, echo on vLLM and SGLang)")
    g.add_argument("--batch-prompts", type=int, default=None, metavar="N",
                   help="prompts per request where the server takes a list of them (default 4; 1 for echo and on "
                        "llama.cpp)")
    g.add_argument("--request-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds per request before it is retried (default {DEFAULT_TIMEOUT_S:g})")
    g.add_argument("--request-retries", type=int, default=DEFAULT_RETRIES, metavar="N",
                   help=f"retries of a request on 429/5xx/timeouts, with backoff (default {DEFAULT_RETRIES})")
    if not run:
        g.add_argument("--reference", default=None, metavar="PATH",
                       help="the same weights as a local model: the self-check's prompts are also scored by its "
                            "forward pass and the difference recorded")
        g.add_argument("--reference-tolerance", type=float, default=None, metavar="P",
                       help="refuse when the server and --reference differ by more than this in P(Yes) (default: "
                            "record only)")


def served_config(args: argparse.Namespace, config: ProbeConfig | None = None, *, run: bool = False):
    """The :class:`~tinymcf_callback.served.ServedConfig` the ``--endpoint`` options describe (``run``: as in
    :func:`add_served`); None without ``--endpoint``, where a served option given is refused."""
    options = ("--served-model", "--reload", "--reference-tolerance") if run else (
        "--reference", "--reference-tolerance")
    if not getattr(args, "endpoint", None):
        given = [o for o in (*options, "--form", "--check-form", "--concurrency", "--batch-prompts")
                 if _given(args, o)]
        if run and given:
            raise ConfigError(f"{given[0]} goes with --endpoint URL, the server it loads each checkpoint into")
        if given:
            raise ConfigError(f"{given[0]} goes with --endpoint (a model in an inference server); a local --model "
                              "runs in this process")
        return None
    if run and not args.reload:
        raise ConfigError("--endpoint needs --reload CMD: the command that loads each checkpoint into the server "
                          "(else every step would score whatever the server holds); see docs/served.md")
    from ..served import ServedConfig

    return ServedConfig(args.endpoint, args.served_model if run else args.model, form=args.form,
                        check_form=args.check_form, concurrency=args.concurrency, batch=args.batch_prompts,
                        timeout=args.request_timeout, retries=args.request_retries,
                        tolerance=config.self_check_tolerance if config is not None else None,
                        seed=config.seed if config is not None else None, reference=getattr(args, "reference", None),
                        reference_tolerance=getattr(args, "reference_tolerance", None),
                        reload=getattr(args, "reload", None),
                        reload_timeout=getattr(args, "reload_timeout", None) or RELOAD_TIMEOUT_S,
                        reload_check=getattr(args, "reload_check", True))


def _given(args: argparse.Namespace, option: str) -> bool:
    value = getattr(args, option[2:].replace("-", "_"), None)
    return value is not None and not (option in ("--form", "--check-form") and value == "auto")


def add_dashboards(parser, *, default: str) -> None:
    """``--report-to`` (the table of trackers' names), for each tracker the option naming its run when the run's record
    does not, and ``--no-figure``."""
    g = parser.add_argument_group("the run's dashboards (--report-to)")
    g.add_argument("--report-to", default=default, metavar="NAMES",
                   help=f"log each line into the run's dashboards, as the callback does: auto (the Trainer's own "
                        f"report_to, as the run's moral_probe_run.json records it), {', '.join(TRACKERS)}, "
                        f"comma-separated, or none (default: {default})")
    for tracker in TRACKERS.values():
        if tracker.option is not None:
            option, metavar, text = tracker.option
            g.add_argument(option, default=None, metavar=metavar, help=text)
    g.add_argument("--no-figure", action="store_true",
                   help="no figure of the curve so far in the dashboards at each line (it costs about 0.2 s a line)")


def named_runs(args: argparse.Namespace) -> dict[str, str]:
    """The runs the trackers' options name (tracker name -> the option's value), for the run's settings."""
    dests = {tracker.name: tracker.option[0][2:].replace("-", "_") for tracker in TRACKERS.values() if tracker.option}
    return {name: getattr(args, dest) for name, dest in dests.items() if getattr(args, dest, None)}


def add_progress(parser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


class Say(logging.Handler):
    """What the package logs, as the command's own lines on stderr (``[tinymcf] ...``), between progress bars."""

    def __init__(self, scrub: Callable[[str], str]):
        super().__init__(logging.INFO)
        self.scrub = scrub

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm.auto import tqdm

        level = "" if record.levelno < logging.WARNING else f"{record.levelname}: "
        try:
            tqdm.write(self.scrub(f"[tinymcf] {level}{record.getMessage()}"), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never fail the command
            self.handleError(record)


@contextlib.contextmanager
def saying(scrub: Callable[[str], str] = lambda text: text):
    """The package's log lines (INFO and up) shown on stderr while a command runs; the library itself only logs."""
    package = logging.getLogger("tinymcf_callback")
    handler, level = Say(scrub), package.level
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(level)


def run(command: Callable[[argparse.Namespace], int], args: argparse.Namespace,
        scrub: Callable[[str], str] = lambda text: text) -> int:
    """Run ``command(args)`` inside the chosen home and map its outcome to the exit status (see the module).

    ``scrub`` removes secrets (API keys) from anything printed.
    """
    try:
        home = getattr(args, "home", None)
        if home is not None and not home.strip():
            raise ConfigError("--home needs a folder")
        with using_home(home), saying(scrub):
            return command(args)
    except TinymcfError as e:
        print(f"error: {scrub(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted; everything finished so far is saved. Rerun the same command to continue.",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - a bug: shown whole (without secrets), exit 1
        print(scrub(traceback.format_exc()), file=sys.stderr)
        return EXIT_BUG
