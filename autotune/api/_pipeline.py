"""The pipeline in readable lines: probe memory, search, pick, write autotune.json."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from autotune import __version__
from autotune.api._deliver import write_train_script
from autotune.api._fit import estimate
from autotune.api._settings import Budget, resolve_budget
from autotune.config import (
    BASELINE_CLASS,
    DeviceInfo,
    MemoryClass,
    MemoryProbe,
    ProbeReport,
    WorkloadSpec,
    format_bytes,
)
from autotune.device import describe_device
from autotune.errors import (
    AutotuneError,
    ConfigError,
    NoFeasibleConfigError,
    OutputExistsError,
)
from autotune.memory import OnStep, hint_for, probe_memory, probe_spec
from autotune.runner import allocator_notes, run_isolated
from autotune.schema import (
    MemoryRecord,
    SearchResult,
    TrialRecord,
    TunedConfig,
    save_tuned,
)
from autotune.search import (
    OnTrial,
    SearchOutcome,
    SearchSettings,
    break_even_steps,
    flops_per_sample,
    pick_winner,
    run_search,
)
from autotune.space import (
    divisors,
    exact_target,
    memory_classes,
    per_device_batch,
    timed_precisions,
)


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
    allow_inexact: bool = False,
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
        allow_inexact: when the world size does not divide the target, tune the nearest
            exact effective batch (reported) instead of refusing.

    Raises:
        ConfigError: bad settings. WorkloadError: the workload fails.
        NoFeasibleConfigError: not even the smallest micro-batch fits in any class.
    """
    info = describe_device(device)
    plan, classes, budget = _plan(workload, target_batch, world_size, info, memory_budget,
                                  headroom, precisions, compile_modes, include_baseline,
                                  allow_inexact)
    candidates = divisors(plan.per_device_batch())
    probes: list[MemoryProbe] = []
    for memory_class in classes:
        probes.append(probe_memory(
            plan.workload, info.device, memory_class, candidates,
            budget_bytes=budget.budget_bytes, usable_bytes=budget.usable_bytes,
            timeout_s=timeout_s, hint=hint_for(memory_class, probes), on_step=on_step))
    if not any(p.max_micro_batch for p in probes):
        raise NoFeasibleConfigError(_nothing_fits(plan.workload, info, budget, probes[0],
                                                  timeout_s))
    return replace(plan, probes=tuple(probes))


def _plan(workload: WorkloadSpec | None, target_batch: int, world_size: int, info: DeviceInfo,
          memory_budget: str | int | None, headroom: float, precisions: Sequence[str] | None,
          compile_modes: Sequence[str] | None, include_baseline: bool,
          allow_inexact: bool) -> tuple[ProbeReport, tuple[MemoryClass, ...], Budget]:
    """What to probe: the report without probes, the classes in order, and the budget."""
    requested = target_batch
    target_batch = exact_target(target_batch, world_size, allow_inexact)
    per_device_batch(target_batch, world_size)
    budget = resolve_budget(info, memory_budget, headroom)
    classes, skipped = memory_classes(info, precisions, compile_modes)
    if include_baseline and BASELINE_CLASS not in classes:
        classes = (BASELINE_CLASS, *classes)
        skipped = (*skipped, "fp32/off probed and timed as the baseline, outside the restriction")
    plan = ProbeReport(workload=workload or WorkloadSpec(), device=info,
                       target_batch=target_batch, world_size=world_size, headroom=headroom,
                       budget_bytes=budget.budget_bytes, probes=(), skipped=skipped,
                       allocator=allocator_notes(info.device),
                       requested_batch=requested if requested != target_batch else None)
    return plan, classes, budget


def _nothing_fits(workload: WorkloadSpec, info: DeviceInfo, budget: Budget,
                  first: MemoryProbe, timeout_s: float,
                  scope: str = "with any precision or compile mode tried") -> str:
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
        f"{scope}: {need}. Try a larger --memory-budget, "
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
    allow_inexact: bool = False,
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
        allow_inexact: tune the nearest exact effective batch when the world size does not
            divide the target (the deviation is reported).

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
    precisions, not_timed = timed_precisions(info, precisions)
    plan, classes, budget = _plan(workload, target_batch, world_size, info, memory_budget,
                                  headroom, precisions, compile_modes, True, allow_inexact)
    outcome = run_search(plan, classes, settings, on_trial=on_trial, on_step=on_step)
    report = replace(plan, probes=outcome.probes, skipped=plan.skipped + not_timed)
    if outcome.baseline is None or outcome.baseline.key() not in outcome.results:
        if outcome.interrupted and "Ctrl-C" in outcome.stop_reason:
            raise KeyboardInterrupt
        if outcome.interrupted:
            raise NoFeasibleConfigError(
                f"{outcome.stop_reason.split(':')[0]} before fp32 eager (the baseline) was "
                "measured: nothing to compare with; allow more time or trials")
        raise NoFeasibleConfigError(_nothing_fits(
            plan.workload, info, budget, outcome.probes[0], settings.timeout_s,
            scope="in fp32 eager (the baseline, measured first)"))
    config = tuned_config(report, outcome, settings)
    config = replace(config, memory=replace(config.memory, calibration=_calibrate(report, config)))
    if path is not None and script is not None:  # checked before the search began, and
        save_tuned(config, path, force=force)  # never replaced if another run wrote them since
        write_train_script(config, script, force=force)
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
        raise OutputExistsError(path)
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
    assert outcome.baseline is not None, "search() refuses an outcome without a baseline"
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
        headroom=report.headroom, usable_bytes=report.usable_bytes(),
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
        requested_batch=report.requested_batch,
        world_size=report.world_size, micro_batch=winner.micro_batch,
        accumulate_steps=winner.accumulate_steps, precision=winner.precision,
        compile_mode=winner.compile_mode, memory=memory, device=report.device,
        objective="time_to_train" if settings.train_steps else "throughput",
        train_steps=settings.train_steps, median_step_s=winner.median_step_s,
        samples_per_s=winner.samples_per_s, tokens_per_s=winner.tokens_per_s,
        flops_per_sample=flops_per_sample(outcome.results.get(outcome.baseline.key())),
        mfu=winner.mfu,
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
