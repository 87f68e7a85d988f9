"""The import names of the systems tfcoord replaces: ``tensorflowonspark`` and ``tfmesos2``.

TensorFlowOnSpark's and tfmesos2's programs must run with zero edited lines, so
``import tensorflowonspark`` (and every ``tensorflowonspark.X``) has to resolve to
:mod:`tfcoord.compat.tensorflowonspark` (``tfmesos2`` to :mod:`tfcoord.compat.tfmesos2`).
One mechanism does it for both names, wherever the program runs: a meta-path finder,
:class:`AliasFinder`, installed by :func:`install`.

Why a finder, and not a second copy of the packages under the old names:

* **One module object per module.** The alias loader hands back the target module itself,
  so ``tensorflowonspark.TFNode is tfcoord.compat.tensorflowonspark.TFNode``: no module runs
  twice, module state (TFNode's feeds, gpu_info's claims) exists once, and ``isinstance``
  agrees whichever name the user imported.
* **Never shadow the real thing.** For a top-level name the finder first asks the normal
  path finder; if a real TensorFlowOnSpark (or tfmesos2) is installed there, the finder
  steps aside and the real package is imported. :func:`describe` says which one is in use
  (``tfcoord env-check`` prints it; ``TFCluster.run`` logs it).
* **Where it gets installed** is the only thing that differs:

  - on the **driver** under ``tfcoord submit --engine spark`` the command installs it;
  - under a plain ``spark-submit`` (or ``python``, a notebook) the opt-in is one
    install-time step, ``pip install ./aliases`` (the ``tfcoord-aliases`` distribution:
    a ``.pth`` file that calls :func:`install` when Python starts), no program edit;
  - on **executors** always, without any install there: ``TFCluster.run`` and
    ``TFParallel.run`` ship a small zip (:func:`shim_zip`) with ``sc.addPyFile``; its
    ``tensorflowonspark/__init__.py`` installs the finder and puts the target in its own
    place, so closures that reference TensorFlowOnSpark's modules unpickle on executors.
    The node runtime installs the finder too before it calls map_fun.
"""

from __future__ import annotations

# Imported by the tfcoord-aliases .pth file at every Python start, so only what Python has
# loaded by then anyway: importlib.abc (it pulls in importlib.resources, tempfile and typing)
# and typing itself cost every Python process of the environment about 10 ms here, so the
# finder and loader are duck-typed (the import system asks only for the methods) and the
# rest is imported where used.
import _thread
import importlib
import importlib.machinery
import os
import sys
from types import ModuleType

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; type checkers read it as True
if TYPE_CHECKING:
    from importlib.abc import Loader as _LoaderBase
    from typing import Any
else:
    _LoaderBase = object

#: Alias top-level name -> the tfcoord module it stands for. ``alias.X`` is ``target.X``.
ALIASES: dict[str, str] = {
    "tensorflowonspark": "tfcoord.compat.tensorflowonspark",
    "tfmesos2": "tfcoord.compat.tfmesos2",
}
#: A module the real distribution has beside its __init__: tells a real install from our own
#: shim, which the path finder also finds on executors (see shim_zip) and which holds only an
#: __init__ (tfcoord's reservation.Client lives in the alias's target, never on the path).
REAL_MARKERS: dict[str, str] = {"tensorflowonspark": "reservation", "tfmesos2": "server"}
#: Set in the shim package; a path-found package that has it is ours, not a real install.
SHIM_ATTR = "__tfcoord_alias__"


class AliasLoader(_LoaderBase):
    """Loads an alias as its target: the very same module object, under both names."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # Returning the existing module: the import system registers it under the alias
        # name too, and leaves its __name__, __spec__ and __path__ as they are.
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the target module was executed once, under its own name."""


class AliasFinder:
    """``tensorflowonspark[.X]`` -> ``tfcoord.compat.tensorflowonspark[.X]``, likewise ``tfmesos2``."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        top, _, rest = fullname.partition(".")
        base = ALIASES.get(top)
        if base is None:
            return None
        if not rest:
            if real_location(top) is not None:
                return None  # a real install: it wins, the path finder imports it
            name = base
        else:
            parent = sys.modules.get(top)
            if parent is None or getattr(parent, "__name__", None) != base:
                return None  # the real package is in use: its own submodules
            name = f"{base}.{rest}"
        import importlib.util  # only for an alias's name: this method sees every import

        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            return None  # "No module named 'tensorflowonspark.X'", as for any missing module
        return importlib.machinery.ModuleSpec(
            fullname, AliasLoader(name), is_package=found.submodule_search_locations is not None
        )


_finder = AliasFinder()


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Take the finder off ``sys.meta_path`` (modules already imported stay)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, AliasFinder)]


def installed() -> bool:
    return any(isinstance(f, AliasFinder) for f in sys.meta_path)


def real_location(top: str) -> str | None:
    """Where a real (not tfcoord's) ``top`` package is on ``sys.path``, else None.

    Entries that no longer exist are passed over: ``sc.addPyFile`` puts the executor shim's
    zip on the driver's ``sys.path`` too, and ``sc.stop()`` deletes it without taking the
    entry off; the zip importer cached for it then raises FileNotFoundError for a package it
    had listed, which would break every ``TFCluster.run`` of the next SparkContext.
    """
    path = [p for p in sys.path if not p or os.path.exists(p)]
    try:
        spec = importlib.machinery.PathFinder.find_spec(top, path)
    except (ImportError, ValueError, OSError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    marker = REAL_MARKERS.get(top)
    if locations and marker is not None:
        if importlib.machinery.PathFinder.find_spec(f"{top}.{marker}", locations) is None:
            return None  # our shim (or something else that is not the real package)
    elif not locations and spec.origin and _is_shim_file(spec.origin):
        return None
    return spec.origin or (locations[0] if locations else top)


def _is_shim_file(origin: str) -> bool:
    try:
        with open(origin, encoding="utf-8") as f:
            return SHIM_ATTR in f.read(4096)
    except OSError:
        return False


def describe(top: str) -> str:
    """One line: which ``top`` an ``import top`` gives in this process, and why."""
    import importlib.metadata

    real = real_location(top)
    version = ""
    if real is not None:
        try:
            version = " " + importlib.metadata.version(top)
        except importlib.metadata.PackageNotFoundError:
            pass
        return f"{top}: the real {top}{version} at {real} (tfcoord's alias steps aside)"
    if installed():
        return f"{top}: tfcoord's alias ({ALIASES[top]})"
    return (
        f"{top}: not importable here (opt in to tfcoord's alias: pip install ./aliases, or run "
        f"under tfcoord submit)"
    )


# -- executors ------------------------------------------------------------------------------

SHIM_INIT = f'''"""tfcoord's stand-in for TensorFlowOnSpark on executors (shipped with sc.addPyFile)."""
{SHIM_ATTR} = True
import importlib
import sys

import tfcoord.aliases

tfcoord.aliases.install()
sys.modules[__name__] = importlib.import_module(tfcoord.aliases.ALIASES["tensorflowonspark"])
'''

#: SparkContext (its application id) -> the shim zip it was given.
_shipped: dict[str, str] = {}
_ship_lock = _thread.allocate_lock()


def shim_zip(directory: str | None = None) -> str:
    """Write the executors' ``tensorflowonspark`` shim package as a zip; returns its path."""
    import tempfile
    import zipfile

    directory = directory or tempfile.mkdtemp(prefix="tfcoord-alias-")
    path = os.path.join(directory, "tfcoord_tensorflowonspark_alias.zip")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("tensorflowonspark/__init__.py", SHIM_INIT)
    return path


def ship_to_executors(sc: Any) -> bool:
    """Make ``tensorflowonspark`` importable on ``sc``'s executors (once per SparkContext).

    Skipped when this driver has a real TensorFlowOnSpark: its executors are then
    expected to have it too, and the shim must not shadow it. Returns whether it shipped.
    """
    if real_location("tensorflowonspark") is not None:
        return False
    with _ship_lock:
        # The application id, not id(sc): a stopped context's id may be reused by the next one.
        key = str(sc.applicationId)
        if key not in _shipped:
            _shipped[key] = shim_zip()
            sc.addPyFile(_shipped[key])
    return True
