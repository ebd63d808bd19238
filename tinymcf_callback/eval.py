"""``python -m tinymcf_callback.eval``: the older form of ``tinymcf eval``, ``tinymcf sweep`` and ``tinymcf compare``.

``--model M`` scores one model, ``--run-dir OUT`` sweeps a run's checkpoints, ``--compare A B``
compares two reports (see :mod:`tinymcf_callback.cli.legacy`).
"""

import sys

from .cli.legacy import eval_main as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
