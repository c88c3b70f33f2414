"""The driver: the search as an order of stages, each a walk of proposals through the policy.

The stages, named (``docs/search.md`` states the algorithm and every rule once):

- **probe**: each memory class (precision x compile mode), fp32 eager (the baseline) first,
  its largest fitting micro-batch found and timed; the compile modes beyond default only for
  a precision near the leader (``bounds.mode``);
- **knobs**: each further knob screened on the leader, one at a time (``screen``);
- **refine**: smaller micro-batches of the settings near the leader, while each is faster;
- **confirm**: the race (``racing.confirm``): the leader and its close contenders again;
- **first launch**: a compiled winner must fit compiled afresh (``racing.fit_cold``).

Every run goes through the executor; every decision not to run something is a ``Skip`` of a
rule in ``bounds`` or ``policy``, kept in the evidence and said in the outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from autotune.config import Knobs, MemoryProbe, ProbeReport, StopReason
from autotune.memory import OnStep
from autotune.runner import run_isolated
from autotune.search import bounds, racing
from autotune.search._records import Candidate, SearchSettings, classify
from autotune.search.evidence import Evidence, Interval
from autotune.search.executor import Executor, OnTrial, Runner, Stale, Stop
from autotune.search.outcome import SearchOutcome, outcome
from autotune.search.plan import Plan
from autotune.search.probing import Prober
from autotune.search.rules import skip
from autotune.signals import SignalGuard


def run_search(report: ProbeReport, classes: Sequence[Knobs], settings: SearchSettings,
               *, values: Mapping[str, Sequence[str]] | None = None, run: Runner = run_isolated,
               on_trial: OnTrial | None = None, on_step: OnStep | None = None,
               guard: SignalGuard | None = None,
               clock: Callable[[], float] = time.perf_counter) -> SearchOutcome:
    """Probe and time the classes in stages, pruning what cannot win (``docs/search.md``).

    Args:
        report: the workload, device, target and budget (its ``probes`` are not used: this
            search probes each class it tries, and returns the probes).
        classes: the (precision, compile mode) settings the device supports and the user
            allows; fp32 eager (the baseline) must be one of them.
        settings: timing, pruning, limits, objective and storage.
        values: per knob beyond precision and compile mode, the values the knob stage may
            screen (``space.knob_values``); None screens none.
        run: runs a spec (the isolated runner).
        on_trial: progress before and after each child run.
        on_step: progress after each memory probe step.
        guard: the installed signal guard (``autotune.signals.guarded``): the stages are its
            armed region, so the first Ctrl-C or SIGTERM ends them and a later one waits for
            the caller's writes; None leaves signals as they are.
        clock: the seconds the time budget and each run's start are read from (a replay of
            recorded runs sets its simulated clock here).

    Raises:
        ConfigError: a storage that cannot be opened or holds another search.
        WorkloadError: the workload fails.
    """
    plan = Plan.of(report, classes, values)
    assert plan.base in plan.classes, "fp32 eager is the baseline: the api adds it"
    search = Search(plan, settings, run, on_trial, on_step, clock)
    stop_reason = StopReason()
    try:
        with (guard or SignalGuard()).armed():
            try:
                search.stages()
            except Stale as stale:  # the stored runs measured another model: afresh
                gave_up = search.ex.study
                search = Search(plan, replace(settings, fresh=True), run, on_trial, on_step,
                                clock, before=search)
                search.ex.study.note(gave_up.record.note if not gave_up.ok else "")
                search.ex.study.note(str(stale))
                search.stages()
    except Stop as stop:
        stop_reason = stop.reason
    except KeyboardInterrupt as exc:
        stop_reason = StopReason.signal(exc)
    return search.outcome(stop_reason)


class Search:
    """One search: its evidence, its executor, and the stages that propose its runs."""

    def __init__(self, plan: Plan, settings: SearchSettings, run: Runner,
                 on_trial: OnTrial | None, on_step: OnStep | None,
                 clock: Callable[[], float], *, before: Search | None = None) -> None:
        self.plan, self.ev = plan, Evidence(plan, settings)
        self.ex = Executor(self.ev, run, on_trial, on_step, clock,
                           before=before.ex if before is not None else None)
        self.prober = Prober(self.ev, self.ex)

    def stages(self) -> None:
        """The stages in order (the module docstring, ``docs/search.md``)."""
        self.ex.stage = "stored"  # what the study holds, said before it answers the stages
        best = {k: self.ev.held_best(k) for k in self.ev.held}
        for key, result in best.items():
            self.ex.progress(key, classify(key, result, best, None, self.plan.report,
                                         self.ev.settings)[0])
        self.ex.stage = "probe"
        first = self.plan.first_classes()
        for i, knobs in enumerate(first):
            if knobs.compile_mode != "off":  # the most promising precision first (its eager
                # run's speed): a strong leader early lets the probes after it stop sooner
                first[i:] = sorted(first[i:], key=lambda c: -self.ev.precision_best(c.precision))
                knobs = first[i]
            self.prober.probe(knobs)
            if knobs == self.plan.base:
                base = self.ev.probes[self.plan.base]
                if base.max_micro_batch:
                    self.ev.name_baseline(Candidate(knobs=knobs,
                                                    micro_batch=base.max_micro_batch))
                elif not self.prober.rescue_baseline():
                    return  # no baseline: the api says what it would take
        for knobs in self.plan.refining_classes():
            why_not = bounds.mode(self.ev, knobs)
            if why_not:
                self.ex.reach.considered.add((knobs.precision, knobs.compile_mode))
                self.ev.decide(why_not)
            else:
                self.prober.probe(knobs)
        self.ex.stage = "knobs"
        self.prober.screen()
        self.ex.stage = "refine"
        screened = self.ev.leader()
        # Eager settings first, best first: their steps cost no compile, and their walks are
        # the evidence a compiled setting is walked down on (``bounds.sibling_ratio``).
        for probe in sorted(self.ev.probes.values(), key=lambda p: (
                p.knobs.compile_mode != "off", -(self.ev.class_best(p.knobs) or 0.0))):
            self.refine(probe)
        if self.ev.leader() != screened:  # the knobs were screened at another micro-batch
            self.ex.stage = "knobs"
            self.prober.screen(timing_only=True)
        self.ev.release_held()
        self.ex.stage = "confirm"
        racing.confirm(self.ex)
        racing.recheck_stored_pick(self.ex)
        self.ex.stage = "first launch"
        racing.fit_cold(self.ex)

    def refine(self, probe: MemoryProbe) -> None:
        """Time smaller micro-batches of one class, largest first, while each is faster than
        the class's best by more than the noise (one run's luck is no trend to follow).

        Micro-batches already measured (a resumed study) are walked through the same rule, so
        a resumed search stops where the first one did."""
        knobs, per_class = probe.knobs, self.ev.settings.micro_batches_per_class
        label = knobs.label()
        fitting = sorted(probe.fitting(), reverse=True)
        why_not = bounds.compiled_whole_batch(self.ev, knobs, fitting)
        if why_not and per_class:
            self.ev.decide(why_not)
            return
        walked: list[int] = []  # largest first, each measured
        for i, m in enumerate(fitting):
            key = Candidate(knobs=knobs, micro_batch=m)
            rest = ", ".join(str(x) for x in fitting[i:])
            if key not in self.ev.results:
                if per_class and len(walked) >= per_class:
                    self.ev.decide(skip("micro-batch-limit", label, context="not-timed",
                                              untimed=rest, per_class=per_class))
                    return
                share = self.ev.share(self.ev.class_best(knobs))
                if per_class and (share is None or share < self.ev.settings.refine_within):
                    self.ev.decide(bounds.behind(self.ev, label, share).within(
                        "not-timed", label, untimed=rest))
                    return
                why_not = bounds.sibling_ratio(self.ev, knobs, walked, m) if per_class else None
                if why_not:
                    self.ev.decide(why_not.within("not-timed", label, untimed=rest))
                    return
                self.ex.measure(self.ex.spec(key))
            if walked and per_class:
                best = max((Candidate(knobs=knobs, micro_batch=x) for x in walked),
                           key=lambda c: self.ev.score(c) or 0)
                before, now = self.ev.score(best), self.ev.score(key)
                noise = self.ev.noise(key, best)
                best_m = best.micro_batch
                if now is None or (before is not None
                                   and not Interval(before, noise).beaten_by(now)):
                    later = list(fitting[i + 1:])
                    if later and self.time_the_other_end(knobs, later[-1], len(walked) + 1):
                        later = later[:-1]
                    if later:
                        self.ev.decide(skip(
                            "walk-not-faster", label, context="not-timed",
                            untimed=", ".join(map(str, later)), micro_batch=m, best=best_m,
                            noise=noise))
                    return
            walked.append(m)

    def time_the_other_end(self, knobs: Knobs, smallest: int, num_timed: int) -> bool:
        """A walk down stopped at a micro-batch that was not faster: time the smallest that fits
        too, once, for the leader's setting when it runs eager, and for any other eager setting
        near the leader where the line through its timed micro-batches predicts the smallest
        could win (speed is not always monotone in the micro-batch: on a CPU a small one can
        stay in cache, and one noisy middle point must not hide the range's other end).

        A compiled setting (the leader's too) pays a compile of its own for that run, and in
        the committed oracles a compiled setting's smallest micro-batch beat its walked best
        once in 214 walks (by 1.10x, where its line said 0.82x), never where its line
        predicted a tie (5 walks) or a gain (2), while eager ones did 32 times in 330, by up to
        2.4x (``benchmarks/rule_checks.py`` (5)): it is timed only where the line predicts it
        ahead by more than the noise and by more than that prediction's own interval (each
        timed point's error carried along the line: ``timing.prediction_halfwidth``), not for
        a predicted tie.
        False when it is not worth a run (the setting is behind the leader by more than
        ``--refine-within``, not predicted to gain, or ``--micro-batches`` allows no more)."""
        per_class = self.ev.settings.micro_batches_per_class
        share = self.ev.share(self.ev.class_best(knobs))
        if (share is None or share < self.ev.settings.refine_within
                or (per_class and num_timed >= per_class)):
            return False
        compiled = knobs.compile_mode != "off"
        always = knobs == self.ev.leaders_setting() and not compiled
        why_not = None if always else bounds.line_predicts_loss(self.ev, knobs, smallest,
                                                                must_gain=compiled)
        if why_not:  # the leader's own eager setting is timed anyway: the pick is decided there
            self.ev.decide(why_not)
            return False
        self.ex.measure(self.ex.spec(Candidate(knobs=knobs, micro_batch=smallest)))
        return True

    def outcome(self, stop: StopReason) -> SearchOutcome:
        return outcome(self.ev, self.ex, stop)
