"""Typed values that pass between the stages. No torch import here.

Every value that crosses a process or layer boundary is a frozen dataclass defined in this module,
so it can be written to JSON and read back (``autotune.serialize``: ``to_json_dict`` /
``from_json_dict``)."""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge

from autotune.knobs import (
    BASELINE,
    COMPILE_MODES,
    CUDA_GRAPH_MODES,
    PRECISIONS,
    CompileMode,
    HasKnobs,
    Knobs,
    Precision,
)
from autotune.serialize import STRICT_FIELDS, Pattern, Text
from autotune.stop_reason import StopReason
from autotune.timing import TimingStop, relative_halfwidth
from autotune.traits import WorkloadTraits
from autotune.units import MIB, accumulate_steps

_halfwidth_of = functools.lru_cache(maxsize=4096)(relative_halfwidth)
"""``relative_halfwidth`` kept per tuple of a finished run's step times: the search reads each
run's figure again at every comparison (``statistics.stdev`` sums exact fractions: a third of
a replayed search's time before). A child's timing loop calls ``relative_halfwidth`` itself,
so nothing is kept in the process whose memory is measured."""

TrialStatus = Literal[
    "ok", "oom", "compile_error", "non_finite", "timeout", "crash", "workload_error", "error",
    "unsupported",
]
"""``unsupported``: a knob value the workload cannot take (e.g. ``fused`` for an optimizer
without it): a reason to skip the candidate, never the workload's failure."""
ChildStatus = Literal["ok", "timeout", "crash"]


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """How a child process rebuilds the workload: workloads hold code, so only this travels."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    kind: Literal["default", "hf", "file"] = "default"
    """``default``: the built-in model sized to the device; ``hf``: a Hugging Face model id or
    local directory built from its config; ``file``: ``path/to/file.py:factory``."""
    target: Text = ""
    """The HF model name or directory, or ``path.py:factory``; empty for the default."""
    seq_len: Annotated[int, Ge(1)] | None = None
    """Worst-case sequence length for ``hf`` models (defaults to the model's maximum, capped)."""
    pretrained: bool = False
    """Load real weights for ``hf`` models (downloads them); random weights otherwise."""
    lengths: tuple[Annotated[int, Ge(1)], ...] | None = None
    """Real sequence lengths for ``hf`` models (``--lengths FILE``): batches vary in length and
    the ``shapes`` knob is tuned on them (``docs/shapes.md``); None: every batch at the worst
    case."""

    def label(self) -> str:
        """A short human-readable name."""
        if self.kind == "default":
            return "default"
        suffix = f" (seq {self.seq_len})" if self.seq_len else ""
        return f"{self.target}{suffix}"


@dataclass(frozen=True, kw_only=True)
class DeviceInfo:
    """Facts about the device that the search relies on."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    device: Annotated[str, Pattern(r"^(cpu|cuda:[0-9]{1,4})$")]
    """``cpu`` or ``cuda:N``."""
    name: Text
    total_memory_bytes: int
    """Physical memory of the device (RAM on CPU)."""
    available_memory_bytes: int
    """What is free now: total minus other processes' use (NVML) or MemAvailable on CPU."""
    supports_bf16: bool
    supports_fp16: bool
    supports_tf32: bool
    native_bf16: bool = False
    """bf16 runs on dedicated units (Ampere+ GPU, or AVX512-BF16/AMX CPU); else it is emulated."""
    torch_version: Text = ""
    cuda_version: Text | None = None
    compute_capability: Text | None = None
    notes: tuple[Text, ...] = ()

    @property
    def is_cuda(self) -> bool:
        """True for a CUDA device."""
        return self.device.startswith("cuda")

    def precisions(self) -> tuple[str, ...]:
        """Precisions this device can run."""
        ok = {"fp32": True, "tf32": self.supports_tf32, "bf16": self.supports_bf16,
              "fp16": self.supports_fp16}
        return tuple(p for p in PRECISIONS if ok[p])

    def compile_modes(self) -> tuple[str, ...]:
        """Compile modes this device can run (CUDA-graph modes only on CUDA)."""
        return tuple(m for m in COMPILE_MODES if self.is_cuda or m not in CUDA_GRAPH_MODES)


@dataclass(frozen=True, kw_only=True)
class TrialSpec(HasKnobs):
    """One isolated run of the real training step, in a fresh child process."""

    workload: WorkloadSpec
    device: str
    micro_batch: int
    """Samples per forward/backward. Memory grows about linearly with it."""
    accumulate_steps: int = 2
    """Micro-batches per optimizer step of the timed steps (the config's accumulation)."""
    warmup_accumulate_steps: int | None = None
    """Micro-batches per warm-up step, when it differs from ``accumulate_steps``: a memory probe
    warms up with 2 (gradients alive during a forward: the most memory any accumulation needs;
    more would only cost time, since gradients accumulate in place), then times
    ``accumulate_steps``, so one run is the probe and the trial. The peak covers both."""
    knobs: Knobs = BASELINE
    """Precision, compile mode and every other knob of the run."""
    num_warmup_steps: int = 2
    """Optimizer steps before timing (compile included); optimizer state appears at the first.
    Probes use 2 so the peak includes optimizer state."""
    num_timed_steps: int = 0
    """Synchronized, timed optimizer steps after warm-up (0 for a memory probe); with
    ``timing_precision``, the most it times."""
    memory_budget_bytes: int | None = None
    """Hard cap for the child: RLIMIT_AS above its baseline on CPU, memory fraction on CUDA."""
    timeout_s: float = 600.0
    seed: int = 0
    max_timed_s: float | None = None
    """Stop timing early once this many seconds were spent timing (at least one timed step):
    a candidate already far slower than the best needs no more evidence. The search sets it
    from the leader's window, counting each timed unit's optimizer steps (a pass over drawn
    lengths is ``lengths.POOL_STEPS`` of them)."""
    stop_above_step_s: float | None = None
    """Sequential stopping: stop timing once ``MIN_STEPS_TO_STOP`` timed steps were all slower
    than this (the leader's median step time plus the noise): even the fastest of them loses,
    so more steps only cost time. None: time every step."""
    min_timed_s: float = 0.0
    """Keep timing past ``num_timed_steps`` until this many seconds were timed: a median over
    a window this long is not one short busy period of the machine (fast steps need many)."""
    timing_precision: float | None = None
    """Stop timing once the median step time's 95% interval is within this share of it (after
    ``MIN_STEPS_TO_STOP`` steps and ``min_timed_s``): the spread decides how long a run times
    (``autotune.timing.stop_reason``). None: time ``num_timed_steps``."""
    count_flops: bool = False
    """Count the model FLOPs of the first warm-up step (eager only; the baseline does it)."""
    ranks: int = 1
    """Processes of the job on this machine (``--nproc-per-node``): with a strategy other than
    ``none`` the run is one job of this many ranks under torch's elastic launcher, each capped
    like a single child; its result is the job's (``runner_ranks.merge_ranks``)."""
    cold_compile: bool = False
    """Compile with an empty inductor cache of the child's own, as a first launch on a fresh
    machine does (``runner.run_isolated``): nothing another child compiled is loaded."""

    def warmup_micro_batches(self) -> int:
        """Micro-batches each warm-up step accumulates."""
        return self.warmup_accumulate_steps or self.accumulate_steps



@dataclass(frozen=True, kw_only=True)
class TrialResult:
    """What one child run produced. A trial succeeds only with positive evidence."""

    status: TrialStatus
    message: str = ""
    peak_bytes: int | None = None
    """Training memory at its peak. CPU: growth of the address space over the child's baseline
    (what the cap limits). CUDA: max_memory_reserved plus CUDA context and non-PyTorch use."""
    baseline_bytes: int | None = None
    """CPU: address space of the child after importing torch and building the model (whose
    parameters and buffers count in the peak by their exact bytes)."""
    peak_rss_bytes: int | None = None
    """CPU: high-water resident set of the child (information only)."""
    context_bytes: int | None = None
    """CUDA: device memory the child used outside PyTorch's allocator (the CUDA context, kernel
    modules loaded as they were first used, library handles), from NVML's device use before
    the child touched CUDA and at the end; counted in ``peak_bytes``."""
    num_alloc_retries: int = 0
    """CUDA allocator retries (cudaMalloc failed, cache flushed): a near-OOM signal."""
    num_optimizer_steps: int = 0
    """Optimizer steps completed, warm-up included."""
    warmup_s: float | None = None
    """Wall time of the warm-up steps (compile included)."""
    compile_s: float | None = None
    """Warm-up time beyond what the same steps take once compiled: the compile cost."""
    step_times_s: tuple[float, ...] = ()
    """Synchronized wall time of each timed optimizer step."""
    update_times_s: tuple[float, ...] = ()
    """Of each timed step, the optimizer update's share (after the last backward: unscale,
    step, zero_grad), timed on the device's own clock; the rest is the micro-batches'."""
    timing_stop: TimingStop = ""
    """Why timing stopped (``autotune.timing.TimingStop``)."""
    first_loss: float | None = None
    """Loss of the first effective batch before any update, in the trial's precision and
    compile mode."""
    reference_loss: float | None = None
    """fp32 eager loss of the same effective batch with the same initial weights (timed trials
    only): the numerics guard compares ``first_loss`` with it, on identical data."""
    last_loss: float | None = None
    num_skipped_steps: int = 0
    """fp16: optimizer steps the GradScaler skipped for inf/NaN gradients."""
    num_graphs: int | None = None
    """Dynamo graphs compiled (None when eager). Zero means the trial silently ran eager."""
    num_graph_breaks: int | None = None
    compile_cache_hits: int | None = None
    """Compiled: artifacts loaded from inductor's on-disk caches (AOT autograd's, FX graphs'):
    a graph another child compiled before is not compiled again."""
    compile_cache_misses: int | None = None
    flops_per_step: int | None = None
    """Model FLOPs of one optimizer step (forward and backward of every micro-batch, counted
    by ``torch.utils.flop_counter``), when the spec asked for them."""
    samples_per_step: int = 0
    tokens_per_sample: int | None = None
    workload_name: str = ""
    workload_fingerprint: str = ""
    """Hash of parameter shapes and batch shapes: changes when the model or its input does."""
    wall_s: float | None = None
    """Whole child process time, start-up included (set by the runner)."""
    traits: WorkloadTraits | None = None
    """What the child saw of the workload that decides which knob values apply to it."""
    fragmentation_bytes: int | None = None
    """CUDA: reserved minus allocated at the peak (the allocator's fragmentation and cache)."""
    rank_peak_bytes: tuple[int, ...] = ()
    """A job of several ranks: each rank's peak, by rank (``peak_bytes`` is the largest)."""
    step_memory_bytes: tuple[int, ...] = ()
    """Memory after each optimizer step, warm-up included, recorded as the steps ran (so a run
    that failed later still has it). CPU: the address space over the baseline plus the model's
    bytes, as ``peak_bytes`` counts it (what the cap limits); CUDA: ``memory_allocated``."""

    @property
    def ok(self) -> bool:
        """True when every planned step ran with finite loss."""
        return self.status == "ok"

    def leak_note(self) -> str | None:
        """Why memory ran out when it grew step after step: a leak in the workload, or None.

        Optimizer state appears at the first step, so growth counts from the second step on.
        A leak is memory that grew at every step after the second, by more than
        ``max(1 MiB, 1% of the peak)`` per step on average, over at least 3 steps after the
        first: a probe (2 warm-up steps) cannot see it, while every longer run runs out.
        """
        series = self.step_memory_bytes
        if len(series) < 4:
            return None
        from_second = series[1:]
        growths = [b - a for a, b in itertools.pairwise(from_second)]
        average = (from_second[-1] - from_second[0]) / len(growths)
        peak = max(self.peak_bytes or 0, *series)
        if min(growths) <= 0 or average <= max(MIB, 0.01 * peak):
            return None
        return (f"memory grew by {average / MIB:.1f} MiB every optimizer step (steps "
                f"2-{len(series)}: {from_second[0] / MIB:.1f} -> {from_second[-1] / MIB:.1f} "
                "MiB): the workload keeps tensors alive across steps (a leak: e.g. losses kept "
                "without .item() or .detach())")

    def fits(self, usable_bytes: int) -> bool:
        """Ran every step with its measured peak within ``usable_bytes`` (the fit rule)."""
        return self.ok and self.peak_bytes is not None and self.peak_bytes <= usable_bytes

    def median_step_s(self) -> float | None:
        """Median time per optimizer step over the timed steps."""
        return statistics.median(self.step_times_s) if self.step_times_s else None

    def spread(self) -> float | None:
        """Relative spread of step times: (p90 - p10) / median."""
        if len(self.step_times_s) < 3:
            return None
        times = sorted(self.step_times_s)
        low = times[int(0.1 * (len(times) - 1))]
        high = times[math.ceil(0.9 * (len(times) - 1))]
        return (high - low) / statistics.median(times)

    def halfwidth(self) -> float | None:
        """The median step time's 95% interval half-width over the median (``timing``)."""
        return _halfwidth_of(self.step_times_s)

    def samples_per_s(self) -> float | None:
        """Throughput from the median step time."""
        median = self.median_step_s()
        return self.samples_per_step / median if median else None


@dataclass(frozen=True, kw_only=True)
class ChildRun:
    """What one isolated child process (``runner.run_in_child``) gave back."""

    status: ChildStatus
    """``ok``: the child's handler returned and its result was written; ``timeout``: no result
    within the time limit, the child's process group was killed; ``crash``: the child could not
    start, died without a result (a signal, ``os._exit``), or its handler raised."""
    data: dict[str, Any] | None = None
    """The JSON the child wrote (with ``child_error`` when its handler raised), else None."""
    message: str = ""
    """Why a run is not ``ok``: the signal or exit code and the end of the child's output, or
    the handler's error."""
    wall_s: float = 0.0
    """Wall time of the child process, start-up included."""


@dataclass(frozen=True, kw_only=True)
class ProbeStep:
    """One measured point of a memory probe."""

    micro_batch: int
    status: TrialStatus
    peak_bytes: int | None
    fits: bool
    """Ran to the end and its peak stayed within the usable budget (budget minus headroom)."""
    message: str = ""
    wall_s: float | None = None
    timed: bool = False
    """The run also timed the config's steps (a search times the probes that may be the
    largest fit: such a probe is a trial too)."""


@dataclass(frozen=True, kw_only=True)
class MemoryProbe:
    """The largest micro-batch that fits, for one setting of the knobs."""

    knobs: Knobs
    max_micro_batch: int
    """Largest candidate that fits; 0 when none does."""
    peak_bytes: int | None
    """Measured peak at ``max_micro_batch``."""
    budget_bytes: int
    usable_bytes: int
    """Budget minus headroom: what a fitting run's peak must stay under."""
    candidates: tuple[int, ...]
    """Micro-batches considered (divisors of target / world size)."""
    steps: tuple[ProbeStep, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def num_probes(self) -> int:
        """How many child runs the probe took."""
        return len(self.steps)

    def margin_bytes(self) -> int | None:
        """Usable budget left at the chosen micro-batch."""
        return None if self.peak_bytes is None else self.usable_bytes - self.peak_bytes

    def fitting(self) -> tuple[int, ...]:
        """Candidate micro-batches up to the largest that fits, less any the probe saw fail
        (memory need not grow with the micro-batch: ``memory.rising_gap``)."""
        failed = {s.micro_batch for s in self.steps if not s.fits}
        return tuple(m for m in self.candidates
                     if m <= self.max_micro_batch and m not in failed)


@dataclass(frozen=True, kw_only=True)
class ProbeReport:
    """Memory probes for every setting of the knobs probed, for one workload on one device."""

    workload: WorkloadSpec
    device: DeviceInfo
    target_batch: int
    world_size: int
    headroom: float
    budget_bytes: int
    probes: tuple[MemoryProbe, ...]
    requested_batch: int | None = None
    """The target the user asked for, when --allow-inexact moved it to ``target_batch``."""
    skipped: tuple[str, ...] = ()
    """Knob settings not probed, with the reason (e.g. CUDA-graph modes on CPU, or a search
    that found the class's precision too far behind to try it)."""
    allocator: str = ""
    """Allocator settings in force in the children (they move the CPU boundary)."""
    nproc_per_node: int = 1
    """Ranks each probe and trial runs as one job (``--nproc-per-node``)."""

    def per_device_batch(self) -> int:
        """target_batch / world_size: what one device's micro-batches must add up to."""
        return self.target_batch // self.world_size

    def usable_bytes(self) -> int:
        """Budget minus headroom: a fitting run's peak stays under this."""
        return int(self.budget_bytes * (1 - self.headroom))

    def pairs(self, probe: MemoryProbe) -> tuple[tuple[int, int], ...]:
        """(micro_batch, accumulate_steps) pairs that fit for one setting of the knobs."""
        per_device = self.per_device_batch()
        return tuple((m, accumulate_steps(per_device, m)) for m in probe.fitting())


__all__ = [
    "COMPILE_MODES", "CUDA_GRAPH_MODES", "PRECISIONS",
    "ChildRun", "ChildStatus", "CompileMode", "DeviceInfo",
    "Knobs", "MemoryProbe", "Precision", "ProbeReport", "ProbeStep", "StopReason", "TrialResult",
    "TrialSpec", "TrialStatus", "WorkloadSpec", "WorkloadTraits", "field",
]
