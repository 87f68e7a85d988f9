"""``python -m tfcoord`` is the ``tfcoord`` command."""

import sys

from tfcoord.cli import main

sys.exit(main())
