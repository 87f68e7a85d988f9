"""``python -m tfcoord.node ...``: one node (see :mod:`tfcoord.node.main`)."""

import sys

from tfcoord.node.main import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m tfcoord.node"))
