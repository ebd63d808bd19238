"""The error of the preparation side: bad input or an unusable setup, named with the fix.

The ``prepare`` and ``validate`` commands print ``error: <message>`` and exit with 2. It
lives below every preparation module (file readers, LLM client, request loop) so that
each can raise it without importing another.
"""


class PrepareError(Exception):
    """Bad input or an unusable setup: the CLI prints ``error: <message>`` and exits with 2."""
