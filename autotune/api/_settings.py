"""Settings every command shares: which workload, how much memory."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config import (
    DeviceInfo,
    WorkloadSpec,
    format_bytes,
    parse_budget,
)
from autotune.errors import ConfigError
from autotune.workload import split_factory


def workload_spec(*, workload: str | None = None, model: str | None = None,
                  seq_len: int | None = None, pretrained: bool = False) -> WorkloadSpec:
    """Name a workload the CLI way: nothing (the default), ``--model`` or ``--workload``.

    Raises:
        ConfigError: both given, a bad ``file.py:factory``, a missing file or a bad seq len.
    """
    if workload and model:
        raise ConfigError("give either --workload FILE.py:FACTORY or --model NAME, not both")
    if seq_len is not None and seq_len <= 0:
        raise ConfigError(f"--seq-len must be a positive number of tokens, got {seq_len}")
    if workload:
        path, factory = split_factory(workload)
        # Absolute, so autotune.json works from any folder (check, codegen, load).
        return WorkloadSpec(kind="file", target=f"{path.resolve()}:{factory}")
    if model:
        return WorkloadSpec(kind="hf", target=model, seq_len=seq_len, pretrained=pretrained)
    if seq_len is not None:
        raise ConfigError("--seq-len applies to --model; the default workload has a fixed shape")
    return WorkloadSpec()


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The memory a run may use on one device."""

    budget_bytes: int
    """Hard cap for each child."""
    usable_bytes: int
    """Budget minus headroom: a fitting peak stays under this."""
    headroom: float


def resolve_budget(device: DeviceInfo, memory_budget: str | int | None,
                   headroom: float) -> Budget:
    """The budget: the user's (``2GiB``, ``80%``) or what the device has free.

    Raises:
        ConfigError: an unparsable budget, a headroom outside [0, 1), or a budget larger than
            the device.
    """
    if not 0 <= headroom < 1:
        raise ConfigError(
            f"--headroom must be a fraction in [0, 1) such as 0.1 for 10%, got {headroom}")
    if memory_budget is None:
        budget = device.available_memory_bytes
    elif isinstance(memory_budget, int):
        budget = memory_budget
    else:
        budget = parse_budget(memory_budget, device.total_memory_bytes)
    if budget > device.total_memory_bytes:
        raise ConfigError(
            f"--memory-budget {memory_budget} ({format_bytes(budget)}) is more than "
            f"{device.device} has ({format_bytes(device.total_memory_bytes)})")
    return Budget(budget_bytes=budget, usable_bytes=int(budget * (1 - headroom)),
                  headroom=headroom)

