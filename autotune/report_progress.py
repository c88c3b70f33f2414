"""The search's progress for people: its first line (the device it runs on), a line per
probe and per run as each ends, and the count of runs with the time left. No torch import.

Each line's fields are as wide as 80 columns hold; the CLI wraps a longer one between words
(``report_width.wrap``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from autotune.config import DeviceInfo, ProbeStep
from autotune.schema import TrialRecord
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.search.forecast import RunCount


def start_line(workload: str, device: DeviceInfo | None, target_batch: int) -> str:
    """The search's first line, printed before anything is run: the device it runs on
    (``device_words``; None where the device asked for is not there: the search says so)."""
    where = f" on {device_words(device)}" if device is not None else ""
    return (f"autotune search: probing the memory of {workload}{where} for target batch "
            f"{target_batch} (each run is a fresh child process; this takes minutes)")


def device_words(info: DeviceInfo) -> str:
    """The device a search runs on, as people name it: ``cpu (Intel Xeon, 2 cores)``,
    ``cuda:0 NVIDIA H200``."""
    if info.is_cuda:
        return f"{info.device} {info.name}"
    return f"{info.device} ({info.name}, {os.cpu_count()} cores)"


def probe_step_line(label: str, step: ProbeStep) -> str:
    """One progress line for a finished probe: it fits, does not fit (ran over the usable
    budget, or out of memory), or failed otherwise, which says nothing of its memory. Its
    fields are as wide as 80 columns hold; a longer label pushes them on (and the line wraps
    between words: ``report_width.wrap``)."""
    verdict = ("fits" if step.fits else "does not fit" if step.status in ("ok", "oom") else
               "no memory verdict")
    seconds = f", {step.wall_s:.1f} s" if step.wall_s is not None else ""
    return (f"{label:<18} micro-batch {step.micro_batch:>4}: {step.status:<5} "
            f"peak {format_bytes(step.peak_bytes):>10}  {verdict}{seconds}")


def trial_line(record: TrialRecord, stage: str = "") -> str:
    """One progress line for a finished run (a probe that fits is also a trial); its fields
    as wide as 80 columns hold (a longer label or a reason wraps between words)."""
    sps = record.samples_per_s
    speed = f"{sps:,.{0 if sps >= 100 else 1}f} samples/s" if sps else "-"
    extra = f" ({record.reason})" if record.reason else ""
    wall = f", {record.wall_s:.0f} s" if record.wall_s is not None else ""
    where = f"{stage:<7} " if stage else ""
    return (f"trial {where}{record.label():<20} {record.verdict:<6} {speed:>15} peak "
            f"{format_bytes(record.peak_bytes):>10}{wall}{extra}")


def run_line(count: RunCount, stage: str, key: str, *, starting: bool = True) -> str:
    """A run beginning (or ended): ``probe: run 9/~23, ~1 min 40 s left: fp32/off/16``."""
    return f"{stage}: {run_count(count, starting=starting)}: {key}"


def run_count(count: RunCount, *, starting: bool = False) -> str:
    """``run 9/~23, ~1 min 40 s left``: the runs made (with the one ``starting``) and the
    forecast of all (an estimate from the plan the search has now: it changes as evidence
    arrives)."""
    left = f", ~{duration(count.left_s)} left" if count.left_s is not None else ""
    return f"run {count.done + starting}/~{count.total}{left}"


def duration(seconds: float) -> str:
    """``40 s``, ``1 min 40 s``, ``1 h 05 min``: rounded to what an estimate says."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        rest = rest // 10 * 10  # to ten seconds: an estimate
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    hours, rest = divmod(seconds // 60, 60)
    return f"{hours} h {rest:02d} min"
