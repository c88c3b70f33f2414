"""Find the largest micro-batch that fits, per setting of the knobs, with real capped steps.

Only divisors of ``target / world_size`` matter (the effective batch stays exact). Measured peaks
grow about linearly with the micro-batch, so after two measurements a line predicts the
boundary and one or two more probes confirm it; before that the search bisects in log space
(``autotune.boundary``, shared with the estimator).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from autotune.boundary import (
    Point,
    bracket,
    confirm_over,
    first_candidate,
    next_candidate,
    open_candidates,
)
from autotune.boundary import may_be_largest as is_largest_candidate
from autotune.config import Knobs, MemoryProbe, ProbeStep, TrialResult, TrialSpec, WorkloadSpec
from autotune.errors import MEMORY_STATUS, WorkloadError
from autotune.runner import run_isolated
from autotune.units import format_bytes

Runner = Callable[[TrialSpec], TrialResult]
OnStep = Callable[[Knobs, ProbeStep], None]
R = TypeVar("R")
Steps = Generator[Any, Any, R]
"""A chain of runs, each decided on the results before: it yields a spec, is sent the spec's
result, and returns what it found (``drive`` runs one; several run side by side on slots,
``search.batch.run_chains``). A step may be a fan: a tuple of specs, to run at once where
slots are free, sent the tuple of their results (``probe_steps`` with ``ahead``)."""


def drive(steps: Steps[R], run: Runner) -> R:
    """Run a chain (``Steps``) one run at a time through ``run`` (a fan's specs in order):
    its answer."""
    try:
        spec = next(steps)
        while True:
            spec = steps.send(tuple(map(run, spec)) if isinstance(spec, tuple) else run(spec))
    except StopIteration as done:
        return done.value


def probe_spec(workload: WorkloadSpec, device: str, knobs: Knobs, micro_batch: int,
               budget_bytes: int | None, timeout_s: float, *, per_device_batch: int | None = None,
               num_timed_steps: int = 0, count_flops: bool = False, ranks: int = 1) -> TrialSpec:
    """The spec of one probe: two micro-batches accumulated, two optimizer steps, capped.

    With ``per_device_batch`` the same run also times ``num_timed_steps`` optimizer steps of
    the config it probes (``per_device_batch / micro_batch`` micro-batches each): its warm-up
    accumulates two (gradients alive during a forward, the memory worst case; more only cost
    time), so one child is both the probe and the trial. ``ranks``: the job's processes on
    this machine (a strategy other than ``none`` runs them as one job).
    """
    accumulate = per_device_batch // micro_batch if per_device_batch else 2
    return TrialSpec(
        workload=workload, device=device, micro_batch=micro_batch, accumulate_steps=accumulate,
        warmup_accumulate_steps=2 if per_device_batch else None,
        knobs=knobs, num_warmup_steps=2, num_timed_steps=num_timed_steps,
        memory_budget_bytes=budget_bytes,
        timeout_s=timeout_s, count_flops=count_flops, ranks=ranks,
    )


def broken_uncapped(uncapped: TrialResult, usable_bytes: int) -> bool:
    """Whether a crash under the memory cap is the workload's, by the same run without the cap
    (``uncapped``): it fails there too other than by running out of memory, or it fits in the
    budget there (then the cap did not cause it). Else it needed more than the cap: the cap's
    doing, and a setting that frees memory may fit."""
    return uncapped.status not in ("ok", MEMORY_STATUS) or uncapped.fits(usable_bytes)


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


def probe_step(micro_batch: int, result: TrialResult, usable_bytes: int, *,
               timed: bool = False) -> ProbeStep:
    """One point of a memory probe from its run: it fits when it ran every step with its peak
    within ``usable_bytes``; its message is the run's first line, or why a run that ended
    well does not fit."""
    fits = result.fits(usable_bytes)
    message = result.message.splitlines()[0] if result.message else ""
    if result.ok and not fits:
        message = "ran, but its peak is over the usable budget (budget minus headroom)"
    return ProbeStep(micro_batch=micro_batch, status=result.status,
                     peak_bytes=result.peak_bytes, fits=fits, message=message,
                     wall_s=result.wall_s, timed=timed)


def refuted(probe: MemoryProbe, result: TrialResult, usable_bytes: int) -> MemoryProbe | None:
    """``probe`` once a timed run at its largest fit ran out of memory or peaked over
    ``usable_bytes`` where the probe's own run there fit: peaks vary from run to run, and the
    larger counts, so that micro-batch no longer fits and the largest fit is the next one
    down (0: none). None where the run fit, or failed in a way memory does not explain."""
    fit = probe.max_micro_batch
    if not fit or result.fits(usable_bytes) or not (result.ok or result.status == MEMORY_STATUS):
        return None
    step = probe_step(fit, result, usable_bytes, timed=True)
    steps = (*probe.steps, step)
    below = max((m for m in probe.fitting() if m < fit), default=0)
    peak = max((s.peak_bytes for s in steps if s.micro_batch == below and s.fits
                and s.peak_bytes), default=None)
    how = (f"peaked {format_bytes(result.peak_bytes)}, over the {format_bytes(usable_bytes)} "
           "usable" if result.ok else "ran out of memory")
    note = (f"micro-batch {fit} does not fit after all: its timed run {how}, where its probe's "
            "run fit (peaks vary from run to run; the larger counts)")
    return dataclasses.replace(probe, max_micro_batch=below, peak_bytes=peak, steps=steps,
                               notes=(*probe.notes, note))


def probe_memory(workload: WorkloadSpec, device: str, knobs: Knobs, candidates: Sequence[int],
                 *, run: Runner = run_isolated, **options: Any) -> MemoryProbe:
    """The largest candidate micro-batch whose real training step fits: ``probe_steps`` (its
    ``options``: the budget, usable memory, hint, limits) run one at a time through ``run``
    (the isolated runner; the search passes one that records each run as a trial).

    Raises:
        WorkloadError: the workload itself fails (factory, batch or model errors).
    """
    return drive(probe_steps(workload, device, knobs, candidates, **options), run)


def probe_steps(
    workload: WorkloadSpec,
    device: str,
    knobs: Knobs,
    candidates: Sequence[int],
    *,
    budget_bytes: int,
    usable_bytes: int,
    timeout_s: float = 900.0,
    hint: int | None = None,
    on_step: OnStep | None = None,
    make_spec: Callable[[int, bool], TrialSpec] | None = None,
    ranks: int = 1,
    stop_above: Callable[[int, int], str | None] | None = None,
    stop_below: Callable[[int, int], str | None] | None = None,
    known: Mapping[int, TrialResult] | None = None,
    flat: bool = False,
    ahead: int = 1,
    floor_first: bool = False,
) -> Steps[MemoryProbe]:
    """The largest candidate micro-batch whose real training step fits, as a chain of runs
    (``Steps``: each spec yielded is sent its result; ``probe_memory`` runs it).

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
        on_step: called after each probe, for progress output.
        make_spec: the spec for a micro-batch, told whether the probe may be the class's
            largest fit (default: ``probe_spec``, no timing; the search times such probes, so
            the run that finds the boundary also times it, while bisection points do not pay
            for timed steps).
        ranks: processes of the job on this machine (``probe_spec``).
        stop_above: asked (the largest fit so far, the larger micro-batch next), before a
            larger micro-batch than the largest fit so far is tried, whether that is worth a
            run: a reason ends the probe there (its largest fit is then a lower bound, said
            in the probe's notes); None goes on.
        stop_below: asked (the smallest micro-batch that ran but peaked over the usable
            budget, the smaller micro-batch next), while nothing has fit, before a micro-batch
            below such a run is tried, whether that is worth a run: a reason ends the probe
            with nothing found to fit (said in its notes, "micro-batches below ..."); None
            goes on.
        known: runs of this very setting measured before the probe (e.g. timed at the
            leader's micro-batch when a knob was screened), by micro-batch: their peaks are on
            the line from the start, so a boundary they already imply costs no run (a probe
            that starts at the hint above such a run, then would try the next, stops where the
            line through both puts it over the cap). Only a run that ended ``ok`` or ``oom``
            counts (a crash or a timeout says nothing of memory); they are the probe's first
            steps, without ``on_step`` (they were reported when they ran).
        flat: this machine's peaks were seen to grow less per sample at larger micro-batches
            (``boundary.flattens``): a line through the peaks puts a micro-batch over the cap
            without a run only within its reach (``boundary.line_reach``), as where this
            probe's own peaks flatten.
        ahead: the most runs made at once (several slots). Where nothing has fit yet and
            the next micro-batch lies below every failure, that one and the runs one at a
            time would make after it were each to fail too (the smallest candidate next,
            then nothing) run as one fan (``descent``), each timed as the boundary it may
            be (``make_spec`` told so). The probe then decides on their results as one at
            a time would, in order: the boundary is the one it finds, in no more rounds;
            the runs are its runs, and one after a fit it would not have made. 1: one run
            at a time.
        floor_first: after a failure at the first guess (``hint``) with nothing fit, the
            smallest candidate next, not the one below the guess (``boundary.next_candidate``):
            for a class whose need may have a floor no smaller micro-batch lowers (a
            compile's own memory, where it counts in the peak), one run says that nothing
            fits.

    Raises:
        WorkloadError: the workload itself fails (factory, batch or model errors).
    """
    cands = sorted(set(candidates))
    steps: list[ProbeStep] = []
    points: list[Point] = []
    stopped = ""

    def record(micro_batch: int, result: TrialResult, timed: bool) -> ProbeStep:
        step = probe_step(micro_batch, result, usable_bytes, timed=timed)
        steps.append(step)
        # Only a complete run's peak is on the line: a failed run's is where it stopped.
        points.append(Point(micro_batch=micro_batch, fits=step.fits,
                            peak_bytes=result.peak_bytes if result.ok else None))
        return step

    def over_with_peak() -> list[int]:
        """The micro-batches that ran to the end over the usable budget (a peak to reason on,
        ``stop_below``'s)."""
        return [p.micro_batch for p in points if not p.fits and p.peak_bytes is not None]

    def advance(micro_batch: int | None) -> int | None:
        """The next micro-batch after ``micro_batch`` (the proposal from the points), or None
        where the boundary is decided or not worth a run (said in ``stopped``)."""
        nonlocal stopped
        fit, _ = bracket(points)
        over = confirm_over(open_candidates(cands, points), points, budget_bytes, flat=flat)
        if micro_batch is None and over is not None:
            above = open_candidates(cands, points)[0]
            fitted = ", ".join(str(p.micro_batch) for p in points if p.fits)
            stopped = (f"micro-batches above {fit} not probed: the line through the peaks at "
                       f"{fitted} puts {above} at {format_bytes(int(over))}, over the "
                       f"{format_bytes(budget_bytes)} cap")
        if micro_batch is not None and stop_above is not None and 0 < fit < micro_batch:
            why = stop_above(fit, micro_batch)
            if why:
                stopped = f"micro-batches above {fit} not probed: {why}"
                return None
        ran_over = over_with_peak()
        if micro_batch is not None and stop_below is not None and not fit and ran_over \
                and micro_batch < min(ran_over):
            why = stop_below(min(ran_over), micro_batch)
            if why:
                stopped = f"micro-batches below {min(ran_over)} not probed: {why}"
                return None
        return micro_batch

    def descent(micro_batch: int, most: int) -> list[int]:
        """With nothing fit yet and ``micro_batch`` below every failure: the runs one at a
        time would make after it were each to fail too (``most`` at most, each worth a run:
        ``stop_below``)."""
        failed = [p.micro_batch for p in points if not p.fits]
        if most < 1 or bracket(points)[0] or not failed or micro_batch > min(failed):
            return []
        ran_over = over_with_peak()
        path: list[int] = []
        assumed, m = [*points], micro_batch
        while len(path) < most:
            assumed.append(Point(micro_batch=m, peak_bytes=None, fits=False))
            m = next_candidate(cands, assumed, usable_bytes, hint, over_bytes=budget_bytes,
                               flat=flat, floor_first=floor_first)
            if m is None or (ran_over and stop_below is not None
                             and stop_below(min(ran_over), m)):
                break
            path.append(m)
        return path

    for m, result in sorted((known or {}).items()):
        if m in cands and result.status in ("ok", "oom"):
            record(m, result, timed=bool(result.step_times_s))
    micro_batch: int | None
    if not points:
        micro_batch = first_candidate(cands, hint)
    elif hint is not None and hint in open_candidates(cands, points):
        micro_batch = advance(hint)  # the first guess still, if the known runs leave it open
    else:
        micro_batch = advance(next_candidate(cands, points, usable_bytes, hint,
                                             over_bytes=budget_bytes, flat=flat,
                                             floor_first=floor_first))
    # The first guess is the expected boundary; after known runs, as the points say.
    may_be_largest = micro_batch is not None and (
        not points or is_largest_candidate(micro_batch, cands, points, usable_bytes))
    while micro_batch is not None:
        fan = [micro_batch, *descent(micro_batch, ahead - 1)]
        specs = [make_spec(m, may_be_largest or m != micro_batch) if make_spec is not None
                 else probe_spec(workload, device, knobs, m, budget_bytes, timeout_s,
                                 ranks=ranks) for m in fan]
        results = (yield tuple(specs)) if len(specs) > 1 else ((yield specs[0]),)
        for m, spec, result in zip(fan, specs, results, strict=True):
            if result.status in ("workload_error", "error"):
                raise WorkloadError(
                    f"the workload failed at micro-batch {m} ({knobs.label()}):\n"
                    f"{result.message}"
                )
            step = record(m, result, timed=spec.num_timed_steps > 0)
            if on_step is not None:
                on_step(knobs, step)
        if any(r.status == "unsupported" for r in results):  # no micro-batch changes that
            break
        micro_batch = advance(next_candidate(cands, points, usable_bytes, hint,
                                             over_bytes=budget_bytes, flat=flat,
                                             floor_first=floor_first))
        if micro_batch is not None:
            may_be_largest = is_largest_candidate(micro_batch, cands, points, usable_bytes)
        elif not stopped:
            gap = rising_gap(cands, steps, budget_bytes, usable_bytes)
            micro_batch = advance(gap[len(gap) // 2]) if gap else None
            may_be_largest = False  # (the search times the boundary once it is found)

    lo, _ = bracket(points)
    best = next((s for s in steps if s.micro_batch == lo and s.fits), None)
    notes = (*_notes(steps), *((stopped,) if stopped else ()))
    return MemoryProbe(
        knobs=knobs, max_micro_batch=lo,
        peak_bytes=best.peak_bytes if best else None, budget_bytes=budget_bytes,
        usable_bytes=usable_bytes, candidates=tuple(cands), steps=tuple(steps), notes=notes,
    )


GAP_EXCESS_SHARE = 0.5
"""``rising_gap``: the most a larger micro-batch's failure may overshoot the cap, as a share
of the smaller one's overshoot, for the micro-batches between to be probed."""


def rising_gap(candidates: Sequence[int], steps: Sequence[ProbeStep], budget_bytes: int,
               usable_bytes: int) -> list[int]:
    """Where nothing fit and a smaller micro-batch failed at a higher peak than a larger one
    did, the candidates not yet run between the largest such smaller one and the next
    micro-batch run above it, where that one failed nearer the cap (its peak over the cap by
    at most ``GAP_EXCESS_SHARE`` of the smaller one's excess: the need falls toward the cap
    across the gap, so one between may land under it); else none. "Nothing fits"
    rests on memory growing with the micro-batch, and these peaks deny it here: a CPU kernel
    picks its workspace by shape (tiny_cnn on the Xeon, bf16 eager: micro-batch 1 peaked at
    35 MiB out of memory, 16 at 28.7 against a 25.5 MiB cap, while 2 and 4 fit in 23; its
    compiled classes failed at 114-131 MiB at every micro-batch, a floor the compile sets,
    and nothing between fits). Once one between fits, the candidates between it and the
    next run above it (a failure there is the boundary); a probe whose fit came without a
    failure below it was decided by the bracket. Each step runs a candidate not run yet, the
    middle one of the gap: the probe ends."""
    ran = {s.micro_batch for s in steps}
    if any(s.fits for s in steps):
        lo = max(s.micro_batch for s in steps if s.fits)
        if not any(s.micro_batch < lo and not s.fits for s in steps):
            return []  # (found without a rising peak: the bracket decided it)
        high = min((m for m in ran if m > lo), default=math.inf)
        return [c for c in candidates if lo < c < high and c not in ran]
    peaks = sorted((s.micro_batch, s.peak_bytes) for s in steps  # memory verdicts alone
                   if s.peak_bytes and s.status in ("ok", MEMORY_STATUS))
    rises = [m for i, (m, peak) in enumerate(peaks)
             if any(peak > other for _, other in peaks[i + 1:])]
    if not rises:
        return []
    low = max(rises)
    high = min((m for m in ran if m > low), default=math.inf)
    excess = {m: p - budget_bytes for m, p in peaks}
    if high not in excess or excess[high] > GAP_EXCESS_SHARE * excess[low]:
        return []
    return [c for c in candidates if low < c < high and c not in ran]


def _notes(steps: list[ProbeStep]) -> tuple[str, ...]:
    notes = []
    for step in steps:
        if step.status not in ("ok", "oom"):
            notes.append(f"micro-batch {step.micro_batch}: {step.status}: {step.message}")
    return tuple(notes)

