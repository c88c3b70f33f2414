"""The pipeline in readable lines: probe(), and the settings every command shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.config import (
    DeviceInfo,
    MemoryProbe,
    ProbeReport,
    WorkloadSpec,
    format_bytes,
    parse_budget,
)
from autotune.device import describe_device
from autotune.errors import ConfigError, NoFeasibleConfigError
from autotune.memory import OnStep, probe_memory, probe_spec
from autotune.runner import run_isolated
from autotune.space import divisors, memory_classes, per_device_batch
from autotune.trial import environment_notes
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
        split_factory(workload)
        return WorkloadSpec(kind="file", target=workload)
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


def probe(
    workload: WorkloadSpec | None = None,
    *,
    target_batch: int,
    world_size: int = 1,
    device: str | None = None,
    memory_budget: str | int | None = None,
    headroom: float = 0.1,
    precisions: Sequence[str] | None = None,
    compile_modes: Sequence[str] | None = None,
    timeout_s: float = 900.0,
    on_step: OnStep | None = None,
) -> ProbeReport:
    """Probe the largest micro-batch that fits for each memory class.

    Args:
        workload: what to train (default: the built-in workload).
        target_batch: effective batch size over all devices.
        world_size: data-parallel devices; micro-batches are divisors of target / world.
        device: ``cpu``, ``cuda`` or ``cuda:N`` (default: CUDA when available).
        memory_budget: ``2GiB``, ``80%`` or bytes (default: what the device has free).
        headroom: share of the budget kept free.
        precisions: restrict the precisions probed.
        compile_modes: restrict the compile modes probed.
        timeout_s: per child process.
        on_step: progress callback after each probe.

    Raises:
        ConfigError: bad settings. WorkloadError: the workload fails.
        NoFeasibleConfigError: not even the smallest micro-batch fits in any class.
    """
    workload = workload or WorkloadSpec()
    per_device = per_device_batch(target_batch, world_size)
    info = describe_device(device)
    budget = resolve_budget(info, memory_budget, headroom)
    classes, skipped = memory_classes(info, precisions, compile_modes)
    candidates = divisors(per_device)
    probes: list[MemoryProbe] = []
    for memory_class in classes:
        eager = next((p for p in probes if p.memory_class.precision == memory_class.precision
                      and p.max_micro_batch), None)
        probes.append(probe_memory(
            workload, info.device, memory_class, candidates, budget_bytes=budget.budget_bytes,
            usable_bytes=budget.usable_bytes, timeout_s=timeout_s,
            hint=eager.max_micro_batch if eager else None, on_step=on_step))
    if not any(p.max_micro_batch for p in probes):
        raise NoFeasibleConfigError(_nothing_fits(workload, info, budget, probes[0], timeout_s))
    allocator = ", ".join(environment_notes()) or "glibc malloc and torch allocator defaults"
    return ProbeReport(workload=workload, device=info, target_batch=target_batch,
                       world_size=world_size, headroom=headroom,
                       budget_bytes=budget.budget_bytes, probes=tuple(probes),
                       skipped=skipped, allocator=allocator)


def _nothing_fits(workload: WorkloadSpec, info: DeviceInfo, budget: Budget,
                  first: MemoryProbe, timeout_s: float) -> str:
    smallest = first.candidates[0]
    # Measure what the smallest micro-batch needs, capped only by what the device has free.
    result = run_isolated(probe_spec(workload, info.device, first.memory_class, smallest,
                                     info.available_memory_bytes, timeout_s))
    if result.ok and result.peak_bytes is not None:
        need = (f"it needs {format_bytes(result.peak_bytes)} at its peak "
                f"({first.memory_class.label()}), so the budget would have to be at least "
                f"{format_bytes(result.peak_bytes / (1 - budget.headroom))} with "
                f"{budget.headroom:.0%} headroom")
    else:
        need = (f"it did not fit in all {format_bytes(info.available_memory_bytes)} free on "
                f"{info.device} either ({result.status})")
    return (
        f"micro-batch {smallest} does not fit in {format_bytes(budget.usable_bytes)} usable "
        f"(budget {format_bytes(budget.budget_bytes)} minus {budget.headroom:.0%} headroom) "
        f"with any precision or compile mode tried: {need}. Try a larger --memory-budget, "
        "--precisions bf16 (halves activations), activation checkpointing in the model, or a "
        "shorter --seq-len."
    )


def env(device: str | None = None) -> DeviceInfo:
    """The device facts autotune uses (torch, CUDA, name, memory, precision support)."""
    return describe_device(device)

