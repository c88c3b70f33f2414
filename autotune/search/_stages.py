"""The search, stage by stage.

1. Probe each memory class with eager and default-compiled code, fp32 eager (the baseline)
   first: a probe that may be the largest fit also times its config, so a class's largest
   fitting micro-batch is usually timed by the run that found it (bisection points only
   measure memory).
2. For each precision whose best is near the leader's, probe the other compile modes (kernel
   autotuning, CUDA graphs): a refinement of ``default`` that rarely gains more than the gap.
3. Time smaller micro-batches of the classes near the leader, largest first, while each is
   faster than the last.
4. Re-measure the leader and the candidates whose gap to it is within the noise (a close
   race), interleaved; each keeps its better run. A clear lead stands without a second run.

What is not tried is said, with the measured reason, in the outcome's ``skipped``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from autotune.config import (
    BASELINE_CLASS,
    COMPILE_MODES,
    PRECISIONS,
    MemoryClass,
    MemoryProbe,
    ProbeReport,
    TrialResult,
    TrialSpec,
)
from autotune.memory import OnStep, hint_for, probe_memory, probe_spec
from autotune.runner import run_isolated
from autotune.schema import TrialRecord
from autotune.search._records import (
    Candidate,
    SearchOutcome,
    SearchSettings,
    classify,
    keep_better,
    score,
)
from autotune.search._study import (
    completed,
    open_study,
    probed,
    running,
    study_identity,
    tell,
)
from autotune.space import divisors

Runner = Callable[[TrialSpec], TrialResult]
OnTrial = Callable[[int, str, Candidate, TrialRecord | None], None]
"""Progress: (runs so far, stage, candidate, its record when done or None when starting)."""
FIRST_MODES = ("off", "default")


class _Stop(Exception):
    """A limit ended the search early: the best so far stands."""


MIN_CHILD_S = 1.0
"""A child run needs at least this much of the time budget left to be started."""


def run_search(report: ProbeReport, classes: Sequence[MemoryClass], settings: SearchSettings,
               *, run: Runner = run_isolated, on_trial: OnTrial | None = None,
               on_step: OnStep | None = None) -> SearchOutcome:
    """Probe and time the classes in stages, pruning what cannot win (module docstring).

    Args:
        report: the workload, device, target and budget (its ``probes`` are not used: this
            search probes each class it tries, and returns the probes).
        classes: the memory classes the device supports and the user allows; fp32 eager
            (the baseline) must be one of them.
        settings: timing, pruning, limits, objective and storage.
        run: runs a spec (the isolated runner).
        on_trial: progress before and after each child run.
        on_step: progress after each memory probe step.

    Raises:
        ConfigError: a storage that cannot be opened or holds another search.
        WorkloadError: the workload fails.
    """
    assert BASELINE_CLASS in classes, "fp32 eager is the baseline: the api adds it"
    search = _Search(report, classes, settings, run, on_trial, on_step)
    interrupted, stop_reason = False, "every class was tried or pruned with a reason"
    try:
        search.stages(classes)
    except _Stop as stop:
        interrupted, stop_reason = True, str(stop)
    except KeyboardInterrupt as exc:
        interrupted, stop_reason = True, f"interrupted ({interrupt_name(exc)}): best so far"
    return search.outcome(interrupted, stop_reason)


def interrupt_name(exc: BaseException) -> str:
    """``Ctrl-C``, or the signal that ended the search (e.g. ``SIGTERM``)."""
    name = getattr(exc, "signal_name", None)
    return "Ctrl-C" if name in (None, "SIGINT") else name


class _Search:
    """The state of one search: the study, the results so far, the probes, what was pruned."""

    def __init__(self, report: ProbeReport, classes: Sequence[MemoryClass],
                 settings: SearchSettings, run: Runner, on_trial: OnTrial | None,
                 on_step: OnStep | None) -> None:
        self.report, self.settings = report, settings
        self._run, self._on_trial, self._on_step = run, on_trial, on_step
        self.per_device = report.per_device_batch()
        self.micro_batches = divisors(self.per_device)
        # Every candidate of any class: the study's choices stay the same when a resumed
        # search is restricted differently.
        self.choices = [f"{p}/{m}/{b}" for p in PRECISIONS for m in COMPILE_MODES
                        for b in self.micro_batches]
        self.study = open_study(settings, study_identity(report, settings),
                                "minimize" if settings.train_steps else "maximize")
        # A resumed study may hold classes this search is restricted from: leave them out.
        allowed = {c.label() for c in classes}
        done, runs = completed(self.study)
        self.results: dict[str, TrialResult] = {
            k: r for k, r in done.items() if k.rsplit("/", 1)[0] in allowed}
        self.probe_runs: dict[str, TrialResult] = probed(self.study)
        """Memory probes that timed nothing (bisection points), by candidate key."""
        self.baseline: Candidate | None = None
        self.probes: dict[MemoryClass, MemoryProbe] = {}
        self.skipped: list[str] = []
        self.runs: dict[str, int] = {k: n for k, n in runs.items() if k in self.results}
        """Runs of each candidate (2 once re-measured), stored ones included."""
        self.num_runs = 0
        self.stage = "probe"
        self.start = time.perf_counter()

    # -- the stages ------------------------------------------------------------------------

    def stages(self, classes: Sequence[MemoryClass]) -> None:
        first = sorted((c for c in classes if c.compile_mode in FIRST_MODES),
                       key=lambda c: (c != BASELINE_CLASS, c.compile_mode != "off"))
        for memory_class in first:
            self.probe(memory_class)
            if memory_class == BASELINE_CLASS:
                base = self.probes[BASELINE_CLASS]
                if not base.max_micro_batch:
                    return  # no baseline: the api says what it would take
                self.baseline = Candidate(precision="fp32", compile_mode="off",
                                          micro_batch=base.max_micro_batch)
        for memory_class in (c for c in classes if c.compile_mode not in FIRST_MODES):
            why_not = self._why_not_mode(memory_class)
            if why_not:
                self.skipped.append(why_not)
            else:
                self.probe(memory_class)
        self.stage = "refine"
        for probe in sorted(self.probes.values(), key=lambda p: -(self._class_best(
                p.memory_class) or 0.0)):
            self.refine(probe)
        self.stage = "confirm"
        self.confirm()

    def probe(self, memory_class: MemoryClass) -> MemoryProbe:
        """Find the class's largest fitting micro-batch, and time it.

        A probe that may be the largest fit times its config in the same run; bisection
        points only measure memory. When the boundary turns out to be such a point, it is
        timed afterwards."""

        def candidate(micro_batch: int) -> Candidate:
            return Candidate(precision=memory_class.precision,
                             compile_mode=memory_class.compile_mode, micro_batch=micro_batch)

        probe = probe_memory(
            self.report.workload, self.report.device.device, memory_class, self.micro_batches,
            budget_bytes=self.report.budget_bytes, usable_bytes=self.report.usable_bytes(),
            timeout_s=self.settings.timeout_s, hint=hint_for(memory_class, self.probes.values()),
            run=self.measure, on_step=self._on_step,
            make_spec=lambda m, may_be_largest: self.spec(candidate(m), timed=may_be_largest))
        self.probes[memory_class] = probe
        if probe.max_micro_batch:
            self.measure(self.spec(candidate(probe.max_micro_batch)))  # reused when timed
        return probe

    def refine(self, probe: MemoryProbe) -> None:
        """Time smaller micro-batches of one class, largest first, while each is faster than
        the class's best by more than the noise (one run's luck is no trend to follow).

        Micro-batches already measured (a resumed study) are walked through the same rule, so
        a resumed search stops where the first one did."""
        memory_class, per_class = probe.memory_class, self.settings.micro_batches_per_class
        label = memory_class.label()
        fitting = sorted(probe.fitting(), reverse=True)
        why_not = self._why_not_smaller(memory_class, fitting)
        if why_not and per_class:
            self.skipped.append(why_not)
            return
        walked: list[int] = []  # largest first, each measured
        for i, m in enumerate(fitting):
            key = self._key(memory_class, m)
            rest = ", ".join(str(x) for x in fitting[i:])
            if key not in self.results:
                if per_class and len(walked) >= per_class:
                    self.skipped.append(f"{label}: micro-batches {rest} not timed: the class's "
                                        f"{per_class} largest were (--micro-batches)")
                    return
                share = self._share(self._class_best(memory_class))
                if per_class and (share is None or share < self.settings.refine_within):
                    self.skipped.append(f"{label}: micro-batches {rest} not timed: "
                                        f"{self._behind(share)}")
                    return
                self.measure(self.spec(Candidate(precision=memory_class.precision,
                                                 compile_mode=memory_class.compile_mode,
                                                 micro_batch=m)))
            if walked and per_class:
                best_m = max(walked, key=lambda x: self._score(self._key(memory_class, x)) or 0)
                before, now = self._score(self._key(memory_class, best_m)), self._score(key)
                noise = self._noise(key, self._key(memory_class, best_m))
                if now is None or (before is not None and now <= before * (1 + noise)):
                    later = ", ".join(str(x) for x in fitting[i + 1:])
                    if later:
                        self.skipped.append(
                            f"{label}: micro-batches {later} not timed: {m} was not faster "
                            f"than {best_m} by more than the noise ({noise:.0%})")
                    return
            walked.append(m)

    def _why_not_smaller(self, memory_class: MemoryClass, fitting: list[int]) -> str | None:
        """Why a compiled class's smaller micro-batches are not worth their compiles, if not.

        A smaller micro-batch only adds accumulation steps, unless memory pressure slows the
        largest (allocator retries, or a boundary below the whole per-device batch). Each one
        costs a compile of its own (``dynamic=False``): a compiled class that runs the whole
        per-device batch without retries is not refined."""
        if memory_class.compile_mode == "off" or len(fitting) < 2:
            return None
        largest = self.results.get(self._key(memory_class, fitting[0]))
        if fitting[0] < self.per_device or largest is None or largest.num_alloc_retries:
            return None
        rest = ", ".join(str(m) for m in fitting[1:])
        return (f"{memory_class.label()}: micro-batches {rest} not timed: {fitting[0]} (the "
                "whole per-device batch) ran without allocator retries, so a smaller one "
                "only adds accumulation steps, each at the cost of a compile "
                "(--micro-batches all times them)")

    def confirm(self) -> None:
        """Re-measure the leader and its close contenders; keep each one's better run."""
        keys = self._contenders()
        if len(keys) < 2:
            return
        for key in keys:
            if self.runs.get(key, 1) >= 2:  # re-measured before this search was resumed
                continue
            candidate = self._candidate(key)
            spec = self._limited(self.spec(candidate, early_stop=False))
            self._progress(candidate, None)
            with running(self.study, key, self.choices) as trial:
                again = self._run_child(spec)
                rec, value = classify(candidate, again, self.results, self.baseline,
                                      self.report, self.settings)
                tell(self.study, trial, again, value, kind="re-measure")
            self.runs[key] = 2
            self._progress(candidate, rec)  # the re-run's own figures
            self.results[key] = keep_better(self.results[key], again)

    def _contenders(self) -> list[str]:
        """The leader and up to ``num_confirm`` candidates whose gap to it is within the noise
        (``confirm_within`` or either run's spread); says why when there are none."""
        if self.settings.num_confirm <= 0:
            return []
        ranked = sorted((k for k in self.results if self._score(k, full=True) is not None),
                        key=lambda k: -(self._score(k, full=True) or 0.0))
        if len(ranked) < 2:
            return []
        leader, top = ranked[0], self._score(ranked[0], full=True) or 0.0

        def noise(key: str) -> float:
            return self._noise(key, leader)

        close = [k for k in ranked[1:]
                 if (self._score(k, full=True) or 0.0) >= top * (1 - noise(k))]
        if not close:
            runner_up = ranked[1]
            share = (self._score(runner_up, full=True) or 0.0) / top
            self.skipped.append(
                f"no re-measurement: the runner-up ({runner_up}) is {share:.2f}x the leader "
                f"({leader}), a gap wider than the noise measured (spread up to "
                f"{noise(runner_up):.0%}, --confirm-within {self.settings.confirm_within:g})")
        return [leader, *close[:self.settings.num_confirm]]

    # -- one run ---------------------------------------------------------------------------

    def spec(self, candidate: Candidate, *, early_stop: bool = True,
             timed: bool = True) -> TrialSpec:
        """A probe of the candidate's memory that also times its config (``timed``), or
        only measures its memory."""
        if not timed:
            return probe_spec(self.report.workload, self.report.device.device,
                              candidate.memory_class(), candidate.micro_batch,
                              self.report.budget_bytes, self.settings.timeout_s)
        is_base_class = candidate.memory_class() == BASELINE_CLASS
        spec = probe_spec(self.report.workload, self.report.device.device,
                          candidate.memory_class(), candidate.micro_batch,
                          self.report.budget_bytes, self.settings.timeout_s,
                          per_device_batch=self.per_device,
                          num_timed_steps=self.settings.num_timed_steps,
                          count_flops=is_base_class)
        spec = replace(spec, min_timed_s=self.settings.min_timed_s)
        medians = [r.median_step_s() for r in self.results.values() if r.ok and r.median_step_s()]
        if not early_stop or is_base_class or not medians:
            return spec
        best_window_s = max(min(m for m in medians if m is not None)
                            * self.settings.num_timed_steps, self.settings.min_timed_s)
        return replace(spec, max_timed_s=self.settings.slower_factor * best_window_s)

    def measure(self, spec: TrialSpec) -> TrialResult:
        """Run a spec in a child (or reuse the study's result for it) and record it."""
        candidate = Candidate.of(spec)
        key = candidate.key()
        timed = spec.num_timed_steps > 0
        if key in self.results:  # a trial answers a memory probe too
            return self.results[key]
        if not timed and key in self.probe_runs:
            return self.probe_runs[key]
        spec = self._limited(spec)
        self._progress(candidate, None)
        with running(self.study, key, self.choices) as trial:
            result = self._run_child(spec)
            if not timed:  # its line comes from the probe's on_step
                tell(self.study, trial, result, None, kind="probe")
                self.probe_runs[key] = result
                return result
            self.results[key] = result
            rec, value = classify(candidate, result, self.results, self.baseline, self.report,
                                  self.settings)
            tell(self.study, trial, result, value)
        self._progress(candidate, rec)
        return result

    def _limited(self, spec: TrialSpec) -> TrialSpec:
        """The spec with a timeout that ends within the time budget; a ``_Stop`` when a limit
        (``--max-trials``, ``--time-budget``) allows no further child run."""
        if self.num_runs >= self.settings.max_trials:
            raise _Stop(f"--max-trials reached ({self.num_runs} child runs): best so far")
        timeout_s = self.settings.timeout_s
        if self.settings.time_budget_s is not None:
            left = self.settings.time_budget_s - (time.perf_counter() - self.start)
            if left < MIN_CHILD_S:
                raise _Stop("--time-budget reached: best so far")
            timeout_s = min(timeout_s, left)
        return replace(spec, timeout_s=timeout_s)

    def _run_child(self, spec: TrialSpec) -> TrialResult:
        """Run one limited spec. A run the time budget cut short says nothing of its
        candidate: it ends the search (its Optuna trial fails) instead of being recorded."""
        result = self._run(spec)
        self.num_runs += 1
        if result.status == "timeout" and spec.timeout_s < self.settings.timeout_s:
            raise _Stop(f"--time-budget reached during a run of {Candidate.of(spec).key()} "
                        "(stopped): best so far")
        return result

    def outcome(self, interrupted: bool, stop_reason: str) -> SearchOutcome:
        if self.baseline is None:  # stopped while probing it: its largest fit timed so far
            self.baseline = self._known_baseline()
        records = tuple(
            replace(classify(self._candidate(k), r, self.results, self.baseline, self.report,
                             self.settings)[0], number=i, num_runs=self.runs.get(k, 1))
            for i, (k, r) in enumerate(self.results.items()))
        return SearchOutcome(records=records, results=self.results, baseline=self.baseline,
                             probes=tuple(self.probes.values()), skipped=tuple(self.skipped),
                             interrupted=interrupted, stop_reason=stop_reason,
                             num_runs=self.num_runs)

    def _known_baseline(self) -> Candidate | None:
        """fp32 eager at the largest micro-batch timed so far that fits: the baseline of a
        search stopped (Ctrl-C, a limit) before the baseline's memory probe ended."""
        usable = self.report.usable_bytes()
        fits = [c for k, r in self.results.items()
                if (c := self._candidate(k)).memory_class() == BASELINE_CLASS and r.fits(usable)]
        return max(fits, key=lambda c: c.micro_batch, default=None)

    # -- measures of progress --------------------------------------------------------------

    def _why_not_mode(self, memory_class: MemoryClass) -> str | None:
        """Why a compile mode beyond off/default is not tried for this precision, if not."""
        if not self.settings.refine_within:
            return None
        same = [c for c in self.probes if c.precision == memory_class.precision]
        if not same:
            return None  # nothing measured predicts it: try it
        share = self._share(max((self._class_best(c) or 0.0 for c in same), default=0.0))
        if share is not None and share >= self.settings.refine_within:
            return None
        return f"{memory_class.label()} not tried: {self._behind(share, memory_class.precision)}"

    def _behind(self, share: float | None, precision: str | None = None) -> str:
        what = f"{precision}'s best" if precision else "its best"
        if share is None:
            return f"{what} did not run"
        digits = 2 if round(share, 2) < self.settings.refine_within else 3  # 0.897, not 0.90
        return (f"{what} is {share:.{digits}f}x the leader's ({self._leader_key()}), under the "
                f"{self.settings.refine_within:.2f} that refinement needs (--refine-within)")

    def _noise(self, *keys: str) -> float:
        """Relative gap two runs need before it counts: ``confirm_within``, or the larger
        step-time spread (p90 - p10 over the median) the runs measured."""
        spreads = [r.spread() or 0.0 for k in keys if (r := self.results.get(k)) is not None]
        return max(self.settings.confirm_within, *spreads)

    def _score(self, key: str, *, full: bool = False) -> float | None:
        """Larger-is-better objective of a run that counts (``full``: all timed steps ran)."""
        result = self.results.get(key)
        if result is None:
            return None
        rec, value = classify(self._candidate(key), result, self.results, self.baseline,
                              self.report, self.settings)
        if rec.verdict not in (("ok",) if full else ("ok", "slower")):
            return None
        return score(value, self.settings)

    def _class_best(self, memory_class: MemoryClass) -> float | None:
        scores = [self._score(self._key(memory_class, m)) for m in self.micro_batches]
        return max((s for s in scores if s is not None), default=None)

    def _leader_key(self) -> str | None:
        scored = [(s, k) for k in self.results if (s := self._score(k, full=True)) is not None]
        return max(scored)[1] if scored else None

    def _share(self, best: float | None) -> float | None:
        leader = self._leader_key()
        top = self._score(leader, full=True) if leader else None
        return best / top if best is not None and top else None

    def _key(self, memory_class: MemoryClass, micro_batch: int) -> str:
        return f"{memory_class.precision}/{memory_class.compile_mode}/{micro_batch}"

    def _candidate(self, key: str) -> Candidate:
        precision, mode, micro_batch = key.split("/")
        return Candidate(precision=precision, compile_mode=mode, micro_batch=int(micro_batch))

    def _progress(self, candidate: Candidate, rec: TrialRecord | None) -> None:
        if self._on_trial is not None:
            self._on_trial(self.num_runs, self.stage, candidate, rec)
