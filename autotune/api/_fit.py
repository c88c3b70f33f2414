"""Memory fit without a GPU: estimate() and check() (DESIGN.md section 5)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.config import (
    MemoryClass,
    WorkloadSpec,
    format_bytes,
)
from autotune.errors import ConfigError, UntraceableStepError, WorkloadError
from autotune.estimate import ESTIMATE_NOTE, EstimateReport, StepEstimate
from autotune.memory import probe_spec
from autotune.runner import run_isolated
from autotune.schema import (
    read_tuned,
)
from autotune.space import divisors, per_device_batch
from autotune.workload import Workload

# ----------------------------------------------------------------------------------------------
# estimate() and check(): the fake-tensor estimator and the CI memory-fit check (issue 5).


def estimate(
    workload: WorkloadSpec | Workload | None = None,
    *,
    micro_batch: int,
    device_memory: str | int,
    precision: str = "fp32",
    headroom: float = 0.1,
    target_batch: int | None = None,
    world_size: int = 1,
    kernels: str = "cuda",
    scale: float | None = None,
    find_max: bool = True,
) -> EstimateReport:
    """Estimate one training step's memory and the largest micro-batch that fits.

    Args:
        workload: a spec (default: the built-in workload as sized for CUDA) or a Workload.
        micro_batch: the micro-batch to break down.
        device_memory: the device's memory, e.g. ``24GiB`` or bytes.
        precision: fp32, tf32, bf16 or fp16.
        headroom: share of the device memory kept free.
        target_batch: when given, list the (micro_batch, accumulate_steps) pairs that fit.
        world_size: data-parallel devices (micro-batches divide target / world).
        kernels: ``cuda`` (model CUDA's fused attention) or ``cpu`` (what a CPU runs).
        scale: calibration (measured / estimate) to apply, from ``autotune.json``.
        find_max: search the largest micro-batch that fits (more traces); without it, only
            the asked micro-batch is traced and reported.

    Raises:
        ConfigError: bad settings. WorkloadError: the workload cannot be built or traced.
    """
    from autotune.config import PRECISIONS, parse_bytes
    from autotune.estimate import FitSearch, estimate_step, largest_fitting
    from autotune.workload import load_workload

    problems = []
    if precision not in PRECISIONS:
        problems.append(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if kernels not in ("cuda", "cpu"):
        problems.append(f"kernels {kernels!r} must be cuda or cpu")
    if micro_batch < 1:
        problems.append(f"micro-batch must be at least 1, got {micro_batch}")
    if not 0 <= headroom < 1:
        problems.append(f"headroom must be a fraction in [0, 1) such as 0.1, got {headroom}")
    if problems:
        raise ConfigError("; ".join(problems))
    total = device_memory if isinstance(device_memory, int) else parse_bytes(device_memory)
    candidates = None
    if target_batch is not None:
        candidates = divisors(per_device_batch(target_batch, world_size))
    if isinstance(workload, Workload):
        loaded = workload
    else:
        loaded = load_workload(workload or WorkloadSpec(), "cuda" if kernels == "cuda" else "cpu")
    usable = int(total * (1 - headroom))

    def trace(m: int) -> StepEstimate:
        return estimate_step(loaded, m, precision=precision, kernels=kernels)  # type: ignore[arg-type]

    asked = trace(micro_batch)
    traced_usable = int(usable / (scale or 1.0))
    if not find_max:
        fits = asked.peak_bytes <= traced_usable
        search = FitSearch(max_micro_batch=micro_batch if fits else 0, estimates=(asked,))
    else:
        search = largest_fitting(trace, traced_usable, candidates, known=[asked])
    best = search.max_micro_batch
    pairs: tuple[tuple[int, int], ...] = ()
    if candidates is not None:
        per_device = per_device_batch(target_batch or 1, world_size)
        pairs = tuple((m, per_device // m) for m in candidates if m <= best)
    peak = search.peak_at(best)
    notes = [ESTIMATE_NOTE]
    if scale is not None:
        notes.append(f"figures scaled by the calibration {scale:.3f} (measured / estimate)")
    return EstimateReport(
        workload_name=loaded.name, estimate=asked, device_memory_bytes=total, headroom=headroom,
        usable_bytes=usable, max_micro_batch=best,
        max_peak_bytes=None if peak is None else int(peak * (scale or 1.0)),
        target_batch=target_batch, world_size=world_size, pairs=pairs, scale=scale,
        notes=tuple(notes))


@dataclass(frozen=True, kw_only=True)
class CheckTarget:
    """What ``check`` needs from ``autotune.json`` (read in one place: ``_read_tuned``)."""

    workload: WorkloadSpec
    micro_batch: int
    accumulate_steps: int
    target_batch: int
    world_size: int
    precision: str
    compile_mode: str
    device_memory_bytes: int
    headroom: float
    calibration: float | None
    """measured / estimate peak for this config's memory class, when the search recorded both."""
    device: str = "cuda"
    """Where the config was tuned (``cpu`` or ``cuda:N``): whose kernels the estimate models."""


def _read_tuned(path: str | Path) -> CheckTarget:
    """Read the fields ``check`` needs from an ``autotune.json``.

    Raises:
        ConfigError: missing or unreadable file, not JSON, another schema, or bad fields.
    """
    config = read_tuned(path)  # validated there: budget positive, headroom in [0, 1), ...
    cal = config.memory.calibration.get(config.memory_class())
    calibration = (cal["measured_peak_bytes"] / cal["estimate_bytes"]
                   if cal and cal.get("estimate_bytes") else None)
    return CheckTarget(
        workload=config.workload, micro_batch=config.micro_batch,
        accumulate_steps=config.accumulate_steps, target_batch=config.target_batch,
        world_size=config.world_size, precision=config.precision,
        compile_mode=config.compile_mode, device_memory_bytes=config.memory.budget_bytes,
        headroom=config.memory.headroom, calibration=calibration, device=config.device.device)


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """Whether a tuned config still fits its device memory with its headroom."""

    fits: bool
    peak_bytes: int
    usable_bytes: int
    budget_bytes: int
    method: str
    """``estimate`` (fake-tensor trace) or ``measure`` (a real step on the device)."""
    message: str
    """One line when it fits; what fits instead when it does not."""


def check(path: str | Path | None = None, *, target: CheckTarget | None = None,
          measure: bool | None = None, workload: Workload | None = None) -> CheckResult:
    """Check that a tuned config (``autotune.json``) still fits its device memory.

    Args:
        path: the ``autotune.json`` to check (or ``target``, already read).
        target: what to check, instead of a file.
        measure: True: a real short step on the CUDA device; False: the estimator; None: measure
            when a CUDA device is here, else estimate.
        workload: a Workload object to estimate instead of the target's spec (tests).

    Raises:
        ConfigError: bad file or settings; ``measure=True`` without a CUDA device.
        WorkloadError: the workload fails (or cannot be traced, with no device to measure on).
    """
    import torch

    if target is None:
        if path is None:
            raise ConfigError("give the autotune.json to check")
        target = _read_tuned(path)
    on_cpu = target.device == "cpu"
    device_here = on_cpu or torch.cuda.is_available()
    if measure and not device_here:
        raise ConfigError(f"--measure runs a real step on the config's device "
                          f"({target.device}) and no CUDA device is here; use --estimate (the "
                          "default on machines without one)")
    usable = int(target.device_memory_bytes * (1 - target.headroom))
    label = f"{target.precision}/{target.compile_mode}"
    step: EstimateReport | None = None
    if measure or (measure is None and device_here and not on_cpu):
        peak, how = _measure(target), f"measured on the device ({label})"
    else:
        kernels = "cpu" if target.device == "cpu" else "cuda"
        settings = dict(micro_batch=target.micro_batch,
                        device_memory=target.device_memory_bytes, precision=target.precision,
                        headroom=target.headroom, target_batch=target.target_batch,
                        world_size=target.world_size, kernels=kernels,
                        scale=target.calibration)
        try:
            step = estimate(workload or target.workload, find_max=False, **settings)
            if not step.fits():  # only then: which micro-batch would fit
                step = estimate(workload or target.workload, **settings)
        except UntraceableStepError as exc:
            # A step the fake-tensor trace cannot follow: measure a real one, but only where
            # the config's device is here and measuring was not forbidden.
            if measure is False or not device_here or workload is not None:
                raise
            step = None
            why = str(exc).split(". ")[0]
        if step is None:
            peak = _measure(target)
            how = f"measured on the device ({label}), since {why}"
        else:
            peak = step.scaled(step.estimate.peak_bytes)
            how = (f"estimate calibrated by {label}'s measured/estimate ratio "
                   f"{target.calibration:.3f}" if target.calibration is not None
                   else "eager estimate, uncalibrated" + (
                       f" (compile mode {target.compile_mode} cannot be traced under fake "
                       "tensors)" if target.compile_mode != "off" else ""))
    head = (f"micro-batch {target.micro_batch} x {target.accumulate_steps} ({label}): peak "
            f"{format_bytes(peak)} ({how}), usable {format_bytes(usable)} (device "
            f"{format_bytes(target.device_memory_bytes)} minus {target.headroom:.0%} headroom)")
    if peak <= usable:
        message = f"fits: {head}, margin {format_bytes(usable - peak)}"
        return CheckResult(fits=True, peak_bytes=peak, usable_bytes=usable,
                           budget_bytes=target.device_memory_bytes,
                           method="measure" if step is None else "estimate",
                           message=message)
    message = f"does not fit: {head}, over by {format_bytes(peak - usable)}"
    if step is not None:
        pairs = step.pairs
        message += (f"; largest that fits: micro-batch {pairs[-1][0]} with accumulate_steps "
                    f"{pairs[-1][1]}" if pairs else "; not even micro-batch 1 fits")
    return CheckResult(fits=False, peak_bytes=peak, usable_bytes=usable,
                       budget_bytes=target.device_memory_bytes,
                       method="measure" if step is None else "estimate", message=message)


def _measure(target: CheckTarget) -> int:

    memory_class = MemoryClass(precision=target.precision,  # type: ignore[arg-type]
                               compile_mode=target.compile_mode)  # type: ignore[arg-type]
    device = "cpu" if target.device == "cpu" else "cuda:0"
    result = run_isolated(probe_spec(target.workload, device, memory_class,
                                     target.micro_batch, None, 900.0))
    if not result.ok or result.peak_bytes is None:
        if result.status == "oom":
            return target.device_memory_bytes + 1
        raise WorkloadError(f"the real step failed ({result.status}): {result.message}")
    return result.peak_bytes



