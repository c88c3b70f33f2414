"""Find the largest micro-batch that fits, per setting of the knobs, with real capped steps.

Only divisors of ``target / world_size`` matter (the effective batch stays exact). Measured peaks
grow about linearly with the micro-batch, so after two fitting measurements a line predicts the
boundary and one or two more probes confirm it; before that the search bisects in log space.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence

from autotune.config import (
    Knobs,
    MemoryProbe,
    ProbeStep,
    TrialResult,
    TrialSpec,
    WorkloadSpec,
)
from autotune.errors import WorkloadError
from autotune.runner import run_isolated

Runner = Callable[[TrialSpec], TrialResult]
OnStep = Callable[[Knobs, ProbeStep], None]


def probe_spec(workload: WorkloadSpec, device: str, knobs: Knobs, micro_batch: int,
               budget_bytes: int | None, timeout_s: float, *, per_device_batch: int | None = None,
               num_timed_steps: int = 0, count_flops: bool = False) -> TrialSpec:
    """The spec of one probe: two micro-batches accumulated, two optimizer steps, capped.

    With ``per_device_batch`` the same run also times ``num_timed_steps`` optimizer steps of
    the config it probes (``per_device_batch / micro_batch`` micro-batches each): its warm-up
    accumulates at least two (gradients alive during a forward, the memory worst case), so one
    child is both the probe and the trial.
    """
    accumulate = per_device_batch // micro_batch if per_device_batch else 2
    return TrialSpec(
        workload=workload, device=device, micro_batch=micro_batch, accumulate_steps=accumulate,
        warmup_accumulate_steps=2 if accumulate < 2 else None,
        knobs=knobs, num_warmup_steps=2, num_timed_steps=num_timed_steps,
        memory_budget_bytes=budget_bytes,
        timeout_s=timeout_s, count_flops=count_flops,
    )


def hint_for(knobs: Knobs, probes: Iterable[MemoryProbe]) -> int | None:
    """A first guess for a setting's boundary: the one found for the most alike setting
    probed so far (the same precision first), earliest on a tie (fp32 eager's, when the
    search probed it first)."""
    found = [p for p in probes if p.max_micro_batch]
    if not found:
        return None

    def alike(probe: MemoryProbe) -> tuple[bool, int]:
        same = sum(getattr(probe.knobs, f.name) == getattr(knobs, f.name)
                   for f in dataclasses.fields(knobs))
        return probe.knobs.precision == knobs.precision, same

    return max(found, key=alike).max_micro_batch


def probe_memory(
    workload: WorkloadSpec,
    device: str,
    knobs: Knobs,
    candidates: Sequence[int],
    *,
    budget_bytes: int,
    usable_bytes: int,
    timeout_s: float = 900.0,
    hint: int | None = None,
    run: Runner = run_isolated,
    on_step: OnStep | None = None,
    make_spec: Callable[[int, bool], TrialSpec] | None = None,
) -> MemoryProbe:
    """The largest candidate micro-batch whose real training step fits.

    A candidate fits when its capped child ran every step and its measured peak stayed within
    ``usable_bytes`` (the budget minus headroom). The cap itself is ``budget_bytes``: the gap
    between the two absorbs allocator noise near the boundary.

    Args:
        workload: what to train.
        device: ``cpu`` or ``cuda:N``.
        knobs: precision, compile mode and the other knobs, held fixed.
        candidates: micro-batches to consider (divisors of the per-device batch).
        budget_bytes: hard cap for each child.
        usable_bytes: a fitting peak must stay under this.
        timeout_s: per child.
        hint: a first guess (e.g. another class's boundary); default: the largest candidate.
        run: how to run a spec (the isolated runner; the search passes one that records
            each run as a trial).
        on_step: called after each probe, for progress output.
        make_spec: the spec for a micro-batch, told whether the probe may be the class's
            largest fit (default: ``probe_spec``, no timing; the search times such probes, so
            the run that finds the boundary also times it, while bisection points do not pay
            for timed steps).

    Raises:
        WorkloadError: the workload itself fails (factory, batch or model errors).
    """
    cands = sorted(set(candidates))
    steps: list[ProbeStep] = []
    lo, hi = 0, math.inf  # largest known to fit, smallest known not to
    micro_batch = hint if hint in cands else cands[-1]
    may_be_largest = True  # the first guess is the expected boundary
    while True:
        spec = (make_spec(micro_batch, may_be_largest) if make_spec is not None else
                probe_spec(workload, device, knobs, micro_batch, budget_bytes, timeout_s))
        result = run(spec)
        if result.status in ("workload_error", "error"):
            raise WorkloadError(
                f"the workload failed at micro-batch {micro_batch} ({knobs.label()}):\n"
                f"{result.message}"
            )
        fits = result.fits(usable_bytes)
        message = result.message.splitlines()[0] if result.message else ""
        if result.ok and not fits:
            message = "ran, but its peak is over the usable budget (budget minus headroom)"
        step = ProbeStep(micro_batch=micro_batch, status=result.status,
                         peak_bytes=result.peak_bytes, fits=fits, message=message,
                         wall_s=result.wall_s, timed=spec.num_timed_steps > 0)
        steps.append(step)
        if on_step is not None:
            on_step(knobs, step)
        if result.status == "unsupported":  # no micro-batch changes that
            break
        if fits:
            lo = max(lo, micro_batch)
        else:
            hi = min(hi, micro_batch)
        between = [c for c in cands if lo < c < hi]
        if not between:
            break
        micro_batch = _next_probe(between, steps, lo, hi, usable_bytes, hint)
        may_be_largest = _may_be_largest(micro_batch, between, steps, usable_bytes)

    best = next((s for s in steps if s.micro_batch == lo and s.fits), None)
    notes = _notes(steps)
    return MemoryProbe(
        knobs=knobs, max_micro_batch=lo,
        peak_bytes=best.peak_bytes if best else None, budget_bytes=budget_bytes,
        usable_bytes=usable_bytes, candidates=tuple(cands), steps=tuple(steps), notes=notes,
    )


def _next_probe(between: list[int], steps: list[ProbeStep], lo: int, hi: float,
                usable_bytes: int, hint: int | None) -> int:
    last = steps[-1]
    if hint is not None and len(steps) == 1 and last.micro_batch == hint:
        # Start next to the hint: its neighbour settles the boundary if the hint was right.
        return min(between) if last.fits else max(between)
    points = {s.micro_batch: s.peak_bytes for s in steps
              if s.status == "ok" and s.peak_bytes is not None}
    if len(points) >= 2:
        slope, intercept = _fit_line(points)
        if slope <= 0:
            return max(between)
        predicted = [c for c in between if intercept + slope * c <= usable_bytes]
        # The largest predicted to fit; when none is, confirm the failure just above `lo`.
        return max(predicted) if predicted else min(between)
    if lo == 0:
        return min(between)  # nothing fits yet: is the smallest feasible at all?
    upper = hi if math.isfinite(hi) else max(between) * 2
    middle = math.sqrt(lo * upper)
    return min(between, key=lambda c: abs(math.log(c) - math.log(middle)))


def _may_be_largest(micro_batch: int, between: list[int], steps: list[ProbeStep],
                    usable_bytes: int) -> bool:
    """Whether the evidence so far allows nothing larger to fit: the largest candidate still
    open, or the largest the fitted line predicts to fit. Bisection points are neither."""
    if micro_batch == max(between):
        return True
    points = {s.micro_batch: s.peak_bytes for s in steps
              if s.status == "ok" and s.peak_bytes is not None}
    if len(points) < 2:
        return False
    slope, intercept = _fit_line(points)
    predicted = [c for c in between if intercept + slope * c <= usable_bytes]
    return bool(predicted) and micro_batch == max(predicted)


def _fit_line(points: dict[int, int]) -> tuple[float, float]:
    xs, ys = list(points), list(points.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
    return slope, mean_y - slope * mean_x


def _notes(steps: list[ProbeStep]) -> tuple[str, ...]:
    notes = []
    for step in steps:
        if step.status not in ("ok", "oom"):
            notes.append(f"micro-batch {step.micro_batch}: {step.status}: {step.message}")
    return tuple(notes)

