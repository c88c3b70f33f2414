"""Device backends: what differs between device kinds, in one class per kind.

A backend owns a kind's child environment, its memory cap and peak (``open_memory``), its
synchronize, its default and supported knob values and its peak FLOP/s. ``backend_for`` maps a
device string to its backend; an unknown kind is an error, never another kind's branch. Adding a
kind is one subclass here and one entry of ``_BACKENDS``.

Device facts (``describe_device``) come without a CUDA context in the calling process: CUDA's
from NVML (pynvml, from the nvidia-ml-py package), the CPU's from /proc. torch is imported where
it is used, not at import: ``runner`` imports this module in parents and children alike.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import mmap
import os
import platform
import resource
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from autotune.config import COMPILE_MODES, CUDA_GRAPH_MODES, PRECISIONS, DeviceInfo, TrialSpec
from autotune.datasheets import peak_tflops
from autotune.errors import ConfigError
from autotune.units import format_bytes

if TYPE_CHECKING:
    import torch
    from torch import nn

Kernels = Literal["cpu", "cuda"]

# glibc defaults make a CPU child's address space wander by tens of MiB for the same step
# (per-thread arenas reserve 64 MiB heaps; freed blocks stay in the heap): one arena and an
# immediate trim make the measured peak repeat to about 1 MiB. A user's own MALLOC_* wins.
CPU_ALLOCATOR = {"MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0"}
_MAPPED_STEP = 64 * 1024**2
AT_CAP_SHARE = 0.02
"""A CPU run that failed with its peak within this share of its cap ran out of memory."""


class DeviceBackend(abc.ABC):
    """What one device kind does differently: a stateless object, one per kind."""

    kind: ClassVar[str]
    """The device kind, as in ``torch.device(...).type``."""
    kernels: ClassVar[Kernels]
    """Whose kernel choices the estimator models for this kind (``estimate.StepEstimate``)."""
    precision_names: ClassVar[tuple[str, ...]]
    """Precisions this kind can run at all; ``precisions`` narrows them to one device."""
    compile_in_peak: ClassVar[bool] = False
    """Whether ``torch.compile``'s own memory counts in a child's peak on this kind: then a
    compile loaded from inductor's cache peaks lower than the first launch that compiles it,
    and a compiled setting fits only if a run that compiled its graphs fit."""

    def child_environment(self, base_env: Mapping[str, str]) -> dict[str, str]:
        """Variables a child on this kind sets over ``base_env`` before it starts torch."""
        return {}

    @abc.abstractmethod
    def allocator_notes(self, env: Mapping[str, str]) -> str:
        """The allocator settings a child with ``env`` runs with, for the report."""

    @abc.abstractmethod
    def open_memory(self, spec: TrialSpec, model: nn.Module) -> TrialMemory:
        """Cap this (child) process's memory for ``spec`` and start measuring it.

        Called once per child, after the model is built and before it moves to the device."""

    @abc.abstractmethod
    def compile_modes(self) -> tuple[str, ...]:
        """Compile modes this kind can run."""

    @abc.abstractmethod
    def max_ranks(self) -> int:
        """The most ranks of a job this machine runs on its own devices of this kind."""

    def default_compile_modes(self) -> tuple[str, ...]:
        """Compile modes a search tries when the user names none."""
        return self.compile_modes()

    def precisions(self, info: DeviceInfo) -> tuple[str, ...]:
        """Precisions the device ``info`` describes can run."""
        ok = {"fp32": True, "tf32": info.supports_tf32, "bf16": info.supports_bf16,
              "fp16": info.supports_fp16}
        return tuple(p for p in PRECISIONS if p in self.precision_names and ok[p])

    def peak_tflops(self, device_name: str, precision: str) -> float | None:
        """Dense peak TFLOP/s of the device in ``precision`` (for MFU), or None if unknown."""
        return None

    def budget_limit(self) -> tuple[int, str] | None:
        """The largest memory budget a child's cap can hold here besides the device's memory,
        and a clause that says what sets it; None when only the device's memory does."""
        return None

    @abc.abstractmethod
    def normalize(self, device: str) -> str:
        """Canonical string of a device of this kind, checked to be there.

        Raises:
            ConfigError: the device is not there.
        """

    @abc.abstractmethod
    def describe(self, device: str) -> DeviceInfo:
        """Facts about ``device``, a canonical string of this kind."""


class TrialMemory(abc.ABC):
    """Caps and measures a trial child's memory on one device (``DeviceBackend.open_memory``)."""

    device: torch.device
    budget: int | None
    """The spec's memory budget (None: uncapped)."""
    baseline: int = 0
    """Memory the process held before training (CPU: its address space high-water mark)."""
    context: int = 0
    """Device memory held outside PyTorch's allocator (CUDA context, library workspaces)."""
    model_bytes: int = 0
    """The model's parameters and buffers, counted in the budget (CPU)."""

    @abc.abstractmethod
    def peak(self) -> dict[str, int | None]:
        """The result's memory fields (``TrialResult``), read after the steps."""

    @abc.abstractmethod
    def current(self) -> int:
        """Memory now, after a step (``TrialResult.step_memory_bytes``)."""

    def rebase(self, model: nn.Module, batch_bytes: int) -> None:
        """The model was sharded (FSDP): count its local shards from now on, not the full
        model it was built as (nothing to do where the device's allocator counts)."""
        return None

    @abc.abstractmethod
    def release(self) -> None:
        """Lift the cap: what runs after the peak was read is not the trial's training."""

    def at_cap(self, peak_bytes: int | None) -> bool:
        """Whether a run that failed had reached its cap: its failure then is an out of memory,
        whatever it raised (on CPU a C extension that cannot allocate under the address-space
        cap may raise a bare ``SystemError``). False where the device's allocator raises its
        own out-of-memory error (CUDA)."""
        return False

    @abc.abstractmethod
    def sync(self) -> None:
        """Wait for the device's queued work (before reading a clock)."""

    def mark(self) -> Any:
        """A point in the device's queue of work, without waiting for it (read by
        ``seconds`` after ``sync``). The host's clock, for a device whose ops return when done."""
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds of device work between two ``mark``s (after ``sync``)."""
        return float(end - start)


# ----------------------------------------------------------------------------------------------
# CPU: the cap is RLIMIT_AS over the child's baseline address space.


class CPUBackend(DeviceBackend):
    """The host CPU: glibc set up for repeatable peaks, RLIMIT_AS as the cap."""

    kind = "cpu"
    kernels = "cpu"
    precision_names = ("fp32", "bf16")
    compile_in_peak = True  # the compile runs in the process whose address space is the cap

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


# ----------------------------------------------------------------------------------------------
# CUDA: the cap is the caching allocator's memory fraction; the context is measured by NVML.


class CUDABackend(DeviceBackend):
    """An NVIDIA GPU: the allocator's memory fraction as the cap, NVML for the context."""

    kind = "cuda"
    kernels = "cuda"
    precision_names = PRECISIONS

    def allocator_notes(self, env: Mapping[str, str]) -> str:
        keys = [k for k in sorted(env) if k.startswith("PYTORCH_CUDA_ALLOC")]
        return ", ".join(f"{k}={env[k]}" for k in keys) or "torch CUDA allocator defaults"

    def open_memory(self, spec: TrialSpec, model: nn.Module) -> TrialMemory:
        return _CUDAMemory(spec)

    def compile_modes(self) -> tuple[str, ...]:
        return COMPILE_MODES

    def max_ranks(self) -> int:
        """One rank per GPU."""
        import torch

        return torch.cuda.device_count()

    def peak_tflops(self, device_name: str, precision: str) -> float | None:
        return peak_tflops(device_name, precision)

    def normalize(self, device: str) -> str:
        import torch

        index = int(device.strip().partition(":")[2] or "0")
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {device!r}: no CUDA device is available here "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); use cpu"
            )
        count = torch.cuda.device_count()
        if index >= count:
            raise ConfigError(f"device {device!r}: only {count} CUDA device(s) are visible")
        return f"cuda:{index}"

    def describe(self, device: str) -> DeviceInfo:
        return _describe_cuda(int(device.partition(":")[2] or "0"))


class _CUDAMemory(TrialMemory):
    """The caching allocator's memory fraction as the cap; peaks from its statistics plus
    the context NVML sees outside it."""

    def __init__(self, spec: TrialSpec) -> None:
        import torch

        self.device = torch.device(spec.device)
        self.budget = self.asked = spec.memory_budget_bytes
        self.index = self.device.index or 0
        # NVML reads the device's use without a CUDA context: before this child has one, so
        # the context (hundreds of MiB) counts. torch's own mem_get_info would create the
        # context before measuring and miss it.
        self.nvml_before = nvml_used_bytes(self.index)
        torch.cuda.set_device(self.device)
        free_before, total = torch.cuda.mem_get_info(self.device)
        torch.empty(1, device=self.device)
        torch.cuda.synchronize(self.device)
        free_after, _ = torch.cuda.mem_get_info(self.device)
        # Without NVML: what the first allocation cost beyond PyTorch's own block.
        fallback = max(0, free_before - free_after - torch.cuda.memory_reserved(self.device))
        self.context = self._outside_allocator() or fallback
        if self.budget is not None:
            allowed = min(self.budget, free_before + self.context) - self.context
            torch.cuda.set_per_process_memory_fraction(max(allowed, 0) / total, self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def release(self) -> None:
        """The whole device for the allocator again."""
        import torch

        torch.cuda.set_per_process_memory_fraction(1.0, self.device)

    def _outside_allocator(self) -> int | None:
        """Device memory this process holds outside PyTorch's allocator now (NVML), or None."""
        import torch

        now = nvml_used_bytes(self.index)
        if self.nvml_before is None or now is None:
            return None
        return max(0, now - self.nvml_before - torch.cuda.memory_reserved(self.device))

    def peak(self) -> dict[str, int | None]:
        """Peak bytes (reserved plus the context), allocator retries, the context and the
        fragmentation (reserved beyond allocated, at their peaks)."""
        import torch

        # Kernel modules load as they are first used, so the context grows during the steps.
        self.context = max(self.context, self._outside_allocator() or 0)
        stats = torch.cuda.memory_stats(self.device)
        reserved = torch.cuda.max_memory_reserved(self.device)
        return {"peak_bytes": reserved + self.context,
                "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
                "context_bytes": self.context,
                "fragmentation_bytes": reserved - torch.cuda.max_memory_allocated(self.device)}

    def current(self) -> int:
        """``memory_allocated`` now."""
        import torch

        return torch.cuda.memory_allocated(self.device)

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def mark(self) -> Any:
        """A CUDA event recorded on the current stream: marking does not wait for the GPU."""
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0


# ----------------------------------------------------------------------------------------------
# From a device string to its backend.

_BACKENDS: dict[str, DeviceBackend] = {b.kind: b for b in (CPUBackend(), CUDABackend())}


def backend_for(device: str | torch.device) -> DeviceBackend:
    """The backend of a device: ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        ConfigError: any other kind (``mps``, ``xpu``, ...), or a CUDA index that is not a
            number. Whether the device is there is ``normalize_device``'s question.
    """
    text = str(device).strip().lower()
    kind, colon, index = text.partition(":")
    supported = "use cpu, cuda or cuda:N"
    backend = _BACKENDS.get(kind)
    if backend is None:
        raise ConfigError(f"device {str(device)!r}: the device kind {kind!r} is not supported "
                          f"(supported kinds: {', '.join(_BACKENDS)}); {supported}")
    if kind == "cpu" and colon:
        raise ConfigError(f"device {str(device)!r} is not a device: {supported}")
    if index and not index.isdigit():
        raise ConfigError(f"device {str(device)!r}: the CUDA index must be a number, e.g. cuda:0")
    return backend


def default_device() -> str:
    """``cuda:0`` when a CUDA device is visible, else ``cpu``."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def normalize_device(device: str | None) -> str:
    """Canonical device string: ``cpu`` or ``cuda:N``.

    Raises:
        ConfigError: unknown device kind, or CUDA asked for where none is available.
    """
    if device is None:
        return default_device()
    return backend_for(device).normalize(device)


def describe_device(device: str | None = None) -> DeviceInfo:
    """Facts about ``device`` (default: CUDA if available, else CPU).

    Raises:
        ConfigError: the device string is wrong or the device is not there.
    """
    device = normalize_device(device)
    return backend_for(device).describe(device)


# ----------------------------------------------------------------------------------------------
# Facts read from /proc and NVML.


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


def _describe_cuda(index: int) -> DeviceInfo:
    import torch

    try:
        import pynvml
    except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(index))
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            return _cuda_info(index, name, int(mem.total), int(mem.free), major, minor,
                              ("memory from NVML",))
        except pynvml.NVMLError:
            pass
    # Without NVML the properties call creates a context: acceptable for `env`, not for search.
    props = torch.cuda.get_device_properties(index)
    return _cuda_info(index, props.name, props.total_memory, props.total_memory,
                      props.major, props.minor, ("NVML unavailable: memory from torch",))


def _nvml_index(index: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids and index < len(ids) and ids[index].isdigit():
        return int(ids[index])
    return index


def _cuda_info(index: int, name: str, total: int, free: int, major: int, minor: int,
               notes: tuple[str, ...]) -> DeviceInfo:
    import torch

    ampere = major >= 8
    return DeviceInfo(
        device=f"cuda:{index}", name=name, total_memory_bytes=total, available_memory_bytes=free,
        supports_bf16=ampere, supports_fp16=True, supports_tf32=ampere, native_bf16=ampere,
        torch_version=torch.__version__, cuda_version=torch.version.cuda,
        compute_capability=f"{major}.{minor}", notes=notes,
    )


def nvml_process_used_bytes(index: int) -> int | None:
    """Device memory NVML attributes to this process (context + allocator), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(index))
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:  # NVML missing, or no per-process accounting (containers): unknown
        return None
    return None


def nvml_used_bytes(index: int) -> int | None:
    """Device memory in use by every process (NVML), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(
            pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(index))).used)
    except Exception:
        return None
