"""The ``python -m`` forms from before the ``tinymcf`` command, translated to its subcommands.

    python -m tinymcf_callback.eval --model M ...      -> tinymcf eval --model M ...
    python -m tinymcf_callback.eval --run-dir OUT ...  -> tinymcf sweep OUT ...
    python -m tinymcf_callback.eval --compare A B ...  -> tinymcf compare A B ...
    python -m tinymcf_callback.prepare --validate ...  -> tinymcf validate ...
    python -m tinymcf_callback.prepare --show N ...    -> tinymcf show -n N ...
    python -m tinymcf_callback.prepare ...             -> tinymcf prepare ...
    python -m tinymcf_callback.validate ...            -> tinymcf validate ...
    python -m tinymcf_callback.plot ...                -> tinymcf plot ...

The modes were options then; they are subcommands now, so an option that belongs to another
mode is refused by that subcommand's own parser. The one exception keeps old scripts running:
``prepare --validate`` and ``prepare --show`` accepted (and ignored) the options of preparing a
set, which are dropped on the way.
"""

from __future__ import annotations

import sys

from .main import main


def _take(argv: list[str], option: str, n: int = 1) -> tuple[list[str] | None, list[str]]:
    """The ``n`` values of ``option`` (``--x V`` or ``--x=V``) and ``argv`` without them; ``None`` when absent."""
    for i, arg in enumerate(argv):
        if arg == option:
            return argv[i + 1:i + 1 + n], argv[:i] + argv[i + 1 + n:]
        if n == 1 and arg.startswith(option + "="):
            return [arg.split("=", 1)[1]], argv[:i] + argv[i + 1:]
    return None, argv


def eval_argv(argv: list[str]) -> list[str]:
    compared, rest = _take(argv, "--compare", 2)
    if compared is not None:
        return ["compare", *compared, *rest]
    run_dir, rest = _take(argv, "--run-dir")
    if run_dir is not None:
        return ["sweep", *run_dir, *rest]
    return ["eval", *argv]


PREPARING_ONLY = {"--source": 1, "--url": 1, "--description": 1, "--force-download": 0, "--allow-checksum-change": 0}


def _without_preparing(argv: list[str]) -> list[str]:
    """``argv`` without the options only the preparing mode read (the old --validate and --show ignored them)."""
    out, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        key = arg.split("=", 1)[0]
        if key in PREPARING_ONLY:
            skip = PREPARING_ONLY[key] if "=" not in arg else 0
            continue
        out.append(arg)
    return out


def prepare_argv(argv: list[str]) -> list[str]:
    count, rest = _take(argv, "--show")
    if count is not None:
        return ["show", "-n", *count, *_without_preparing(rest)]
    if "--validate" in argv:
        return ["validate", *_without_preparing([a for a in argv if a != "--validate"])]
    return ["prepare", *argv]


def eval_main(argv: list[str] | None = None) -> int:
    """``python -m tinymcf_callback.eval``."""
    return main(eval_argv(sys.argv[1:] if argv is None else list(argv)))


def prepare_main(argv: list[str] | None = None) -> int:
    """``python -m tinymcf_callback.prepare``."""
    return main(prepare_argv(sys.argv[1:] if argv is None else list(argv)))


def validate_main(argv: list[str] | None = None) -> int:
    """``python -m tinymcf_callback.validate`` (``--validate`` may still be given: it is the command's name now)."""
    return main(["validate", *[a for a in (sys.argv[1:] if argv is None else argv) if a != "--validate"]])


def plot_main(argv: list[str] | None = None) -> int:
    """``python -m tinymcf_callback.plot``."""
    return main(["plot", *(sys.argv[1:] if argv is None else argv)])
