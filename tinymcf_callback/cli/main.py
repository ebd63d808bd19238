"""``tinymcf``: one command, one subcommand per job.

    tinymcf eval --model PATH --name scifi        score one model, write its JSON report
    tinymcf sweep RUN_DIR --name scifi            score each checkpoint of a Trainer run into its history
    tinymcf watch RUN_DIR --device cuda:1         the same while the run trains, into its dashboards
    tinymcf compare A.json B.json                 the paired change between two reports
    tinymcf plot RUN_DIR/moral_probe_scifi.jsonl  draw the curves
    tinymcf prepare --name clifford               make a vignette set ready
    tinymcf validate --name myset                 judge a set's texts with an LLM
    tinymcf show --name myset                     spot-check a set's rewrites

Each subcommand is a module of this package with ``NAME``, ``SUMMARY``, ``add_arguments(parser)``
and ``run(args)`` (and ``USAGE``, a short usage line, where its options are many and come in groups); the outcome
maps to the exit status in one place (:func:`.options.run`): 0 done, 2 bad input (one ``error:`` line), 1 a bug
(with its traceback), 130 interrupted.
``python -m tinymcf_callback`` is the same command, and ``python -m tinymcf_callback.prepare`` its
``prepare`` subcommand (the name the project's design gives the offline step).
"""

from __future__ import annotations

import sys

from .._version import __version__
from . import compare, eval, plot, prepare, show, sweep, validate, watch
from .options import Parser, run

COMMANDS = (eval, sweep, watch, compare, plot, prepare, validate, show)
PROG = "tinymcf"


def build_parser(prog: str = PROG) -> Parser:
    parser = Parser(prog=prog, description="A fast moral-foundations probe for Hugging Face models and training runs.")
    parser.add_argument("--version", action="version", version=f"tinymcf_callback {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.SUMMARY, usage=getattr(command, "USAGE", None),
                           description=(command.__doc__ or "").split("\n\n")[0])
        command.add_arguments(p)
        p.set_defaults(command_module=command)
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else [str(a) for a in argv])
    except SystemExit as e:  # --help, --version, or one "error:" line from the parser
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    module = args.command_module
    return run(module.run, args, prepare.Say().scrub)  # no key this process could send is ever printed


if __name__ == "__main__":
    sys.exit(main())
