"""The executor side of ``parallel()``: one independent single-node TensorFlow job per Spark task.

The driver (:func:`tfcoord.driver.spark.parallel`) pickles :class:`ParallelTask` into its
Spark job; each task claims its GPUs, runs ``map_fun(tf_args, ctx)`` with no cluster to
join, and says which task failed, where, with the traceback, when it raises.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tfcoord.client import TfcoordError

from .context import TFNodeContext
from .executor import requested_gpus


class ParallelTaskFailed(TfcoordError):
    """A ``map_fun`` under ``parallel()`` raised; the message names the task, its host and
    Spark task, and carries the traceback."""


def single_context(executor_id: int, num_workers: int, default_fs: str, working_dir: str) -> TFNodeContext:
    """The context of an independent task: a worker 0 with no cluster spec."""
    return TFNodeContext(
        executor_id=executor_id,
        job_name="worker",
        task_index=0,
        cluster_spec={},
        num_workers=num_workers,
        defaultFS=default_fs,
        working_dir=working_dir,
    )


@dataclass(frozen=True)
class ParallelTask:
    """What each Spark task of ``parallel()`` runs (called with its partition: one executor id)."""

    map_fun: Callable[[Any, TFNodeContext], Any]
    tf_args: Any
    num_executors: int
    default_fs: str
    working_dir: str
    #: Run in the task's process before map_fun (``run(..., executor_setup=...)``).
    setup: Callable[[], None] | None = None

    def __call__(self, partition: Iterable[int]) -> list[int]:
        from pyspark import TaskContext

        from .gpuclaim import lock_dir
        from .gpus import select_gpus

        (executor_id,) = list(partition)
        tc = TaskContext.get()
        where = f"host {socket.gethostname()}" + (
            f", stage {tc.stageId()} partition {tc.partitionId()} TID {tc.taskAttemptId()} "
            f"attempt {tc.attemptNumber()}"
            if tc
            else ""
        )
        num_gpus, required = requested_gpus(self.tf_args)
        # Claimed while map_fun runs, so two tasks on one host never share a GPU.
        gpus = select_gpus(
            num_gpus,
            spark_resources=tc.resources() if tc else None,
            require=required,
            lock_dir=lock_dir(),
            holder_name=f"parallel task {executor_id}",
        )
        try:
            os.environ.update(gpus.env())
            os.environ.pop("TF_CONFIG", None)  # independent: no cluster to join
            if self.setup is not None:
                self.setup()
            ctx = single_context(executor_id, self.num_executors, self.default_fs, self.working_dir)
            self.map_fun(self.tf_args, ctx)
        except Exception:
            raise ParallelTaskFailed(
                f"parallel task {executor_id} of {self.num_executors} ({where}) failed:\n"
                f"{traceback.format_exc()}"
            ) from None
        finally:
            gpus.release()  # the Python worker may be reused for another task
        return [executor_id]
