"""Choosing the GPUs a TensorFlow node drives.

Whoever granted GPUs decides, in this order: Spark task resources
(``TaskContext.get().resources()['gpu'].addresses``, passed in by the caller so this
module never imports pyspark), then the GPUs of a Mesos offer, then ``nvidia-smi``
discovery of free GPUs, else the CPU. A GPU is free when no compute process runs on
it, enough of its memory is free, and no other node on the host has claimed it (see
:mod:`tfcoord.node.gpuclaim`: nvidia-smi sees a GPU as busy only once TensorFlow has
started on it, seconds too late for two nodes starting together); when too few are free
we retry a few times and then fail with a message naming what holds each GPU.

``CUDA_VISIBLE_DEVICES`` is always set (empty for the CPU): left unset, TensorFlow
grabs every GPU on the host, including the ones another node was given.

The parsing of ``nvidia-smi`` output is pure (:func:`parse_gpus`, :func:`parse_apps`,
:func:`free_gpus`); only ``_run`` starts a process.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfcoord.client.errors import TfcoordError

from .gpuclaim import ClaimError, GpuClaim, holder

log = logging.getLogger("tfcoord.node")

#: nvidia-smi answers in well under a second once the driver is loaded, but without
#: persistence mode it initialises every GPU first (seconds on an 8-GPU host), and on a
#: wedged driver it hangs for ever. 30 s covers the slow cold start; past that the node
#: should start (on the CPU, or fail when GPUs are required) rather than hang.
NVIDIA_SMI_TIMEOUT_S = 30.0

GPU_QUERY = ("--query-gpu=index,uuid,memory.total,memory.used,memory.free", "--format=csv,noheader,nounits")
APPS_QUERY = (
    "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
    "--format=csv,noheader,nounits",
)

#: What nvidia-smi prints for a value the GPU or driver does not report.
_NOT_AVAILABLE = frozenset({"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]"})

SOURCES = ("spark", "mesos", "nvidia-smi", "cpu")

_ADVICE = (
    "Lower num_gpus, free the GPUs held above, or use Spark GPU scheduling "
    "(spark.task.resource.gpu.amount with spark.executor.resource.gpu.amount and a GPU discovery "
    "script) so Spark gives each task its own GPUs."
)


class GpuUnavailable(TfcoordError):
    """The GPUs asked for cannot be had: too few free, nvidia-smi missing while GPUs are
    required, or nvidia-smi output that cannot be read. The message says what to do."""


@dataclass(frozen=True)
class GpuSelection:
    """The GPUs a node uses.

    Attributes:
        ids: what goes into ``CUDA_VISIBLE_DEVICES`` (indices, or whatever Spark/Mesos gave).
        uuids: one per id, for the coordinator's check that no two nodes on a host claim
            the same GPU; the id itself when nvidia-smi could not map it to a UUID.
        source: who chose: ``"spark"``, ``"mesos"``, ``"nvidia-smi"`` or ``"cpu"``.
    """

    ids: tuple[str, ...]
    uuids: tuple[str, ...]
    source: str
    #: The host-local claim on the GPUs (nvidia-smi discovery with a lock directory).
    claim: GpuClaim | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"GpuSelection.source must be one of {SOURCES}, got {self.source!r}")
        if not isinstance(self.ids, tuple) or not all(isinstance(i, str) and i for i in self.ids):
            raise ValueError(f"GpuSelection.ids must be a tuple of non-empty str, got {self.ids!r}")
        if not isinstance(self.uuids, tuple) or len(self.uuids) != len(self.ids):
            raise ValueError(
                f"GpuSelection.uuids must be a tuple matching ids {self.ids!r}, got {self.uuids!r}"
            )
        if any("," in i for i in self.ids):
            raise ValueError(f"GpuSelection.ids must not contain ',': {self.ids!r}")
        if (self.source == "cpu") != (not self.ids):
            raise ValueError(f"GpuSelection: source {self.source!r} does not fit ids {self.ids!r}")

    def env(self) -> dict[str, str]:
        """``{"CUDA_VISIBLE_DEVICES": ...}``, set even for the CPU (to ``""``)."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.ids)}

    def release(self) -> None:
        """Free the host-local claim, if any (the node is done with its GPUs)."""
        if self.claim is not None:
            self.claim.release()


CPU = GpuSelection((), (), "cpu")


@dataclass(frozen=True)
class GpuInfo:
    """One line of ``nvidia-smi --query-gpu``; memory in MiB, None where not reported."""

    index: int
    uuid: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    memory_free_mib: int | None

    @property
    def free_fraction(self) -> float | None:
        """Free memory over total, or None when nvidia-smi does not report enough to tell."""
        total = self.memory_total_mib
        if not total:
            return None
        free = self.memory_free_mib
        if free is None and self.memory_used_mib is not None:
            free = total - self.memory_used_mib
        return None if free is None else free / total


@dataclass(frozen=True)
class ComputeApp:
    """One line of ``nvidia-smi --query-compute-apps``; pid and memory are None where hidden
    (in a container without the host's PID namespace, for instance)."""

    gpu_uuid: str
    pid: int | None
    process_name: str
    used_memory_mib: int | None


class _NvidiaSmiUnusable(Exception):
    """nvidia-smi is missing, failed or timed out: no GPUs as far as we can tell."""

    def __init__(self, why: str, *, missing: bool = False) -> None:
        super().__init__(why)
        #: There is no nvidia-smi at all: a host without the NVIDIA driver, so without GPUs.
        self.missing = missing


# -- parsing (pure) -----------------------------------------------------------------------------


def _value(field: str) -> str | None:
    field = field.strip()
    return None if field.lower() in _NOT_AVAILABLE else field


def _int(field: str, what: str, line: str, query: str) -> int | None:
    v = _value(field)
    if v is None:
        return None
    try:
        return int(float(v)) if "." in v else int(v)
    except ValueError:
        raise _unparseable(query, line, f"{what} {v!r} is not a number") from None


def _unparseable(query: str, line: str, why: str) -> GpuUnavailable:
    return GpuUnavailable(
        f"cannot read the output of nvidia-smi {query}: {why} in line {line!r}. "
        "Is this nvidia-smi too old or a wrapper printing something else? Pass "
        "nvidia_smi= the real binary, or give GPUs through Spark resources or Mesos."
    )


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def parse_gpus(text: str) -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,memory.total,memory.used,memory.free
    --format=csv,noheader,nounits``. Raises :class:`GpuUnavailable` on a malformed line."""
    out = []
    for line in _lines(text):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            raise _unparseable("--query-gpu", line, f"expected 5 fields, got {len(fields)}")
        index = _int(fields[0], "index", line, "--query-gpu")
        uuid = _value(fields[1])
        if index is None or index < 0:
            raise _unparseable("--query-gpu", line, "no GPU index")
        if not uuid:
            raise _unparseable("--query-gpu", line, "no GPU UUID")
        total, used, free = (_int(f, "memory", line, "--query-gpu") for f in fields[2:])
        out.append(GpuInfo(index, uuid, total, used, free))
    return sorted(out, key=lambda g: g.index)


def parse_apps(text: str) -> list[ComputeApp]:
    """Parse ``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
    --format=csv,noheader,nounits``; empty output (no process) gives ``[]``."""
    out = []
    for line in _lines(text):
        if line.lower().startswith("no running"):  # some versions say so instead of printing nothing
            continue
        fields = line.split(",")
        if len(fields) < 4:
            raise _unparseable("--query-compute-apps", line, f"expected 4 fields, got {len(fields)}")
        uuid = _value(fields[0])
        if not uuid:
            raise _unparseable("--query-compute-apps", line, "no GPU UUID")
        pid = _int(fields[1], "pid", line, "--query-compute-apps")
        used = _int(fields[-1], "used_memory", line, "--query-compute-apps")
        name = ",".join(fields[2:-1]).strip()  # a process path may itself hold commas
        out.append(ComputeApp(uuid, pid, _value(name) or "?", used))
    return out


def is_free(gpu: GpuInfo, apps: Sequence[ComputeApp], free_memory_fraction: float) -> bool:
    """No compute process on ``gpu`` and at least ``free_memory_fraction`` of its memory free.

    When nvidia-smi does not report the memory (``[N/A]``), only the processes decide.
    """
    if any(a.gpu_uuid == gpu.uuid for a in apps):
        return False
    frac = gpu.free_fraction
    return frac is None or frac >= free_memory_fraction


def free_gpus(
    gpus: Sequence[GpuInfo], apps: Sequence[ComputeApp], free_memory_fraction: float
) -> list[GpuInfo]:
    """The free GPUs, lowest index first."""
    return sorted((g for g in gpus if is_free(g, apps, free_memory_fraction)), key=lambda g: g.index)


def describe(
    gpus: Sequence[GpuInfo],
    apps: Sequence[ComputeApp],
    free_memory_fraction: float,
    claimed: Mapping[str, str] | None = None,
) -> str:
    """One line per GPU saying whether it is free and, if not, what holds it.

    ``claimed`` maps the UUIDs another node on this host has claimed to what its lock
    file says about that node.
    """
    claimed = claimed or {}
    lines = []
    for g in gpus:
        mem = f"{_mib(g.memory_used_mib)}/{_mib(g.memory_total_mib)} MiB used"
        frac = g.free_fraction
        if frac is not None:
            mem += f", {frac:.0%} free"
        held = [
            f"pid {a.pid if a.pid is not None else '?'} {a.process_name} ({_mib(a.used_memory_mib)} MiB)"
            for a in apps
            if a.gpu_uuid == g.uuid
        ]
        if held:
            state = "held by " + ", ".join(held)
        elif g.uuid in claimed:
            state = f"claimed by another tfcoord node on this host ({claimed[g.uuid]})"
        elif is_free(g, apps, free_memory_fraction):
            state = "free"
        else:
            state = f"memory in use by no listed process (needs {free_memory_fraction:.0%} free)"
        lines.append(f"  GPU {g.index} ({g.uuid}): {state}; {mem}")
    return "\n".join(lines)


def _mib(v: int | None) -> str:
    return "?" if v is None else str(v)


# -- running nvidia-smi ------------------------------------------------------------------------


def _run(nvidia_smi: str, args: Sequence[str]) -> str:
    import subprocess  # only where GPUs are looked for: a CPU node never runs nvidia-smi

    cmd = [nvidia_smi, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except FileNotFoundError:
        where = "does not exist" if os.sep in nvidia_smi else "was not found on PATH"
        raise _NvidiaSmiUnusable(f"{nvidia_smi!r} {where}", missing=True) from None
    except subprocess.TimeoutExpired:
        raise _NvidiaSmiUnusable(
            f"{' '.join(cmd)} did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s (hung driver?)"
        ) from None
    except OSError as e:
        raise _NvidiaSmiUnusable(f"cannot run {nvidia_smi!r}: {e}") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise _NvidiaSmiUnusable(
            f"{' '.join(cmd)} exited with {proc.returncode}" + (f": {why[0]}" if why else "")
        )
    return proc.stdout


def _query(nvidia_smi: str) -> tuple[list[GpuInfo], list[ComputeApp]]:
    """The host's GPUs and the compute processes on them; raises GpuUnavailable on output
    it cannot parse, _NvidiaSmiUnusable when nvidia-smi is missing, fails or times out."""
    gpus = parse_gpus(_run(nvidia_smi, GPU_QUERY))
    apps = parse_apps(_run(nvidia_smi, APPS_QUERY)) if gpus else []
    return gpus, apps


def host_gpus(nvidia_smi: str = "nvidia-smi") -> list[GpuInfo]:
    """Every GPU ``nvidia-smi`` lists; none when it is missing, fails or prints nonsense."""
    try:
        return parse_gpus(_run(nvidia_smi, GPU_QUERY))
    except (_NvidiaSmiUnusable, GpuUnavailable):
        return []


# -- selection ---------------------------------------------------------------------------------


def _spark_ids(spark_resources: Mapping[str, Any] | None) -> tuple[str, ...]:
    if not spark_resources or "gpu" not in spark_resources:
        return ()
    res = spark_resources["gpu"]
    addresses = getattr(res, "addresses", None)
    if addresses is None:
        raise TypeError(f"spark_resources['gpu'] must have .addresses (a ResourceInformation), got {res!r}")
    return tuple(str(a).strip() for a in addresses if str(a).strip())


def _uuids_for(ids: Sequence[str], nvidia_smi: str) -> tuple[str, ...]:
    """Map ids given by Spark or Mesos (indices or UUIDs) to UUIDs; an id nvidia-smi does
    not know (or no nvidia-smi at all) stands for itself."""
    try:
        gpus = parse_gpus(_run(nvidia_smi, GPU_QUERY))
    except (_NvidiaSmiUnusable, GpuUnavailable) as e:
        log.debug("cannot map GPU ids %s to UUIDs: %s", ids, e)
        return tuple(ids)
    by_index = {str(g.index): g.uuid for g in gpus}
    known = {g.uuid for g in gpus}
    return tuple(i if i in known else by_index.get(i, i) for i in ids)


def select_gpus(
    num_gpus: int = 0,
    *,
    spark_resources: Mapping[str, Any] | None = None,
    mesos_gpus: Sequence[str | int] | None = None,
    nvidia_smi: str = "nvidia-smi",
    free_memory_fraction: float = 0.9,
    attempts: int = 3,
    delay_s: float = 5.0,
    sleep: Callable[[float], object] = time.sleep,
    require: bool = False,
    lock_dir: str | None = None,
    holder_name: str = "",
) -> GpuSelection:
    """Choose the GPUs for this node.

    Args:
        num_gpus: GPUs wanted from nvidia-smi discovery; 0 means the CPU unless Spark or
            Mesos granted GPUs (a grant is used whole, whatever ``num_gpus`` says, as
            TensorFlowOnSpark does).
        spark_resources: ``TaskContext.get().resources()``; its ``'gpu'`` addresses win.
        mesos_gpus: the GPU ids a Mesos offer granted; used when Spark gave none.
        nvidia_smi: the nvidia-smi executable (looked up on PATH).
        free_memory_fraction: a GPU with a smaller share of its memory free is busy.
        attempts: how often to look for enough free GPUs.
        delay_s: the wait between two looks.
        sleep: the wait function (tests pass a recorder).
        require: with ``num_gpus > 0``, fail instead of falling back to the CPU when
            nvidia-smi is missing, fails or lists no GPU.
        lock_dir: claim discovered GPUs in this directory (:mod:`tfcoord.node.gpuclaim`,
            usually ``gpuclaim.lock_dir()``), skipping those another live process claimed;
            None claims nothing. GPUs that Spark or Mesos granted are claimed too where
            free, so discovery elsewhere on the host skips them, but used either way:
            the grant is exclusive.
        holder_name: who claims, written into the lock file for other nodes' errors.

    Returns:
        A :class:`GpuSelection`; its ``env()`` sets ``CUDA_VISIBLE_DEVICES``. Hold it
        for the node's whole life and call ``release()`` at the end (or just exit).

    Raises:
        GpuUnavailable: too few free GPUs after every attempt; nvidia-smi unusable while
            GPUs are required; output of nvidia-smi that cannot be parsed.
    """
    if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus < 0:
        raise ValueError(f"num_gpus must be an int >= 0, got {num_gpus!r}")
    if not 0.0 <= free_memory_fraction <= 1.0:
        raise ValueError(f"free_memory_fraction must be within [0, 1], got {free_memory_fraction!r}")
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts!r}")
    if delay_s < 0:
        raise ValueError(f"delay_s must be >= 0, got {delay_s!r}")

    ids = _spark_ids(spark_resources)
    if ids:
        return _granted(ids, _uuids_for(ids, nvidia_smi), "spark", lock_dir, holder_name)
    ids = tuple(str(g).strip() for g in mesos_gpus or () if str(g).strip())
    if ids:
        return _granted(ids, _uuids_for(ids, nvidia_smi), "mesos", lock_dir, holder_name)
    if num_gpus == 0:
        return CPU

    claim = GpuClaim(lock_dir) if lock_dir is not None else None
    claimed: dict[str, str] = {}
    for attempt in range(1, attempts + 1):
        try:
            gpus, apps = _query(nvidia_smi)
        except _NvidiaSmiUnusable as e:
            return _no_nvidia_smi(num_gpus, require, str(e), missing=e.missing)
        if not gpus:
            return _no_nvidia_smi(num_gpus, require, f"{nvidia_smi} lists no GPU")
        if len(gpus) < num_gpus:  # waiting cannot help
            raise GpuUnavailable(
                f"{num_gpus} GPU(s) wanted but this host has {len(gpus)}:\n"
                f"{describe(gpus, apps, free_memory_fraction)}\n{_ADVICE}"
            )
        free = free_gpus(gpus, apps, free_memory_fraction)
        chosen, claimed = _claim_some(free, num_gpus, claim, holder_name)
        if len(chosen) >= num_gpus:
            return GpuSelection(
                tuple(str(g.index) for g in chosen), tuple(g.uuid for g in chosen), "nvidia-smi", claim
            )
        if attempt < attempts:
            log.info(
                "%d of %d GPU(s) free (attempt %d/%d); retrying in %g s",
                len(chosen),
                num_gpus,
                attempt,
                attempts,
                delay_s,
            )
            sleep(delay_s)
    raise GpuUnavailable(
        f"{num_gpus} free GPU(s) wanted, {len(chosen)} found after {attempts} attempt(s) {delay_s:g} s apart "
        f"(free: no compute process, at least {free_memory_fraction:.0%} of memory free, not claimed by "
        f"another node on this host):\n{describe(gpus, apps, free_memory_fraction, claimed)}\n{_ADVICE}"
    )


def _claim_some(
    free: Sequence[GpuInfo], num_gpus: int, claim: GpuClaim | None, holder_name: str
) -> tuple[list[GpuInfo], dict[str, str]]:
    """Claim up to ``num_gpus`` of ``free``, lowest index first; all or nothing.

    Returns the GPUs claimed (``num_gpus`` of them, or none) and, for the error message,
    the free GPUs another process holds with what their lock files say.
    """
    if claim is None:
        return list(free[:num_gpus]), {}
    chosen: list[GpuInfo] = []
    claimed: dict[str, str] = {}
    try:
        for g in free:
            if len(chosen) == num_gpus:
                break
            if claim.try_claim(g.uuid, holder_name):
                chosen.append(g)
            else:
                claimed[g.uuid] = holder(claim.directory, g.uuid)
    except ClaimError as e:
        claim.release()
        raise GpuUnavailable(str(e)) from None
    if len(chosen) < num_gpus:  # do not sit on some while waiting for the rest
        claim.release()
        return [], claimed
    return chosen, claimed


def _granted(
    ids: tuple[str, ...], uuids: tuple[str, ...], source: str, lock_dir: str | None, holder_name: str
) -> GpuSelection:
    """GPUs a scheduler granted: used whatever happens, claimed where we can (see select_gpus)."""
    claim = None
    if lock_dir is not None:
        claim = GpuClaim(lock_dir)
        try:
            for uuid in uuids:
                if not claim.try_claim(uuid, holder_name):
                    log.warning(
                        "GPU %s, granted by %s, is claimed by another process on this host (%s); "
                        "using it anyway",
                        uuid,
                        source,
                        holder(lock_dir, uuid),
                    )
        except ClaimError as e:
            log.warning("cannot claim the GPUs %s granted: %s", source, e)
    return GpuSelection(ids, uuids, source, claim)


def _no_nvidia_smi(num_gpus: int, require: bool, why: str, *, missing: bool = False) -> GpuSelection:
    if require:
        raise GpuUnavailable(
            f"{num_gpus} GPU(s) required but none can be found: {why}. Install the NVIDIA driver "
            "(nvidia-smi comes with it) or pass nvidia_smi= its path, give GPUs through Spark "
            "resources (spark.task.resource.gpu.amount) or a Mesos offer, or run on the CPU "
            "(num_gpus=0 or require=False)."
        )
    # No nvidia-smi at all is a host without the NVIDIA driver: the CPU is what a GPU wanted
    # only where one exists means there (TensorFlowOnSpark's "one GPU if any exist", every
    # node of every CPU cluster), not worth a warning. One that fails or lists none is.
    level = logging.DEBUG if missing else logging.WARNING
    log.log(level, "%d GPU(s) wanted but %s; running on the CPU", num_gpus, why)
    return CPU
