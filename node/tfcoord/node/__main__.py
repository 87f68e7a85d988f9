"""``python -m tfcoord.node ...`` is ``tfcoord node ...`` (see tfcoord.cli)."""

import sys

from tfcoord.cli import main

if __name__ == "__main__":
    sys.exit(main(["node", *sys.argv[1:]]))
