"""MkDocs hook: lay out the source tree as the installed package, for mkdocstrings.

pyproject maps ``client/`` to ``tfcoord.client`` (and ``coordinator/``, ``node/``
likewise), so no directory on disk is the package ``tfcoord`` as Python imports it, and
griffe's static analysis cannot find ``tfcoord.client``. Importing the package instead
(griffe's inspection) would run ``tfcoord.__main__``. So before the build this hook
builds ``docs/.api/tfcoord``: symlinks to ``tfcoord/``'s entries and to each mapped
directory, read from pyproject's ``package-dir`` so the tree follows the packaging.
mkdocs.yml points mkdocstrings at ``.api``.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

from mkdocs.plugins import event_priority

DOCS = Path(__file__).resolve().parent.parent
REPO = DOCS.parent
TREE = DOCS / ".api"


def build_tree(repo: Path = REPO, tree: Path = TREE) -> Path:
    """Create ``tree/tfcoord`` mirroring the installed package; returns ``tree``."""
    with open(repo / "pyproject.toml", "rb") as f:
        package_dir: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    if tree.exists():
        shutil.rmtree(tree)
    root = tree / "tfcoord"
    root.mkdir(parents=True)
    mapped = {
        name.removeprefix("tfcoord."): repo / path for name, path in package_dir.items() if name != "tfcoord"
    }
    for entry in (repo / package_dir["tfcoord"]).iterdir():
        if entry.name not in mapped and entry.name != "__pycache__":
            os.symlink(entry, root / entry.name)
    for name, path in mapped.items():
        os.symlink(path, root / name)
    return tree


# Before mkdocstrings' own on_config, which sets up its Python handler from ``paths``: a
# tree made later (a fresh clone has none yet) would not be searched.
@event_priority(100)
def on_config(config):
    build_tree()
    # mkdocs.yml says paths: [.api]; make it absolute so the build works from any directory
    # (mkdocs build -f docs/mkdocs.yml from the repository root included).
    config.plugins["mkdocstrings"].config.handlers["python"]["paths"] = [str(TREE)]
    return config
