"""An NVIDIA GPU's backend: the caching allocator's memory fraction as the cap, the context
(outside the allocator) measured by NVML, facts from NVML without a CUDA context.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.config import COMPILE_MODES, PRECISIONS, DeviceInfo, TrialSpec
from autotune.datasheets import peak_tflops
from autotune.device.backend import DeviceBackend, TrialMemory
from autotune.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn


class CUDABackend(DeviceBackend):
    """An NVIDIA GPU: the allocator's memory fraction as the cap, NVML for the context."""

    kind = "cuda"
    kernels = "cuda"
    precision_names = PRECISIONS
    peak_counted = (
        "torch.cuda.max_memory_reserved() (counted from the process's start) plus what the "
        "device holds for the process outside PyTorch's allocator (the CUDA context, library "
        "workspaces: NVML's used memory less memory_reserved)")

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


def _describe_cuda(index: int) -> DeviceInfo:
    import torch

    try:
        import pynvml
    except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            handle = _nvml_handle(pynvml, index)
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


def _nvml_handle(pynvml: Any, index: int) -> Any:
    """NVML's handle of torch's device ``index``: by UUID where ``CUDA_VISIBLE_DEVICES``
    names it so (a slot of a parallel search, ``search.slots``), else by index."""
    ids = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
           if v.strip()]
    if index < len(ids) and ids[index].startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(ids[index])
    return pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(index))


def visible_uuids() -> list[str]:
    """The UUIDs of the CUDA devices torch sees, in its order (NVML: no CUDA context in this
    process); a device NVML cannot name keeps its index."""
    import torch

    count = torch.cuda.device_count()
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return [str(_nvml_index(i)) for i in range(count)]
    found = []
    for i in range(count):
        try:
            uuid = pynvml.nvmlDeviceGetUUID(_nvml_handle(pynvml, i))
            found.append(uuid.decode() if isinstance(uuid, bytes) else uuid)
        except Exception:
            found.append(str(_nvml_index(i)))
    return found


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
        handle = _nvml_handle(pynvml, index)
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
            _nvml_handle(pynvml, index)).used)
    except Exception:
        return None
