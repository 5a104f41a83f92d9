"""``python -m autodl``: the same command line as ``autodl``."""

import sys

from autodl.cli import main

if __name__ == "__main__":
    sys.exit(main())
