"""Memory fit without a GPU: estimate() and check() (DESIGN.md section 5).

What ``check`` reads of an ``autotune.json`` (``CheckTarget``) is ``api.fit_target``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.api.fit_target import CheckTarget, read_target
from autotune.api.request import asked_budget
from autotune.config import WorkloadSpec
from autotune.device import backend_for, default_device
from autotune.errors import (
    MEMORY_STATUS,
    ConfigError,
    UntraceableStepError,
    WorkloadError,
    error_for_status,
)
from autotune.estimate.calibration import Calibration
from autotune.estimate.fits import EstimateReport, EstimateRequest, estimate_report
from autotune.knobs import KNOBS, Knobs
from autotune.memory import probe_spec
from autotune.names import KEYWORDS, Names
from autotune.runner import run_in_child, run_isolated
from autotune.serialize import from_json_dict, to_json_dict
from autotune.space import divisors, per_device_batch
from autotune.units import batch_limit_problem, format_bytes
from autotune.user_loop import capped_device
from autotune.workload import Workload

# ----------------------------------------------------------------------------------------------
# estimate() and check(): the fake-tensor estimator and the CI memory-fit check (issue 5).

DEFAULT_TIMEOUT_S = 600.0
"""How long a child that builds and traces (or measures) a workload may take."""


def estimate(
    workload: WorkloadSpec | Workload | None = None,
    *,
    micro_batch: int,
    device_memory: str | int,
    knobs: Knobs | None = None,
    precision: str | None = None,
    headroom: float = 0.1,
    target_batch: int | None = None,
    world_size: int = 1,
    kernels: str | None = None,
    device: str | None = None,
    calibration: Calibration | None = None,
    find_max: bool = True,
    any_micro_batch: bool = False,
    also_trace: tuple[int, ...] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
    name: Names = KEYWORDS,
) -> EstimateReport:
    """Estimate one training step's memory and the largest micro-batch that fits.

    A workload named by a spec is built and traced in a child process with a timeout (its
    code decides nothing in this process); a ``Workload`` object, already the caller's code,
    is traced here.

    Args:
        workload: a spec (default: the built-in workload as sized for CUDA) or a Workload.
        micro_batch: the micro-batch to break down.
        device_memory: the device's memory, e.g. ``24GiB`` or bytes.
        knobs: what the step runs with (default: fp32 eager, nothing else changed); a
            compile mode is traced eager, the allocator changes no tensor.
        precision: fp32, tf32, bf16 or fp16: a shortcut for ``Knobs(precision=...)`` (not
            with ``knobs``).
        headroom: share of the device memory kept free.
        target_batch: when given, list the (micro_batch, accumulate_steps) pairs that fit.
        world_size: data-parallel devices (micro-batches divide target / world); with a
            ``knobs.strategy`` (ddp, fsdp), the step is traced as one rank of that many.
        kernels: ``cuda`` (model CUDA's kernel choices: fused attention, a foreach optimizer
            step) or ``cpu`` (what a CPU runs); default: the device's.
        device: the device the estimate is for, ``cpu``, ``cuda`` or ``cuda:N`` (it need not be
            here); default: CUDA when this machine has it, else the CPU.
        calibration: the search's measurement of these knobs, from ``autotune.json``.
        find_max: search the largest micro-batch that fits (more traces); without it, only
            the asked micro-batch is traced and reported.
        any_micro_batch: with ``target_batch`` and ``find_max``, also the largest micro-batch
            of any size that fits (``any_max_micro_batch``), apart from the target's divisors.
        also_trace: further micro-batches to trace (reported in ``traced``).
        timeout_s: for the child process that builds and traces the workload.
        name: how the user wrote the settings, for the messages (``names.FLAGS`` on the
            command line).

    Raises:
        ConfigError: bad settings. WorkloadError: the workload fails, hangs, exits or crashes
        (UntraceableStepError: an op of its step cannot be traced).
    """
    from autotune.config import PRECISIONS
    from autotune.units import parse_bytes

    problems = []
    if knobs is not None and precision is not None:
        problems.append(f"give the precision in knobs ({knobs.label()}) or as precision "
                        f"{precision!r}, not both")
    elif precision is not None and precision not in PRECISIONS:
        problems.append(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    problems += [f"{k.name} {getattr(knobs, k.name)!r} is not one of {', '.join(k.values)}"
                 for k in KNOBS if knobs is not None and getattr(knobs, k.name) not in k.values]
    answers_for = device or default_device()  # the device need not be here (a CPU runner)
    try:
        kernels = kernels or backend_for(answers_for).kernels
    except ConfigError as exc:
        problems.append(f"{name.given('device', device)}: {str(exc).split(': ', 1)[-1]}")
    if kernels not in ("cuda", "cpu"):
        problems.append(f"kernels {kernels!r} must be cuda or cpu")
    if micro_batch < 1:
        problems.append(f"micro-batch must be at least 1, got {micro_batch}")
    if world_size < 1:
        problems.append(f"world size must be at least 1, got {world_size}")
    problems += filter(None, (batch_limit_problem(name("micro_batch"), micro_batch),
                              batch_limit_problem(name("world_size"), world_size, "devices")))
    if target_batch is not None:
        problems += filter(None, (batch_limit_problem(name("target_batch"), target_batch),))
    if not 0 <= headroom < 1:
        problems.append(f"headroom must be a fraction in [0, 1) such as 0.1, got {headroom}")
    if timeout_s <= 0:
        problems.append(f"timeout must be a positive number of seconds, got {timeout_s}")
    if problems:
        raise ConfigError("; ".join(problems))
    total = device_memory if isinstance(device_memory, int) else parse_bytes(device_memory)
    candidates = None
    if target_batch is not None:
        candidates = divisors(per_device_batch(target_batch, world_size, name))
    if knobs is None:
        knobs = Knobs(precision=precision or "fp32")  # type: ignore[arg-type]
    request = EstimateRequest(
        micro_batch=micro_batch, device_memory_bytes=total, knobs=knobs,
        headroom=headroom, candidates=candidates, target_batch=target_batch,
        world_size=world_size, kernels=kernels,  # type: ignore[arg-type]
        calibration=calibration, find_max=find_max, also_trace=tuple(also_trace),
        any_micro_batch=any_micro_batch)
    report = (estimate_report(workload, request) if isinstance(workload, Workload) else
              _estimate_in_child(workload or WorkloadSpec(), request, timeout_s))
    return replace(report, device=answers_for, device_given=device is not None)


def _estimate_in_child(spec: WorkloadSpec, request: EstimateRequest,
                       timeout_s: float) -> EstimateReport:
    run = run_in_child("autotune.estimate",
                       {"workload": to_json_dict(spec), "request": to_json_dict(request)},
                       timeout_s=timeout_s, device="cpu")
    where = f"estimating {spec.label()} at micro-batch {request.micro_batch}"
    if run.status == "timeout":
        raise WorkloadError(f"{where} took longer than {timeout_s:.0f} s and was stopped: the "
                            "workload hangs, or builds too slowly for --timeout")
    if run.status != "ok" or run.data is None:
        raise WorkloadError(f"{where}: the child process failed: {run.message}")
    data = run.data
    if "report" in data:
        return from_json_dict(EstimateReport, data["report"])
    message = str(data.get("message") or data.get("child_error") or data)
    kind = data.get("error")
    if kind == "untraceable":
        raise UntraceableStepError(message)
    if kind == "config":
        raise ConfigError(message)
    raise WorkloadError(message if kind == "workload" else f"{where}: {message}")


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
          measure: bool | None = None, workload: Workload | WorkloadSpec | None = None,
          timeout_s: float = DEFAULT_TIMEOUT_S, memory_budget: str | int | None = None,
          name: Names = KEYWORDS) -> CheckResult:
    """Check that a tuned config (``autotune.json``) still fits its device memory.

    The workload runs only in child processes with ``timeout_s`` (unless a ``Workload``
    object is passed: the caller's own code, traced in the caller's process).

    Args:
        path: the ``autotune.json`` to check (or ``target``, already read).
        target: what to check, instead of a file.
        measure: True: a real short step on the CUDA device; False: the estimator; None: measure
            when a CUDA device is here, else estimate.
        workload: a spec to use instead of the file's (e.g. the workload file moved), or a
            Workload object to estimate in this process (tests).
        timeout_s: per child process.
        memory_budget: ask about this budget instead of the file's (``16GiB``, ``50%`` of the
            device it was tuned on, or bytes; at most that device's memory), e.g. a smaller
            device: validated as the search's.
        name: how the user wrote the settings, for the messages (``names.FLAGS``).

    Raises:
        ConfigError: bad file or settings; ``measure=True`` without a CUDA device.
        WorkloadError: the workload fails, exits, crashes or hangs (or cannot be traced, with
            no device to measure on).
    """
    if target is None:
        if path is None:
            raise ConfigError("give the autotune.json to check")
        target = read_target(path, workload if isinstance(workload, WorkloadSpec) else None)
    if memory_budget is not None:
        budget = asked_budget(memory_budget, target.device_total_bytes or
                              target.device_memory_bytes, target.device, name)
        target = replace(target, device_memory_bytes=budget,
                         asked=name.given("memory_budget", memory_budget))
    result = _check(target, measure, workload, timeout_s)
    if not target.peak_unverified:
        return result
    return replace(result, message=f"{result.message}; the search's {target.peak_unverified}")


def _check(target: CheckTarget, measure: bool | None, workload: Workload | WorkloadSpec | None,
           timeout_s: float) -> CheckResult:
    """``check`` of a target read (its verdict, before the notes on the file)."""
    import torch

    on_cpu = target.device == "cpu"
    device_here = on_cpu or torch.cuda.is_available()
    if measure and not device_here:
        raise ConfigError(f"--measure runs a real step on the config's device "
                          f"({target.device}) and no CUDA device is here; use --estimate (the "
                          "default on machines without one)")
    object_workload = workload if isinstance(workload, Workload) else None
    usable = int(target.device_memory_bytes * (1 - target.headroom))
    label = target.knobs.label()
    step: EstimateReport | None = None
    words = ""  # an estimate's: the peak and whence
    if measure or (measure is None and device_here and not on_cpu):
        peak, how = _measure(target, timeout_s), "measured on the device"
    else:
        kernels = backend_for(target.device).kernels
        settings: dict[str, Any] = dict(
            micro_batch=target.micro_batch, device_memory=target.device_memory_bytes,
            knobs=target.knobs, headroom=target.headroom, target_batch=target.target_batch,
            world_size=target.world_size, kernels=kernels, calibration=target.calibration,
            timeout_s=timeout_s)
        try:
            step = estimate(object_workload or target.workload, find_max=False, **settings)
            estimated, measured = step.peak_bytes(), target.measured_peak_bytes
            if target.calibration is None and measured and measured > estimated:
                # What the search measured of this very config corrects the estimate, as a
                # stored calibration would: the larger peak decides, and what would fit.
                settings["calibration"] = Calibration(
                    micro_batch=target.micro_batch, measured_peak_bytes=measured,
                    estimate_bytes=step.estimate.peak_bytes)
                step = replace(step, calibration=settings["calibration"])
            if not step.fits():  # only then: which micro-batch would fit
                step = estimate(object_workload or target.workload, **settings)
        except UntraceableStepError as exc:
            # A step the fake-tensor trace cannot follow: measure a real one, but only where
            # the config's device is here and measuring was not forbidden.
            if measure is False or not device_here or object_workload is not None:
                raise
            step = None
            why = str(exc).split(". ")[0]
        if step is None:
            peak, how = _measure(target, timeout_s), f"measured on the device, since {why}"
        else:
            peak = max(step.peak_bytes(), measured or 0)
            words = _estimate_words(target, estimated, measured)
    if peak is None:
        cap = format_bytes(target.device_memory_bytes)
        return CheckResult(
            fits=False, peak_bytes=target.device_memory_bytes, usable_bytes=usable,
            budget_bytes=target.device_memory_bytes, method="measure",
            message=f"does not fit: micro-batch {target.micro_batch} x "
                    f"{target.accumulate_steps} ({label}): a real step ran out of memory "
                    f"under the {cap} cap, the budget each of the search's runs had")
    head = (f"micro-batch {target.micro_batch} x {target.accumulate_steps} ({label}): "
            f"{words or f'peak {format_bytes(peak)} {how}'}; "
            f"usable {format_bytes(usable)}, the {format_bytes(target.device_memory_bytes)} "
            f"budget{f' asked ({target.asked})' if target.asked else ''} less "
            f"{target.headroom:.0%} headroom")
    if peak <= usable:
        message = f"fits: {head}; margin {format_bytes(usable - peak)}"
        return CheckResult(fits=True, peak_bytes=peak, usable_bytes=usable,
                           budget_bytes=target.device_memory_bytes,
                           method="measure" if step is None else "estimate",
                           message=message)
    message = f"does not fit: {head}; over by {format_bytes(peak - usable)}"
    if step is not None:
        pairs = step.pairs
        message += (f"; largest that fits: micro-batch {pairs[-1][0]} with accumulate_steps "
                    f"{pairs[-1][1]}" if pairs else "; not even micro-batch 1 fits")
    return CheckResult(fits=False, peak_bytes=peak, usable_bytes=usable,
                       budget_bytes=target.device_memory_bytes,
                       method="measure" if step is None else "estimate", message=message)


def _estimate_words(target: CheckTarget, estimated: int, measured: int | None) -> str:
    """The peak a check of an estimate goes by, and whence, in one clause: the estimate (as
    the file's calibration corrected it) and, beside it, what the search measured of the
    config, the larger first."""
    label, mode = target.knobs.label(), target.knobs.compile_mode
    kind = (f"the estimate corrected by {label}'s measurement: "
            f"{target.calibration.describe()}" if target.calibration is not None else
            "the eager estimate, uncorrected" + (
                f", as compile mode {mode} cannot be traced under fake tensors"
                if mode != "off" else ""))
    if measured is None:
        words = f"peak {format_bytes(estimated)} by {kind}"
    elif measured > estimated:
        words = (f"peak {format_bytes(measured)} as the search measured this config, above "
                 f"{format_bytes(estimated)} by {kind}")
    else:
        words = f"peak {format_bytes(estimated)} by {kind}, " + (
            "as the search measured this config" if measured == estimated else
            f"above the {format_bytes(measured)} the search measured for this config")
    notes = target.calibration.notes if target.calibration is not None else ()
    words += "".join(f"; {note}" for note in notes)
    if target.knobs.distributed:
        words += (f"; one rank of {target.world_size} ({target.knobs.strategy}, traced with "
                  "a fake process group)")
    return words


def _measure(target: CheckTarget, timeout_s: float) -> int | None:
    """A real step of the config in a child capped at the budget, as each of the search's
    probes is (``memory.probe_spec``): its peak, or None when it ran out of memory under
    the cap.

    Raises:
        WorkloadError: the step fails otherwise (crash, hang, exit, non-finite loss).
        ConfigError: a knob value the workload cannot take.
    """
    ranks = target.nproc_per_node if target.knobs.distributed else 1
    device = capped_device(target.device, target.device_memory_bytes, ranks=ranks,
                           strategy=target.knobs.strategy)
    result = run_isolated(probe_spec(target.workload, device, target.knobs,
                                     target.micro_batch, target.device_memory_bytes, timeout_s,
                                     ranks=ranks))
    if not result.ok or result.peak_bytes is None:
        if result.status == MEMORY_STATUS:
            return None
        if result.status == "unsupported":  # as the estimator says of such a knob
            raise ConfigError(f"the workload cannot take {target.knobs.label()}: "
                              f"{result.message}")
        raise error_for_status(result.status, f"the real step of micro-batch {target.micro_batch} "
                            f"({target.knobs.label()}) failed, which is not a memory verdict "
                            f"[{result.status}]: {result.message}")
    return result.peak_bytes
