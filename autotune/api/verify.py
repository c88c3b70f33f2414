"""``verify()``: a tuned config run as a user's loop runs it, beside what the search reported.

The step is the library's (``cfg.apply``, ``cfg.build_optimizer``, ``cfg.compile``,
``cfg.train_step``: the step every trial measures), in a fresh child capped at the config's
budget as the search's probes are, as a first launch runs it (compiled from nothing unless
the saved compiled artifacts apply): ``autotune.user_loop``. Its samples/s (median of the
timed steps, warm-up excluded) and its peak, counted as the search counts it, are said beside
the figures ``autotune.json`` reports, with their ratios (issue 62).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from autotune.api.request import workload_file_here
from autotune.config import TrialSpec, WorkloadSpec
from autotune.device import backend_for
from autotune.errors import MEMORY_STATUS, ConfigError, error_for_status
from autotune.schema import TunedConfig
from autotune.tuned_file import read_tuned
from autotune.units import format_bytes
from autotune.user_loop import UserLoopRun, capped_device, run_user_loop

DEFAULT_TIMED_STEPS = 10
"""Timed steps of the loop (the search's own default, ``SearchSettings.num_timed_steps``)."""
WARMUP_STEPS = 2
"""Steps before timing (the compile in them): a probe's and a trial's."""
MAX_TIMED_STEPS = 10_000


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """A tuned config's loop as measured here, beside what its search reported."""

    as_reported: bool
    """Its peak within ``limit_bytes`` (the reported peak plus the config's headroom): the
    exit code's verdict (``autotune verify`` exits 1 where it is false)."""
    peak_bytes: int | None
    """Its peak as the search counts it (None: it ran out of memory under the cap)."""
    reported_peak_bytes: int | None
    """``memory.peak_bytes`` of the file."""
    limit_bytes: int
    """The most the peak may be and still be as reported: the reported peak plus the
    config's headroom share of it (``memory.headroom``); the usable bytes (the budget less
    headroom) where the file reports no peak."""
    usable_bytes: int
    budget_bytes: int
    samples_per_s: float | None
    """Samples over the median timed step."""
    reported_samples_per_s: float | None
    """``samples_per_s`` of the file (None also where the two are not comparable: the search
    timed the declared lengths, this loop the worst case)."""
    run: UserLoopRun
    """The child's run: its steps, compile and what the library said."""
    lines: tuple[str, ...]
    """What ``autotune verify`` prints."""


def peak_limit(reported_peak_bytes: int | None, headroom: float, usable_bytes: int) -> int:
    """The largest peak that is the reported one within the config's headroom: a measured
    peak above it is not what the search reported (``VerifyResult.limit_bytes``)."""
    if not reported_peak_bytes:
        return usable_bytes
    return int(reported_peak_bytes * (1 + headroom))


def verify(path: str | Path = "autotune.json", *, workload: WorkloadSpec | None = None,
           num_timed_steps: int = DEFAULT_TIMED_STEPS, timeout_s: float = 600.0
           ) -> VerifyResult:
    """Run ``autotune.json``'s config as a user's loop runs it and compare with the report.

    Args:
        path: the ``autotune.json`` to verify.
        workload: a spec to use instead of the file's (e.g. the workload file moved).
        num_timed_steps: optimizer steps timed after ``WARMUP_STEPS``.
        timeout_s: the child's limit, start-up and compile included.

    Raises:
        ConfigError: a missing or bad file, a workload file that is not where it says, a
            config of a device that is not here, a job of several ranks, bad settings.
        WorkloadError: the loop fails other than by running out of memory (a crash, a hang,
            a non-finite loss, the workload raised).
    """
    problems = []
    if not 1 <= num_timed_steps <= MAX_TIMED_STEPS:
        problems.append(f"timed steps must be 1 to {MAX_TIMED_STEPS}, got {num_timed_steps}")
    if not timeout_s > 0:
        problems.append(f"timeout must be a positive number of seconds, got {timeout_s}")
    if problems:
        raise ConfigError("; ".join(problems))
    config = read_tuned(path)
    if workload is None:
        workload_file_here(config.workload, path)
    else:
        config = replace(config, workload=workload)
    device = _device_here(config, path)
    spec = TrialSpec(workload=config.workload, device=device, micro_batch=config.micro_batch,
                     accumulate_steps=config.accumulate_steps, knobs=config.knobs,
                     num_warmup_steps=WARMUP_STEPS, num_timed_steps=num_timed_steps,
                     memory_budget_bytes=config.memory.budget_bytes, timeout_s=timeout_s,
                     cold_compile=True)
    run = run_user_loop(config, Path(path).absolute().parent, spec)
    result = run.result
    if result.status == "unsupported":
        raise ConfigError(f"the workload cannot take {config.knobs.label()}: {result.message}")
    if not result.ok and result.status != MEMORY_STATUS:
        raise error_for_status(result.status, (
            f"the loop of {config.knobs.label()} {config.micro_batch}x"
            f"{config.accumulate_steps} failed, which is not a memory verdict "
            f"[{result.status}]: {result.message}"))
    peak = result.peak_bytes if result.ok else None
    mem = config.memory
    limit = peak_limit(mem.peak_bytes, mem.headroom, mem.usable_bytes)
    reported_sps = None if run.varied_lengths else config.samples_per_s
    found = VerifyResult(
        as_reported=peak is not None and peak <= limit, peak_bytes=peak,
        reported_peak_bytes=mem.peak_bytes, limit_bytes=limit, usable_bytes=mem.usable_bytes,
        budget_bytes=config.memory.budget_bytes, samples_per_s=result.samples_per_s(),
        reported_samples_per_s=reported_sps, run=run, lines=())
    return replace(found, lines=_lines(found, config, path, device))


def _device_here(config: TunedConfig, path: str | Path) -> str:
    """The device the loop runs on here: the config's kind, capped at its budget.

    Raises:
        ConfigError: its kind is not here, it runs as a job of ranks, or a child's cap
            cannot hold its budget here.
    """
    import torch

    tuned = config.device.device
    if tuned != "cpu" and not torch.cuda.is_available():
        raise ConfigError(
            f"{path} was tuned on {tuned} ({config.device.name}) and this machine has no CUDA "
            "device: verify runs the config where it was tuned, on that kind of device; run "
            "it there (here `autotune check` estimates its memory without one)")
    if config.knobs.distributed or config.world_size != 1:
        raise ConfigError(
            f"{path} runs as a job of {config.world_size} ranks (strategy "
            f"{config.knobs.strategy}): verify runs one process; `autotune check --measure` "
            "measures a job's step on a machine with its devices")
    return capped_device(tuned, config.memory.budget_bytes,
                         instead="use `autotune check` (the estimator)")


def _ratio(measured: float | None, reported: float | None) -> str:
    return f": {measured / reported:.2f}x" if measured and reported else ""


def _lines(found: VerifyResult, config: TunedConfig, path: str | Path,
           device: str) -> tuple[str, ...]:
    """What ``autotune verify`` prints: how the loop ran, its samples/s and peak beside the
    reported ones with their ratios, how the peak is counted, and the verdict."""
    run, result = found.run, found.run.result
    lines = [f"{path}: {config.knobs.label()} {config.micro_batch}x{config.accumulate_steps} "
             f"on {device}, run as your loop runs it (cfg.apply, cfg.build_optimizer, "
             f"cfg.compile, cfg.train_step) in a fresh child capped at "
             f"{format_bytes(found.budget_bytes)}"]
    if config.compiled:
        how = run.artifacts or "no compiled artifacts beside it: compiled from nothing"
        lines.append(f"compile: {how}; warm-up {result.warmup_s or 0:,.1f} s "
                     f"({WARMUP_STEPS} steps, not timed)")
    if found.samples_per_s is not None:
        reported = (f"{found.reported_samples_per_s:,.1f} reported"
                    if found.reported_samples_per_s else
                    "not compared: the search timed the declared lengths, this loop the "
                    "worst case" if run.varied_lengths else "none reported")
        lines.append(f"samples/s: {found.samples_per_s:,.1f} measured (median of "
                     f"{len(result.step_times_s)} timed steps), {reported}"
                     + _ratio(found.samples_per_s, found.reported_samples_per_s))
    reported_peak = (f"{format_bytes(found.reported_peak_bytes)} reported"
                     if found.reported_peak_bytes else "none reported")
    if found.peak_bytes is not None:
        lines.append(f"peak: {format_bytes(found.peak_bytes)} measured, {reported_peak}"
                     + _ratio(found.peak_bytes, found.reported_peak_bytes))
    else:
        lines.append(f"peak: over the {format_bytes(found.budget_bytes)} cap (the loop ran "
                     f"out of memory: {(result.message or 'out of memory').splitlines()[0]}), "
                     f"{reported_peak}")
    lines.append(f"the peak counts {backend_for(device).peak_counted}")
    here = backend_for(device).describe(device).name
    if here != config.device.name:
        lines.append(f"note: tuned on {config.device.name}, run here on {here}: its samples/s "
                     "are this device's")
    lines += [f"note: {text}" for text in run.warnings]
    if config.memory.peak_verified is False:
        lines.append(f"the search's peak was unverified as a first launch: "
                     f"{config.memory.peak_unverified or 'not checked'}")
    headroom = config.memory.headroom
    limit = (f"{format_bytes(found.limit_bytes)} (the reported "
             f"{format_bytes(found.reported_peak_bytes)} plus its {headroom:.0%} headroom)"
             if found.reported_peak_bytes else
             f"{format_bytes(found.limit_bytes)} usable (no peak reported: the "
             f"{format_bytes(found.budget_bytes)} budget less {headroom:.0%} headroom)")
    if found.peak_bytes is None:
        lines.append(f"not as reported: over {limit} (the loop ran out of memory under its "
                     f"{format_bytes(found.budget_bytes)} cap)")
    elif found.as_reported:
        lines.append(f"as reported: the peak is within {limit}, margin "
                     f"{format_bytes(found.limit_bytes - found.peak_bytes)}; "
                     + ("within" if found.peak_bytes <= found.usable_bytes else "over")
                     + f" the {format_bytes(found.usable_bytes)} usable")
    else:
        lines.append(f"not as reported: the peak is over {limit} by "
                     f"{format_bytes(found.peak_bytes - found.limit_bytes)}")
    return tuple(lines)
