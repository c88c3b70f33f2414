"""What the evidence says of memory: a setting's largest fit, whether a value lowered the
leader's peak, the growth per sample, the recompute floor, and each compiled candidate's fit
as a first launch (its own run compiled afresh, or a sibling's bounding it).

Pure queries of ``Evidence``: nothing here runs or records anything.
"""

from __future__ import annotations

from autotune.boundary import Point, fit_line, flattens, line_reach
from autotune.config import Knobs, MemoryProbe
from autotune.knobs import KNOB
from autotune.search._records import Candidate
from autotune.search.evidence import Evidence
from autotune.search.plan import memory_class, recompute_twin
from autotune.units import format_bytes


def largest_fit(ev: Evidence, knobs: Knobs, *, calm: bool = False) -> int:
    """The largest micro-batch of ``knobs`` known to fit (its probes' and timed runs'), 0
    when none; ``calm``: only runs without allocator retries count."""
    return max((c.micro_batch for c, r in [*ev.probe_runs.items(), *ev.results.items()]
                if c.knobs == knobs and r.fits(ev.usable)
                and not (calm and r.num_alloc_retries)), default=0)


def lower_peak(ev: Evidence, leader: Candidate, timed: Candidate) -> bool:
    """Whether memory binds the leader (a larger micro-batch exists that it does not run)
    and ``timed``, run at the leader's micro-batch, peaked below it there."""
    ran, led = ev.results.get(timed), ev.results.get(leader)
    return (timed.micro_batch == leader.micro_batch < ev.plan.per_device
            and ran is not None and ran.ok and led is not None and bool(ran.peak_bytes)
            and bool(led.peak_bytes) and (ran.peak_bytes or 0) < (led.peak_bytes or 0))


def growth(ev: Evidence, knobs: Knobs, micro_batch: int, above: int) -> float | None:
    """Peak bytes per sample from ``micro_batch`` up to ``above`` for ``knobs``, or None (not
    known).

    Measured on a setting of the same memory class at two or more micro-batches that
    completed, the slope of the line through them (``boundary.fit_line``; through those at
    ``micro_batch`` and above where two are: a CPU's peak grows less per sample at larger
    micro-batches), where that line reaches ``above`` (``boundary.line_reach``, where this
    machine's peaks flatten: ``flat``); else a lower
    bound from the class's probe that stopped at ``micro_batch``: its run above failed, so
    its peak there exceeded the budget (or is the measured one)."""
    cls = memory_class(knobs)
    bound = None
    for k, probe in ev.probes.items():
        if memory_class(k) != cls:
            continue
        points = sorted({s.micro_batch: s.peak_bytes for s in probe.steps
                         if s.status == "ok" and s.peak_bytes}.items())
        measured = [Point(micro_batch=m, peak_bytes=b, fits=True) for m, b in points]
        local = [p for p in measured if p.micro_batch >= micro_batch]
        measured = local if len(local) >= 2 else measured
        line = fit_line(measured)
        if line is not None and (above <= line_reach(measured) or not flat(ev)):
            return max(0.0, line[0])
        over = min((s for s in probe.steps if s.micro_batch > micro_batch and not s.fits),
                   key=lambda s: s.micro_batch, default=None)
        if points and points[-1][0] == micro_batch and over is not None:
            end = over.peak_bytes if over.status == "ok" and over.peak_bytes else \
                ev.plan.report.budget_bytes
            bound = max(0.0, (end - points[-1][1]) / (over.micro_batch - micro_batch))
    return bound


def flat(ev: Evidence) -> bool:
    """Whether this device's peaks grow less per sample at larger micro-batches: its kind's
    do (a CPU's: ``Plan.peaks_flatten``), or a setting's probe measured such peaks
    (``boundary.flattens``). Then a line through two peaks is not trusted further beyond them
    than they are apart (``boundary.line_reach``)."""
    return ev.plan.peaks_flatten or any(
        flattens([Point(micro_batch=s.micro_batch, peak_bytes=s.peak_bytes, fits=s.fits)
                  for s in probe.steps if s.status == "ok"])
        for probe in ev.probes.values())


def recompute_floor(ev: Evidence, knobs: Knobs) -> int:
    """For a checkpointed setting, the largest micro-batch its setting without
    checkpointing is known to fit as a user's first launch runs it: a timed run without
    allocator retries within the usable budget that, compiled, also fit with its graphs
    compiled afresh (eager code compiles nothing). 0: none known, or no checkpointing."""
    if knobs.checkpointing == "off":
        return 0
    twin = recompute_twin(knobs)

    def first_launch_fits(key: Candidate) -> bool:
        cold = ev.cold.get(key)
        return not key.knobs.compiled or (cold is not None
                                                   and cold.fits(ev.usable))

    return max((c.micro_batch for c, r in ev.results.items()
                if c.knobs == twin and r.fits(ev.usable) and r.step_times_s
                and not r.num_alloc_retries and first_launch_fits(c)), default=0)


def sibling_bound(ev: Evidence, key: Candidate) -> tuple[int, int, Candidate] | None:
    """Where a run of the same graphs (another optimizer implementation on its setting)
    compiled them afresh and ran: the candidate's own peak, that run's peak and the
    sibling. That run's peak holds its compile's memory, so the two peaks' sum bounds the
    candidate's peak as a first launch. None without such a run."""
    own = ev.results[key].peak_bytes if key in ev.results else None
    siblings = [(cold.peak_bytes, other) for other, cold in ev.cold.items()
                if other.graph() == key.graph() and cold.ok and cold.peak_bytes is not None]
    if own is None or not siblings:
        return None
    peak, sibling = min(siblings, key=lambda s: s[0])
    return own, peak, sibling


def vouched_by_sibling(ev: Evidence, key: Candidate) -> bool:
    """Whether ``sibling_bound`` puts the candidate's first launch within budget."""
    bound = sibling_bound(ev, key)
    return bound is not None and bound[0] + bound[1] <= ev.usable


def unchecked_launch(ev: Evidence, key: Candidate) -> bool:
    """Whether a compiled candidate's fit as a first launch is still to check: on a device
    whose peak counts the compile, no run of it compiled its graphs afresh, and no
    sibling's run afresh bounds it within the usable budget (``sibling_bound``)."""
    if not (key.knobs.compiled and key not in ev.cold
            and ev.plan.compile_in_peak):
        return False
    return not vouched_by_sibling(ev, key)


def first_launch(ev: Evidence) -> dict[Candidate, str]:
    """``SearchOutcome.first_launch``: what is unknown or against each compiled
    candidate's fit as a first launch (on a device whose peak counts the compile)."""
    if not ev.plan.compile_in_peak:
        return {}
    notes = {}
    for key in ev.results:
        cold = ev.cold.get(key)
        if not key.knobs.compiled or (cold is not None and cold.fits(ev.usable)):
            continue
        if cold is None and vouched_by_sibling(ev, key):
            continue
        notes[key] = ("unchecked (its runs loaded their compiled graphs from inductor's "
                      "cache, which lowers the peak)" if cold is None else
                      "it does not fit (compiled afresh it "
                      + (f"peaked at {format_bytes(cold.peak_bytes or 0)}"
                         if cold.ok else f"ended {cold.status}")
                      + f", over the {format_bytes(ev.usable)} usable)")
    return notes


def known_baseline(ev: Evidence) -> Candidate | None:
    """fp32 eager at the largest micro-batch timed so far that fits: the baseline of a
    search stopped before the baseline's memory probe ended."""
    fits = [c for c, r in ev.results.items()
            if c.knobs == ev.plan.base and r.fits(ev.usable)]
    return max(fits, key=lambda c: c.micro_batch, default=None)


VALUE_PEAK_DROP = 0.25
"""The share of a run's peak that a knob value freeing no memory by design (an optimizer
implementation, a memory format) may take off it: on the recorded CPU tables, of 1,408 such
values set beside their setting at peaks of 10 MiB or more, 95% took at most 23% off its
peak, 99% at most 27%, one 35% (channels_last on the EPYC CNN at 11.6 MiB); the deep GPT's
foreach optimizer took 22% off at micro-batch 1 (``benchmarks/value_peaks.py``): mostly at
small micro-batches, where the allocator's blocks and a kernel's workspace weigh most. A
miss within it of the usable memory is near (rule ``near-miss``)."""


def near_miss(ev: Evidence, knobs: Knobs) -> tuple[int, bool] | None:
    """The peak of ``knobs`` at the smallest micro-batch where that run missed the usable
    memory by no more than a value freeing no memory by design may take off a peak (rule
    ``near-miss``), and whether it went through every step under the cap (a miss inside the
    headroom, the margin kept for the allocator's run-to-run noise) or, fp32 eager's (whose
    rescue tries only the values that free memory), ran out of memory there
    (``VALUE_PEAK_DROP``; a live run reports the peak it had reached when an allocation
    failed, at most the cap, so on a live machine any out-of-memory there is near; the
    replay's tables keep what the run needed). None: it fit, failed otherwise, or was not
    run there."""
    probe = ev.probes.get(knobs)
    smallest = ev.plan.micro_batches[0]
    # (the last run there: a timed run over the budget where the probe's fit, ``refuted``)
    step = next((s for s in reversed(probe.steps if probe else ()) if s.micro_batch == smallest),
                None)
    if step is None or step.fits or not step.peak_bytes or step.peak_bytes <= ev.usable:
        return None
    headroom = step.status == "ok" and step.peak_bytes <= ev.plan.report.budget_bytes
    if headroom or (step.status == "oom" and knobs == ev.plan.base
                    and step.peak_bytes * (1 - VALUE_PEAK_DROP) <= ev.usable):
        return step.peak_bytes, headroom
    return None


def floor_first(ev: Evidence, knobs: Knobs) -> bool:
    """Whether a probe out of memory at its first guess tries the smallest micro-batch next
    (``memory.probe_steps``, from ``stages.probe``): a compiled setting where the compile's
    memory counts in the peak (CPU). There such a class is over a compile's floor, which no
    smaller micro-batch lowers, far more often than over its activations: 74 of 88 compiled
    classes out of memory at fp32 eager's fit fit nothing smaller on the develop tables, 74
    of 82 on the judge's (``benchmarks/probe_fits.py``); one run says so. Where the one
    below fits (8 on each), the probe goes up from the smallest: two runs more."""
    return knobs.compiled and ev.plan.compile_in_peak


def floor_over(ev: Evidence, knobs: Knobs) -> bool:
    """Whether a compiled setting's probe starts at the smallest micro-batch: where it tries
    the smallest next after a failure (``floor_first``) and another compiled setting's probe
    fit nothing down to the smallest, a compile's floor over the budget. Its own first guess
    (its eager class's fit) then most likely fails too, a run that compiles for nothing: one
    run says so from the start. On the generated replay tables (``replay.py --families all
    --seeds 30 --noise keyed``, before and after) every pick stayed the same and the cost
    fell by 0.0060 (develop) and 0.0043 (judge) of an exhaustive pass."""
    return floor_first(ev, knobs) and any(fit_nothing(ev, k, p) for k, p in ev.probes.items())


def fit_nothing(ev: Evidence, knobs: Knobs, probe: MemoryProbe) -> bool:
    """A compiled class without checkpointing whose probe fit no micro-batch down to the
    smallest: each run out of memory, crashed, or over the usable memory (none timed)."""
    smallest = ev.plan.micro_batches[0]
    return (knobs.compiled and knobs.checkpointing == KNOB["checkpointing"].default
            and not probe.max_micro_batch
            and any(s.micro_batch == smallest for s in probe.steps)
            and not any(s.fits or s.status not in ("oom", "crash", "ok") for s in probe.steps))
