"""The pipeline in readable lines: probe(), and the settings every command shares."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from autotune import __version__
from autotune.codegen import SCRIPT_NAME, render_train_script
from autotune.config import (
    DeviceInfo,
    MemoryClass,
    MemoryProbe,
    ProbeReport,
    WorkloadSpec,
    format_bytes,
    parse_budget,
)
from autotune.device import describe_device
from autotune.errors import AutotuneError, ConfigError, NoFeasibleConfigError, WorkloadError
from autotune.estimate import ESTIMATE_NOTE, EstimateReport, StepEstimate
from autotune.memory import OnStep, probe_memory, probe_spec
from autotune.runner import allocator_notes, run_isolated
from autotune.schema import (
    MemoryRecord,
    SearchResult,
    TrialRecord,
    TunedConfig,
    read_tuned,
    save_tuned,
    write_json_atomic,
)
from autotune.search import (
    Candidate,
    SearchOutcome,
    SearchSettings,
    break_even_steps,
    pick_winner,
    run_search,
)
from autotune.space import divisors, memory_classes, per_device_batch
from autotune.usage import Tuned
from autotune.workload import Workload, split_factory

OnTrial = Callable[[int, int, Candidate, TrialRecord | None], None]


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
    include_baseline: bool = False,
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
        include_baseline: also probe fp32 eager (the search's baseline) when restricted out.

    Raises:
        ConfigError: bad settings. WorkloadError: the workload fails.
        NoFeasibleConfigError: not even the smallest micro-batch fits in any class.
    """
    workload = workload or WorkloadSpec()
    per_device = per_device_batch(target_batch, world_size)
    info = describe_device(device)
    budget = resolve_budget(info, memory_budget, headroom)
    classes, skipped = memory_classes(info, precisions, compile_modes)
    baseline = MemoryClass(precision="fp32", compile_mode="off")
    if include_baseline and baseline not in classes:
        classes = (baseline, *classes)
        skipped = (*skipped, "fp32/off probed and timed as the baseline, outside the restriction")
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
    allocator = allocator_notes(info.device)
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



def search(
    workload: WorkloadSpec | None = None,
    *,
    target_batch: int,
    world_size: int = 1,
    device: str | None = None,
    memory_budget: str | int | None = None,
    headroom: float = 0.1,
    precisions: Sequence[str] | None = None,
    compile_modes: Sequence[str] | None = None,
    out: str | Path | None = ".",
    force: bool = False,
    settings: SearchSettings | None = None,
    on_step: OnStep | None = None,
    on_trial: OnTrial | None = None,
) -> SearchResult:
    """Probe memory per class, time candidates (baseline first), write ``autotune.json``.

    Args:
        workload: what to train (default: the built-in workload).
        target_batch: effective batch size over all devices.
        world_size: data-parallel devices.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        memory_budget: ``2GiB``, ``80%`` or bytes (default: what the device has free).
        headroom: share of the budget kept free.
        precisions: restrict the precisions tried.
        compile_modes: restrict the compile modes tried.
        out: folder for ``autotune.json`` (None: write nothing).
        force: overwrite an existing ``autotune.json``.
        settings: trial counts, time budget, objective, Optuna storage.
        on_step: progress after each memory probe.
        on_trial: progress before and after each timed trial.

    Raises:
        ConfigError: bad settings, an existing output without ``force``, a bad storage.
        WorkloadError: the workload fails.
        NoFeasibleConfigError: nothing fits, or no candidate ran.
    """
    settings = settings or SearchSettings()
    path = Path(out) / "autotune.json" if out is not None else None
    script = Path(out) / "train_autotuned.py" if out is not None else None
    if path is not None and script is not None:
        _check_writable(path, force)
        _check_writable(script, force)
    info = describe_device(device)
    extra_skipped: tuple[str, ...] = ()
    if precisions is None and not info.is_cuda and not info.native_bf16:
        precisions = ["fp32"]
        extra_skipped = ("bf16 not timed: this CPU emulates it (many times slower than fp32); "
                         "ask for it with --precisions fp32,bf16",)
    report = probe(workload, target_batch=target_batch, world_size=world_size, device=device,
                   memory_budget=memory_budget, headroom=headroom, precisions=precisions,
                   compile_modes=compile_modes, timeout_s=settings.timeout_s, on_step=on_step,
                   include_baseline=True)
    report = replace(report, skipped=report.skipped + extra_skipped)
    outcome = run_search(report, settings, on_trial=on_trial)
    config = tuned_config(report, outcome, settings)
    config = replace(config, memory=replace(config.memory, calibration=_calibrate(report, config)))
    if path is not None and script is not None:  # both checked before the search began
        save_tuned(config, path, force=True)
        write_train_script(config, script, force=True)
    return SearchResult(config=config, path=path, probe=report, stop_reason=outcome.stop_reason)


def _calibrate(report: ProbeReport, config: TunedConfig) -> dict[str, dict[str, int]]:
    """Measured peak and the estimator's figure for the same config, for the winner's class
    and fp32 eager: ``autotune check`` scales later estimates by their ratio."""
    calibration = {}
    for probe in report.probes:
        label = probe.memory_class.label()
        if label not in (config.memory_class(), "fp32/off") or not probe.peak_bytes:
            continue
        try:
            figure = estimate(report.workload, micro_batch=probe.max_micro_batch,
                              device_memory=report.device.total_memory_bytes,
                              precision=probe.memory_class.precision,
                              kernels="cuda" if report.device.is_cuda else "cpu", find_max=False)
        except AutotuneError:  # a step the fake-tensor trace cannot follow: no calibration
            continue
        calibration[label] = {"measured_peak_bytes": probe.peak_bytes,
                              "estimate_bytes": figure.estimate.peak_bytes,
                              "micro_batch": probe.max_micro_batch}
    return calibration


def _check_writable(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise ConfigError(f"{path} exists; pass --force to overwrite it, or --out another folder")
    folder = path.parent
    existing = folder if folder.exists() else next(
        (p for p in folder.parents if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(f"--out {folder} is not writable; choose a folder you can write to")


def tuned_config(report: ProbeReport, outcome: SearchOutcome,
                 settings: SearchSettings) -> TunedConfig:
    """Pick the winner and describe it, with every trial, as ``autotune.json`` content.

    Raises:
        NoFeasibleConfigError: no candidate ran to the end with sound numerics.
    """
    winner = pick_winner(outcome.records, settings)
    if winner is None:
        seen = ", ".join(f"{r.label()}: {r.verdict}" for r in outcome.records) or "none ran"
        raise NoFeasibleConfigError(f"no candidate completed its timed steps ({seen})")
    baseline = next(r for r in outcome.records if r.is_baseline)
    records = tuple(replace(r, verdict="winner", reason="fastest") if r is winner else
                    _lost(r, winner) for r in outcome.records)
    result = outcome.results[f"{winner.precision}/{winner.compile_mode}/{winner.micro_batch}"]
    memory = MemoryRecord(
        device_total_bytes=report.device.total_memory_bytes, budget_bytes=report.budget_bytes,
        headroom=report.headroom, usable_bytes=int(report.budget_bytes * (1 - report.headroom)),
        peak_bytes=winner.peak_bytes,
        max_micro_batch={p.memory_class.label(): p.max_micro_batch for p in report.probes},
        allocator=report.allocator,
        peak_definition=("max_memory_reserved + CUDA context" if report.device.is_cuda else
                         "address-space growth of the child over its baseline"),
    )
    return TunedConfig(
        autotune_version=__version__, created_at=datetime.now(timezone.utc).isoformat(),
        workload=report.workload, workload_name=result.workload_name,
        workload_fingerprint=result.workload_fingerprint, target_batch=report.target_batch,
        world_size=report.world_size, micro_batch=winner.micro_batch,
        accumulate_steps=winner.accumulate_steps, precision=winner.precision,
        compile_mode=winner.compile_mode, memory=memory, device=report.device,
        objective="time_to_train" if settings.train_steps else "throughput",
        train_steps=settings.train_steps, median_step_s=winner.median_step_s,
        samples_per_s=winner.samples_per_s, tokens_per_s=winner.tokens_per_s,
        baseline_samples_per_s=baseline.samples_per_s, speedup=winner.speedup,
        break_even_steps=break_even_steps(winner, baseline),
        reason=_why(winner, baseline, records), trials=records,
        skipped=report.skipped + outcome.skipped, interrupted=outcome.interrupted,
    )


def _lost(record: TrialRecord, winner: TrialRecord) -> TrialRecord:
    if record.verdict != "ok" or not record.samples_per_s or not winner.samples_per_s:
        return record
    ratio = record.samples_per_s / winner.samples_per_s
    return replace(record, reason=f"{ratio:.2f}x the winner's samples/s")


def _why(winner: TrialRecord, baseline: TrialRecord, records: tuple[TrialRecord, ...]) -> str:
    text = f"{winner.label()} won at {winner.samples_per_s:,.1f} samples/s"
    if winner.is_baseline:
        text += " (it is the baseline: nothing tried beat fp32 eager)"
    elif winner.speedup:
        noise = max(winner.spread or 0.0, baseline.spread or 0.0)
        text += f", {winner.speedup:.2f}x the baseline ({baseline.label()})"
        if winner.speedup - 1 < noise:
            text += f", within the measured noise ({noise:.0%} spread)"
    others = [r for r in records if r.verdict == "ok" and r.samples_per_s]
    if others:
        runner_up = max(others, key=lambda r: r.samples_per_s or 0.0)
        text += f"; runner-up {runner_up.label()} ({runner_up.reason})"
    return text
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
    config = read_tuned(path)
    if config.memory.budget_bytes <= 0 or not 0 <= config.memory.headroom < 1:
        raise ConfigError(f"{path}: bad memory budget {config.memory.budget_bytes} or headroom "
                          f"{config.memory.headroom}; regenerate it with `autotune search`")
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
    has_cuda = torch.cuda.is_available()
    if measure and not has_cuda:
        raise ConfigError("--measure runs a real step on a CUDA device and none is here; "
                          "use --estimate (the default on CPU-only machines)")
    usable = int(target.device_memory_bytes * (1 - target.headroom))
    label = f"{target.precision}/{target.compile_mode}"
    if measure or (measure is None and has_cuda):
        peak, how = _measure(target), f"measured on the device ({label})"
    else:
        kernels = "cpu" if target.device == "cpu" else "cuda"
        settings = dict(micro_batch=target.micro_batch,
                        device_memory=target.device_memory_bytes, precision=target.precision,
                        headroom=target.headroom, target_batch=target.target_batch,
                        world_size=target.world_size, kernels=kernels,
                        scale=target.calibration)
        step = estimate(workload or target.workload, find_max=False, **settings)
        if not step.fits():  # only then: which micro-batch would fit
            step = estimate(workload or target.workload, **settings)
        peak = step.scaled(step.estimate.peak_bytes)
        if target.calibration is not None:
            how = f"estimate calibrated by {label}'s measured/estimate ratio " \
                  f"{target.calibration:.3f}"
        else:
            how = "eager estimate, uncalibrated" + (
                f" (compile mode {target.compile_mode} cannot be traced under fake tensors)"
                if target.compile_mode != "off" else "")
    head = (f"micro-batch {target.micro_batch} x {target.accumulate_steps} ({label}): peak "
            f"{format_bytes(peak)} ({how}), usable {format_bytes(usable)} (device "
            f"{format_bytes(target.device_memory_bytes)} minus {target.headroom:.0%} headroom)")
    if peak <= usable:
        message = f"fits: {head}, margin {format_bytes(usable - peak)}"
        return CheckResult(fits=True, peak_bytes=peak, usable_bytes=usable,
                           budget_bytes=target.device_memory_bytes,
                           method="measure" if "measured" in how else "estimate",
                           message=message)
    message = f"does not fit: {head}, over by {format_bytes(peak - usable)}"
    if "measured" not in how:
        pairs = step.pairs
        message += (f"; largest that fits: micro-batch {pairs[-1][0]} with accumulate_steps "
                    f"{pairs[-1][1]}" if pairs else "; not even micro-batch 1 fits")
    return CheckResult(fits=False, peak_bytes=peak, usable_bytes=usable,
                       budget_bytes=target.device_memory_bytes,
                       method="measure" if "measured" in how else "estimate", message=message)


def _measure(target: CheckTarget) -> int:
    from autotune.config import MemoryClass

    memory_class = MemoryClass(precision=target.precision,  # type: ignore[arg-type]
                               compile_mode=target.compile_mode)  # type: ignore[arg-type]
    result = run_isolated(probe_spec(target.workload, "cuda:0", memory_class,
                                     target.micro_batch, None, 900.0))
    if not result.ok or result.peak_bytes is None:
        if result.status == "oom":
            return target.device_memory_bytes + 1
        raise WorkloadError(f"the real step failed ({result.status}): {result.message}")
    return result.peak_bytes




# ----------------------------------------------------------------------------------------------
# Delivering the result: load() for your scripts, train_autotuned.py.


def load(path: str | Path = "autotune.json", *, world_size: int | None = None,
         device_type: str | None = None) -> Tuned:
    """Load ``autotune.json`` for use in a training script.

    Args:
        path: the file ``autotune search`` wrote.
        world_size: devices of the current run (default: ``WORLD_SIZE`` from torchrun, else 1).
            It must be the one the config was tuned for: the per-device micro-batch and the
            accumulation are only right for that world size.
        device_type: ``cuda`` or ``cpu`` for autocast and the GradScaler (default: the tuned
            device's).

    Returns:
        The tuned knobs (``micro_batch``, ``accumulate_steps``, ``precision``,
        ``compile_mode``) with ``compile``, ``autocast``, ``grad_scaler``, ``train_step``,
        ``training_arguments`` and ``accelerator_kwargs``.

    Raises:
        ConfigError: the file is missing, corrupt, from another schema version, or tuned for
            another world size.
    """
    config = read_tuned(path)
    if world_size is None:
        env = os.environ.get("WORLD_SIZE", "1")
        if not env.isdigit() or int(env) < 1:
            raise ConfigError(f"WORLD_SIZE={env!r} is not a positive number of processes")
        world_size, source = int(env), f"WORLD_SIZE={env}"
    else:
        source = f"world_size={world_size}"
    if world_size != config.world_size:
        raise ConfigError(
            f"{path} was tuned for {config.world_size} device(s) (micro-batch "
            f"{config.micro_batch} x {config.accumulate_steps} accumulation per device) but this "
            f"run has {world_size} ({source}): the effective batch would be "
            f"{config.micro_batch * config.accumulate_steps * world_size}, not "
            f"{config.target_batch}. Re-run `autotune search --target-batch "
            f"{config.target_batch} --world-size {world_size}`")
    return Tuned(config, device_type=device_type)


def write_train_script(config: TunedConfig, path: str | Path, *, force: bool = False) -> Path:
    """Write ``train_autotuned.py`` (atomically) for a tuned config.

    Args:
        config: the tuned config.
        path: the script's path, or a folder to write ``train_autotuned.py`` into.
        force: overwrite an existing script.

    Raises:
        ConfigError: the script exists and ``force`` is False, or the folder is not writable.
    """
    path = Path(path)
    if path.is_dir():
        path = path / SCRIPT_NAME
    write_json_atomic(path, render_train_script(config, script_dir=path.parent), force=force)
    return path


def codegen(config_path: str | Path, *, workload: str | None = None, out: str | Path = ".",
            force: bool = False) -> Path:
    """Write ``train_autotuned.py`` from an ``autotune.json`` (``autotune codegen``).

    Args:
        config_path: the ``autotune.json`` to read.
        workload: ``path/to/file.py:factory`` to use instead of the one the file names (e.g.
            when the script moved to another machine).
        out: folder for the script.
        force: overwrite an existing script.

    Raises:
        ConfigError: a missing or bad ``autotune.json``, a bad ``--workload``, an existing
            script without ``force``.
    """
    config = read_tuned(config_path)
    if workload is not None:
        config = replace(config, workload=workload_spec(workload=workload))
    return write_train_script(config, Path(out) / SCRIPT_NAME, force=force)
