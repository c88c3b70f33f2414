"""What ``check`` reads of an ``autotune.json``: the ``CheckTarget`` (the config, its budget
and calibration, where it was tuned) and the largest peak the search measured of the config
itself, which an estimate below it does not replace.

Apart from ``api.fit`` because it reads the tuned file and nothing else: ``check`` then
estimates or measures the target, however it was made (a file, or ``testing.assert_fits``'s own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.api.request import workload_file_here
from autotune.config import WorkloadSpec
from autotune.estimate.calibration import Calibration
from autotune.knobs import Knobs
from autotune.report import peak_unverified_line
from autotune.schema import TunedConfig
from autotune.tuned_file import read_tuned


@dataclass(frozen=True, kw_only=True)
class CheckTarget:
    """What ``check`` needs from ``autotune.json`` (read in one place: ``read_target``)."""

    workload: WorkloadSpec
    micro_batch: int
    accumulate_steps: int
    target_batch: int
    world_size: int
    knobs: Knobs
    """The tuned knobs: the step is estimated with them (a compile mode traced eager)."""
    device_memory_bytes: int
    headroom: float
    calibration: Calibration | None
    """The search's measurement of this config's knobs, when it recorded one."""
    device: str = "cuda"
    """Where the config was tuned (``cpu`` or ``cuda:N``): whose kernels the estimate models."""
    nproc_per_node: int = 1
    """Ranks a measured step runs as one job (the search's)."""
    measured_peak_bytes: int | None = None
    """The most a complete run of this very config (knobs and micro-batch) peaked at in the
    search, when the file records one: an estimate below it is not the config's peak."""
    device_total_bytes: int | None = None
    """The memory of the device it was tuned on: a budget asked for is at most this."""
    asked: str = ""
    """The budget the user asked for instead of the file's (``--memory-budget 16GiB``)."""
    peak_unverified: str = ""
    """That the search did not check the config's fit as a first launch, and why
    (``report.peak_unverified_line``): said beside the verdict ("" otherwise)."""


def read_target(path: str | Path, workload: WorkloadSpec | None = None) -> CheckTarget:
    """Read the fields ``check`` needs from an ``autotune.json`` (validated on read).

    Raises:
        ConfigError: missing or unreadable file, not JSON, another schema, or bad fields; a
            workload file that is not where ``workload.target`` says (without ``workload``).
    """
    config = read_tuned(path)
    if workload is None:
        workload_file_here(config.workload, path)
    label = config.knobs.label()
    record = config.memory.calibration.get(label)
    calibration = Calibration.from_record(record, label) if record else None
    return CheckTarget(
        workload=workload or config.workload, micro_batch=config.micro_batch,
        accumulate_steps=config.accumulate_steps, target_batch=config.target_batch,
        world_size=config.world_size, knobs=config.knobs,
        device_memory_bytes=config.memory.budget_bytes,
        headroom=config.memory.headroom, calibration=calibration, device=config.device.device,
        nproc_per_node=config.nproc_per_node, measured_peak_bytes=_measured_peak(config),
        device_total_bytes=config.memory.device_total_bytes,
        peak_unverified=peak_unverified_line(config))


_COMPLETE = ("winner", "ok", "slower", "numerics", "over_budget")
"""Verdicts of trials that ran their steps: their peaks are the config's, not a failure's."""


def _measured_peak(config: TunedConfig) -> int | None:
    """The largest peak the search measured for the config itself (its knobs and
    micro-batch): its complete trials and runs, and its calibration at that micro-batch."""
    peaks = [r.peak_bytes for r in (*config.trials, *config.runs)
             if r.knobs == config.knobs and r.micro_batch == config.micro_batch
             and r.peak_bytes and getattr(r, "verdict", getattr(r, "status", "")) in _COMPLETE]
    record = config.memory.calibration.get(config.knobs.label(), {})
    if record.get("micro_batch") == config.micro_batch:
        peaks.append(record.get("measured_peak_bytes", 0))
    return max(peaks, default=0) or None
