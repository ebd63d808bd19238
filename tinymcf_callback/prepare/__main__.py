"""``python -m tinymcf_callback.prepare``: the older form of ``tinymcf prepare``, ``validate`` and ``show``."""

import sys

from ..cli.legacy import prepare_main

if __name__ == "__main__":
    sys.exit(prepare_main())
