"""``python -m tinymcf_callback``: the ``tinymcf`` command."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
