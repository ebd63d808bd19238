"""``python -m tinymcf_callback.validate``: the older form of ``tinymcf validate``."""

import sys

from .cli.legacy import validate_main as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
