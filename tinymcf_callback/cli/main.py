"""``tinymcf``: one command, one subcommand per job (``tinymcf --help`` lists them; docs/cli.md).

Each subcommand is a module of this package with ``NAME``, ``SUMMARY``, ``add_arguments(parser)`` and ``run(args)``
(and ``USAGE`` where its options come in groups); the outcome maps to the exit status in :func:`.options.run`.
"""

from __future__ import annotations

import sys

from .._version import __version__
from . import compare, eval, plot, prepare, show, sweep, validate, watch
from .options import Parser, run

COMMANDS = (eval, sweep, watch, compare, plot, prepare, validate, show)
PROG = "tinymcf"


def build_parser(prog: str = PROG, only: str | None = None) -> Parser:
    """Every subcommand, each with its options; with ``only`` (the command about to run) the others get none, so a
    light command such as ``show`` imports no heavy option machinery (``HfArgumentParser``, hence transformers)."""
    parser = Parser(prog=prog, description="A fast moral-foundations probe for Hugging Face models and training runs.")
    parser.add_argument("--version", action="version", version=f"tinymcf_callback {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.SUMMARY, usage=getattr(command, "USAGE", None),
                           description=(command.__doc__ or "").split("\n\n")[0])
        if only is None or only == command.NAME:
            command.add_arguments(p)
        p.set_defaults(command_module=command)
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    named = argv[0] if argv and argv[0] in {c.NAME for c in COMMANDS} else None
    parser = build_parser(prog, only=named or "")  # no command named: the top level's help or error needs none
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or one "error:" line from the parser
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    module = args.command_module
    return run(module.run, args, prepare.Say().scrub)  # no key this process could send is ever printed


if __name__ == "__main__":
    sys.exit(main())
