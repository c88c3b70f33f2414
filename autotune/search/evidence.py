"""The evidence: every run of every candidate a search has, and what it says so far.

``Evidence`` is the one state of a search (no other module keeps runs): timed runs, memory
probes, the runs per candidate, those that compiled their graphs afresh (a first launch's
peak), the drift between two runs of one config, the interleaved rounds; and beside what was
measured, the decisions made (``skips``, the candidates ruled out as a first launch). Other
modules read its fields and write only through its methods (``took``, ``remeasured``,
``decide``, ``rule_out``...). Its queries are what every rule reads: a candidate's score and
``Interval``, the leader, the ranking (what it says of memory: ``fits``; what the pick reads
of it: its base, ``figures.Figures``).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from autotune.config import Knobs, MemoryProbe, TrialResult, WorkloadTraits
from autotune.search._records import (
    OUT_OF_MEMORY,
    Candidate,
    SearchSettings,
    judge,
    keep_better,
    objective,
    score,
    typical_run,
)
from autotune.search.figures import Figures
from autotune.search.intervals import PAIR_STALL, noise_of
from autotune.search.plan import Plan
from autotune.search.rules import Skip
from autotune.timing import MIN_STEPS_TO_STOP


@dataclass
class Evidence(Figures):
    """What one search knows: its plan, its settings and every run so far."""

    plan: Plan
    settings: SearchSettings
    held: dict[Candidate, list[TrialResult]] = field(default_factory=dict)
    """Timed runs the study holds that this search has not asked for yet, per candidate in the
    order they were made: each answers one ask, the first its first timing and the next each
    re-measure (``answer``), so a resumed search decides on what the first one had seen at
    that point and takes the same path, its rounds included; those it never asks for
    (another search's, in a shared study) join the race (``release_held``)."""
    measured: dict[Candidate, TrialResult] = field(default_factory=dict)
    """Timed runs this search asked for (run now, or answered from ``held``): the better of a
    candidate's runs, as measured (``results`` says them as judged): what the stages' bounds
    read (a slow period only inflates times, so what they exclude stays excluded)."""
    timed: dict[Candidate, list[TrialResult]] = field(default_factory=dict)
    """Every timed run of each candidate in ``measured``, in the order they came (a stale
    stored one dropped, ``rechecked``): what its record shows and the pick reads
    (``figure``)."""
    probe_runs: dict[Candidate, TrialResult] = field(default_factory=dict)
    """Memory probes that timed nothing (bisection points)."""
    runs: dict[Candidate, int] = field(default_factory=dict)
    """Runs of each candidate this search has (2 once re-measured), answered from the study or
    run now."""
    stored: set[Candidate] = field(default_factory=set)
    """Candidates whose timing came from the local study store: re-checked before they pick
    (their ``held`` is their first run, their ``runs`` the store's count)."""
    stored_rest: dict[Candidate, list[TrialResult]] = field(default_factory=dict)
    """The local store's later runs of each candidate: they join its record at its re-check,
    or as the search ends (``join_stored``), never answering an ask (a re-measure of a stored
    timing runs afresh). Until then the candidate reads as the search that ran it first read
    it: a re-check decides on fresh evidence, not on what a later run of it carried (a CPU
    peak moves by a few 100 KiB a run)."""
    reached: set[Candidate] = field(default_factory=set)
    """Candidates this search asked for: a probe starts from those of its setting."""
    cold: dict[Candidate, TrialResult] = field(default_factory=dict)
    """Per compiled candidate, a run that compiled every graph afresh (a first launch's peak).
    One out of memory is kept over one that fit."""
    floored: list[Knobs] = field(default_factory=list)
    """Compiled classes not probed (rule ``compile-floor``): they fit no more than a class
    that fit nothing, so the probe stage offers them checkpointing as it offers that one."""
    drift: dict[Candidate, float] = field(default_factory=dict)
    """Candidates timed twice in this search, and how far apart."""
    round_shares: dict[Candidate, tuple[float, ...]] = field(default_factory=dict)
    """Interleaved rounds: each candidate's samples/s over the other's in each round."""
    rivals: dict[Candidate, Candidate] = field(default_factory=dict)
    """Interleaved rounds: each candidate's other of the pair."""
    timed_s: dict[Candidate, float] = field(default_factory=dict)
    """Seconds of timed steps per candidate, over its runs in this search."""
    probes: dict[Knobs, MemoryProbe] = field(default_factory=dict)
    uncapped: TrialResult | None = None
    """fp32 eager's smallest micro-batch run once more without the memory cap, when it crashed
    under it: whether the crash was the cap's doing (``stages.probe.rescue_baseline``)."""
    baseline: Candidate | None = None
    traits: WorkloadTraits | None = None
    """What the workload allows (blocks, convolutions, optimizer), from any run."""
    skips: list[Skip] = field(default_factory=list)
    """The decisions not to run something, in the order they were made (``decide``)."""
    out: dict[Candidate, Skip] = field(default_factory=dict)
    """Compiled candidates ruled out as a first launch (``rule_out``): their run compiled
    afresh did not fit."""
    judged: dict[Candidate, TrialResult] = field(default_factory=dict, repr=False)
    """``results``, kept as the runs are taken."""

    # -- the runs ---------------------------------------------------------------------------

    @property
    def results(self) -> Mapping[Candidate, TrialResult]:
        """Each candidate's better run as the search judges it: as measured, or for one ruled
        out as a first launch (``out``), out of memory with its rule's words. Every rule
        reads these."""
        return self.judged

    def _keep(self, key: Candidate, result: TrialResult) -> None:
        """``result`` as ``key``'s better run so far (``measured``), and as judged."""
        self.measured[key] = result
        out = self.out.get(key)
        self.judged[key] = result if out is None else replace(
            result, status="oom", message=out.text.removeprefix(f"{key.key()}: "))

    @property
    def usable(self) -> int:
        return self.plan.usable

    def hold(self, completed: Mapping[Candidate, list[TrialResult]],
             probed: dict[Candidate, TrialResult], *, local: bool) -> None:
        """What the study holds as the search starts: its timed runs in this search's space
        (``held``), its memory probes, the workload's traits from any run, and each run
        that compiled afresh (``note_cold``). ``local``: the local store, a cache whose
        timings are re-checked, not replayed: each candidate's first run answers its first
        ask (as the search that ran it read it), its later runs wait (``stored_rest``), and a
        re-measure runs afresh (``stored``)."""
        self.held = {c: r for c, r in completed.items() if self.plan.allowed(c.knobs)}
        self.probe_runs = probed
        held = [(k, r) for k, runs in self.held.items() for r in runs]
        self.traits = next((r.traits for _, r in held if r.traits is not None), None)
        if local:
            self.stored, self.runs = set(self.held), {k: len(v) for k, v in self.held.items()}
            self.stored_rest = {k: v[1:] for k, v in self.held.items() if len(v) > 1}
            self.held = {k: v[:1] for k, v in self.held.items()}
        for key, result in [*self.probe_runs.items(), *held]:
            self.note_cold(key, result)

    def asked(self, key: Candidate) -> None:
        """The search asked for a run of ``key`` (``reached``)."""
        self.reached.add(key)

    def took(self, key: Candidate, result: TrialResult) -> None:
        """A candidate's first timing, run now or answered from the study."""
        self.timed[key] = [result]
        self._keep(key, result)

    def probed_at(self, key: Candidate, result: TrialResult) -> None:
        """A memory probe's run that timed nothing (a bisection point)."""
        self.probe_runs[key] = result

    def ran(self, key: Candidate, result: TrialResult) -> None:
        """A child run ended: its seconds of timed steps, and its first-launch peak where it
        compiled afresh (``note_cold``)."""
        self.note_cold(key, result)
        self.timed_s[key] = self.timed_s.get(key, 0.0) + sum(result.step_times_s)

    def learned(self, result: TrialResult) -> None:
        """What the workload allows, from the first run that says it."""
        if self.traits is None and result.traits is not None:
            self.traits = result.traits

    def found(self, probe: MemoryProbe) -> None:
        """A setting's memory probe (its boundary)."""
        self.probes[probe.knobs] = probe

    def unfound(self, knobs: Knobs) -> None:
        """A setting's probe that says nothing of its boundary (its smaller micro-batches were
        never tried): not "fits none"."""
        del self.probes[knobs]

    def took_uncapped(self, result: TrialResult) -> None:
        """fp32 eager's smallest micro-batch, run once more without the memory cap."""
        self.uncapped = result

    def name_baseline(self, key: Candidate | None) -> None:
        """What an untuned user runs: fp32 eager at its largest fit (or what rescued it)."""
        self.baseline = key

    def decide(self, skip: Skip) -> None:
        """A decision not to run something, said with its rule (``skips``)."""
        self.skips.append(skip)

    def rule_out(self, key: Candidate, why: Skip) -> None:
        """A compiled candidate is out: its run compiled afresh, as a first launch compiles it,
        did not fit (``why``, also said in ``skips``). Its run stays as measured; it is judged
        out of memory."""
        self.out[key] = why
        self._keep(key, self.measured[key])
        self.decide(why)

    def raced(self, leader: Candidate, challenger: Candidate, shares: Sequence[float],
              note: Skip) -> None:
        """Interleaved rounds decided between two candidates (``shares``: the challenger's
        samples/s over the leader's in each round), said in ``note``."""
        self.round_shares[challenger] = tuple(shares)
        self.round_shares[leader] = tuple(1 / s for s in shares)
        self.rivals[challenger], self.rivals[leader] = leader, challenger
        self.decide(note)

    def rechecked(self, key: Candidate, again: TrialResult, *, fresh: bool, note: Skip) -> None:
        """A stored timing re-checked (after ``remeasured``): no longer a stored one; with
        ``fresh`` (the stored run is stale) the fresh run alone counts."""
        self.stored.discard(key)
        if fresh:
            self.stored_rest.pop(key, None)
            self.timed[key] = [again]
            self._keep(key, again)
        else:
            self.join_stored(key)
        self.decide(note)

    def join_stored(self, key: Candidate) -> None:
        """A local stored candidate's later runs (``stored_rest``) join its record: its count
        has them already."""
        rest = self.stored_rest.pop(key, [])
        if rest and key in self.measured:
            self.timed.setdefault(key, [self.measured[key]]).extend(rest)
            self._keep(key, functools.reduce(keep_better, rest, self.measured[key]))

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
        if not key.knobs.compiled or result.compile_cache_hits != 0 or not (
                result.compile_cache_misses or result.num_graphs):  # caches off: no counts
            return
        if not ((result.ok and result.step_times_s) or result.status in OUT_OF_MEMORY):
            return
        known = self.cold.get(key)
        if known is None or (known.fits(self.usable) and (
                not result.fits(self.usable)
                or (result.peak_bytes or 0) > (known.peak_bytes or 0))):
            self.cold[key] = result

    def remeasured(self, key: Candidate, again: TrialResult, *, cold: bool = False,
                   paired: bool = False) -> None:
        """A contender's run again, in full (``cold``: compiled afresh, a first launch): its
        count, the drift between its runs, and its better run kept. A stored timing re-checked
        is left to ``rechecked``. Results of one batch of proposals can come in any order:
        each touches only its own candidate's entries."""
        self.runs[key] = self.runs.get(key, 1) + 1
        before = self.measured[key]
        if cold:
            self.cold[key] = again  # compiled afresh, whatever its counters say
            if not again.ok:
                return
        # A stored run is another session's: its gap is not this one's drift. Compiling
        # afresh does not slow the steps after it (benchmarks/cold_vs_cached.py).
        if cold or key not in self.stored:
            self.note_drift(key, before, again)
        self.timed.setdefault(key, [before]).append(again)
        # The noise's re-measure (``paired``): two draws of one config by design, read as
        # their mean short of a stall (its better run, the luckier draw, was what every cut
        # read); any other re-measure keeps its better run.
        self._keep(key, typical_run([before, again], PAIR_STALL - 1) if paired
                   else keep_better(before, again))

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
        if asked:
            for key in [k for k in self.stored_rest if k in self.measured]:
                self.join_stored(key)
        for key in [k for k in self.held if asked or k not in self.results]:
            best = self.held_best(key)
            rest = self.held.pop(key) + self.stored_rest.pop(key, [])
            if key in self.results:
                self.runs[key] = self.runs.get(key, 1) + len(rest)
                best = keep_better(self.measured[key], best)
                self.timed.setdefault(key, [self.measured[key]]).extend(rest)
            else:  # the local store's count, or the runs held
                self.runs.setdefault(key, len(rest))
                self.timed[key] = list(rest)
            self._keep(key, best)

    def held_best(self, key: Candidate) -> TrialResult:
        """The better of the study's runs of ``key`` not yet asked for (``keep_better``), the
        local store's later ones too."""
        return functools.reduce(keep_better, self.held[key] + self.stored_rest.get(key, []))

    # -- scores -----------------------------------------------------------------------------

    def score(self, key: Candidate, *, full: bool = False) -> float | None:
        """Larger-is-better objective of a run that counts (``full``: all timed steps ran)."""
        result = self.results.get(key)
        if result is None:
            return None
        base = self.results.get(self.baseline) if self.baseline is not None else None
        verdict, _ = judge(key, result, base, self.plan.report, self.settings)
        if verdict not in (("ok",) if full else ("ok", "slower")):
            return None
        return score(objective(result, self.settings), self.settings)

    def noise(self, *keys: Candidate) -> float:
        """``noise_of`` the candidates' runs (those that ran), at this machine's measured
        noise (``noise_level``)."""
        return noise_of(self.settings, *(r for k in keys if (r := self.results.get(k))
                                         is not None), level=self.noise_level)

    @property
    def noise_level(self) -> float:
        """This machine's run-to-run noise as the search measured it: the median of the gaps
        between two full runs of one config (``drift``: the baseline's early re-measure
        first, then every re-measure), ``confirm_within`` its floor (and the figure until a
        config ran twice). The median, not the widest: a run that stalled (one-sided, 1.5x
        slower and more) says how slow one run can come out (``stall``), not how far a
        typical run lands from another."""
        gaps = sorted(self.drift.values())
        return max(self.settings.confirm_within, statistics.median(gaps) if gaps else 0.0)

    def drift_beside(self, key: Candidate) -> float:
        """How far two runs of one config land apart here as measured on the others than
        ``key`` (the median of their ``drift``; 0 before any other ran twice): whether
        ``key``'s two runs are two draws of one config or one of them stalled
        (``typical_run``), which their own gap cannot say. Measured only, without
        ``confirm_within``'s floor: a setting, not a measurement."""
        gaps = sorted(g for k, g in self.drift.items() if k != key)
        return statistics.median(gaps) if gaps else 0.0

    def refine_floor(self) -> float:
        """The least share of the leader's score a setting's best needs to be refined (its
        smaller micro-batches timed, a precision's other compile modes tried):
        ``--refine-within`` (what refinement gains at most: the best's figure over that share
        still reaches the leader) less this machine's measured noise (``noise_level``): a
        best one unlucky run put behind is behind only beyond the noise. 0 with
        ``--refine-within 0`` (rule ``behind-refine``, ``bounds.refines``)."""
        return self.settings.refine_within * (1 - self.noise_level)

    @property
    def stall(self) -> float:
        """How much slower than another run of its config one run came out here, at most (the
        widest ``drift``; ``noise_level`` at least): a single run this far behind the leader
        may be such a run, so it excludes nothing before it is timed again."""
        return max(self.noise_level, max(self.drift.values(), default=0.0))

    def class_best(self, knobs: Knobs) -> float | None:
        scores = [self.score(Candidate(knobs=knobs, micro_batch=m))
                  for m in self.plan.micro_batches]
        return max((s for s in scores if s is not None), default=None)

    def setting_best(self, knobs: Knobs) -> Candidate | None:
        """The setting's best-scoring candidate so far (a run stopped early counts), or None."""
        scored = [(s, c) for c in self.results if c.knobs == knobs
                  and (s := self.score(c)) is not None]
        return max(scored, key=lambda t: t[0])[1] if scored else None

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
