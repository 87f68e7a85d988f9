"""Running a user's Spark script the way ``spark-submit`` does: as ``__main__``.

``tfcoord submit --engine spark -- train.py ARGS`` runs ``train.py`` as the program,
with ``sys.argv`` set, so its ``if __name__ == "__main__":`` block runs: a script
written for ``spark-submit`` (it creates its SparkContext and calls ``run``/``TFCluster.run``
itself) works unchanged. A script that only defines ``main_fun(args, ctx)`` is run by
tfcoord afterwards. A failure of the script itself is shown as the user's own
traceback: the frames of their files, not tfcoord's.
"""

from __future__ import annotations

import sys
import traceback
import types
from pathlib import Path
from typing import Any


class ScriptFailed(Exception):
    """The user's script raised (or did not compile); ``traceback_text`` is its own traceback."""

    def __init__(self, script: str, traceback_text: str, exit_code: int = 1) -> None:
        super().__init__(f"{script} failed: see its traceback above; fix it and submit again")
        self.traceback_text = traceback_text
        self.exit_code = exit_code


def user_traceback(e: BaseException, script: Path) -> str:
    """``e``'s traceback from the first frame in ``script`` on: tfcoord's frames are not the user's."""
    if isinstance(e, SyntaxError):
        return "".join(traceback.format_exception_only(type(e), e))
    tb = e.__traceback__
    target = str(script)
    while tb is not None and tb.tb_frame.f_code.co_filename != target:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb or e.__traceback__))


def compile_script(path: str) -> tuple[Path, types.CodeType]:
    """Read and compile the script: a syntax error is reported before Spark starts.

    Raises:
        FileNotFoundError: no such file.
        ScriptFailed: it does not compile (the traceback names its file and line).
    """
    file = Path(path).resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no script at {path}: give the path of your training script after --")
    try:
        return file, compile(file.read_bytes(), str(file), "exec")
    except SyntaxError as e:
        raise ScriptFailed(path, user_traceback(e, file)) from None


def run_as_main(
    file: Path, code: types.CodeType, argv: list[str], passthrough: tuple[type[BaseException], ...] = ()
) -> tuple[Any, bool]:
    """Execute ``code`` as the ``__main__`` module with ``sys.argv = [file, *argv]``.

    Returns the module and whether the script ended itself with ``sys.exit(0)`` (its
    ``--help``, say): then it is done, and nothing more is run.

    The module stays importable as ``__main__`` only while it runs (tfcoord's own
    ``__main__`` comes back afterwards); functions it defines remain usable, and Spark's
    cloudpickle ships functions of a ``__main__`` module by value, so executors need
    no copy of the file.

    Raises:
        ScriptFailed: the script raised, or exited with a non-zero status.
        passthrough: errors of these types (a job that failed inside the script) as they are.
    """
    module = types.ModuleType("__main__")
    module.__file__ = str(file)
    saved_main, saved_argv = sys.modules.get("__main__"), sys.argv
    sys.modules["__main__"] = module
    sys.argv = [str(file), *argv]
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))  # as `python file` does: its neighbours import
    exited = False
    try:
        exec(code, module.__dict__)
    except SystemExit as e:
        if e.code not in (None, 0):
            status = e.code if isinstance(e.code, int) else 1
            text = "" if isinstance(e.code, int) else f"{e.code}\n"
            raise ScriptFailed(str(file), text, status) from None
        exited = True
    except passthrough:
        raise
    except Exception as e:
        raise ScriptFailed(str(file), user_traceback(e, file)) from None
    finally:
        sys.argv = saved_argv
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
    return module, exited
