"""``python -m seal.eval ...`` is ``seal eval ...``."""

import sys

from seal.cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", *sys.argv[1:]]))
