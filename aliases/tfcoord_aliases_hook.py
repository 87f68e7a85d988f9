"""Run by ``tfcoord-aliases.pth`` when Python starts: install tfcoord's import aliases.

Kept tiny and silent: it runs in every Python process of the environment. Without
tfcoord installed (a half-removed environment) it does nothing; ``TFCOORD_ALIASES=off``
turns it off for one process tree without uninstalling.
"""

import os

if os.environ.get("TFCOORD_ALIASES", "").lower() not in ("0", "off", "no", "false"):
    try:
        from tfcoord import aliases
    except ImportError:
        pass
    else:
        aliases.install()
