"""How every command of the package refuses bad input: exit status 2 and one ``error:`` line, no traceback.

Shared by the tests of the eval, compare, prepare, validate and plot commands, so that a
refusal that prints a traceback, a second line or exits with another status fails them all
the same way (the README's promise for every CLI).
"""

from __future__ import annotations


def one_error_line(rc: int, err: str, *needles: str) -> str:
    """The single ``error: ...`` line of a refused command; asserts status 2 and nothing else on stderr.

    The only other output allowed is a progress bar (``\\r``-rewritten lines, e.g. transformers'
    "Loading weights" before a model is found unusable) and the command's own ``[tinymcf] ...`` lines of
    what it did before it stopped (a warning about the probe it built, a checkpoint it scored); the error line
    comes last. Every ``needle`` must appear in it (what is wrong, and the option or command that fixes it).
    """
    assert rc == 2, f"exit status {rc}, expected 2 (bad input); stderr: {err!r}"
    assert "Traceback" not in err, f"a traceback instead of one error line: {err}"
    lines = [line for line in err.strip().split("\n") if line.strip() and "\r" not in line
             and not line.startswith("[tinymcf] ")]
    assert len(lines) == 1, f"expected exactly one line on stderr, got {len(lines)}: {err!r}"
    assert lines[0].startswith("error: "), f"the line does not start with 'error: ': {lines[0]!r}"
    assert err.rstrip("\n").endswith(lines[0]), f"output after the error line: {err!r}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} is not in the error line {lines[0]!r}"
    return lines[0]


def names(message, *needles: str) -> str:
    """The text of ``message`` (an error or a string), asserting that it names each of ``needles``: the value that is
    wrong, the option or command that fixes it. The words around them are not the contract, and may change."""
    text = str(message)
    for needle in needles:
        assert needle in text, f"{needle!r} is not named in {text!r}"
    return text
