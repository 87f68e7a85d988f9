"""tfcoord.aliases: `import tensorflowonspark` / `import tfmesos2` give tfcoord's modules, once.

Each case runs in a fresh interpreter: the import system's state (sys.modules,
sys.meta_path) is what is under test, and the tfcoord-aliases .pth hook must not be in
play unless the case says so (TFCOORD_ALIASES=off).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfcoord import aliases


def _python(code: str, *, hook: bool = False, path: list[str] = ()) -> str:
    env = dict(os.environ, TFCOORD_ALIASES="on" if hook else "off")
    env["PYTHONPATH"] = os.pathsep.join([*path, env.get("PYTHONPATH", "")]).strip(os.pathsep)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


real_tfos = pytest.mark.skipif(
    aliases.real_location("tensorflowonspark") is not None,
    reason="a real TensorFlowOnSpark is installed here (pip install tensorflowonspark; make bench keeps it in .venv-bench): the alias rightly steps aside",
)


@real_tfos
def test_the_alias_is_the_same_module_object_under_both_names():
    out = _python("""
        from tfcoord import aliases
        aliases.install()
        import tensorflowonspark, tfcoord.compat.tensorflowonspark as c
        from tensorflowonspark import TFCluster, TFNode, TFParallel, compat, gpu_info, util
        import tensorflowonspark.TFNode as T
        print(tensorflowonspark is c, T is c.TFNode, TFNode is c.TFNode, TFCluster is c.TFCluster)
        import tfmesos2
        print(tfmesos2.__name__)
        import tensorflowonspark.reservation as r  # stop_streaming.py's reservation.Client
        print(r.__name__)
        print(aliases.describe("tensorflowonspark"))
    """)
    lines = out.splitlines()
    assert lines[0] == "True True True True"
    assert lines[1] == "tfcoord.compat.tfmesos2"
    assert lines[2] == "tfcoord.compat.tensorflowonspark.reservation"
    assert lines[3] == "tensorflowonspark: tfcoord's alias (tfcoord.compat.tensorflowonspark)"


def test_without_the_finder_there_is_no_such_module():
    out = _python("""
        try:
            import tensorflowonspark
        except ModuleNotFoundError as e:
            print(e)
    """)
    assert out.strip() == "No module named 'tensorflowonspark'" or aliases.real_location("tensorflowonspark")


@real_tfos
def test_the_pth_hook_is_the_install_time_opt_in():
    out = _python("import tensorflowonspark; print(tensorflowonspark.__name__)", hook=True)
    assert out.strip() == "tfcoord.compat.tensorflowonspark"


def test_a_real_tensorflowonspark_is_never_shadowed(tmp_path: Path):
    real = tmp_path / "site" / "tensorflowonspark"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    (real / "reservation.py").write_text("")
    (real / "TFNode.py").write_text("WHO = 'real'\n")
    out = _python(
        """
        from tfcoord import aliases
        aliases.install()
        import tensorflowonspark, tensorflowonspark.TFNode
        print(tensorflowonspark.REAL, tensorflowonspark.TFNode.WHO)
        print(aliases.describe("tensorflowonspark"))
    """,
        path=[str(tmp_path / "site")],
    )
    first, second = out.splitlines()
    assert first == "True real"
    assert second.startswith("tensorflowonspark: the real tensorflowonspark") and "steps aside" in second


@real_tfos
def test_the_executor_shim_zip_works_without_any_install(tmp_path: Path):
    # What sc.addPyFile ships: the zip first on sys.path, no finder installed beforehand.
    zipped = aliases.shim_zip(str(tmp_path))
    out = _python(
        """
        import pickle, sys
        from tfcoord import aliases
        assert not aliases.installed()
        import tensorflowonspark.TFNode as T
        import tfcoord.compat.tensorflowonspark as c
        print(T is c.TFNode, sys.modules["tensorflowonspark"] is c, aliases.installed())
        print(aliases.real_location("tensorflowonspark"))
        print(pickle.loads(pickle.dumps(T.next_batch)) is c.TFNode.next_batch)
    """,
        path=[zipped],
    )
    assert out.splitlines() == ["True True True", "None", "True"]


@real_tfos
def test_a_deleted_shim_zip_left_on_sys_path_breaks_nothing(tmp_path: Path):
    # sc.addPyFile(shim) puts the zip on the driver's sys.path too; sc.stop() deletes the zip and
    # leaves the entry, with a zip importer that still lists tensorflowonspark/__init__.py. The
    # next SparkContext's TFCluster.run / TFParallel.run (TensorFlowOnSpark's tests start one per
    # test class) must still find out which tensorflowonspark is in use.
    zipped = aliases.shim_zip(str(tmp_path))
    out = _python(
        f"""
        import os, sys
        from tfcoord import aliases
        sys.path.insert(1, {zipped!r})
        print(aliases.real_location("tensorflowonspark"))  # the zip importer caches its listing
        os.remove({zipped!r})
        print(aliases.real_location("tensorflowonspark"))
        aliases.install()
        import tensorflowonspark
        print(tensorflowonspark.__name__)
        print(aliases.describe("tensorflowonspark"))
    """
    )
    assert out.splitlines() == [
        "None",
        "None",
        "tfcoord.compat.tensorflowonspark",
        "tensorflowonspark: tfcoord's alias (tfcoord.compat.tensorflowonspark)",
    ]
