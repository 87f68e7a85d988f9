"""GPU selection: Spark resources, then Mesos, then nvidia-smi, else the CPU.

nvidia-smi is a fake: a small Python script named ``nvidia-smi`` that prints the CSV
files lying next to it (``gpus.csv`` / ``apps.csv``, or ``gpus.N.csv`` / ``apps.N.csv``
for its N-th call, counted per query), logs its arguments, and fails when an ``exit``
file is there. It runs with ``python -S``: skipping site-packages makes each call ~15 ms
instead of ~250 ms. Waits between attempts go to a recording ``sleep``: nothing here sleeps.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tfcoord.client.errors import TfcoordError
from tfcoord.node import gpus
from tfcoord.node.gpus import (
    APPS_QUERY,
    CPU,
    GPU_QUERY,
    ComputeApp,
    GpuInfo,
    GpuSelection,
    GpuUnavailable,
    parse_apps,
    parse_gpus,
    select_gpus,
)

FAKE_NVIDIA_SMI = """\
#!{python} -S
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
kind = "apps" if any(a.startswith("--query-compute-apps") for a in args) else "gpus"
with open(os.path.join(here, "calls.log"), "a") as f:
    f.write(" ".join(args) + "\\n")
counter = os.path.join(here, kind + ".count")
n = int(open(counter).read()) if os.path.exists(counter) else 0
with open(counter, "w") as f:
    f.write(str(n + 1))
if os.path.exists(os.path.join(here, "exit")):
    sys.stderr.write(open(os.path.join(here, "exit")).read())
    sys.exit(9)
for name in (kind + "." + str(n) + ".csv", kind + ".csv"):
    if os.path.exists(os.path.join(here, name)):
        sys.stdout.write(open(os.path.join(here, name)).read())
        break
"""

# index, uuid, memory.total, memory.used, memory.free (MiB), as nvidia-smi prints them.
FOUR_FREE = """\
0, GPU-aaaa, 81559, 0, 81559
1, GPU-bbbb, 81559, 0, 81559
2, GPU-cccc, 81559, 0, 81559
3, GPU-dddd, 81559, 0, 81559
"""
UUIDS = {"0": "GPU-aaaa", "1": "GPU-bbbb", "2": "GPU-cccc", "3": "GPU-dddd"}


class FakeSmi:
    """A fake ``nvidia-smi`` in its own folder; ``path`` is what to pass as ``nvidia_smi``."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "bin"
        self.dir.mkdir()
        self.path = str(self.dir / "nvidia-smi")
        Path(self.path).write_text(FAKE_NVIDIA_SMI.format(python=sys.executable))
        os.chmod(self.path, 0o755)

    def set(self, gpus: str | None = None, apps: str | None = None, *, call: int | None = None) -> FakeSmi:
        """Output for every call, or only for the ``call``-th (0-based) of each query."""
        suffix = "" if call is None else f".{call}"
        if gpus is not None:
            (self.dir / f"gpus{suffix}.csv").write_text(gpus)
        if apps is not None:
            (self.dir / f"apps{suffix}.csv").write_text(apps)
        return self

    def fail(self, stderr: str) -> None:
        (self.dir / "exit").write_text(stderr)

    def calls(self) -> list[str]:
        log = self.dir / "calls.log"
        return log.read_text().splitlines() if log.exists() else []


@dataclass
class Res:
    """What ``TaskContext.resources()`` maps names to (pyspark's ResourceInformation)."""

    name: str
    addresses: list[str]


class Sleeps(list):
    def __call__(self, s: float) -> None:
        self.append(s)


@pytest.fixture
def smi(tmp_path: Path) -> FakeSmi:
    return FakeSmi(tmp_path)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def missing(tmp_path: Path) -> str:
    return str(tmp_path / "nowhere" / "nvidia-smi")


# -- who decides --------------------------------------------------------------------------------


def test_spark_resources_win_over_mesos_and_nvidia_smi(smi: FakeSmi) -> None:
    smi.set(FOUR_FREE, "")
    sel = select_gpus(
        1, spark_resources={"gpu": Res("gpu", ["3", "1"])}, mesos_gpus=["0"], nvidia_smi=smi.path
    )
    assert sel == GpuSelection(("3", "1"), ("GPU-dddd", "GPU-bbbb"), "spark")
    assert sel.env() == {"CUDA_VISIBLE_DEVICES": "3,1"}
    # Only the UUID lookup ran; the free-GPU search did not.
    assert smi.calls() == [" ".join(GPU_QUERY)]


def test_spark_ids_stand_for_themselves_without_nvidia_smi(missing: str) -> None:
    sel = select_gpus(spark_resources={"gpu": Res("gpu", ["0", "1"])}, nvidia_smi=missing)
    assert sel == GpuSelection(("0", "1"), ("0", "1"), "spark")


@pytest.mark.parametrize("resources", [None, {}, {"fpga": Res("fpga", ["0"])}, {"gpu": Res("gpu", [])}])
def test_spark_without_gpus_falls_through_to_mesos(resources, missing: str) -> None:
    sel = select_gpus(spark_resources=resources, mesos_gpus=[2, "3"], nvidia_smi=missing)
    assert sel == GpuSelection(("2", "3"), ("2", "3"), "mesos")


def test_spark_resource_without_addresses_is_a_type_error(missing: str) -> None:
    with pytest.raises(TypeError, match="addresses"):
        select_gpus(spark_resources={"gpu": object()}, nvidia_smi=missing)


def test_mesos_ids_are_mapped_to_uuids_where_nvidia_smi_knows_them(smi: FakeSmi) -> None:
    smi.set(FOUR_FREE, "")
    # An index maps to its UUID, a UUID stays, an id nvidia-smi does not know stands for itself.
    sel = select_gpus(2, mesos_gpus=["2", "GPU-aaaa", "7"], nvidia_smi=smi.path)
    assert sel == GpuSelection(("2", "GPU-aaaa", "7"), ("GPU-cccc", "GPU-aaaa", "7"), "mesos")


def test_no_gpus_wanted_is_cpu_without_running_nvidia_smi(smi: FakeSmi) -> None:
    smi.set(FOUR_FREE, "")
    assert select_gpus(0, nvidia_smi=smi.path) is CPU
    assert select_gpus(nvidia_smi=smi.path, mesos_gpus=[], spark_resources={}) is CPU
    assert smi.calls() == []


# -- nvidia-smi discovery -----------------------------------------------------------------------


def test_nvidia_smi_picks_free_gpus_lowest_index_first(smi: FakeSmi) -> None:
    smi.set("3, GPU-dddd, 100, 0, 100\n1, GPU-bbbb, 100, 0, 100\n2, GPU-cccc, 100, 0, 100\n", "")
    sel = select_gpus(2, nvidia_smi=smi.path)
    assert sel == GpuSelection(("1", "2"), ("GPU-bbbb", "GPU-cccc"), "nvidia-smi")
    assert smi.calls() == [" ".join(GPU_QUERY), " ".join(APPS_QUERY)]


def test_gpu_held_by_a_compute_app_is_skipped(smi: FakeSmi) -> None:
    # Little memory used, but a process runs there: still not ours.
    smi.set(FOUR_FREE, "GPU-aaaa, 4242, python3, 300\nGPU-cccc, 77, /usr/bin/train, 10\n")
    sel = select_gpus(2, nvidia_smi=smi.path)
    assert sel.ids == ("1", "3")
    assert sel.uuids == ("GPU-bbbb", "GPU-dddd")


def test_gpu_with_low_free_memory_is_skipped(smi: FakeSmi) -> None:
    smi.set("0, GPU-aaaa, 1000, 200, 800\n1, GPU-bbbb, 1000, 50, 950\n", "")
    assert select_gpus(1, nvidia_smi=smi.path).ids == ("1",)
    # The threshold is a parameter: at 80 % GPU 0 is free enough.
    assert select_gpus(1, nvidia_smi=smi.path, free_memory_fraction=0.8).ids == ("0",)


def test_memory_not_reported_leaves_the_decision_to_processes(smi: FakeSmi) -> None:
    smi.set(
        "0, GPU-aaaa, [N/A], [N/A], [N/A]\n1, GPU-bbbb, [N/A], [N/A], [N/A]\n", "GPU-aaaa, 9, python, [N/A]\n"
    )
    assert select_gpus(1, nvidia_smi=smi.path).ids == ("1",)


def test_retries_until_a_gpu_frees_up(smi: FakeSmi, sleeps: Sleeps) -> None:
    smi.set("0, GPU-aaaa, 1000, 0, 1000\n", "")
    smi.set(apps="GPU-aaaa, 11, python, 900\n", call=0)
    smi.set(apps="GPU-aaaa, 11, python, 100\n", call=1)
    sel = select_gpus(1, nvidia_smi=smi.path, attempts=5, delay_s=7.5, sleep=sleeps)
    assert sel == GpuSelection(("0",), ("GPU-aaaa",), "nvidia-smi")
    assert sleeps == [7.5, 7.5]
    assert len(smi.calls()) == 6


def test_not_enough_free_gpus_lists_what_holds_each(smi: FakeSmi, sleeps: Sleeps) -> None:
    smi.set(
        "0, GPU-aaaa, 81559, 2100, 79459\n1, GPU-bbbb, 81559, 40000, 41559\n2, GPU-cccc, 81559, 0, 81559\n",
        "GPU-aaaa, 4242, python3, 2000\nGPU-aaaa, 4243, /opt/conda/bin/python, 100\n",
    )
    with pytest.raises(GpuUnavailable) as err:
        select_gpus(2, nvidia_smi=smi.path, attempts=3, delay_s=2.0, sleep=sleeps)
    assert sleeps == [2.0, 2.0]
    assert isinstance(err.value, TfcoordError)
    msg = str(err.value)
    assert "2 free GPU(s) wanted, 1 found after 3 attempt(s)" in msg
    assert (
        "GPU 0 (GPU-aaaa): held by pid 4242 python3 (2000 MiB), pid 4243 /opt/conda/bin/python (100 MiB)"
        in msg
    )
    assert (
        "GPU 1 (GPU-bbbb): memory in use by no listed process (needs 90% free); 40000/81559 MiB used" in msg
    )
    assert "GPU 2 (GPU-cccc): free" in msg
    assert "Lower num_gpus" in msg and "spark.task.resource.gpu.amount" in msg


# -- host-local claims (two nodes on one host) --------------------------------------------------

#: Selects one GPU in its own process, prints the ids, and holds the claim until stdin closes.
HOLDER = """\
import sys
from tfcoord.node.gpus import select_gpus
sel = select_gpus(1, nvidia_smi=sys.argv[1], lock_dir=sys.argv[2], holder_name="job j worker:0", attempts=1)
print(",".join(sel.ids), flush=True)
sys.stdin.read()
"""


def _holder(smi: FakeSmi, lock_dir: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, smi.path, str(lock_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()  # the line comes once the claim is held


def test_two_processes_on_one_host_get_different_gpus(smi: FakeSmi, tmp_path: Path, sleeps: Sleeps) -> None:
    # nvidia-smi shows both GPUs free to both nodes: nothing runs on them yet.
    smi.set("0, GPU-aaaa, 16000, 0, 16000\n1, GPU-bbbb, 16000, 0, 16000\n", "")
    locks = tmp_path / "locks"
    proc, first = _holder(smi, locks)
    try:
        assert first == "0"
        mine = select_gpus(1, nvidia_smi=smi.path, lock_dir=str(locks), holder_name="job j worker:1")
        assert (mine.ids, mine.uuids) == (("1",), ("GPU-bbbb",))
        with pytest.raises(GpuUnavailable) as err:  # a third node on the host finds none left
            select_gpus(1, nvidia_smi=smi.path, lock_dir=str(locks), attempts=2, delay_s=1.0, sleep=sleeps)
        assert sleeps == [1.0]
        msg = str(err.value)
        assert "1 free GPU(s) wanted, 0 found after 2 attempt(s)" in msg
        assert (
            f"GPU 0 (GPU-aaaa): claimed by another tfcoord node on this host (pid {proc.pid} job j worker:0)"
            in msg
        )
        assert (
            f"GPU 1 (GPU-bbbb): claimed by another tfcoord node on this host (pid {os.getpid()} job j worker:1)"
            in msg
        )
    finally:
        proc.kill()  # SIGKILL: no clean-up code runs; the kernel drops the lock
        proc.wait()
        proc.stdin.close()  # type: ignore[union-attr]
        proc.stdout.close()  # type: ignore[union-attr]
    again = select_gpus(1, nvidia_smi=smi.path, lock_dir=str(locks))
    assert again.ids == ("0",)  # the dead process's claim is free again
    mine.release()
    assert select_gpus(1, nvidia_smi=smi.path, lock_dir=str(locks)).ids == ("1",)  # released, free again
    again.release()


def test_a_forked_child_keeps_the_claim_until_it_exits(smi: FakeSmi, tmp_path: Path) -> None:
    """The node's map_fun is forked from the supervisor: while it lives, its GPU stays claimed."""
    smi.set("0, GPU-aaaa, 16000, 0, 16000\n", "")
    locks = str(tmp_path / "locks")
    sel = select_gpus(1, nvidia_smi=smi.path, lock_dir=locks)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child holds the inherited descriptor until the parent closes the pipe
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        sel.release()  # the supervisor lets go; the child still runs on the GPU
        with pytest.raises(GpuUnavailable, match="claimed by another tfcoord node"):
            select_gpus(1, nvidia_smi=smi.path, lock_dir=locks, attempts=1)
    finally:
        os.close(w)
        os.waitpid(pid, 0)
    assert select_gpus(1, nvidia_smi=smi.path, lock_dir=locks, attempts=1).ids == ("0",)


def test_claims_skip_busy_gpus_and_need_all_or_nothing(smi: FakeSmi, tmp_path: Path, sleeps: Sleeps) -> None:
    smi.set(FOUR_FREE, "GPU-aaaa, 4242, python, 100\n")
    locks = str(tmp_path / "locks")
    one = select_gpus(2, nvidia_smi=smi.path, lock_dir=locks)
    assert one.ids == ("1", "2")
    with pytest.raises(GpuUnavailable, match="2 free GPU"):
        select_gpus(2, nvidia_smi=smi.path, lock_dir=locks, attempts=1)
    # the failed attempt did not keep GPU 3 claimed
    assert select_gpus(1, nvidia_smi=smi.path, lock_dir=locks).ids == ("3",)


def test_granted_gpus_are_used_even_when_claimed_elsewhere(smi: FakeSmi, tmp_path: Path) -> None:
    smi.set(FOUR_FREE, "")
    locks = str(tmp_path / "locks")
    found = select_gpus(1, nvidia_smi=smi.path, lock_dir=locks)
    assert found.ids == ("0",)
    spark = select_gpus(spark_resources={"gpu": Res("gpu", ["0", "1"])}, nvidia_smi=smi.path, lock_dir=locks)
    assert spark.ids == ("0", "1") and spark.source == "spark"  # Spark's grant is exclusive: it wins
    # ... and what it could claim, discovery skips
    assert select_gpus(1, nvidia_smi=smi.path, lock_dir=locks).ids == ("2",)


def test_an_unusable_lock_dir_is_a_clear_error(smi: FakeSmi, tmp_path: Path) -> None:
    smi.set(FOUR_FREE, "")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(GpuUnavailable, match="TFCOORD_GPU_LOCK_DIR"):
        select_gpus(1, nvidia_smi=smi.path, lock_dir=str(blocker / "locks"))


def test_lock_dir_default_is_per_user_under_tmp() -> None:
    from tfcoord.node import gpuclaim

    assert gpuclaim.lock_dir({}) == f"/tmp/tfcoord-gpus-{os.getuid()}"
    assert gpuclaim.lock_dir({"TFCOORD_GPU_LOCK_DIR": "/x"}) == "/x"


def test_more_gpus_than_the_host_has_fails_at_once(smi: FakeSmi, sleeps: Sleeps) -> None:
    smi.set(FOUR_FREE, "")
    with pytest.raises(GpuUnavailable, match=r"5 GPU\(s\) wanted but this host has 4"):
        select_gpus(5, nvidia_smi=smi.path, sleep=sleeps)
    assert sleeps == []


def test_default_nvidia_smi_is_found_on_path(smi: FakeSmi, monkeypatch: pytest.MonkeyPatch) -> None:
    smi.set(FOUR_FREE, "GPU-aaaa, 1, python, 10\n")
    monkeypatch.setenv("PATH", f"{smi.dir}{os.pathsep}{os.environ.get('PATH', '')}")
    assert select_gpus(1) == GpuSelection(("1",), ("GPU-bbbb",), "nvidia-smi")
    assert len(smi.calls()) == 2


# -- no usable nvidia-smi -----------------------------------------------------------------------


def test_nvidia_smi_missing_from_path_means_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with caplog.at_level(logging.DEBUG, logger="tfcoord"):
        assert select_gpus(2) is CPU
    # A host without the NVIDIA driver is a CPU host: said at debug level, not warned about
    # by every node of every CPU cluster (TensorFlowOnSpark's default asks one GPU if any exist).
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "running on the CPU" in r.getMessage()]
    assert said == [
        (logging.DEBUG, "2 GPU(s) wanted but 'nvidia-smi' was not found on PATH; running on the CPU")
    ]
    with pytest.raises(
        GpuUnavailable, match=r"2 GPU\(s\) required but none can be found: 'nvidia-smi' was not"
    ):
        select_gpus(2, require=True)


def test_failing_nvidia_smi_means_cpu_unless_required(smi: FakeSmi, caplog: pytest.LogCaptureFixture) -> None:
    smi.fail("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    with caplog.at_level(logging.DEBUG, logger="tfcoord"):
        assert select_gpus(1, nvidia_smi=smi.path) is CPU
    # A driver that is there but broken is worth a warning.
    assert [r.levelno for r in caplog.records if "running on the CPU" in r.getMessage()] == [logging.WARNING]
    with pytest.raises(GpuUnavailable, match="exited with 9: NVIDIA-SMI has failed") as err:
        select_gpus(1, nvidia_smi=smi.path, require=True)
    assert "require=False" in str(err.value)


def test_host_without_gpus_means_cpu_unless_required(smi: FakeSmi) -> None:
    smi.set("", "")
    assert select_gpus(1, nvidia_smi=smi.path) is CPU
    with pytest.raises(GpuUnavailable, match="lists no GPU"):
        select_gpus(1, nvidia_smi=smi.path, require=True)


def test_hung_nvidia_smi_is_given_up_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def hang(cmd, **kw):
        seen.append(kw["timeout"])
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(subprocess, "run", hang)  # the module gpus imports when it looks for GPUs
    assert select_gpus(1) is CPU
    with pytest.raises(GpuUnavailable, match="did not answer within 30 s"):
        select_gpus(1, require=True)
    assert seen == [gpus.NVIDIA_SMI_TIMEOUT_S] * 2


def test_missing_nvidia_smi_at_a_path_says_so(missing: str) -> None:
    with pytest.raises(GpuUnavailable, match="nvidia-smi' does not exist"):
        select_gpus(1, nvidia_smi=missing, require=True)


def test_required_gpus_from_spark_need_no_nvidia_smi(missing: str) -> None:
    sel = select_gpus(1, spark_resources={"gpu": Res("gpu", ["0"])}, nvidia_smi=missing, require=True)
    assert sel.source == "spark"


# -- parsing ------------------------------------------------------------------------------------


def test_parse_gpus_tolerates_whitespace_and_not_available() -> None:
    text = "\n  1 ,GPU-bbbb ,  16384,[N/A] , 16000  \r\n\n0,GPU-aaaa,[Not Supported],100,[N/A]\n"
    assert parse_gpus(text) == [
        GpuInfo(0, "GPU-aaaa", None, 100, None),
        GpuInfo(1, "GPU-bbbb", 16384, None, 16000),
    ]
    assert parse_gpus(text)[1].free_fraction == pytest.approx(16000 / 16384)
    assert GpuInfo(0, "u", 1000, 250, None).free_fraction == 0.75


@pytest.mark.parametrize("text", ["", "\n  \n", "No running processes found\n"])
def test_parse_apps_without_processes(text: str) -> None:
    assert parse_apps(text) == []


def test_parse_apps_keeps_commas_in_names_and_hidden_values() -> None:
    text = "GPU-aaaa, 12, /opt/my,app/python, 512\nGPU-bbbb, [N/A], [N/A], [N/A]\n"
    assert parse_apps(text) == [
        ComputeApp("GPU-aaaa", 12, "/opt/my,app/python", 512),
        ComputeApp("GPU-bbbb", None, "?", None),
    ]


@pytest.mark.parametrize(
    ("parse", "text", "why"),
    [
        (
            parse_gpus,
            "index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]\n",
            "index 'index'",
        ),
        (parse_gpus, "0, GPU-aaaa, 100\n", "expected 5 fields, got 3"),
        (parse_gpus, "0, GPU-aaaa, lots, 0, 100\n", "memory 'lots' is not a number"),
        (parse_gpus, "[N/A], GPU-aaaa, 100, 0, 100\n", "no GPU index"),
        (parse_gpus, "0, [N/A], 100, 0, 100\n", "no GPU UUID"),
        (parse_apps, "GPU-aaaa, 12\n", "expected 4 fields, got 2"),
        (parse_apps, "GPU-aaaa, twelve, python, 10\n", "pid 'twelve' is not a number"),
    ],
)
def test_unparseable_output_is_a_clear_error(parse, text: str, why: str) -> None:
    with pytest.raises(GpuUnavailable, match="cannot read the output of nvidia-smi") as err:
        parse(text)
    assert why in str(err.value)
    assert repr(text.strip()) in str(err.value)


def test_unparseable_output_from_nvidia_smi_is_not_taken_for_a_cpu_host(smi: FakeSmi) -> None:
    smi.set("Failed to initialize NVML: Driver/library version mismatch\n", "")
    with pytest.raises(GpuUnavailable, match="Driver/library version mismatch"):
        select_gpus(1, nvidia_smi=smi.path)


# -- the selection itself -----------------------------------------------------------------------


def test_env_always_sets_cuda_visible_devices(smi: FakeSmi, missing: str) -> None:
    smi.set(FOUR_FREE, "")
    assert select_gpus(0).env() == {"CUDA_VISIBLE_DEVICES": ""}
    assert select_gpus(3, nvidia_smi=missing).env() == {"CUDA_VISIBLE_DEVICES": ""}
    assert select_gpus(2, nvidia_smi=smi.path).env() == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert select_gpus(mesos_gpus=["5"], nvidia_smi=missing).env() == {"CUDA_VISIBLE_DEVICES": "5"}


@pytest.mark.parametrize(
    ("ids", "uuids", "source"),
    [
        (("0",), ("u",), "gpu"),
        (("0",), (), "nvidia-smi"),
        (["0"], ["u"], "spark"),
        (("0,1",), ("u",), "mesos"),
        (("",), ("u",), "mesos"),
        ((), (), "spark"),
        (("0",), ("u",), "cpu"),
    ],
)
def test_gpu_selection_is_validated(ids, uuids, source) -> None:
    with pytest.raises(ValueError, match="GpuSelection"):
        GpuSelection(ids, uuids, source)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_gpus": -1},
        {"num_gpus": True},
        {"num_gpus": 1.0},
        {"num_gpus": 1, "free_memory_fraction": 1.5},
        {"num_gpus": 1, "attempts": 0},
        {"num_gpus": 1, "delay_s": -1.0},
    ],
)
def test_bad_arguments_are_rejected(kwargs) -> None:
    with pytest.raises(ValueError):
        select_gpus(**kwargs)


# -- TensorFlowOnSpark's gpu_info and util.single_node_env ------------------------------------


@pytest.fixture
def tfos_gpus(smi: FakeSmi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSmi]:
    """The fake nvidia-smi first on PATH, claims in a directory of this test's own."""
    from tfcoord.compat.tensorflowonspark import gpu_info

    monkeypatch.setenv("PATH", f"{smi.dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TFCOORD_GPU_LOCK_DIR", str(tmp_path / "locks"))
    yield smi
    while gpu_info._held:  # what this process claimed through gpu_info
        gpu_info._held.pop().release()


def test_tfos_get_gpus_claims_so_a_second_call_gets_others(tfos_gpus: FakeSmi) -> None:
    from tfcoord.compat.tensorflowonspark import gpu_info

    tfos_gpus.set(FOUR_FREE, "")
    assert gpu_info.is_gpu_available()
    assert gpu_info.get_gpus(2) == "0,1"
    assert gpu_info.get_gpus(1, worker_index=3, format=gpu_info.AS_LIST) == ["2"]  # 0 and 1 are held
    with pytest.raises(GpuUnavailable, match="claimed by another tfcoord node on this host"):
        gpu_info.get_gpus(2, attempts=1)  # one left
    with pytest.raises(ValueError, match=r"AS_STRING or gpu_info\.AS_LIST"):
        gpu_info.get_gpus(1, format="csv")


def test_tfos_single_node_env_sets_cuda_visible_devices(
    tfos_gpus: FakeSmi, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfcoord.compat.tensorflowonspark import util

    tfos_gpus.set(FOUR_FREE, "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "unset by the test")
    util.single_node_env(num_gpus=2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    (tfos_gpus.dir / "exit").write_text("NVIDIA-SMI has failed: no driver")  # a host without GPUs
    util.single_node_env(num_gpus=2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
