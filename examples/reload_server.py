"""The restart route for a server that cannot reload in place, kept here for commands written before it shipped with
the package: it is ``python -m tinymcf_callback.served.restart`` (its options, docs/served.md)."""

import sys

from tinymcf_callback.served.restart import main

if __name__ == "__main__":
    sys.exit(main())
