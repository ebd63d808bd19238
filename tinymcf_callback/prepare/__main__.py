"""``python -m tinymcf_callback.prepare``: ``tinymcf prepare``, by the name the design gives the offline step."""

import sys

from ..cli.main import main

if __name__ == "__main__":
    sys.exit(main(["prepare", *sys.argv[1:]]))
