"""``autotune.json``: the tuned config, versioned, with every trial. No torch import here.

The file is complete enough to reproduce the winner and to check it later: knobs, memory facts,
measured throughput and the baseline's, device and versions, workload fingerprint, and each
trial with its outcome and why it lost (DESIGN.md section 7).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from autotune.config import (
    DeviceInfo,
    ProbeReport,
    WorkloadSpec,
    from_json_dict,
    to_json_dict,
)
from autotune.errors import ConfigError

SCHEMA_VERSION = 1

Verdict = Literal[
    "winner", "ok", "slower", "numerics", "over_budget", "oom", "compile_error", "non_finite",
    "timeout", "crash", "error", "workload_error",
]


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """One measured candidate and what became of it."""

    number: int
    micro_batch: int
    accumulate_steps: int
    precision: str
    compile_mode: str
    verdict: Verdict
    """``winner``; ``ok`` (ran, lost by a little); ``slower`` (stopped early: clearly slower);
    ``numerics`` (loss far from fp32 eager); ``over_budget`` (ran, but its peak is over the
    budget minus headroom: a memory probe's miss); or the failure status of the child."""
    reason: str = ""
    """Why it lost or failed, in words."""
    is_baseline: bool = False
    median_step_s: float | None = None
    """Median wall time of one optimizer step (micro_batch x accumulate_steps samples)."""
    spread: float | None = None
    """(p90 - p10) / median of the timed steps."""
    num_timed_steps: int = 0
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    peak_bytes: int | None = None
    compile_s: float | None = None
    first_loss: float | None = None
    num_skipped_steps: int = 0
    num_graphs: int | None = None
    num_graph_breaks: int | None = None
    num_alloc_retries: int = 0
    tflops_per_s: float | None = None
    """Model TFLOP/s achieved (the baseline's counted FLOPs per sample x samples/s)."""
    mfu: float | None = None
    """Model FLOPs utilization: TFLOP/s over the device's dense peak in this precision, when
    the peak is known (``config.PEAK_TFLOPS``)."""
    speedup: float | None = None
    """samples/s over the baseline's."""
    time_to_train_s: float | None = None
    """compile_s + train_steps x median_step_s, when an objective in steps was given."""
    wall_s: float | None = None
    num_runs: int = 1
    """Times it was measured; a close race is re-measured and each keeps its better run."""

    def label(self) -> str:
        """E.g. ``bf16/default mb=16x4``."""
        return f"{self.precision}/{self.compile_mode} {self.micro_batch}x{self.accumulate_steps}"


@dataclass(frozen=True, kw_only=True)
class MemoryRecord:
    """Memory facts behind the tuned config."""

    device_total_bytes: int
    budget_bytes: int
    headroom: float
    usable_bytes: int
    """Budget minus headroom: the winner's peak stays under this."""
    peak_bytes: int | None
    """The winner's measured peak."""
    max_micro_batch: dict[str, int] = field(default_factory=dict)
    """Largest fitting micro-batch per memory class (``precision/compile_mode``)."""
    calibration: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per memory class: ``measured_peak_bytes`` and the estimator's ``estimate_bytes`` for
    the same config, so ``autotune check`` can scale a later estimate."""
    allocator: str = ""
    peak_definition: str = ""


@dataclass(frozen=True, kw_only=True)
class TunedConfig:
    """The content of ``autotune.json``."""

    schema: int = SCHEMA_VERSION
    autotune_version: str
    created_at: str
    workload: WorkloadSpec
    workload_name: str
    workload_fingerprint: str
    target_batch: int
    """Effective batch tuned for: samples per optimizer step over all devices."""
    requested_batch: int | None = None
    """What the user asked for, when --allow-inexact tuned the nearest exact batch instead."""
    world_size: int
    micro_batch: int
    """Samples per forward/backward on each device."""
    accumulate_steps: int
    """Micro-batches per optimizer step: target_batch / (micro_batch x world_size)."""
    precision: str
    compile_mode: str
    compile_dynamic: bool = False
    extras: dict[str, str] = field(default_factory=dict)
    memory: MemoryRecord
    device: DeviceInfo
    objective: Literal["throughput", "time_to_train"] = "throughput"
    train_steps: int | None = None
    median_step_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    flops_per_sample: float | None = None
    """Model FLOPs of one sample's forward and backward, counted on the baseline's step."""
    mfu: float | None = None
    """The winner's model FLOPs utilization, when the device's peak is known."""
    baseline_samples_per_s: float | None = None
    speedup: float | None = None
    break_even_steps: float | None = None
    """Optimizer steps after which the compiled winner's compile time has paid for itself."""
    reason: str = ""
    """One line: why the winner won."""
    trials: tuple[TrialRecord, ...] = ()
    skipped: tuple[str, ...] = ()
    """Candidates or classes not measured, with the reason."""
    interrupted: bool = False
    """True when the search stopped early (Ctrl-C or time budget): best so far."""

    def effective_batch(self) -> int:
        """micro_batch x accumulate_steps x world_size."""
        return self.micro_batch * self.accumulate_steps * self.world_size

    def memory_class(self) -> str:
        """E.g. ``bf16/default``."""
        return f"{self.precision}/{self.compile_mode}"


def write_json_atomic(path: Path, text: str, *, force: bool = False) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename.

    Raises:
        ConfigError: ``path`` exists and ``force`` is False, or the folder is not writable.
    """
    path = Path(path)
    if path.exists() and not force:
        raise ConfigError(f"{path} exists; pass --force to overwrite it, or --out another folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}; choose a writable "
                          "--out folder") from exc


def save_tuned(config: TunedConfig, path: Path, *, force: bool = False) -> None:
    """Write ``autotune.json`` atomically (never a half-written file)."""
    write_json_atomic(path, json.dumps(to_json_dict(config), indent=2) + "\n", force=force)


def read_tuned(path: str | Path) -> TunedConfig:
    """Read and validate ``autotune.json``.

    Raises:
        ConfigError: missing, not JSON, not an autotune file, from a newer schema, or
            with fields this version does not know.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: run `autotune search` to create it")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); re-run `autotune search`") from exc
    if not isinstance(data, dict) or "schema" not in data:
        raise ConfigError(f"{path} is not an autotune.json file (no 'schema' field)")
    if data["schema"] != SCHEMA_VERSION:
        newer = isinstance(data["schema"], int) and data["schema"] > SCHEMA_VERSION
        raise ConfigError(
            f"{path} has schema {data['schema']!r}; this autotune reads schema {SCHEMA_VERSION}"
            + (": upgrade autotune (pip install -U torch-autotune)" if newer else
               ": re-run `autotune search` to write a current file"))
    try:
        return from_json_dict(TunedConfig, data)
    except (TypeError, ConfigError) as exc:
        raise ConfigError(f"{path} does not match schema {SCHEMA_VERSION}: {exc}") from exc


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What ``autotune.search`` returns: the tuned config, where it was written, the probes."""

    config: TunedConfig
    path: Path | None
    """Where ``autotune.json`` was written (None when not written)."""
    probe: ProbeReport
    stop_reason: str = ""
