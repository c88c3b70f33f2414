"""Device backends: what differs between device kinds, in one class per kind.

A backend owns a kind's child environment, its memory cap and peak (``open_memory``), its
synchronize, its default and supported knob values and its peak FLOP/s. ``backend_for`` maps a
device string to its backend; an unknown kind is an error, never another kind's branch. Adding a
kind is one subclass (its own module here, beside ``cpu`` and ``cuda``, of the interface in
``backend``) and one entry of ``_BACKENDS``.

Device facts (``describe_device``) come without a CUDA context in the calling process: CUDA's
from NVML (pynvml, from the nvidia-ml-py package), the CPU's from /proc. torch is imported where
it is used, not at import: ``runner`` imports this package in parents and children alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.config import DeviceInfo
from autotune.device.backend import DeviceBackend
from autotune.device.cpu import CPUBackend
from autotune.device.cuda import CUDABackend
from autotune.errors import ConfigError

if TYPE_CHECKING:
    import torch

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
