"""The pipeline in readable lines: probe memory, search, pick, write autotune.json."""

from __future__ import annotations

import os
import signal
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.api.deliver import with_compile_artifacts, write_outputs
from autotune.api.fit import estimate
from autotune.api.nothing_fits import failed_eager, nothing_fits, uncapped_run
from autotune.api.request import Budget, TuneRequest
from autotune.api.settings import check_settings
from autotune.artifacts import artifacts_name
from autotune.config import (
    DeviceInfo,
    Knobs,
    MemoryProbe,
    ProbeReport,
    StopReason,
    TrialResult,
    WorkloadSpec,
)
from autotune.device import describe_device
from autotune.errors import (
    AutotuneError,
    ConfigError,
    Interrupted,
)
from autotune.files import check_output
from autotune.knobs import BASELINE, job_baseline
from autotune.memory import OnStep, broken_uncapped, hint_for, probe_memory
from autotune.names import KEYWORDS, Names
from autotune.runner import allocator_notes
from autotune.schema import SearchResult, SkipRecord, TunedConfig
from autotune.search import (
    Ledger,
    OnTrial,
    SearchOutcome,
    SearchSettings,
    recall,
    remember,
    run_search,
    thread_slots,
    tuned_config,
)
from autotune.signals import SignalGuard, guarded, interrupted_by
from autotune.space import divisors, timed_precisions


def probe(
    request: TuneRequest | WorkloadSpec | None = None,
    *,
    timeout_s: float = 900.0,
    on_step: OnStep | None = None,
    include_baseline: bool = False,
    name: Names = KEYWORDS,
    **fields: Any,
) -> ProbeReport:
    """Probe the largest micro-batch that fits for each (precision, compile mode) setting.

    Args:
        request: what to probe (a ``TuneRequest``; or its fields as keywords, with a
            workload spec or None for the built-in workload here).
        timeout_s: per child process.
        on_step: progress callback after each probe.
        include_baseline: also probe fp32 eager (the search's baseline) when restricted out.
        name: how the user wrote the settings, for the messages (``names.FLAGS`` on the
            command line).
        **fields: ``TuneRequest`` fields when ``request`` is not one.

    Raises:
        ConfigError: bad settings (all reported at once). WorkloadError: the workload fails.
        NoFeasibleConfigError: not even the smallest micro-batch fits in any setting.
    """
    request = as_request(request, fields, name, timeout_s=timeout_s, on_step=on_step,
                         include_baseline=include_baseline)
    info = describe_device(request.device)
    plan, classes, budget, values = _plan(request, info, include_baseline, name)
    # Each strategy asked for is a job of its own: probe every one (DDP's and FSDP's largest
    # micro-batch side by side).
    classes = tuple(dict.fromkeys(c.with_(strategy=s) for c in classes
                                  for s in values["strategy"]))
    candidates = divisors(plan.per_device_batch())
    probes: list[MemoryProbe] = []
    uncapped: dict[Knobs, TrialResult] = {}
    for knobs in classes:
        probes.append(probe_memory(
            plan.workload, info.device, knobs, candidates,
            budget_bytes=budget.budget_bytes, usable_bytes=budget.usable_bytes,
            timeout_s=timeout_s, hint=hint_for(knobs, probes), on_step=on_step,
            ranks=plan.nproc_per_node))
        if not uncapped and failed_eager(probes[-1], ("crash",)):  # the cap's doing? one run
            uncapped[knobs] = uncapped_run(plan.workload, info, knobs, candidates[0],
                                           timeout_s, plan.nproc_per_node)
        if failed_eager(probes[-1]) or (knobs in uncapped and broken_uncapped(
                uncapped[knobs], budget.usable_bytes)):  # broken whatever is tried: say so now
            raise nothing_fits(plan.workload, info, budget, probes[-1], timeout_s,
                               ranks=plan.nproc_per_node, uncapped=uncapped.get(knobs), name=name)
    if not any(p.max_micro_batch for p in probes):
        raise nothing_fits(plan.workload, info, budget, probes[0], timeout_s,
                           ranks=plan.nproc_per_node, uncapped=uncapped.get(probes[0].knobs),
                           name=name)
    return replace(plan, probes=tuple(probes))


def as_request(request: TuneRequest | WorkloadSpec | None, fields: dict[str, Any],
               name: Names = KEYWORDS, **settings: Any) -> TuneRequest:
    """A ``TuneRequest``: the one given, or one made of a workload spec and keyword fields;
    checked with the other ``settings`` first (``check_settings``: before anything starts,
    every problem at once).

    Raises:
        ConfigError: a setting of the wrong type or out of range, a field that is none, or
            fields given beside a request.
    """
    given = isinstance(request, TuneRequest)
    search = settings.pop("settings", None)
    check_settings(name, request if given else None,
                   search if isinstance(search, SearchSettings) else None,
                   request_fields=fields, **settings,
                   **({"settings": search} if search is not None else {}),
                   **({} if given else {"workload": request or WorkloadSpec()}))
    if given:
        if fields:
            raise ConfigError(f"give a TuneRequest or its fields, not both ({sorted(fields)})")
        return request
    return TuneRequest(workload=request or WorkloadSpec(), **fields)


def _plan(request: TuneRequest, info: DeviceInfo, include_baseline: bool, name: Names
          ) -> tuple[ProbeReport, tuple[Knobs, ...], Budget, dict[str, tuple[str, ...]]]:
    """What to probe: the report without probes, the settings in order, the budget, and the
    further knobs' values."""
    target_batch, budget, classes, values, skipped = request.validate(info, name)
    baseline = job_baseline(values["strategy"][0])
    if include_baseline and baseline not in classes:
        classes = (baseline, *classes)
        skipped = (*skipped, "fp32/off probed and timed as the baseline, outside the restriction")
    plan = ProbeReport(workload=request.workload, device=info, target_batch=target_batch,
                       world_size=request.world_size, headroom=request.headroom,
                       nproc_per_node=request.nproc_per_node,
                       budget_bytes=budget.budget_bytes, probes=(), skipped=skipped,
                       allocator=allocator_notes(info.device),
                       requested_batch=(request.target_batch
                                        if request.target_batch != target_batch else None))
    return plan, classes, budget, values


def env(device: str | None = None) -> DeviceInfo:
    """The device facts autotune uses (torch, CUDA, name, memory, precision support)."""
    return describe_device(device)



def search(
    request: TuneRequest | WorkloadSpec | None = None,
    *,
    out: str | Path | None = ".",
    force: bool = False,
    settings: SearchSettings | None = None,
    on_step: OnStep | None = None,
    on_trial: OnTrial | None = None,
    name: Names = KEYWORDS,
    **fields: Any,
) -> SearchResult:
    """Probe memory per setting, time candidates (baseline first), screen the further knobs
    on the leader, write ``autotune.json`` (and, for a compiled winner, its compiled artifacts
    for the first launch beside it: docs/compile.md).

    Args:
        request: what to tune (a ``TuneRequest``; or its fields as keywords, with a workload
            spec or None for the built-in workload here).
        out: folder for ``autotune.json`` (None: write nothing).
        force: overwrite an existing ``autotune.json``.
        settings: trial counts, time budget, objective, Optuna storage.
        on_step: progress after each memory probe.
        on_trial: progress before and after each timed trial.
        name: how the user wrote the settings, for the messages (``names.FLAGS`` on the
            command line).
        **fields: ``TuneRequest`` fields when ``request`` is not one.

    Raises:
        ConfigError: bad settings, an existing output without ``force``, a bad storage.
        WorkloadError: the workload fails.
        NoFeasibleConfigError: nothing fits, or no candidate ran.
    """
    request = as_request(request, fields, name, settings=settings, out=out, force=force,
                         on_step=on_step, on_trial=on_trial)
    settings = settings or SearchSettings()
    started = time.monotonic()
    path = Path(out) / "autotune.json" if out is not None else None
    script = Path(out) / "train_autotuned.py" if out is not None else None
    info = describe_device(request.device)
    precisions, not_timed = timed_precisions(info, request.precisions)
    plan, classes, budget, values = _plan(replace(request, precisions=precisions), info, True,
                                          name)
    if path is not None and script is not None:  # after the request's own problems, all said
        for output in (path, script, path.with_suffix(".html"),  # the report beside it
                       path.with_name(artifacts_name(path))):  # compiled artifacts
            _check_writable(output, force, name)
    # From here a signal ends a stage (the first one) or waits for the writes: once a run is
    # timed there is a result, and no Ctrl-C or SIGTERM may cost it (autotune.signals).
    with guarded() as guard:
        outcome = run_search(plan, classes, settings, values=values, on_trial=on_trial,
                             on_step=on_step, guard=guard,
                             slots=thread_slots(info.device, request.slots(info),
                                                plan.nproc_per_node))
        report = replace(plan, probes=outcome.probes, skipped=plan.skipped + not_timed)
        if outcome.baseline is None or outcome.baseline not in outcome.results:
            if outcome.interrupted and outcome.stop_reason.by_signal:
                raise Interrupted(*_signal_of(outcome.stop_reason))
            crashed = outcome.uncapped is None and any(
                failed_eager(p, ("crash",)) for p in outcome.probes[:1])
            if outcome.interrupted and crashed:  # the crash is all that is known: say it
                raise nothing_fits(plan.workload, info, budget, outcome.probes[0], None,
                                   name=name)
            if outcome.interrupted:  # a limit, not a memory verdict
                raise ConfigError(
                    f"{outcome.stop_reason.stopped_by} before fp32 eager (the baseline) was "
                    f"measured: nothing to compare with; allow more {name('time_budget_s')} or "
                    f"{name('max_trials')}")
            with guard.armed():  # it may run one more child: nothing to keep if stopped
                raise nothing_fits(plan.workload, info, budget, outcome.probes[0],
                                   _time_left(settings, started), outcome.results,
                                   scope="in fp32 eager (the baseline, measured first)",
                                   ranks=plan.nproc_per_node, uncapped=outcome.uncapped,
                                   name=name)
        config, stop_reason = _finish(report, outcome, settings, started, guard)
        writer = outcome.ledger.outputs_by() if outcome.ledger is not None else ""
        if writer and path is not None:  # --join: the first node to end writes them, once
            config, path = _written_elsewhere(config, writer, path), None
        if path is not None and script is not None:  # both checked before the search began
            runs_left = settings.max_trials - outcome.num_runs - len(config.memory.calibration)
            config, saved = with_compile_artifacts(
                config, path, _time_left(settings, started) if runs_left > 0 else None, guard)
            write_outputs(config, path, script, force=force, artifacts=saved)
    if guard.held:  # a signal after the search: acted on now that the result is written
        stopped = interrupted_by(guard.held[0])
        stopped.written = path  # type: ignore[attr-defined]
        raise stopped
    return SearchResult(config=config, path=path, probe=report, stop_reason=stop_reason)


def _finish(report: ProbeReport, outcome: SearchOutcome, settings: SearchSettings,
            started: float, guard: SignalGuard) -> tuple[TunedConfig, StopReason]:
    """The tuned config of a search's outcome, calibrated for ``autotune check`` where the
    limits leave room (a signal ends the calibration only), and the reason the search ended."""
    config = tuned_config(report, outcome, settings)
    stop_reason = outcome.stop_reason
    if outcome.interrupted:  # a limit or a signal: say which, not "interrupted" for both
        config = replace(config, stopped_by=stop_reason.stopped_by)
    timeout_s = _time_left(settings, started)
    runs_left = settings.max_trials - outcome.num_runs
    if (outcome.interrupted or timeout_s is None or runs_left <= 0
            or config.knobs.distributed):
        why = ("the search was interrupted" if stop_reason.by_signal else
               f"the search stopped early: {config.stopped_by}" if outcome.interrupted else
               "the time budget is spent" if timeout_s is None else
               "--max-trials reached" if runs_left <= 0 else
               f"the estimator traces one process, not a job of {config.knobs.strategy} ranks")
        return replace(config, skips=(*config.skips, SkipRecord(
            rule="calibration", text=f"no estimator calibration: {why}"))), stop_reason
    try:
        with guard.armed():
            calibration, notes = _calibrate(report, config, timeout_s, runs_left, outcome.ledger)
        config = replace(config, memory=replace(config.memory, calibration=calibration),
                         skips=(*config.skips, *(SkipRecord(rule="calibration", text=n)
                                                 for n in notes)),
                         study=outcome.ledger.record if outcome.ledger else config.study)
    except KeyboardInterrupt as exc:  # the search is done: keep its result
        stop_reason = StopReason.signal(exc, "calibrating")
        config = replace(config, interrupted=True, stopped_by=stop_reason.stopped_by, skips=(
                *config.skips, SkipRecord(rule="calibration",
                                                text="no estimator calibration: interrupted")))
    return config, stop_reason


def _signal_of(stop_reason: StopReason) -> tuple[str, int]:
    name = stop_reason.detail
    number = getattr(signal, name, signal.SIGINT) if name.startswith("SIG") else signal.SIGINT
    return signal.Signals(number).name, int(number)


def _time_left(settings: SearchSettings, started: float) -> float | None:
    """The timeout of a child run after the search: the per-child limit within what is left
    of ``--time-budget``; None when too little is left to start one."""
    if settings.time_budget_s is None:
        return settings.timeout_s
    left = settings.time_budget_s - (time.monotonic() - started)
    return min(settings.timeout_s, left) if left >= 1.0 else None


def _calibrate(report: ProbeReport, config: TunedConfig, timeout_s: float, runs_left: int,
               ledger: Ledger | None = None) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Measured peak and the estimator's figure for the same config, for the winner's class
    and fp32 eager: ``autotune check`` corrects later estimates with them. Each estimate runs
    in a child under the search's limits (``timeout_s`` in all, ``runs_left`` children)."""
    calibration, notes = {}, []
    deadline = time.monotonic() + timeout_s
    for probe in report.probes:
        label = probe.knobs.label()
        if label not in (config.memory_class(), BASELINE.label()) or not probe.peak_bytes:
            continue
        left = deadline - time.monotonic()
        if left < 1.0 or runs_left <= 0:
            notes.append(f"no estimator calibration for {label}: "
                         + ("the time budget is spent" if left < 1.0 else "--max-trials reached"))
            continue
        runs_left -= 1
        # A second measured point, far enough below the boundary for its growth to show
        # over the noise, lets the check calibrate per-sample growth apart from the constant.
        m = probe.max_micro_batch
        lower = [s for s in probe.steps if s.status == "ok" and s.peak_bytes and
                 2 * s.micro_batch <= m]
        point = max(lower, key=lambda s: s.micro_batch, default=None)
        # The estimator's figures depend only on what the study's key holds (the workload,
        # the knobs, the micro-batches): a repeated search takes them from its study.
        kept = f"estimate:{label}:{m}:{point.micro_batch if point else 0}"
        traced = recall(ledger, kept)
        if not (isinstance(traced, dict) and all(isinstance(v, int) for v in traced.values())
                and str(m) in traced):
            try:
                figure = estimate(report.workload, micro_batch=m,
                                  device_memory=report.device.total_memory_bytes,
                                  knobs=probe.knobs,
                                  kernels="cuda" if report.device.is_cuda else "cpu",
                                  find_max=False, timeout_s=left,
                                  also_trace=(point.micro_batch,) if point else ())
            except AutotuneError as exc:  # a step the fake-tensor trace cannot follow
                notes.append(f"no estimator calibration for {label}: "
                             f"{str(exc).splitlines()[0]}")
                continue
            traced = {str(k): v for k, v in figure.traced} | {
                str(m): figure.estimate.peak_bytes}
            remember(ledger, kept, traced)
        record = {"measured_peak_bytes": probe.peak_bytes,
                  "estimate_bytes": traced[str(m)], "micro_batch": m}
        traced = {int(k): v for k, v in traced.items()}
        if point is not None and point.peak_bytes and point.micro_batch in traced:
            record.update(growth_micro_batch=point.micro_batch,
                          growth_measured_peak_bytes=point.peak_bytes,
                          growth_estimate_bytes=traced[point.micro_batch])
        calibration[label] = record
    return calibration, notes


def _written_elsewhere(config: TunedConfig, writer: str, path: Path) -> TunedConfig:
    """A joined search whose outputs another node writes (the first to end): ``path`` is
    not written here, and the config's study note (the footer) and a warning say who does."""
    line = (f"the outputs are written by {writer}, the first of the joined searches to end "
            f"(--join): this node writes no {path}")
    warnings.warn(line, stacklevel=3)
    study = config.study
    return replace(config, study=replace(study, note="; ".join(filter(None, (
        study.note, line))))) if study is not None else config


def _check_writable(path: Path, force: bool, name: Names) -> None:
    check_output(path, force=force, name=name)  # what writing it refuses, said before the search
    folder = path.parent
    existing = folder if folder.exists() else next(
        (p for p in folder.parents if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(f"{name.given('out', str(folder))} is not writable; choose a folder "
                          "you can write to")
