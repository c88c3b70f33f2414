"""The host CPU's backend: glibc set up for repeatable peaks, RLIMIT_AS over the child's
baseline address space as the cap, peaks from the kernel's VmPeak, facts from /proc.
"""

from __future__ import annotations

import contextlib
import importlib
import mmap
import os
import platform
import resource
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from autotune.config import COMPILE_MODES, CUDA_GRAPH_MODES, DeviceInfo, TrialSpec
from autotune.device.backend import DeviceBackend, TrialMemory
from autotune.units import format_bytes

if TYPE_CHECKING:
    from torch import nn


# glibc defaults make a CPU child's address space wander by tens of MiB for the same step
# (per-thread arenas reserve 64 MiB heaps; freed blocks stay in the heap): one arena and an
# immediate trim make the measured peak repeat to about 1 MiB. A user's own MALLOC_* wins.
CPU_ALLOCATOR = {"MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0"}
_MAPPED_STEP = 64 * 1024**2
AT_CAP_SHARE = 0.02
"""A CPU run that failed with its peak within this share of its cap ran out of memory."""


class CPUBackend(DeviceBackend):
    """The host CPU: glibc set up for repeatable peaks, RLIMIT_AS as the cap."""

    kind = "cpu"
    kernels = "cpu"
    precision_names = ("fp32", "bf16")
    compile_in_peak = True  # the compile runs in the process whose address space is the cap
    # The process's baseline and the allocator's arenas are a large share of a small
    # micro-batch's peak: in the replay's recorded CPU tables the line through the peaks at 1
    # and 2 put 4 at up to 2.5x its peak (``boundary.flattens``).
    peaks_flatten = True
    peak_counted = (
        "the process's address-space high-water mark (VmPeak in /proc/self/status) over its "
        "value once the model is built, before it moves to the device and trains, plus the "
        "model's parameter and buffer bytes: the compile, the optimizer state and every "
        "step's memory count")

    def child_environment(self, base_env: Mapping[str, str]) -> dict[str, str]:
        """``CPU_ALLOCATOR``, unless the user set any ``MALLOC_*`` variable (theirs win)."""
        if any(k.startswith("MALLOC_") for k in base_env):
            return {}
        return dict(CPU_ALLOCATOR)

    def allocator_notes(self, env: Mapping[str, str]) -> str:
        keys = [k for k in sorted(env) if k.startswith("MALLOC_")]
        return ", ".join(f"{k}={env[k]}" for k in keys) or "glibc allocator defaults"

    def open_memory(self, spec: TrialSpec, model: nn.Module) -> TrialMemory:
        return _CPUMemory(spec, model)

    def budget_limit(self) -> tuple[int, str] | None:
        """What a hard address-space limit (``ulimit -v``) leaves a child above what it maps
        before its training (about what this process maps with torch loaded): the cap, set
        over that baseline, cannot rise over the hard limit."""
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY:
            return None
        import torch  # noqa: F401  (mapped here as in a child before its baseline)

        # Rounded up to 64 MiB: two processes (a search, then a check of its config) that map
        # a little more or less here find the same room.
        mapped = -(-_proc_status()["VmSize"] // _MAPPED_STEP) * _MAPPED_STEP
        room = max(hard - mapped, 0)
        return room, (f"the hard address-space limit (ulimit -v) is {format_bytes(hard)}, and a "
                      f"child maps about {format_bytes(mapped)} before it trains (torch "
                      f"loaded), which leaves {format_bytes(room)}")

    def max_ranks(self) -> int:
        """One rank per core: ranks sharing a core time each other's work."""
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)

    def compile_modes(self) -> tuple[str, ...]:
        """Every mode but the CUDA-graph ones."""
        return tuple(m for m in COMPILE_MODES if m not in CUDA_GRAPH_MODES)

    def default_compile_modes(self) -> tuple[str, ...]:
        """Eager and inductor's default: every CPU compile takes long, autotuning longer."""
        return ("off", "default")

    def normalize(self, device: str) -> str:
        return "cpu"

    def describe(self, device: str) -> DeviceInfo:
        import torch

        mem = _meminfo()
        flags, name = _cpu_flags_and_name()
        native_bf16 = bool(flags & {"avx512_bf16", "amx_bf16"})
        total = mem.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        notes = [f"{os.cpu_count()} CPU cores"]
        if not native_bf16:
            notes.append("no native bf16 on this CPU (no AVX512-BF16/AMX): bf16 is emulated, slow")
        notes.append("fp16 and tf32 are CUDA-only here; CUDA-graph compile modes need CUDA")
        return DeviceInfo(
            device="cpu", name=name, total_memory_bytes=total,
            available_memory_bytes=mem.get("MemAvailable", total),
            supports_bf16=True, supports_fp16=False, supports_tf32=False,
            native_bf16=native_bf16, torch_version=torch.__version__, cuda_version=None,
            notes=tuple(notes),
        )


def tensor_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (each storage once: tied weights share)."""
    seen: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard on this rank
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _proc_status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmSize", "VmPeak", "VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def _pad_to_high_water() -> mmap.mmap | None:
    """An inaccessible private mapping (PROT_NONE: no memory behind it, nothing committed) as
    large as VmPeak over VmSize, so that VmSize reaches VmPeak; kept mapped while it is held.
    None when there is no gap, or no room for it under an address-space limit set before."""
    status = _proc_status()
    gap = status["VmPeak"] - status["VmSize"]
    if gap < mmap.PAGESIZE:
        return None
    gap -= gap % mmap.PAGESIZE
    try:
        return mmap.mmap(-1, gap, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0)  # PROT_NONE
    except OSError:  # an address-space limit already this tight: count from the mark as before
        return None


def _start_compile_threads() -> None:
    """Start inductor's compile threads now, so their stacks count in the baseline.

    Inductor compiles CPU kernels on a pool of threads (one per core by default) created at
    the first compile (and tqdm a monitor thread for its progress bar): under the cap their
    stacks (8 MiB of address space each) would count as training memory and move the boundary
    by that much. A torch without this pool compiles in the calling thread.
    """
    try:
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads
    except ImportError:  # pragma: no cover - older or newer torch
        return
    num_threads = get_compile_threads()
    if num_threads <= 1:
        return
    with contextlib.suppress(ImportError):  # inductor's progress bar would start it mid-compile
        import tqdm

        tqdm.tqdm.monitor_interval = 0  # no monitor thread
    # Each task waits for all the others, so the pool must start one thread per task.
    barrier = threading.Barrier(num_threads + 1)
    futures = [AsyncCompile.pool().submit(barrier.wait) for _ in range(num_threads)]
    barrier.wait()
    for future in futures:
        future.result()


class _CPUMemory(TrialMemory):
    """RLIMIT_AS over the baseline; peaks from the kernel's VmPeak."""

    def __init__(self, spec: TrialSpec, model: nn.Module) -> None:
        import torch

        self.device = torch.device(spec.device)
        self.budget = self.asked = spec.memory_budget_bytes
        # The model is already built: its parameters and buffers count exactly (their bytes),
        # while what building it cost the process (lazy imports of its code, Python objects)
        # stays in the baseline, as it is host memory on a GPU.
        self.model_bytes = tensor_bytes(model)
        # Create the thread pool now so its stacks count in the baseline, not the budget.
        torch.ones(64, 64) @ torch.ones(64, 64)
        # Every optimizer imports torch._dynamo lazily (a large import): do it before the cap,
        # or it fails under a small cap (as a SystemError, not an OOM) and its address space
        # counts as training memory.
        importlib.import_module("torch._dynamo")
        if spec.compiled:
            _start_compile_threads()
        # Peaks are read from the kernel's high-water mark VmPeak, which may sit above the
        # address space VmSize here: glibc maps twice a new thread arena's size and trims it,
        # large blocks freed before now were unmapped (MALLOC_MMAP_THRESHOLD_), and a child
        # forked from the fork server inherits the server's mark (53 MiB above its VmSize under
        # a small mmap threshold). Training would fill that gap unseen by the peak, and the cap
        # over the mark would allow the gap on top. Reserve it (inaccessible, never in RSS nor
        # committed), so the address space starts at its high-water mark and both count from
        # the same bytes.
        self._padding = _pad_to_high_water()
        self.baseline = _proc_status()["VmPeak"]
        self.uncapped = resource.getrlimit(resource.RLIMIT_AS)
        self._cap()

    def rebase(self, model: nn.Module, batch_bytes: int) -> None:
        """Count from here: the sharded model's bytes and the batches exactly, the cap over
        the address space now (the full parameters were freed). The kernel's VmPeak still
        remembers the full model: a run whose training needs less than the parameters freed
        reports that earlier high-water mark, an over-count that errs on the safe side."""
        self.model_bytes = tensor_bytes(model) + batch_bytes
        self.baseline = _proc_status()["VmSize"]
        self._cap()

    def _cap(self) -> None:
        """RLIMIT_AS at the baseline plus what the budget leaves beside the model; at most the
        hard limit (``ulimit -v``), which is then the cap: ``budget`` becomes what it leaves,
        so a run that fails there ran out of memory (``at_cap``)."""
        if self.asked is None:
            return
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = self.baseline + max(self.asked - self.model_bytes, 0)
        if hard != resource.RLIM_INFINITY and cap > hard:
            cap = hard
        self.budget = max(cap - self.baseline + self.model_bytes, 0)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

    def release(self) -> None:
        """The address-space limit the child had before the cap."""
        resource.setrlimit(resource.RLIMIT_AS, self.uncapped)

    def at_cap(self, peak_bytes: int | None) -> bool:
        """Within ``AT_CAP_SHARE`` of the cap: an allocation that would cross it fails, so a
        run that ran out of address space stops a little under it (deep GPT's compile under
        a 54.2 MiB cap: ``SystemError: error return without exception set`` at 54.1 MiB)."""
        return (self.budget is not None and peak_bytes is not None
                and peak_bytes >= self.budget * (1 - AT_CAP_SHARE))

    def peak(self) -> dict[str, int | None]:
        """Peak bytes (address space over the baseline plus the model) and peak RSS."""
        status = _proc_status()
        return {"peak_bytes": status["VmPeak"] - self.baseline + self.model_bytes,
                "peak_rss_bytes": status["VmHWM"], "num_alloc_retries": 0}

    def current(self) -> int:
        """The address space over the baseline plus the model's bytes (what the cap limits,
        as the peak counts it)."""
        return _proc_status()["VmSize"] - self.baseline + self.model_bytes

    def sync(self) -> None:
        """Nothing to wait for: CPU ops return when done."""


def _meminfo() -> dict[str, int]:
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values


def _cpu_flags_and_name() -> tuple[set[str], str]:
    flags: set[str] = set()
    name = platform.machine()  # not platform.processor(): it runs `uname -p`
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return flags, name
