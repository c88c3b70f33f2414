"""Facts about the device, read without creating a CUDA context in the calling process.

CUDA facts come from NVML (pynvml, from the nvidia-ml-py package); CPU facts from /proc.
"""

from __future__ import annotations

import os
import platform

import torch

from autotune.config import DeviceInfo
from autotune.errors import ConfigError


def default_device() -> str:
    """``cuda:0`` when a CUDA device is visible, else ``cpu``."""
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def normalize_device(device: str | None) -> str:
    """Canonical device string: ``cpu`` or ``cuda:N``.

    Raises:
        ConfigError: unknown device, or CUDA asked for where none is available.
    """
    if device is None:
        return default_device()
    text = device.strip().lower()
    if text == "cpu":
        return "cpu"
    if text == "cuda" or text.startswith("cuda:"):
        index_text = text.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise ConfigError(f"--device {device!r}: the CUDA index must be a number, e.g. cuda:0")
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device {device!r}: no CUDA device is available here "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); use --device cpu"
            )
        count = torch.cuda.device_count()
        if int(index_text) >= count:
            raise ConfigError(f"--device {device!r}: only {count} CUDA device(s) are visible")
        return f"cuda:{int(index_text)}"
    raise ConfigError(f"--device {device!r} is not a device: use cpu, cuda or cuda:N")


def describe_device(device: str | None = None) -> DeviceInfo:
    """Facts about ``device`` (default: CUDA if available, else CPU).

    Raises:
        ConfigError: the device string is wrong or the device is not there.
    """
    device = normalize_device(device)
    if device == "cpu":
        return _describe_cpu()
    return _describe_cuda(int(device.partition(":")[2]))


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


def _describe_cpu() -> DeviceInfo:
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
        supports_bf16=True, supports_fp16=False, supports_tf32=False, native_bf16=native_bf16,
        torch_version=torch.__version__, cuda_version=None, notes=tuple(notes),
    )


def _describe_cuda(index: int) -> DeviceInfo:
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
