"""device: one backend per device kind; an unknown kind is an error, never another's branch."""

from __future__ import annotations

import mmap

import pytest
import torch
from torch import nn

from autotune.config import TrialSpec, WorkloadSpec
from autotune.device import backend_for, describe_device, normalize_device
from autotune.device.cpu import CPU_ALLOCATOR, CPUBackend, _proc_status, tensor_bytes
from autotune.device.cuda import CUDABackend
from autotune.errors import ConfigError
from autotune.units import MIB


@pytest.mark.parametrize("device", ["mps", "xpu", "xpu:0", "meta", "tpu", "cuda:x", "cpu:0"])
def test_unknown_kinds_are_an_error_naming_the_device(device: str) -> None:
    for call in (backend_for, normalize_device, describe_device):
        with pytest.raises(ConfigError, match=f"'{device}'") as raised:
            call(device)
        assert "cuda" in str(raised.value)  # says what would work


def test_known_kinds_map_to_their_backend() -> None:
    assert isinstance(backend_for("cpu"), CPUBackend)
    assert isinstance(backend_for(" CPU "), CPUBackend)
    for device in ("cuda", "cuda:0", "cuda:3", torch.device("cuda", 1)):
        assert isinstance(backend_for(device), CUDABackend)
    assert normalize_device("cpu") == "cpu"


def test_cpu_child_environment_sets_one_arena_unless_the_user_set_malloc() -> None:
    cpu = backend_for("cpu")
    env = cpu.child_environment({"PATH": "/bin"})
    assert env == CPU_ALLOCATOR
    assert env["MALLOC_ARENA_MAX"] == "1"
    assert cpu.child_environment({"MALLOC_MMAP_THRESHOLD_": "131072"}) == {}
    assert "MALLOC_ARENA_MAX=1" in cpu.allocator_notes({**env, "PATH": "/bin"})
    assert backend_for("cuda:0").child_environment({"PATH": "/bin"}) == {}


def test_the_backends_own_their_knob_values() -> None:
    cpu, cuda = backend_for("cpu"), backend_for("cuda")
    assert cpu.default_compile_modes() == ("off", "default")
    assert "reduce-overhead" not in cpu.compile_modes()
    assert "reduce-overhead" in cuda.compile_modes() == cuda.default_compile_modes()
    info = describe_device("cpu")
    assert cpu.precisions(info) == info.precisions()
    assert (cpu.kernels, cuda.kernels) == ("cpu", "cuda")
    assert cpu.peak_tflops(info.name, "fp32") is None
    assert cuda.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4


def test_cpu_memory_measures_a_large_tensor_in_process() -> None:
    model = nn.Linear(8, 8)
    spec = TrialSpec(workload=WorkloadSpec(), device="cpu", micro_batch=1,
                     memory_budget_bytes=None)  # a budget would set RLIMIT_AS on pytest itself
    memory = backend_for("cpu").open_memory(spec, model)
    assert memory.model_bytes == tensor_bytes(model) == (8 * 8 + 8) * 4
    before = memory.current()
    # Past the high-water mark this process already reached, so the peak must move.
    status = _proc_status()
    size = status["VmPeak"] - status["VmSize"] + 64 * MIB
    big = torch.empty(size, dtype=torch.uint8)
    memory.sync()
    assert memory.current() - before >= size
    peak = memory.peak()
    assert peak["peak_bytes"] is not None and peak["peak_bytes"] >= 64 * MIB
    assert peak["num_alloc_retries"] == 0
    del big


def test_cpu_memory_counts_training_that_stays_under_an_earlier_high_water_mark() -> None:
    # A child forked from the fork server inherits the server's high-water mark VmPeak, and
    # blocks freed before the baseline (unmapped under a small MALLOC_MMAP_THRESHOLD_) leave it
    # above VmSize: training that fills that gap must still show in the peak (it read 0 here,
    # and the estimator's real-step checks failed by 35-850%, before the gap was reserved).
    hole = mmap.mmap(-1, 128 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0)
    hole.close()
    status = _proc_status()
    assert status["VmPeak"] - status["VmSize"] >= 128 * MIB
    model = nn.Linear(8, 8)
    spec = TrialSpec(workload=WorkloadSpec(), device="cpu", micro_batch=1,
                     memory_budget_bytes=None)
    memory = backend_for("cpu").open_memory(spec, model)
    # 48 MiB: above glibc's largest mmap threshold (32 MiB), so a mapping of its own
    big = torch.ones(48 * MIB, dtype=torch.uint8)
    peak = memory.peak()["peak_bytes"]
    assert peak is not None
    assert 48 * MIB <= peak - memory.model_bytes < 56 * MIB, peak / MIB
    del big


def test_no_room_for_the_reservation_counts_from_the_mark_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.device import cpu

    hole = mmap.mmap(-1, 16 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0)
    hole.close()  # a gap to reserve

    def no_room(*args: object, **kwargs: object) -> mmap.mmap:
        raise OSError(12, "Cannot allocate memory")  # as under an address-space limit

    monkeypatch.setattr(cpu.mmap, "mmap", no_room)
    assert cpu._pad_to_high_water() is None


_UNDER_A_HARD_LIMIT = """
import json, resource
from autotune.api import resolve_budget
from autotune.names import FLAGS
from autotune.config import TrialSpec, WorkloadSpec
from autotune.units import GIB
from autotune.device import describe_device
from autotune.errors import ConfigError
from autotune.runner import run_isolated
from tests.conftest import workload_target

info = describe_device("cpu")
said = {"hard": resource.getrlimit(resource.RLIMIT_AS)[1], "free": info.available_memory_bytes,
        "total": info.total_memory_bytes}
default = resolve_budget(info, None, 0.1)
said.update(budget=default.budget_bytes, note=default.note)
try:
    resolve_budget(info, "4GiB", 0.1, FLAGS)
except ConfigError as exc:
    said["refused"] = str(exc)
# A child asked for more than the hard limit allows (as the check of micro-batch 1 without the
# cap asks for all that is free): its cap is the hard limit, never a ValueError.
said["run"] = run_isolated(TrialSpec(
    workload=WorkloadSpec(kind="file", target=workload_target("tiny")), device="cpu",
    micro_batch=1, memory_budget_bytes=8 * GIB, timeout_s=120.0)).status
print(json.dumps(said))
"""


# slow: a search under ulimit -v in a shell; the everyday run keeps the budget's arithmetic under a
# hard limit in this process
@pytest.mark.slow
@pytest.mark.subprocess
def test_a_hard_address_space_limit_bounds_the_budget_and_names_itself() -> None:
    """Under a hard ``ulimit -v`` every child failed with "ValueError: current limit exceeds
    maximum limit", blamed on the workload: the default budget is now what the hard limit
    leaves above what a child maps, a larger one is refused naming the limit, and a child's
    cap never rises over it."""
    import json
    import resource
    import subprocess
    import sys

    from autotune.units import GIB, format_bytes
    from tests.conftest import ROOT

    hard = 3 * GIB

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))

    proc = subprocess.run([sys.executable, "-c", _UNDER_A_HARD_LIMIT], cwd=ROOT, text=True,
                          capture_output=True, preexec_fn=lower, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.splitlines()[-1])
    assert said["hard"] == hard
    if said["free"] < hard or said["total"] < 4 * GIB:
        pytest.skip("this machine has less memory than the limit under test")
    room = said["budget"]  # what the limit leaves above the mapped bytes, rounded up to 64 MiB
    assert 1 * GIB < room < hard and (hard - room) % (64 * MIB) == 0, room
    limit = (f"the hard address-space limit (ulimit -v) is {format_bytes(hard)}, and a child "
             f"maps about {format_bytes(hard - room)} before it trains (torch loaded), which "
             f"leaves {format_bytes(room)}")
    assert said["note"] == (f"memory budget {format_bytes(room)}, less than the "
                            f"{format_bytes(said['free'])} free: {limit}")
    assert said["refused"] == (
        f"--memory-budget 4GiB (4.00 GiB) is more than a child process's memory cap can be "
        f"here: {limit}. Give --memory-budget {room // MIB}MiB or less, or raise the hard "
        "limit where it is set (the ulimit -v of the shell or job script, the container's or "
        "scheduler's limit)")
    assert said["run"] == "ok"
