"""What fits a device memory with headroom: the asked micro-batch's estimate and the largest.

``estimate_report`` traces the asked micro-batch (``trace.estimate_step``), searches the
largest micro-batch whose corrected peak (``calibration``) fits (``largest_fitting``: the
memory probe's boundary search over traces instead of runs) and says what the figure counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.boundary import Point, bracket, first_candidate, next_candidate
from autotune.estimate.calibration import Calibration
from autotune.estimate.trace import Kernels, StepEstimate, estimate_step
from autotune.knobs import BASELINE, Knobs, memory_budget
from autotune.units import accumulate_steps
from autotune.workload import Workload


@dataclass(frozen=True, kw_only=True)
class EstimateReport:
    """An estimated step, and what fits a device memory with headroom."""

    workload_name: str
    estimate: StepEstimate
    """The step at the asked micro-batch."""
    device_memory_bytes: int
    headroom: float
    usable_bytes: int
    """Device memory minus headroom: an estimated peak that fits stays under this."""
    max_micro_batch: int
    """Largest micro-batch whose estimated peak fits (0: none)."""
    max_peak_bytes: int | None
    """The corrected peak at ``max_micro_batch``."""
    target_batch: int | None = None
    world_size: int = 1
    pairs: tuple[tuple[int, int], ...] = ()
    """(micro_batch, accumulate_steps) that fit the target batch, largest micro-batch last."""
    calibration: Calibration | None = None
    """The correction applied to peaks, from ``autotune.json``, or None."""
    traced: tuple[tuple[int, int], ...] = ()
    """(micro_batch, traced peak bytes) of every step traced, uncorrected."""
    notes: tuple[str, ...] = ()
    any_max_micro_batch: int | None = None
    """The largest micro-batch up to the per-device batch that fits, a divisor of it or not
    (None: not searched)."""
    device: str = ""
    """The device the estimate answers for (``cpu``, ``cuda``, ``cuda:N``: ``--device``, by
    default this machine's), whose memory ``device_memory_bytes`` is; "": not said."""
    device_given: bool = False
    """Whether the caller named ``device`` (else it is this machine's)."""

    def fits(self) -> bool:
        """True when the asked micro-batch's estimated peak fits."""
        return self.peak_bytes() <= self.usable_bytes

    def peak_bytes(self) -> int:
        """The asked micro-batch's peak, corrected by the calibration."""
        return self.corrected(self.estimate.peak_bytes)

    def corrected(self, traced_bytes: int) -> int:
        """A traced peak with the calibration applied (never less than traced)."""
        return self.calibration.apply(traced_bytes) if self.calibration else traced_bytes


@dataclass(frozen=True, kw_only=True)
class EstimateRequest:
    """What to estimate: everything but the workload, so it can travel to a child process."""

    micro_batch: int
    device_memory_bytes: int
    knobs: Knobs = BASELINE
    """What to trace the step with (precision, checkpointing, optimizer implementation, memory
    format; a compile mode is traced eager)."""
    headroom: float = 0.1
    candidates: tuple[int, ...] | None = None
    """Allowed micro-batches (divisors of the per-device batch), or None for any."""
    target_batch: int | None = None
    world_size: int = 1
    """Data-parallel ranks of the job: the target batch is divided over them, and with a
    ``knobs.strategy`` the step is traced as one rank of that many (fake process group)."""
    kernels: Kernels = "cuda"
    calibration: Calibration | None = None
    find_max: bool = True
    also_trace: tuple[int, ...] = ()
    """Micro-batches to trace besides the asked one (a calibration's second point)."""
    any_micro_batch: bool = False
    """With ``candidates`` and ``find_max``: also the largest micro-batch of any size."""


ESTIMATE_NOTE = (
    "counts live tensor bytes at the step's peak (fake-tensor trace of the eager step); not "
    "counted: CUDA context and library workspaces, allocator caching and fragmentation, "
    "kernels' internal scratch, CPU process overhead. The headroom is there for those")


BUDGET_NOTE = (
    "checkpointing {}: not modelled: the compiler picks what to recompute when the model "
    "compiles, which a trace of the eager step cannot follow; traced as checkpointing off (the "
    "eager step's activations, more than the compiled step keeps with the budget). A search's "
    "measured peak of the setting (its calibration, `autotune check`) is the figure to trust")


STRATEGY_NOTE = {
    "ddp": "gradients include DDP's all-reduce buckets, a second copy of them (bucket view "
           "makes the synchronized micro-batch's gradients views of the buckets, not the "
           "first no_sync micro-batch's: it saves only where the optimizer step peaks)",
    "fsdp": "parameters, gradients and optimizer state are this rank's shards; the blocks' "
            "gathered parameters count as activations (forward) and temporaries (backward); "
            "not counted: the whole model a rank builds before it shards it"}


@dataclass(frozen=True, kw_only=True)
class FitSearch:
    """The largest micro-batch whose estimated peak stays within the usable memory."""

    max_micro_batch: int
    """0 when not even micro-batch 1 fits."""
    estimates: tuple[StepEstimate, ...]
    """Every traced step, by micro-batch (the boundary is always traced, never extrapolated)."""

    def peak_at(self, micro_batch: int) -> int | None:
        """Traced peak at a micro-batch, or None when it was not traced."""
        return next((e.peak_bytes for e in self.estimates if e.micro_batch == micro_batch),
                    None)


EVERY_MICRO_BATCH = range(1, 2**16 + 1)
"""The candidates when any micro-batch is allowed (no target batch given)."""


def largest_fitting(trace: Callable[[int], StepEstimate], usable_bytes: int,
                    candidates: Sequence[int] | None = None,
                    known: Sequence[StepEstimate] = ()) -> FitSearch:
    """The largest candidate micro-batch whose traced peak is at most ``usable_bytes``: the
    memory probe's boundary search (``autotune.boundary``) over traces instead of runs.

    The peak grows about linearly with the micro-batch, so two traces predict the boundary and
    one or two more confirm it. Without candidates, every micro-batch up to 65536 is one.

    Args:
        trace: micro-batch -> its estimate (``estimate_step`` with the other settings bound).
        usable_bytes: memory a fitting step may use (device memory minus headroom).
        candidates: allowed micro-batches (e.g. divisors of the per-device batch).
        known: estimates already traced (the first is where the search starts from).
    """
    done: dict[int, StepEstimate] = {e.micro_batch: e for e in known}
    cands: Sequence[int] = sorted(set(candidates)) if candidates else EVERY_MICRO_BATCH

    def point(e: StepEstimate) -> Point:
        return Point(micro_batch=e.micro_batch, peak_bytes=e.peak_bytes,
                     fits=e.peak_bytes <= usable_bytes)

    points = [point(e) for e in done.values()]
    # A trace costs the same at any size: start from what is known, else the smallest.
    hint = known[0].micro_batch if known else cands[0]
    micro_batch = (next_candidate(cands, points, usable_bytes, hint) if points
                   else first_candidate(cands, hint))
    while micro_batch is not None and len(done) < 32:
        done[micro_batch] = trace(micro_batch)
        points.append(point(done[micro_batch]))
        micro_batch = next_candidate(cands, points, usable_bytes, hint)
    return FitSearch(max_micro_batch=bracket(points)[0],
                     estimates=tuple(done[m] for m in sorted(done)))


def estimate_report(workload: Workload, request: EstimateRequest) -> EstimateReport:
    """Trace the asked micro-batch (and, with ``find_max``, the boundary) and say what fits.

    Raises:
        WorkloadError: the workload fails; UntraceableStepError: an op cannot be traced.
        ConfigError: a knob value the workload cannot take.
    """
    def trace(m: int) -> StepEstimate:
        return estimate_step(workload, m, knobs=request.knobs, kernels=request.kernels,
                             world_size=request.world_size)

    usable = int(request.device_memory_bytes * (1 - request.headroom))
    asked = trace(request.micro_batch)
    limit = request.calibration.traced_limit(usable) if request.calibration else usable
    known = [asked, *(trace(m) for m in request.also_trace if m != request.micro_batch)]
    if not request.find_max:
        fits = asked.peak_bytes <= limit
        search = FitSearch(max_micro_batch=request.micro_batch if fits else 0,
                           estimates=tuple(known))
    else:
        search = largest_fitting(trace, limit, request.candidates, known=known)
    best = search.max_micro_batch
    any_max = None
    if request.any_micro_batch and request.find_max and request.candidates is not None:
        # Up to the per-device batch, from the boundary among its divisors: a trace or two more.
        every = range(1, max(request.candidates) + 1)
        start = sorted((e for e in search.estimates if e.micro_batch in every),
                       key=lambda e: e.micro_batch != best)
        any_max = largest_fitting(trace, limit, every, known=start).max_micro_batch
    pairs: tuple[tuple[int, int], ...] = ()
    if request.candidates is not None:
        per_device = (request.target_batch or 1) // request.world_size
        pairs = tuple((m, accumulate_steps(per_device, m)) for m in request.candidates if m <= best)
    peak = search.peak_at(best)
    notes = [ESTIMATE_NOTE]
    if request.knobs.distributed:
        notes.append(f"one rank of {request.world_size} ({request.knobs.strategy}), traced in "
                     "one process with a fake process group (collectives do nothing): "
                     + STRATEGY_NOTE[request.knobs.strategy.split("-")[0]])
    if memory_budget(request.knobs.checkpointing) is not None:
        notes.append(BUDGET_NOTE.format(request.knobs.checkpointing))
    if request.calibration is not None:
        notes.append(f"peaks corrected by the search's measurement: "
                     f"{request.calibration.describe()}")
        notes += request.calibration.notes
    return EstimateReport(
        workload_name=workload.name, estimate=asked,
        device_memory_bytes=request.device_memory_bytes, headroom=request.headroom,
        usable_bytes=usable, max_micro_batch=best,
        max_peak_bytes=None if peak is None else (
            request.calibration.apply(peak) if request.calibration else peak),
        target_batch=request.target_batch, world_size=request.world_size, pairs=pairs,
        calibration=request.calibration,
        traced=tuple((e.micro_batch, e.peak_bytes) for e in search.estimates),
        notes=tuple(notes), any_max_micro_batch=any_max)
