"""TensorFlowOnSpark's ``gpu_info``: free GPUs by ``nvidia-smi``, on tfcoord's selection.

``get_gpus`` keeps its signature and return shapes, and adds what TensorFlowOnSpark's
lacked: the GPUs it returns are claimed host-locally (see :mod:`tfcoord.node.gpuclaim`)
for as long as this process lives, so two processes on one host calling it never get
the same GPU, and running out ends in an error that lists what holds each GPU.
"""

from __future__ import annotations

from tfcoord.node import gpuclaim
from tfcoord.node.gpus import GpuSelection, host_gpus, select_gpus

AS_STRING = "string"
AS_LIST = "list"

#: The claims this process holds: the kernel drops them when it exits.
_held: list[GpuSelection] = []


def is_gpu_available(nvidia_smi: str = "nvidia-smi") -> bool:
    """Whether ``nvidia-smi`` runs and lists at least one GPU."""
    return bool(host_gpus(nvidia_smi))


def get_gpus(
    num_gpu: int = 1,
    worker_index: int = -1,
    format: str = AS_STRING,
    *,
    nvidia_smi: str = "nvidia-smi",
    attempts: int = 3,
    delay_s: float = 5.0,
) -> str | list[str]:
    """``num_gpu`` free GPUs of this host, claimed for this process.

    Args:
        num_gpu: how many.
        worker_index: TensorFlowOnSpark spread workers over GPUs by this index; the
            host-local claims make that unnecessary, so it only names the claimant.
        format: ``AS_STRING`` (``"0,1"``, for ``CUDA_VISIBLE_DEVICES``) or ``AS_LIST``.
        nvidia_smi: the nvidia-smi executable (looked up on PATH).
        attempts: how often to look for enough free GPUs.
        delay_s: the wait between two looks.

    Raises:
        tfcoord.node.gpus.GpuUnavailable: too few free GPUs (the message says what holds each).
        ValueError: an unknown ``format``.
    """
    if format not in (AS_STRING, AS_LIST):
        raise ValueError(f"format must be gpu_info.AS_STRING or gpu_info.AS_LIST, not {format!r}")
    who = f"gpu_info.get_gpus (worker {worker_index})" if worker_index >= 0 else "gpu_info.get_gpus"
    selection = select_gpus(
        num_gpu,
        nvidia_smi=nvidia_smi,
        require=True,
        lock_dir=gpuclaim.lock_dir(),
        holder_name=who,
        attempts=attempts,
        delay_s=delay_s,
    )
    _held.append(selection)
    ids = list(selection.ids)
    return ",".join(ids) if format == AS_STRING else ids
