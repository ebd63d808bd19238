"""``tinymcf validate --name NAME``: ask a judge model which foundation each text of a set engages.

See :mod:`tinymcf_callback.prepare.judge`. Takes the LLM options of ``tinymcf prepare``.
"""

from __future__ import annotations

from .prepare import Say, add_llm_options, check_llm_options

NAME = "validate"
SUMMARY = "judge every text of a prepared set: does it engage the foundation it should?"


def add_arguments(p) -> None:
    p.add_argument("--judge-model", help="the judge (default: --model)")
    p.add_argument("--out", help="results, one JSON line per text (default: ./validate_<name>.jsonl)")
    add_llm_options(p)


def run(args) -> int:
    from ..prepare.judge import validate_set

    check_llm_options(args)
    say = Say()
    return validate_set(args, say.secrets, say)
