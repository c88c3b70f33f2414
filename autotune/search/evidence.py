"""The evidence: every run of every candidate a search has, and what it says so far.

``Evidence`` is the one state of a search (no other module keeps runs): timed runs, memory
probes, the runs per candidate, those that compiled their graphs afresh (a first launch's
peak), the drift between two runs of one config, the interleaved rounds, and the decisions
made (``skips``). Its queries are what every rule reads: a candidate's score and interval, the
leader, the ranking, a setting's largest fit, its growth per sample, its first-launch fit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, replace

from autotune.boundary import Point, fit_line
from autotune.config import Knobs, MemoryProbe, TrialResult, WorkloadTraits, format_bytes
from autotune.schema import TrialRecord
from autotune.search._records import (
    OUT_OF_MEMORY,
    Candidate,
    SearchSettings,
    classify,
    keep_better,
    score,
)
from autotune.search.pick import pick_winner
from autotune.search.plan import Plan, memory_class
from autotune.search.rules import Skip
from autotune.timing import MIN_STEPS_TO_STOP


@dataclass
class Evidence:
    """What one search knows: its plan, its settings and every run so far."""

    plan: Plan
    settings: SearchSettings
    held: dict[Candidate, list[TrialResult]] = field(default_factory=dict)
    """Timed runs the study holds that this search has not asked for yet, per candidate in the
    order they were made: each answers one ask, the first its first timing and the next each
    re-measure (``answer``), so a resumed search decides on what the first one had seen at
    that point and takes the same path, its rounds included; those it never asks for
    (another search's, in a shared study) join the race (``release_held``)."""
    results: dict[Candidate, TrialResult] = field(default_factory=dict)
    """Timed runs this search asked for (run now, or answered from ``held``): the better of a
    candidate's runs."""
    probe_runs: dict[Candidate, TrialResult] = field(default_factory=dict)
    """Memory probes that timed nothing (bisection points)."""
    runs: dict[Candidate, int] = field(default_factory=dict)
    """Runs of each candidate this search has (2 once re-measured), answered from the study or
    run now."""
    stored: set[Candidate] = field(default_factory=set)
    """Candidates whose timing came from the local study store: re-checked before they pick
    (their ``held`` is their better run, their ``runs`` the store's count)."""
    reached: set[Candidate] = field(default_factory=set)
    """Candidates this search asked for: a probe starts from those of its setting."""
    cold: dict[Candidate, TrialResult] = field(default_factory=dict)
    """Per compiled candidate, a run that compiled every graph afresh (a first launch's peak).
    One out of memory is kept over one that fit."""
    drift: dict[Candidate, float] = field(default_factory=dict)
    """Candidates timed twice in this search, and how far apart."""
    round_shares: dict[Candidate, tuple[float, ...]] = field(default_factory=dict)
    """Interleaved rounds: each candidate's samples/s over the other's in each round."""
    timed_s: dict[Candidate, float] = field(default_factory=dict)
    """Seconds of timed steps per candidate, over its runs in this search."""
    probes: dict[Knobs, MemoryProbe] = field(default_factory=dict)
    uncapped: TrialResult | None = None
    """fp32 eager's smallest micro-batch run once more without the memory cap, when it crashed
    under it: whether the crash was the cap's doing (``Prober.rescue_baseline``)."""
    baseline: Candidate | None = None
    traits: WorkloadTraits | None = None
    """What the workload allows (blocks, convolutions, optimizer), from any run."""
    skips: list[Skip] = field(default_factory=list)

    # -- the runs ---------------------------------------------------------------------------

    @property
    def usable(self) -> int:
        return self.plan.usable

    def note_drift(self, key: Candidate, one: TrialResult, two: TrialResult) -> None:
        """How far apart two full timings of one candidate landed (``drift``)."""
        medians = [m for r in (one, two) if r.ok and len(r.step_times_s) >= MIN_STEPS_TO_STOP
                   and (m := r.median_step_s())]
        if len(medians) == 2:
            gap = max(medians) / min(medians) - 1
            self.drift[key] = max(gap, self.drift.get(key, 0.0))

    def note_cold(self, key: Candidate, result: TrialResult) -> None:
        """Keep a compiled run that loaded nothing from inductor's cache (``cold``): a timed
        one that ran (a memory probe runs fewer micro-batches and steps: its peak is no timed
        run's), or one that ran out of memory (other endings say nothing of memory)."""
        if key.knobs.compile_mode == "off" or result.compile_cache_hits != 0 or not (
                result.compile_cache_misses or result.num_graphs):  # caches off: no counts
            return
        if not ((result.ok and result.step_times_s) or result.status in OUT_OF_MEMORY):
            return
        known = self.cold.get(key)
        if known is None or (known.fits(self.usable) and (
                not result.fits(self.usable)
                or (result.peak_bytes or 0) > (known.peak_bytes or 0))):
            self.cold[key] = result

    def remeasured(self, key: Candidate, again: TrialResult, *, cold: bool = False) -> None:
        """A contender's run again, in full (``cold``: compiled afresh, a first launch): its
        count, the drift between its runs, and its better run kept. A stored timing re-checked
        is left to ``policy.rechecked``. Results of one batch of proposals can come in any
        order: each touches only its own candidate's entries."""
        self.runs[key] = self.runs.get(key, 1) + 1
        before = self.results[key]
        if cold:
            self.cold[key] = again  # compiled afresh, whatever its counters say
            if not again.ok:
                return
        # A stored run is another session's: its gap is not this one's drift. Compiling
        # afresh does not slow the steps after it (benchmarks/cold_vs_cached.py).
        if cold or key not in self.stored:
            self.note_drift(key, before, again)
        self.results[key] = keep_better(before, again)

    def answer(self, key: Candidate) -> TrialResult | None:
        """The study's next run of ``key`` not yet asked for (a resumed search), or None."""
        rest = self.held.get(key)
        if not rest:
            return None
        result = rest.pop(0)
        if not rest:
            del self.held[key]
        return result

    def release_held(self, *, asked: bool = False) -> None:
        """The stored runs of candidates this search never asked for join the race, each its
        better run (the race's re-measures of those asked for answer from the rest); with
        ``asked``, the rest too (the search ends: it picks from all the study holds)."""
        for key in [k for k in self.held if asked or k not in self.results]:
            best, rest = self.held_best(key), self.held.pop(key)
            if key in self.results:
                self.runs[key] = self.runs.get(key, 1) + len(rest)
                best = keep_better(self.results[key], best)
            else:  # the local store's count, or the runs held
                self.runs.setdefault(key, len(rest))
            self.results[key] = best

    def held_best(self, key: Candidate) -> TrialResult:
        """The better of the study's runs of ``key`` not yet asked for (``keep_better``)."""
        first, *rest = self.held[key]
        for result in rest:
            first = keep_better(first, result)
        return first

    # -- scores -----------------------------------------------------------------------------

    def score(self, key: Candidate, *, full: bool = False) -> float | None:
        """Larger-is-better objective of a run that counts (``full``: all timed steps ran)."""
        result = self.results.get(key)
        if result is None:
            return None
        rec, value = classify(key, result, self.results, self.baseline, self.plan.report,
                              self.settings)
        if rec.verdict not in (("ok",) if full else ("ok", "slower")):
            return None
        return score(value, self.settings)

    def noise(self, *keys: Candidate) -> float:
        """Relative gap two runs need before it counts: ``confirm_within`` (the run-to-run
        noise of a machine), or the 95% interval of the runs' ratio when wider (their medians'
        half-widths in quadrature: a short or noisy timing says less)."""
        widths = [r.halfwidth() or 0.0 for k in keys if (r := self.results.get(k)) is not None]
        return max(self.settings.confirm_within, math.hypot(*widths))

    def class_best(self, knobs: Knobs) -> float | None:
        scores = [self.score(Candidate(knobs=knobs, micro_batch=m))
                  for m in self.plan.micro_batches]
        return max((s for s in scores if s is not None), default=None)

    def precision_best(self, precision: str) -> float:
        """The best score of the settings of one precision probed so far (0: none)."""
        return max((self.class_best(k) or 0.0 for k in self.probes
                    if k.precision == precision), default=0.0)

    def leader(self) -> Candidate | None:
        """The candidate with the best score of a complete timed run so far."""
        scored = [(s, k) for k in self.results if (s := self.score(k, full=True)) is not None]
        return max(scored, key=lambda t: t[0])[1] if scored else None

    def ranked(self) -> list[Candidate]:
        """Candidates with a complete timed run, best first."""
        return sorted((k for k in self.results if self.score(k, full=True) is not None),
                      key=lambda k: -(self.score(k, full=True) or 0.0))

    def share(self, best: float | None) -> float | None:
        """``best`` over the leader's score."""
        leader = self.leader()
        top = self.score(leader, full=True) if leader else None
        return best / top if best is not None and top else None

    def leaders_setting(self) -> Knobs | None:
        """The probed setting the leader is, or was screened from (the most alike: further
        knobs timed at its micro-batch share its probe)."""
        leader = self.leader()
        if leader is None or not self.probes:
            return None
        return max(self.probes, key=lambda k: sum(
            getattr(k, f.name) == getattr(leader.knobs, f.name) for f in dataclasses.fields(k)))

    def record(self, key: Candidate, result: TrialResult) -> TrialRecord:
        """``classify``'s record, with the candidate's interleaved rounds."""
        rec = classify(key, result, self.results, self.baseline, self.plan.report,
                       self.settings)[0]
        return replace(rec, round_shares=self.round_shares.get(key, ()))

    def winner(self) -> Candidate | None:
        """The candidate the outcome would pick now (``pick_winner`` over the verdicts)."""
        records = {k: self.record(k, r) for k, r in self.results.items()}
        best = pick_winner(tuple(records.values()), self.settings)
        return next((k for k, rec in records.items() if rec is best), None)

    # -- memory -----------------------------------------------------------------------------

    def largest_fit(self, knobs: Knobs, *, calm: bool = False) -> int:
        """The largest micro-batch of ``knobs`` known to fit (its probes' and timed runs'), 0
        when none; ``calm``: only runs without allocator retries count."""
        return max((c.micro_batch for c, r in [*self.probe_runs.items(), *self.results.items()]
                    if c.knobs == knobs and r.fits(self.usable)
                    and not (calm and r.num_alloc_retries)), default=0)

    def lower_peak(self, leader: Candidate, timed: Candidate) -> bool:
        """Whether memory binds the leader (a larger micro-batch exists that it does not run)
        and ``timed``, run at the leader's micro-batch, peaked below it there."""
        ran, led = self.results.get(timed), self.results.get(leader)
        return (timed.micro_batch == leader.micro_batch < self.plan.per_device
                and ran is not None and ran.ok and led is not None and bool(ran.peak_bytes)
                and bool(led.peak_bytes) and (ran.peak_bytes or 0) < (led.peak_bytes or 0))

    def growth(self, knobs: Knobs, micro_batch: int) -> float | None:
        """Peak bytes per sample above ``micro_batch`` for ``knobs``, or None (not known).

        Measured on a setting of the same memory class at two or more micro-batches that
        completed, the slope of the line through them (``boundary.fit_line``); else a lower
        bound from the class's probe that stopped at ``micro_batch``: its run above failed, so
        its peak there exceeded the budget (or is the measured one)."""
        cls = memory_class(knobs)
        bound = None
        for k, probe in self.probes.items():
            if memory_class(k) != cls:
                continue
            points = sorted({s.micro_batch: s.peak_bytes for s in probe.steps
                             if s.status == "ok" and s.peak_bytes}.items())
            line = fit_line([Point(micro_batch=m, peak_bytes=b, fits=True) for m, b in points])
            if line is not None:
                return max(0.0, line[0])
            over = min((s for s in probe.steps if s.micro_batch > micro_batch and not s.fits),
                       key=lambda s: s.micro_batch, default=None)
            if points and points[-1][0] == micro_batch and over is not None:
                end = over.peak_bytes if over.status == "ok" and over.peak_bytes else \
                    self.plan.report.budget_bytes
                bound = max(0.0, (end - points[-1][1]) / (over.micro_batch - micro_batch))
        return bound

    def recompute_floor(self, knobs: Knobs) -> int:
        """For a checkpointed setting, the largest micro-batch its setting without
        checkpointing is known to fit as a user's first launch runs it: a timed run without
        allocator retries within the usable budget that, compiled, also fit with its graphs
        compiled afresh (eager code compiles nothing). 0: none known, or no checkpointing."""
        if knobs.checkpointing == "off":
            return 0
        twin = knobs.with_(checkpointing="off")

        def first_launch_fits(key: Candidate) -> bool:
            cold = self.cold.get(key)
            return key.knobs.compile_mode == "off" or (cold is not None
                                                       and cold.fits(self.usable))

        return max((c.micro_batch for c, r in self.results.items()
                    if c.knobs == twin and r.fits(self.usable) and r.step_times_s
                    and not r.num_alloc_retries and first_launch_fits(c)), default=0)

    def sibling_bound(self, key: Candidate) -> tuple[int, int, Candidate] | None:
        """Where a run of the same graphs (another optimizer implementation on its setting)
        compiled them afresh and ran: the candidate's own peak, that run's peak and the
        sibling. That run's peak holds its compile's memory, so the two peaks' sum bounds the
        candidate's peak as a first launch. None without such a run."""
        own = self.results[key].peak_bytes if key in self.results else None
        siblings = [(cold.peak_bytes, other) for other, cold in self.cold.items()
                    if other.graph() == key.graph() and cold.ok and cold.peak_bytes is not None]
        if own is None or not siblings:
            return None
        peak, sibling = min(siblings, key=lambda s: s[0])
        return own, peak, sibling

    def vouched_by_sibling(self, key: Candidate) -> bool:
        """Whether ``sibling_bound`` puts the candidate's first launch within budget."""
        bound = self.sibling_bound(key)
        return bound is not None and bound[0] + bound[1] <= self.usable

    def unchecked_launch(self, key: Candidate) -> bool:
        """Whether a compiled candidate's fit as a first launch is still to check: on a device
        whose peak counts the compile, no run of it compiled its graphs afresh, and no
        sibling's run afresh bounds it within the usable budget (``sibling_bound``)."""
        if not (key.knobs.compile_mode != "off" and key not in self.cold
                and self.plan.compile_in_peak):
            return False
        return not self.vouched_by_sibling(key)

    def first_launch(self) -> dict[Candidate, str]:
        """``SearchOutcome.first_launch``: what is unknown or against each compiled
        candidate's fit as a first launch (on a device whose peak counts the compile)."""
        if not self.plan.compile_in_peak:
            return {}
        notes = {}
        for key in self.results:
            cold = self.cold.get(key)
            if key.knobs.compile_mode == "off" or (cold is not None and cold.fits(self.usable)):
                continue
            if cold is None and self.vouched_by_sibling(key):
                continue
            notes[key] = ("unchecked (its runs loaded their compiled graphs from inductor's "
                          "cache, which lowers the peak)" if cold is None else
                          "it does not fit (compiled afresh it "
                          + (f"peaked at {format_bytes(cold.peak_bytes or 0)}"
                             if cold.ok else f"ended {cold.status}")
                          + f", over the {format_bytes(self.usable)} usable)")
        return notes

    def known_baseline(self) -> Candidate | None:
        """fp32 eager at the largest micro-batch timed so far that fits: the baseline of a
        search stopped before the baseline's memory probe ended."""
        fits = [c for c, r in self.results.items()
                if c.knobs == self.plan.base and r.fits(self.usable)]
        return max(fits, key=lambda c: c.micro_batch, default=None)
