"""The executor: one child run at a time, its limits, the study's ask/tell, cost and progress.

Every run a search makes goes through ``Executor.measure`` (a probe or a first timing) or
``run_proposal`` (a run the race proposes: a contender again in full, or compiled afresh as a
user's first launch compiles): each is limited by ``--max-trials`` and ``--time-budget`` (read
from the clock the replay sets), told to the study (a resumed search answers from it), counted
(``Tally``, ``Reach``) and said through ``on_trial``. What it measures lands in the
``Evidence``; it judges nothing (the stages and the policy do). With several slots
(``--parallel``) a stage's batch goes through ``batch`` instead, which starts each run here
(``limited``, ``answered``) and records it here as it ends (``ran``, ``took``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from autotune.config import StopReason, TrialResult, TrialSpec
from autotune.lengths import POOL_STEPS
from autotune.memory import OnStep, probe_spec
from autotune.schema import RunKind, TrialRecord
from autotune.search._records import Candidate, SearchSettings, classify, run_record
from autotune.search._store import open_search_study
from autotune.search._study import Asked
from autotune.search.claims import Elsewhere, who
from autotune.search.evidence import Evidence
from autotune.search.forecast import RunCount, forecast
from autotune.search.intervals import Interval
from autotune.search.plan import Plan
from autotune.search.slots import Slots
from autotune.search.tally import Reach, Tally

Runner = Callable[[TrialSpec], TrialResult]
Reserve = Callable[["Executor"], float]
"""Seconds of the time budget to keep for the first-launch check now (``stages.race``)."""
OnTrial = Callable[[RunCount, str, Candidate, TrialRecord | None], None]
"""Progress: (runs so far and the estimate of all, stage, candidate, its record when done or
None when starting)."""
MIN_CHILD_S = 1.0
"""A child run needs at least this much of the time budget left to be started."""


@dataclass(frozen=True)
class Proposal:
    """A run the policy asks for beside others (the confirm stage's batch): a contender again
    in full, or compiled afresh as a first launch compiles (``cold``), or a stored timing
    re-checked (``recheck``). Its spec is built from the evidence when it is proposed; its
    limits (``--max-trials``, ``--time-budget``) are read when it starts. A resumed search
    answers it with the study's next run of the candidate (``stored``): no child runs."""

    candidate: Candidate
    spec: TrialSpec
    cold: bool = False
    recheck: bool = False
    stored: TrialResult | None = None


class Stop(Exception):
    """A limit ended the search early: the best so far stands."""

    def __init__(self, reason: StopReason, *, cut: bool = False, kept_s: float = 0.0) -> None:
        super().__init__(str(reason))
        self.reason = reason
        self.cut = cut
        """Whether it cut a run short (a limit reached before a run began: False)."""
        self.kept_s = kept_s
        """The seconds of the time budget kept for the first-launch check when that is what
        stopped the other runs (``Executor.limited``): the check still runs; 0 otherwise."""


class Stale(Exception):
    """A re-check ran another model than the stored runs did (its fingerprint differs)."""


class Executor:
    """Runs children for one search and records them in its evidence and study."""

    def __init__(self, ev: Evidence, run: Runner, on_trial: OnTrial | None,
                 on_step: OnStep | None, clock: Callable[[], float] = time.perf_counter, *,
                 before: Executor | None = None, reserve: Reserve | None = None,
                 slots: Slots | None = None) -> None:
        """``before``: the executor of a search given up (its stored runs were stale); its
        runs, cost and clock carry over, so the limits and the record cover both.
        ``reserve``: the seconds of ``--time-budget`` no run but a first-launch check may
        take (``limited``); None keeps none. ``slots``: where a batch's runs go at once
        (``--parallel``, ``batch``); None or one slot: one run at a time."""
        self.ev = ev
        self.slots = slots if slots is not None and slots.width > 1 else None
        self.in_flight = 0
        """Runs started on slots and not yet ended (``--max-trials`` counts them)."""
        self.slot = ""
        """The slot of the run said now (its progress says it)."""
        self.later: frozenset[Candidate] = frozenset()
        """Runs that set no bar to stop a run early (``spec``): with several slots, those the
        chains after the one deciding now made (``batch.run_chains``), which one slot makes
        after it; so a run is stopped behind on what one slot would have known, not on
        which neighbour's run happened to end first."""
        self.run, self.on_trial, self.on_step, self.clock = run, on_trial, on_step, clock
        self.reserve: Reserve = reserve or (lambda ex: 0.0)
        self.kept_s = 0.0
        """The reserve the last run's timeout was shortened to keep (``limited``; 0: none)."""
        self.study = open_search_study(ev)
        ev.hold(self.study.completed(), self.study.probed(),
                # the local store: a cache whose timings are re-checked, not replayed
                local=self.study.record.name.startswith("autotune-"))
        self.tally = Tally(clock(), run_log=self.study.stored_runs(self.plan.usable))
        self.reach = Reach()
        self.reach.enter("probe")
        self.stage_began_at = 0
        """The runs made before the current stage began (the forecast counts its own)."""
        if before is not None:
            old = before.tally
            self.tally.num_runs, self.tally.start = old.num_runs, old.start
            self.tally.cost, self.tally.compiles = dict(old.cost), list(old.compiles)
            self.tally.run_log += [replace(r, number=len(self.tally.run_log) + i)
                                   for i, r in enumerate(
                                       r for r in old.run_log if r.stored_at is None)]

    @property
    def plan(self) -> Plan:
        return self.ev.plan

    @property
    def settings(self) -> SearchSettings:
        return self.ev.settings

    @property
    def stage(self) -> str:
        """The stage running now (said with each run's progress)."""
        return self.reach.stage

    @stage.setter
    def stage(self, name: str) -> None:
        self.reach.enter(name)
        self.stage_began_at = self.tally.num_runs

    def spec(self, candidate: Candidate, *, early_stop: bool = True,
             timed: bool = True) -> TrialSpec:
        """A probe of the candidate's memory that also times its config (``timed``), or
        only measures its memory."""
        if not timed:
            return probe_spec(self.plan.report.workload, self.plan.report.device.device,
                              candidate.knobs, candidate.micro_batch,
                              self.plan.report.budget_bytes, self.settings.timeout_s,
                              ranks=self.plan.report.nproc_per_node)
        is_base_class = self.plan.baseline_setting(candidate.knobs)
        spec = probe_spec(self.plan.report.workload, self.plan.report.device.device,
                          candidate.knobs, candidate.micro_batch,
                          self.plan.report.budget_bytes, self.settings.timeout_s,
                          per_device_batch=self.plan.per_device,
                          num_timed_steps=self.settings.num_timed_steps,
                          count_flops=is_base_class, ranks=self.plan.report.nproc_per_node)
        spec = replace(spec, min_timed_s=self.settings.min_timed_s)
        if not early_stop:  # a re-measurement of a contender: every step, in full
            return spec
        spec = replace(spec, timing_precision=self.settings.rank_precision)
        # Only a run that fits sets the bar: one over the usable budget is faster than anything
        # that can be picked, and would stop a real contender "behind" it.
        usable = self.plan.usable
        # (Nor one a later chain of a batch made: one slot makes it after this one, ``later``.)
        medians = [r.median_step_s() for c, r in self.ev.results.items()
                   if r.ok and r.fits(usable) and r.median_step_s() and c not in self.later]
        if is_base_class or not medians:
            return spec
        best_s = min(m for m in medians if m is not None)
        # A timed unit of drawn lengths (a workload that declares them) is POOL_STEPS optimizer
        # steps, each median a step's: the leader's window in wall time counts them.
        units = POOL_STEPS if self.ev.traits is not None and self.ev.traits.has_lengths else 1
        best_window_s = max(best_s * self.settings.num_timed_steps * units,
                            self.settings.min_timed_s)
        spec = replace(spec, max_timed_s=self.settings.slower_factor * best_window_s)
        if self.settings.train_steps:  # compile time counts too: a slow step may still win
            return spec
        # Its fastest step slower than the leader's median beyond the noise: it is behind.
        return replace(spec, stop_above_step_s=Interval(best_s, self.stop_margin()).high)

    def stop_margin(self) -> float:
        """How much slower than the leader's median a candidate's fastest steps must be to
        stop timing it: ``stop_margin`` (the run-to-run noise of a machine), or the width of
        the leader's own interval when wider (a noisy leader's median says less), at most
        ``slower_factor``."""
        leader = self.ev.leader()
        width = (self.ev.results[leader].halfwidth() or 0.0) if leader is not None else 0.0
        return min(max(self.settings.stop_margin, width), self.settings.slower_factor - 1)

    def measure(self, spec: TrialSpec, *, wait: bool = True) -> TrialResult:
        """Run a spec in a child (or reuse the study's result for it) and record it. In a
        joined study another node may run it (``Ledger.claim``): its result is waited for,
        or without ``wait`` a ``Elsewhere`` is raised (``batch.measure_all`` comes back)."""
        candidate = Candidate.of(spec)
        timed = spec.num_timed_steps > 0
        answered = self.answered(spec)
        if answered is not None:
            return answered
        claimed = self.study.claim(candidate, "trial" if timed else "probe",
                                   self.plan.micro_batches, wait=wait, waiting=self.waiting)
        if not isinstance(claimed, Asked):
            return self.heard(spec, claimed)
        try:
            spec = self.limited(spec, claimed)
        except Stop:
            self.study.release(claimed)
            raise
        self.progress(candidate, None)
        with self.study.running(candidate, self.plan.micro_batches, claimed) as trial:
            result = self.run_child(spec, "trial" if timed else "probe")
            rec = self.took(spec, trial, result)
            if rec is None:  # its line comes from the probe's on_step
                return result
        self.progress(candidate, rec)
        return result

    def heard(self, spec: TrialSpec, result: TrialResult | None) -> TrialResult:
        """Another node's result for ``spec`` (a joined study) into the evidence, as a stored
        run's; ``Elsewhere`` while it is still running there."""
        if result is None:
            raise Elsewhere(spec)
        key = Candidate.of(spec)
        self.ev.learned(result)
        if spec.num_timed_steps > 0:
            self.ev.took(key, result)
        else:
            self.ev.probed_at(key, result)
        self.reach.begin(key.knobs)
        return result

    def answered(self, spec: TrialSpec) -> TrialResult | None:
        """The spec's answer without a run: the evidence's, or the study's (``measure``)."""
        key = Candidate.of(spec)
        timed = spec.num_timed_steps > 0
        self.ev.asked(key)
        if not timed and key in self.ev.probe_runs and key not in self.ev.results:
            # a memory probe the study holds answers as the first search saw it: a timed run
            # of the key made later (a walk down) is not its answer (it comes at its ask)
            return self.ev.probe_runs[key]
        if key not in self.ev.results and (stored := self.ev.answer(key)) is not None:
            self.ev.took(key, stored)  # its first run, as the search that ran it had it
            self.reach.begin(key.knobs)
        if key in self.ev.results:  # a trial answers a memory probe too
            return self.ev.results[key]
        if not timed and key in self.ev.probe_runs:
            return self.ev.probe_runs[key]
        return None

    def took(self, spec: TrialSpec, trial: Any, result: TrialResult) -> TrialRecord | None:
        """A measured run into the evidence and the study: its record (a memory probe: None,
        its line comes from the probe's ``on_step``)."""
        key = Candidate.of(spec)
        self.ev.learned(result)
        if spec.num_timed_steps <= 0:
            self.study.tell(trial, result, None, kind="probe")
            self.ev.probed_at(key, result)
            return None
        self.ev.took(key, result)
        rec, value = classify(key, result, self.ev.results, self.ev.baseline,
                              self.plan.report, self.settings)
        self.study.tell(trial, result, value)
        return rec

    def uncapped(self, candidate: Candidate) -> TrialResult:
        """A memory probe of ``candidate`` capped only by what the device has free (as a run
        under the search's limits, outside the study: its budget is not the study's)."""
        spec = replace(self.spec(candidate, timed=False),
                       memory_budget_bytes=self.plan.report.device.available_memory_bytes)
        self.progress(candidate, None)
        return self.run_child(self.limited(spec), "probe")

    def left_s(self) -> float | None:
        """Seconds the time budget has left (None: no budget): in a joined study, counted
        from when the joined search began (``Ledger.late_s``)."""
        if self.settings.time_budget_s is None:
            return None
        return (self.settings.time_budget_s - self.study.late_s
                - (self.clock() - self.tally.start))

    def waiting(self) -> None:
        """While this node waits on a run another node makes (a joined study): a ``Stop``
        once the time budget leaves no child run here, as ``limited`` says before a run."""
        if (left := self.left_s()) is not None and left < MIN_CHILD_S:
            raise Stop(StopReason("time-budget"))

    def limited(self, spec: TrialSpec, claimed: Asked | None = None) -> TrialSpec:
        """The spec with a timeout that ends within the time budget; a ``Stop`` when a limit
        (``--max-trials``, ``--time-budget``) allows no further child run. In a joined study
        ``--max-trials`` counts every node's runs (``claimed``: this run's own claim).

        A run other than a first-launch check (one compiled afresh, ``cold_compile``) leaves
        the time ``reserve`` says that check needs: its timeout ends before it, and where
        less than ``MIN_CHILD_S`` is left beside it, the ``Stop`` says so (``kept_s``) and
        the check runs in the time kept (``driver.run_search``)."""
        made = self.tally.num_runs + self.in_flight
        if (joint := self.study.joint_runs()) is not None:  # every node's, less this claim
            made = max(made, joint - (claimed is not None and claimed.claimed is not None))
        if made >= self.settings.max_trials:
            raise Stop(StopReason("max-trials", str(made)))
        timeout_s = self.settings.timeout_s
        self.kept_s = 0.0
        if (left := self.left_s()) is not None:
            if left < MIN_CHILD_S:
                raise Stop(StopReason("time-budget"))
            kept = 0.0 if spec.cold_compile else self.reserve(self)
            if kept and left - kept < MIN_CHILD_S:
                raise Stop(StopReason("time-budget"), kept_s=kept)
            self.kept_s = kept if left - kept < timeout_s else 0.0
            timeout_s = min(timeout_s, left - kept)
        self.reach.begin(spec.knobs)
        return replace(spec, timeout_s=timeout_s)

    def run_child(self, spec: TrialSpec, kind: RunKind) -> TrialResult:
        """Run one limited spec. A run the time budget cut short says nothing of its
        candidate: it ends the search (its Optuna trial fails) instead of being recorded."""
        start_s = self.clock() - self.tally.start
        if self.slots is not None:  # pinned as the batches' runs are
            return self.ran(spec, kind, self.slots.run_alone(spec), start_s, self.kept_s,
                            self.slots.alone)
        return self.ran(spec, kind, self.run(spec), start_s, self.kept_s)

    def ran(self, spec: TrialSpec, kind: RunKind, result: TrialResult, start_s: float,
            kept_s: float, slot: str = "") -> TrialResult:
        """A child run's cost and record (``run_child``; a slot's run: ``batch``)."""
        tally = self.tally
        tally.num_runs += 1
        cut = result.status == "timeout" and spec.timeout_s < self.settings.timeout_s
        tally.run_log.append(replace(run_record(
            len(tally.run_log), kind, Candidate.of(spec), result, self.plan.usable,
            start_s=start_s, compiled=spec.compiled, cut=cut), slot=slot,
            node=who() if self.settings.join else ""))
        tally.cost["child_s"] += result.wall_s or 0.0
        tally.cost["compile_s"] += (result.compile_s or 0.0) if spec.compiled \
            else 0.0
        tally.cost["timed_s"] += sum(result.step_times_s)
        if result.compile_cache_hits is not None:
            tally.compiles[0] += 1
            tally.compiles[1] += bool(result.compile_cache_hits
                                      and not result.compile_cache_misses)
        self.ev.ran(Candidate.of(spec), result)
        if cut:
            raise Stop(StopReason("time-budget", Candidate.of(spec).key()), cut=True,
                       kept_s=kept_s)
        return result

    def run_proposal(self, proposal: Proposal) -> tuple[TrialResult, TrialRecord]:
        """One proposed run in a child, its limits read as it starts, told to the study (or
        the study's answer to it). What it says is the race's to take (``race.tell``)."""
        key = proposal.candidate
        if proposal.stored is not None:
            self.reach.begin(key.knobs)
            rec, _ = classify(key, proposal.stored, self.ev.results, self.ev.baseline,
                              self.plan.report, self.settings)
            return proposal.stored, rec
        spec = self.limited(proposal.spec)
        self.progress(key, None)
        with self.study.running(key, self.plan.micro_batches) as trial:
            again = self.run_child(spec, "re-measure")
            rec, value = classify(key, again, self.ev.results, self.ev.baseline,
                                  self.plan.report, self.settings)
            self.study.tell(trial, again, value, kind="re-measure")
        return again, rec

    def progress(self, candidate: Candidate, rec: TrialRecord | None) -> None:
        """Say a run beginning (``rec`` None) or ended, with the runs made and the forecast
        of all (``forecast``: an estimate from the plan as it stands)."""
        if self.on_trial is not None:
            tally = self.tally
            count = forecast(self.ev, self.stage, tally.num_runs, tally.cost["child_s"],
                             self.clock() - tally.start, starting=rec is None,
                             in_stage=tally.num_runs - self.stage_began_at)
            slot = self.slot or (self.slots.alone if self.slots is not None else "")
            self.on_trial(count, f"{self.stage} [{slot}]" if slot else self.stage,
                          candidate, rec)

