"""The search, stage by stage.

1. Probe each memory class with eager and default-compiled code, fp32 eager (the baseline)
   first: a probe that may be the largest fit also times its config, so a class's largest
   fitting micro-batch is usually timed by the run that found it (bisection points only
   measure memory, but for a compiled setting's above its largest fit so far: timed apart,
   it would load its graphs again). A failure the line through the fitting peaks puts over
   the cap is not run to confirm it. A compiled setting whose first run peaked over the usable
   budget, behind the leader by more than refinement allows, is not probed below it: a
   smaller micro-batch only adds accumulation steps, at a compile each (``_why_not_below``).
2. For each precision whose best is near the leader's, probe the other compile modes (kernel
   autotuning, CUDA graphs): a refinement of ``default`` that rarely gains more than the gap.
3. Screen each further knob (checkpointing, optimizer implementation, memory format,
   allocator) on the leader, one knob at a time, in ``knobs.KNOBS`` order: a value that frees
   memory gets a boundary probe of its own only where memory binds the leader (its largest fit
   is under the per-device batch, or the allocator retried); any other value is timed at the
   leader's micro-batch. The best becomes the leader for the next knob. The space grows by
   the sum of the knobs' values, not their product, plus, where a later knob changed the
   leader's setting at the same micro-batch, the values of the knobs screened before it that
   free no memory, timed once more on the final leader (an optimizer implementation can gain
   beside channels_last and lose without it). Where memory binds, the values that
   peaked below the leader are timed together too (their savings add up) and probed above
   its micro-batch, lowest peak first, where the growth per sample says the next may fit;
   such a probe starts from the setting's runs so far (its timed run at the leader's
   micro-batch is on its line: a larger micro-batch that line puts over the cap is not run).
   When fp32 eager fits nothing, the values that free memory are tried on it first (the
   baseline becomes the first that fits). Checkpointing, which recomputes, is never run at a
   micro-batch its setting fits without it (it runs no faster there, and a lead it shows is
   noise): its probe starts one micro-batch above that fit. It is not screened at all where
   the leader's setting already ran slower at its largest timed fit than the leader does at
   a smaller micro-batch, by more than a larger micro-batch can gain.
4. Time smaller micro-batches of the settings near the leader, largest first, while each is
   faster than the last; then the smallest that fits, once, where it could still win (always
   for the leader's eager setting: a small micro-batch can stay in cache; a compiled setting
   only where it is predicted ahead, beyond the noise and the prediction's own interval:
   that run is a compile of its own). A compiled setting is
   walked down only on evidence that a smaller micro-batch can gain (allocator retries at its
   best, its own walk getting faster, or a sibling timed faster there): otherwise a smaller
   one only adds accumulation steps, at the cost of a compile.
5. Re-measure the leader and the candidates whose gap to it is within the noise (a close
   race), interleaved; each keeps its better run. A clear lead stands without a second run.
   Where two runs of one config drifted further apart than that noise (a shared machine's
   busy minute), the candidates timed once within that drift of the leader are re-measured
   too: one run that far behind is not behind at all. Where that drift (wider than
   ``confirm_within``) also exceeds the gap between the leader and its best challenger, the
   two run back to back in interleaved rounds, the order reversed each round (the re-measures
   just made are the first round where the two ran one after the other): two rounds, a third
   where they split. The one ahead in most rounds is picked of the two, whatever their best
   runs say: a run in a quiet minute is not a faster config (``TrialRecord.round_shares``).
   A compiled leader not yet run with its graphs compiled afresh is re-measured so (an empty
   inductor cache of its own): that run is also stage 6's check. It is made here even for a
   clear lead (stage 6 would make it anyway): as a second run of the leader it shows the
   drift before the race is settled.
6. Where a compile's own memory counts in the peak (CPU), a compiled winner fits only if a run
   of it that compiled its graphs afresh fit: a run that loads them from inductor's cache
   (another setting with the same graphs compiled them, e.g. another optimizer implementation,
   or an earlier search did) peaks lower than a user's first launch. Without such a run the
   winner runs once more, every step, with an empty cache of its own; if that does not fit,
   it is out, with the reason, and the next winner is checked the same way. Where the out
   winner was ahead of that next one, its setting's next smaller micro-batch (its boundary as
   a first launch, and not walked in stage 4) is timed first, compiled afresh (not for a
   checkpointed one where its setting fits that micro-batch without it as a first launch;
   where that is not known, the setting without checkpointing is timed there first).
   That run is not needed where a run of the same graphs (``Knobs.graph``) at its micro-batch
   compiled them afresh and fit with room to spare: compiling adds to the winner's own peak at
   most what that whole run peaked at, so the two peaks' sum within the usable budget settles
   it.

What is not tried is said, with the measured reason, in the outcome's ``skipped``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from autotune.boundary import Point, fit_line
from autotune.config import (
    Knobs,
    MemoryProbe,
    ProbeReport,
    TrialResult,
    TrialSpec,
    WorkloadTraits,
    format_bytes,
)
from autotune.device import backend_for
from autotune.errors import BROKEN
from autotune.knobs import KNOBS, Knob, job_baseline, skip_reason
from autotune.memory import OnStep, hint_for, probe_memory, probe_spec
from autotune.runner import run_isolated
from autotune.schema import RunKind, RunRecord, SearchCost, StudyRecord, TrialRecord
from autotune.search._ledger import Ledger
from autotune.search._records import (
    OUT_OF_MEMORY,
    Candidate,
    SearchOutcome,
    SearchSettings,
    classify,
    keep_better,
    pick_winner,
    run_record,
    score,
)
from autotune.search._store import open_local, study_key
from autotune.search._study import open_study, redact, study_identity
from autotune.signals import SignalGuard
from autotune.space import divisors
from autotune.timing import (
    MIN_STEPS_TO_STOP,
    gain_ceiling,
    predict_step_s,
    prediction_halfwidth,
)

Runner = Callable[[TrialSpec], TrialResult]
OnTrial = Callable[[int, str, Candidate, TrialRecord | None], None]
"""Progress: (runs so far, stage, candidate, its record when done or None when starting)."""
FIRST_MODES = ("off", "default")
_ROUNDS = 2
"""Stage 5's interleaved rounds when they agree; one more where they split."""
_SPACE_SETTINGS = frozenset((
    "num_timed_steps", "rank_precision", "min_timed_s", "micro_batches_per_class",
    "refine_within", "slower_factor", "stop_margin", "num_confirm", "confirm_within",
    "timeout_s"))
"""Settings that change what a search measures: part of the local store's key."""


class _Stop(Exception):
    """A limit ended the search early: the best so far stands."""


class _Stale(Exception):
    """A re-check ran another model than the stored runs did (its fingerprint differs)."""


MIN_CHILD_S = 1.0
"""A child run needs at least this much of the time budget left to be started."""


def run_search(report: ProbeReport, classes: Sequence[Knobs], settings: SearchSettings,
               *, values: Mapping[str, Sequence[str]] | None = None, run: Runner = run_isolated,
               on_trial: OnTrial | None = None, on_step: OnStep | None = None,
               guard: SignalGuard | None = None,
               clock: Callable[[], float] = time.perf_counter) -> SearchOutcome:
    """Probe and time the classes in stages, pruning what cannot win (module docstring).

    Args:
        report: the workload, device, target and budget (its ``probes`` are not used: this
            search probes each class it tries, and returns the probes).
        classes: the (precision, compile mode) settings the device supports and the user
            allows; fp32 eager (the baseline) must be one of them.
        settings: timing, pruning, limits, objective and storage.
        values: per knob beyond precision and compile mode, the values stage 3 may screen
            (``space.knob_values``); None screens none.
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
    base = job_baseline((values or {}).get("strategy", ("none",))[0])
    assert base in classes, "fp32 eager is the baseline: the api adds it"
    search = _Search(report, classes, settings, values or {}, run, on_trial, on_step,
                     clock=clock)
    interrupted, stop_reason = False, "every class was tried or pruned with a reason"
    try:
        with (guard or SignalGuard()).armed():
            try:
                search.stages(classes)
            except _Stale as stale:  # the stored runs measured another model: afresh
                gave_up = search.study
                search = _Search(report, classes, replace(settings, fresh=True), values or {},
                                 run, on_trial, on_step, before=search, clock=clock)
                search.study.note(gave_up.record.note if not gave_up.ok else "")
                search.study.note(str(stale))
                search.stages(classes)
    except _Stop as stop:
        interrupted, stop_reason = True, str(stop)
    except KeyboardInterrupt as exc:
        interrupted, stop_reason = True, f"interrupted ({interrupt_name(exc)}): best so far"
    return search.outcome(interrupted, stop_reason)


def _split(result: TrialResult, accumulate: int) -> tuple[float, float]:
    """(seconds per micro-batch, seconds per update) of a timed run's median step; the whole
    step counts as micro-batches when the run did not time its update apart (a stored run)."""
    step_s = result.median_step_s() or 0.0
    update_s = statistics.median(result.update_times_s) if result.update_times_s else 0.0
    return (step_s - update_s) / accumulate, update_s


def _alike(other: Knobs, knobs: Knobs) -> tuple[bool, int]:
    """How alike two settings are, for picking a sibling to predict from: the same precision
    and compile mode first, then the number of knobs they share."""
    return ((other.precision, other.compile_mode) == (knobs.precision, knobs.compile_mode),
            sum(getattr(other, f.name) == getattr(knobs, f.name)
                for f in dataclasses.fields(knobs)))


def _memory_class(knobs: Knobs) -> tuple[str, ...]:
    """The knobs that set how a setting's peak grows with the micro-batch: precision, compile
    mode and the values that free memory (checkpointing, allocator, strategy). An optimizer
    implementation or memory format moves the peak by a fixed amount."""
    return tuple(getattr(knobs, k.name) for k in KNOBS
                 if k.frees_memory or k.name in ("precision", "compile_mode"))


def _ratio(one: TrialResult | None, other: TrialResult | None) -> float | None:
    """``one``'s samples/s over ``other``'s (None: either did not run its timed steps)."""
    a, b = (r.samples_per_s() if r is not None and r.ok else None for r in (one, other))
    return a / b if a and b else None


def interrupt_name(exc: BaseException) -> str:
    """``Ctrl-C``, or the signal that ended the search (e.g. ``SIGTERM``)."""
    name = getattr(exc, "signal_name", None)
    return "Ctrl-C" if name in (None, "SIGINT") else name


class _Search:
    """The state of one search: the study, the results so far, the probes, what was pruned."""

    def __init__(self, report: ProbeReport, classes: Sequence[Knobs],
                 settings: SearchSettings, values: Mapping[str, Sequence[str]], run: Runner,
                 on_trial: OnTrial | None, on_step: OnStep | None, *,
                 before: _Search | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """``before``: a search given up (its stored runs were stale); its own runs, cost and
        clock carry over, so the limits and the record cover both."""
        self.report, self.settings = report, settings
        self._run, self._on_trial, self._on_step = run, on_trial, on_step
        self.per_device = report.per_device_batch()
        self.micro_batches = divisors(self.per_device)
        self.values = {k: tuple(v) for k, v in values.items()}
        self.base = job_baseline(self.values.get("strategy", ("none",))[0])
        """fp32 eager in the job's strategy: what an untuned user runs."""
        self.study = self._open_study(classes)
        # A resumed study may hold settings this search is restricted from: leave them out.
        self.allowed_base = {(c.precision, c.compile_mode) for c in classes}
        done, runs = self.study.completed()
        self.held: dict[Candidate, TrialResult] = {
            c: r for c, r in done.items() if self._allowed(c.knobs)}
        """Timed runs the study holds that this search has not asked for yet: each answers when
        asked (``measure``), so a resumed search decides on what the first one had seen at
        that point and takes the same path; those it never asks for (another search's, in a
        shared study) join the race at ``confirm``."""
        self.results: dict[Candidate, TrialResult] = {}
        """Timed runs this search asked for (run now, or answered from ``held``)."""
        self.probe_runs: dict[Candidate, TrialResult] = self.study.probed()
        """Memory probes that timed nothing (bisection points)."""
        self.baseline: Candidate | None = None
        self.probes: dict[Knobs, MemoryProbe] = {}
        self.skipped: list[str] = []
        self.traits: WorkloadTraits | None = next(
            (r.traits for r in self.held.values() if r.traits is not None), None)
        """What the workload allows (blocks, convolutions, optimizer), from any run."""
        self.runs: dict[Candidate, int] = {k: n for k, n in runs.items() if k in self.held}
        """Runs of each candidate (2 once re-measured), stored ones included."""
        self.stored = set(self.held) if self.study.record.name.startswith("autotune-") \
            else set()
        """Candidates whose timing came from the local study store: a contender among them is
        re-measured once in this search (``confirm``), so a stale timing never picks alone."""
        self.reached: set[Candidate] = set()
        """Candidates this search asked for (run, or answered from the study): a probe starts
        from those of its setting (``probe_memory``'s ``known``), the same in a resumed search
        as in the first."""
        self.num_runs = 0
        self.cost: dict[str, float] = {"child_s": 0.0, "compile_s": 0.0, "timed_s": 0.0}
        self.compiles = [0, 0]
        """Compiled runs, and those whose graphs all came from inductor's on-disk cache."""
        self.timed_s: dict[Candidate, float] = {}
        """Seconds of timed steps per candidate, over its runs in this search."""
        self.run_log: list[RunRecord] = self.study.stored_runs(report.usable_bytes())
        """Every child run: the study's stored ones first, then this search's, in order."""
        self.cold: dict[Candidate, TrialResult] = {}
        """Per compiled candidate, a run of it that compiled every graph afresh (no cache
        hit): what a first launch peaks at. One out of memory is kept over one that fit."""
        self.drift: dict[Candidate, float] = {}
        """``SearchOutcome.drift``: candidates timed twice in this search, and how far apart."""
        self.round_shares: dict[Candidate, tuple[float, ...]] = {}
        """The two candidates of stage 5's interleaved rounds, each with its samples/s over
        the other's in each round (``TrialRecord.round_shares``)."""
        for key, result in [*self.probe_runs.items(), *self.held.items()]:
            self._note_cold(key, result)
        self.classes = tuple(classes)
        self.entered: list[str] = []
        """The stages entered, in order (``stage``), and those where a run began (``_begin``):
        what a search stopped early never reached is said in ``TunedConfig.not_reached``."""
        self.ran_in: set[str] = set()
        self.considered: set[tuple[str, str]] = set()
        """(precision, compile mode) of the settings a run began on, or ruled out with a
        reason (``_why_not_mode``)."""
        self.screened: set[str] = set()
        """The knobs whose screening (stage 3) ran a value or ended."""
        self.stage = "probe"
        self.clock = clock
        self.start = clock()
        if before is not None:
            self.num_runs, self.start = before.num_runs, before.start
            self.cost, self.compiles = dict(before.cost), list(before.compiles)
            self.run_log += [replace(r, number=len(self.run_log) + i) for i, r in enumerate(
                r for r in before.run_log if r.stored_at is None)]

    def _open_study(self, classes: Sequence[Knobs]) -> Ledger:
        """``--storage``'s study, or the local store's study for this search's key, or (with
        ``--no-cache``) one in memory."""
        settings, direction = self.settings, "minimize" if self.settings.train_steps else \
            "maximize"
        identity = study_identity(self.report, settings)
        if settings.storage is not None or not settings.cache:
            study = open_study(settings, identity, direction)
            return Ledger(study, StudyRecord(storage=redact(settings.storage or ""),
                                             name=study.study_name if settings.storage else ""))
        space = {
            "classes": sorted(k.label() for k in classes),
            "values": {k: sorted(v) for k, v in sorted(self.values.items())},
            **{f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
               if f.name in _SPACE_SETTINGS}}
        name, key = study_key(identity, space)
        local = open_local(name, key, direction, fresh=settings.fresh)
        return Ledger(local.study, StudyRecord(storage=local.storage or "",
                                               name=name if local.storage else "",
                                               note=local.note))

    # -- the stages ------------------------------------------------------------------------

    @property
    def stage(self) -> str:
        """The stage running now (said with each run's progress)."""
        return self._stage

    @stage.setter
    def stage(self, name: str) -> None:
        self._stage = name
        if name not in self.entered:
            self.entered.append(name)

    def _allowed(self, knobs: Knobs) -> bool:
        """Whether a stored run's setting is in this search's space."""
        return (knobs.precision, knobs.compile_mode) in self.allowed_base and all(
            getattr(knobs, k.name) == k.default or getattr(knobs, k.name) in self.values.get(
                k.name, ()) for k in KNOBS[2:])

    def stages(self, classes: Sequence[Knobs]) -> None:
        self.stage = "stored"  # what the study holds, said before it answers the stages
        for key, result in list(self.held.items()):
            self._progress(key, classify(key, result, self.held, None, self.report,
                                         self.settings)[0])
        self.stage = "probe"
        first = sorted((c for c in classes if c.compile_mode in FIRST_MODES),
                       key=lambda c: (c != self.base, c.compile_mode != "off"))
        for i, knobs in enumerate(first):
            if knobs.compile_mode != "off":  # the most promising precision first (its eager
                # run's speed): a strong leader early lets the probes after it stop sooner
                first[i:] = sorted(first[i:], key=lambda c: -self._precision_best(c.precision))
                knobs = first[i]
            self.probe(knobs)
            if knobs == self.base:
                base = self.probes[self.base]
                if base.max_micro_batch:
                    self.baseline = Candidate(knobs=knobs, micro_batch=base.max_micro_batch)
                elif not self.rescue_baseline():
                    return  # no baseline: the api says what it would take
        for knobs in (c for c in classes if c.compile_mode not in FIRST_MODES):
            why_not = self._why_not_mode(knobs)
            if why_not:
                self.skipped.append(why_not)
            else:
                self.probe(knobs)
        self.stage = "knobs"
        self.screen()
        self.stage = "refine"
        screened = self._leader()
        # Eager settings first, best first: their steps cost no compile, and their walks are
        # the evidence a compiled setting is walked down on (``_sibling_says_no``).
        for probe in sorted(self.probes.values(), key=lambda p: (
                p.knobs.compile_mode != "off", -(self._class_best(p.knobs) or 0.0))):
            self.refine(probe)
        if self._leader() != screened:  # the knobs were screened at another micro-batch
            self.stage = "knobs"
            self.screen(timing_only=True)
        self._release_held()
        self.stage = "confirm"
        self.confirm()
        self.recheck_stored_pick()
        self.stage = "first launch"
        self.fit_cold()

    def probe(self, knobs: Knobs, *, above: int = 0) -> MemoryProbe:
        """Find the setting's largest fitting micro-batch, and time it.

        A probe that may be the largest fit times its config in the same run; bisection
        points only measure memory. When the boundary turns out to be such a point, it is
        timed afterwards. ``above``: only larger micro-batches are considered (the probe
        starts at the next one up: the smaller ones cannot win, ``_probe_recompute``)."""

        def candidate(micro_batch: int) -> Candidate:
            return Candidate(knobs=knobs, micro_batch=micro_batch)

        def free(micro_batch: int) -> bool:
            # The baseline always finds its boundary; a run already measured (a resumed study)
            # costs nothing: the probe goes on as the first search's did.
            key = candidate(micro_batch)
            return knobs == self.base or key in self.results or key in self.held \
                or key in self.probe_runs

        def stop_above(fit: int, above: int) -> str | None:
            return None if free(above) else self._why_not_larger(candidate(fit))

        def stop_below(over: int, below: int) -> str | None:
            return None if free(below) else self._why_not_below(candidate(over))

        def timed(micro_batch: int, may_be_largest: bool) -> bool:
            # A compiled setting's probe above its largest fit so far times its config too:
            # should it fit, timing it in a run of its own costs another child and another
            # load of its graphs, where the timed steps alone cost seconds.
            if may_be_largest or knobs.compile_mode == "off":
                return may_be_largest
            return 0 < self._largest_fit(knobs) < micro_batch

        considered = [m for m in self.micro_batches if m > above]
        probe = probe_memory(
            self.report.workload, self.report.device.device, knobs, considered,
            budget_bytes=self.report.budget_bytes, usable_bytes=self.report.usable_bytes(),
            timeout_s=self.settings.timeout_s,
            hint=considered[0] if above else hint_for(knobs, self.probes.values()),
            run=self.measure, on_step=self._on_step, stop_above=stop_above,
            stop_below=stop_below,
            make_spec=lambda m, largest: self.spec(candidate(m), timed=timed(m, largest)),
            known={c.micro_batch: r for c, r in [*self.probe_runs.items(), *self.results.items()]
                   if c.knobs == knobs and c in self.reached})
        self.probes[knobs] = probe
        self.skipped += [f"{knobs.label()}: {n}" for n in probe.notes
                         if n.startswith(("micro-batches above", "micro-batches below"))]
        if not probe.max_micro_batch and any(n.startswith("micro-batches below")
                                             for n in probe.notes):
            del self.probes[knobs]  # its smaller micro-batches were never tried: not "none"
        if probe.max_micro_batch:
            self.measure(self.spec(candidate(probe.max_micro_batch)))  # reused when timed
        return probe

    def rescue_baseline(self) -> bool:
        """fp32 eager fits nothing: try the values that free memory on it, most first; the
        first that fits is the baseline (what fits with the least change). False when none
        does (the api then says what the budget would need), and at once when fp32 eager
        failed at the smallest micro-batch in a way no memory changes (``BROKEN``: a hang,
        a non-finite loss; the api names the workload's failure)."""
        if any(s.status in BROKEN and s.micro_batch == self.micro_batches[0]
               for s in self.probes[self.base].steps):
            return False
        for knob in KNOBS[2:]:
            for value in knob.frees_memory:
                if value not in self.values.get(knob.name, ()):
                    continue
                knobs = self.base.with_(**{knob.name: value})
                why = skip_reason(knobs, self.traits)
                if why:
                    self.skipped.append(f"{knobs.label()} not tried: {why}")
                    continue
                probe = self.probe(knobs)
                if probe.max_micro_batch:
                    self.baseline = Candidate(knobs=knobs, micro_batch=probe.max_micro_batch)
                    self.skipped.append(
                        f"{self.base.label()} fits no micro-batch in "
                        f"{format_bytes(self.report.usable_bytes())}"
                        f" usable: the baseline is {self.baseline.key()}, the first setting "
                        "that frees enough memory")
                    return True
        return False

    def screen(self, *, timing_only: bool = False) -> None:
        """Stage 3: each further knob on the leader, one at a time (module docstring).

        ``timing_only``: only the knobs whose values free no memory, at the leader's
        micro-batch (after refinement moved the leader to another micro-batch, where their
        effect can differ: an optimizer step weighs more beside smaller micro-batches)."""
        lowered: list[tuple[str, str, Candidate]] = []  # (knob, value, where it was timed)
        after: dict[str, Candidate] = {}  # per timing knob, the leader once it was screened
        for knob in KNOBS[2:]:
            if timing_only and knob.frees_memory:
                continue
            leader = self._leader()
            if leader is None:
                return
            if knobs_after := self._knob_values_screened(knob, leader, lowered):
                after[knob.name] = knobs_after
        self._probe_lowered(lowered)
        final = self._leader()
        stale = {name: on for name, on in after.items() if final is not None
                 and on.knobs != final.knobs and on.micro_batch == final.micro_batch}
        if not timing_only and stale and final is not None:
            # A knob screened before a later one changed the leader's setting: its best value
            # can depend on the other's (an optimizer implementation on channels_last), so
            # its values are timed again on the final leader, once. (A leader at another
            # micro-batch is screened again after refinement, ``stages``.)
            known = len(self.results)
            self.screen(timing_only=True)
            if len(self.results) > known:
                on = next(iter(stale.values()))
                self.skipped.append(
                    f"{', '.join(stale)} screened again on {final.key()}: the leader changed "
                    f"after {'it was' if len(stale) == 1 else 'they were'} screened (on "
                    f"{on.knobs.label()}), and a knob's best value can depend on another's")

    def _knob_values_screened(self, knob: Knob, leader: Candidate,
                              lowered: list[tuple[str, str, Candidate]]) -> Candidate | None:
        """Stage 3 for one knob: each of its values on ``leader`` (``screen``); a value that
        peaked below the leader joins ``lowered``. For a knob that frees no memory, the
        leader after it (None for one that does)."""
        for value in self.values.get(knob.name, ()):
            if value == getattr(leader.knobs, knob.name):
                continue
            knobs = leader.knobs.with_(**{knob.name: value})
            timed_here = Candidate(knobs=knobs, micro_batch=leader.micro_batch)
            recompute = knob.name == "checkpointing" and value in knob.frees_memory
            if knobs in self.probes or (timed_here in self.results and not recompute):
                continue  # (a recompute's run there, stored, says nothing of its probe)
            why = skip_reason(knobs, self.traits)
            if why is None and value in knob.frees_memory:
                why = self._why_not_free(leader)
            if why is None and recompute:
                why = self._why_not_recompute(leader)
            if why:
                self.skipped.append(f"{knobs.label()} not tried: {why}")
            elif recompute:
                self._probe_recompute(knobs)
            elif value in knob.frees_memory:
                self.probe(knobs)
            else:
                result = self.measure(self.spec(Candidate(knobs=knobs,
                                                          micro_batch=leader.micro_batch)))
                if result.status == "oom":  # it needs more memory than the leader's
                    self.probe(knobs)
                elif self._lower_peak(leader, timed_here):
                    # its boundary may be above the leader's
                    lowered.append((knob.name, value, timed_here))
        now = self._leader()
        self.screened.add(knob.name)
        return None if knob.frees_memory else now

    def _probe_recompute(self, knobs: Knobs) -> None:
        """Probe a checkpointing value above the largest micro-batch its setting fits without
        it: checkpointing recomputes each checkpointed block's forward, so at a micro-batch
        the setting fits without it (without allocator retries: memory pressure is what
        freeing memory can relieve), it runs no faster (``_why_not_recompute``) and is not
        run there. The probe starts at the next micro-batch up, timed; where that does not
        fit either, the value fits nothing that could win, and is left out of the probes (its
        smaller micro-batches were never tried: "fits none" would be wrong), with the reason."""
        twin = knobs.with_(checkpointing="off")
        usable = self.report.usable_bytes()
        # A fit under memory pressure (allocator retries) is no floor: there, freeing memory
        # can make a step faster.
        fit = self._largest_fit(twin, calm=True)
        if not fit:  # nothing known to fit without it: the whole range is open
            self.probe(knobs)
            return
        if fit >= self.per_device:
            self.skipped.append(f"{knobs.label()} not tried: {twin.label()} fits the whole "
                                f"per-device batch {self.per_device} without it, and "
                                "checkpointing recomputes, so it runs no faster there")
            return
        probe = self.probe(knobs, above=fit)
        why = (f"checkpointing recomputes, so it runs no faster where {twin.label()} fits "
               "without it")
        if probe.max_micro_batch:
            self.skipped.append(f"{knobs.label()}: micro-batches {fit} and below not tried: "
                                f"{why}")
            return
        del self.probes[knobs]
        first = probe.steps[0] if probe.steps else None
        seen = "" if first is None else f" (at {first.micro_batch}: " + (
            f"peak {format_bytes(first.peak_bytes)} of {format_bytes(usable)} usable)"
            if first.status == "ok" else f"{first.status})")
        self.skipped.append(f"{knobs.label()}: fits no micro-batch above {fit}{seen}, and is "
                            f"not tried at {fit} or below: {why}")

    def _largest_fit(self, knobs: Knobs, *, calm: bool = False) -> int:
        """The largest micro-batch of ``knobs`` known to fit (its probes' and timed runs'), 0
        when none; ``calm``: only runs without allocator retries count."""
        usable = self.report.usable_bytes()
        return max((c.micro_batch for c, r in [*self.probe_runs.items(), *self.results.items()]
                    if c.knobs == knobs and r.fits(usable)
                    and not (calm and r.num_alloc_retries)), default=0)

    def _lower_peak(self, leader: Candidate, timed: Candidate) -> bool:
        """Whether memory binds the leader (a larger micro-batch exists that it does not run)
        and ``timed``, run at the leader's micro-batch, peaked below it there (a multi-tensor
        optimizer's or another memory format's footprint)."""
        ran, led = self.results.get(timed), self.results.get(leader)
        return (timed.micro_batch == leader.micro_batch < self.per_device and ran is not None
                and ran.ok and led is not None and bool(ran.peak_bytes) and bool(
                    led.peak_bytes) and (ran.peak_bytes or 0) < (led.peak_bytes or 0))

    def _probe_lowered(self, lowered: Sequence[tuple[str, str, Candidate]]) -> None:
        """Probe above the leader's micro-batch the knob values that peaked below it there
        (``lowered``: each value with the candidate it was timed as, on the leader then).

        Their savings add up: two values that alone fit no larger micro-batch may fit one
        together (e.g. a multi-tensor optimizer's and another memory format's), so the
        lowest-peak value of each knob is first timed together on the leader at its
        micro-batch (unless that setting ran already: one of them became the leader, and the
        next was timed on it). Then, lowest peak first, each is probed above where the next
        micro-batch may fit by the growth per sample (``_growth``); one whose peak is not below
        a setting whose probe fit nothing larger is not (it would end in an out-of-memory
        too). The gain ceiling still decides each step of a probe (``_why_not_larger``)."""
        leader = self._leader()
        if leader is None:
            return
        here = [(name, value, c) for name, value, c in lowered
                if c.micro_batch == leader.micro_batch and self.results.get(c) is not None]
        peak = {c: self.results[c].peak_bytes or 0 for _, _, c in here}
        changes: dict[str, str] = {}
        for name, value, _c in sorted(here, key=lambda t: peak[t[2]]):
            changes.setdefault(name, value)
        together = Candidate(knobs=leader.knobs.with_(**changes), micro_batch=leader.micro_batch)
        if together.knobs != leader.knobs and together not in self.results \
                and together.knobs not in self.probes \
                and skip_reason(together.knobs, self.traits) is None:
            self.measure(self.spec(together))
            if self._lower_peak(leader, together):
                peak[together] = self.results[together].peak_bytes or 0
        pool = [c for c in peak if c.knobs not in self.probes]
        none_above: Candidate | None = None  # the lowest peak whose probe fit nothing larger
        for c in sorted(pool, key=peak.__getitem__):
            m = c.micro_batch
            above = next(x for x in self.micro_batches if x > m)
            growth = self._growth(c.knobs, m)
            need = None if growth is None else peak[c] + growth * (above - m)
            if none_above is not None:
                self.skipped.append(
                    f"{c.knobs.label()}: micro-batches above {m} not probed: its peak at {m} "
                    f"({format_bytes(peak[c])}) is not below {none_above.knobs.label()}'s "
                    f"({format_bytes(peak[none_above])}), which fits no larger micro-batch")
            elif need is not None and need > self.report.usable_bytes():
                self.skipped.append(
                    f"{c.knobs.label()}: micro-batches above {m} not probed: its peak at {m} "
                    f"({format_bytes(peak[c])}) grows to about {format_bytes(int(need))} at "
                    f"{above} ({format_bytes(int(growth or 0))} a sample), over the "
                    f"{format_bytes(self.report.usable_bytes())} usable")
            else:
                steps = self.probe(c.knobs).steps
                if not any(s.fits for s in steps if s.micro_batch > m) and any(
                        s.micro_batch > m for s in steps):  # tried above: nothing larger fit
                    none_above = c

    def _growth(self, knobs: Knobs, micro_batch: int) -> float | None:
        """Peak bytes per sample above ``micro_batch`` for ``knobs``, or None (not known).

        Measured on a setting of the same memory class (``_memory_class``: the other knobs
        move a fixed amount, not the growth) at two or more micro-batches that completed, the
        slope of the boundary search's line through them (``boundary.fit_line``); else a
        lower bound from the class's probe that stopped at ``micro_batch``: its run above
        failed, so its peak there exceeded the budget (or is the measured one)."""
        cls = _memory_class(knobs)
        bound = None
        for k, probe in self.probes.items():
            if _memory_class(k) != cls:
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
                    self.report.budget_bytes
                bound = max(0.0, (end - points[-1][1]) / (over.micro_batch - micro_batch))
        return bound

    def _why_not_recompute(self, leader: Candidate) -> str | None:
        """Why checkpointing cannot win on the leader's setting, if it cannot: it recomputes
        each checkpointed block's forward, so at a micro-batch the setting fits without it, it
        runs no faster (in the committed oracles, checkpointed against not at the same
        micro-batch: at most 1.01x in the Xeon causal LM's at 8-64, at most 0.97x in the CNN's
        and the masked LM's at 8-64; with their micro-batches 1-4 measured once on noisier
        days, up to 1.32x and 1.42x, fp32/default+ckpt=alternate+opt=foreach at 1-2, at 0.33x
        and 0.47x of the best; at most 1.28x in the CNN's at 1-64, at 0.32x of the best:
        ``benchmarks/rule_checks.py`` (2)); it is worth a run only for a
        micro-batch larger than the setting's largest fit. Where the setting's largest timed
        fit ``M`` is behind the leader (which runs a smaller micro-batch of it) by more than
        what a larger micro-batch can gain (``_why_not_larger``, the setting's own pair of timed
        micro-batches counting), no larger micro-batch can win, checkpointed or not: in the
        committed oracles, of 24 checkpointed candidates above a setting that got slower with
        its larger micro-batch, 4 ran over that bound by more than 5%, at most 1.09x
        (``rule_checks.py`` (9)), so a skip behind by more than the noise (5% at least) misses
        at most a few percent. None: screen it (the leader runs the setting's largest timed
        fit, nothing bounds the gain, or that fit ran under memory pressure)."""
        usable = self.report.usable_bytes()
        timed = [c for c, r in self.results.items() if c.knobs == leader.knobs
                 and r.fits(usable) and self._score(c) is not None]
        if not timed:
            return None
        largest = max(timed, key=lambda c: c.micro_batch)
        result = self.results[largest]
        if largest == leader or result.num_alloc_retries:
            return None
        why = self._why_not_larger(largest, own_pair=True)
        if why is None:
            return None
        return (f"checkpointing recomputes, so it runs no faster at a micro-batch "
                f"{leader.knobs.label()} fits without it, and is worth a run only above its "
                f"largest timed fit {largest.micro_batch}: {why}")

    def _why_not_larger(self, timed: Candidate, *, own_pair: bool = False) -> str | None:
        """Why no micro-batch larger than a setting's largest fit so far can win, if none
        can: the most a larger one gains (``timing.gain_ceiling``, from a sibling's two timed
        micro-batches: the per-micro-batch overhead spread over more samples) leaves it
        behind the leader by more than the noise. Its memory probe then stops there (a
        compiled setting's probe above its fit costs a compile, and often ends in an OOM).
        A run of the pair stopped early behind the leader counts with its interval measured
        (three steps or more: its width is in the noise); one cut by the time limit before
        that does not. ``own_pair``: the setting's own two timed micro-batches count too (a
        bound for what it gains above its largest fit without a probe of its own). None: probe
        on (the setting leads, was not timed there, or nothing predicts)."""
        leader = self._leader()
        result = self.results.get(timed)
        if leader is None or result is None or self.settings.train_steps \
                or timed.micro_batch >= self.per_device:
            return None
        sps, top = result.samples_per_s(), self._score(leader, full=True)
        if not sps or not top:
            return None

        def usable(c: Candidate) -> bool:
            r = self.results.get(c)
            return r is not None and not r.num_alloc_retries and self._score(c) is not None \
                and (self._score(c, full=True) is not None
                     or len(r.step_times_s) >= MIN_STEPS_TO_STOP)

        pairs = [(c.knobs, c.micro_batch, d.micro_batch) for c in self.results
                 for d in self.results if c.knobs == d.knobs
                 and (own_pair or c.knobs != timed.knobs)
                 and c.micro_batch < d.micro_batch and usable(c) and usable(d)]
        if not pairs:
            return None
        sibling, small, large = max(pairs, key=lambda t: (
            *_alike(t[0], timed.knobs), -abs(math.log(t[1] / timed.micro_batch)), -t[2]))
        at_small, at_large = (Candidate(knobs=sibling, micro_batch=m) for m in (small, large))
        ratio = (self._score(at_large) or 0.0) / (self._score(at_small) or 1.0)
        ceiling = gain_ceiling(ratio, small, large, timed.micro_batch, self.per_device)
        noise = self._noise(timed, leader, at_small, at_large)
        if ceiling is None or sps * ceiling >= top * (1 - noise):
            return None
        return (f"at {timed.micro_batch} it runs {sps:,.1f} samples/s, {sps / top:.2f}x the "
                f"leader's ({leader.key()}); "
                f"a larger one gains at most {ceiling:.2f}x (up to {self.per_device}: the "
                f"per-micro-batch overhead {sibling.label()} showed from {small} to {large}, "
                f"{ratio:.2f}x, spread over more samples), {sps * ceiling:,.1f} samples/s: "
                f"behind by more than the noise ({noise:.0%})")

    def _why_not_below(self, over: Candidate) -> str | None:
        """Why a compiled setting's micro-batches below ``over`` (a run that peaked over the
        usable budget, while nothing smaller has fit yet) cannot win, if they cannot: ``over``
        ran behind the leader by more than refinement allows (``--refine-within``), even at
        the top of its interval, and a smaller micro-batch of a compiled setting only adds
        accumulation steps (time per micro-batch linear in its size, plus one update per
        step), each at a compile of its own. In the committed oracles, of 46 compiled
        settings that ran over the usable budget above a fit, the fit below beat that run by
        more than 5% in 2 (up to 1.16x); of the 26 whose run over the budget was under 0.90 of
        the best, the fit below came to at most 0.95x of it (``benchmarks/rule_checks.py``
        (10)): the pick is not among them. None: probe on (an eager setting, whose smaller
        micro-batch can stay in cache and costs no compile; ``over`` not timed, under memory
        pressure, or near the leader; every micro-batch timed: ``--micro-batches all``)."""
        leader, result = self._leader(), self.results.get(over)
        if over.knobs.compile_mode == "off" or leader is None or result is None \
                or not result.ok or result.num_alloc_retries or self.settings.train_steps \
                or not self.settings.micro_batches_per_class \
                or len(result.step_times_s) < MIN_STEPS_TO_STOP:
            return None
        sps, top = result.samples_per_s(), self._score(leader, full=True)
        if not sps or not top:
            return None
        noise = self._noise(over, leader)
        if sps * (1 + noise) >= top * self.settings.refine_within:
            return None
        return (f"at {over.micro_batch} it ran {sps:,.1f} samples/s (over the usable budget), "
                f"{sps / top:.2f}x the leader's ({leader.key()}), under the "
                f"{self.settings.refine_within:.2f} that refinement needs (--refine-within) by "
                f"more than the noise ({noise:.0%}); a smaller micro-batch of a compiled setting "
                "only adds accumulation steps (time per micro-batch linear in its size, plus "
                "one update per step), at the cost of a compile of its own")

    def _why_not_free(self, leader: Candidate) -> str | None:
        """Why freeing memory cannot help the leader, if it cannot: it already runs the whole
        per-device batch without allocator retries (a measured fact, said with its peak)."""
        result = self.results.get(leader)
        if leader.micro_batch < self.per_device or result is None or result.num_alloc_retries:
            return None
        return (f"the leader ({leader.key()}) already runs the whole per-device batch "
                f"{self.per_device} at peak {format_bytes(result.peak_bytes)} of "
                f"{format_bytes(self.report.usable_bytes())} usable, without allocator retries: "
                "freeing memory cannot raise its micro-batch, and costs time")

    def refine(self, probe: MemoryProbe) -> None:
        """Time smaller micro-batches of one class, largest first, while each is faster than
        the class's best by more than the noise (one run's luck is no trend to follow).

        Micro-batches already measured (a resumed study) are walked through the same rule, so
        a resumed search stops where the first one did."""
        knobs, per_class = probe.knobs, self.settings.micro_batches_per_class
        label = knobs.label()
        fitting = sorted(probe.fitting(), reverse=True)
        why_not = self._why_not_smaller(knobs, fitting)
        if why_not and per_class:
            self.skipped.append(why_not)
            return
        walked: list[int] = []  # largest first, each measured
        for i, m in enumerate(fitting):
            key = Candidate(knobs=knobs, micro_batch=m)
            rest = ", ".join(str(x) for x in fitting[i:])
            if key not in self.results:
                if per_class and len(walked) >= per_class:
                    self.skipped.append(f"{label}: micro-batches {rest} not timed: the class's "
                                        f"{per_class} largest were (--micro-batches)")
                    return
                share = self._share(self._class_best(knobs))
                if per_class and (share is None or share < self.settings.refine_within):
                    self.skipped.append(f"{label}: micro-batches {rest} not timed: "
                                        f"{self._behind(share)}")
                    return
                why_not = self._sibling_says_no(knobs, walked, m) if per_class else None
                if why_not:
                    self.skipped.append(f"{label}: micro-batches {rest} not timed: {why_not}")
                    return
                self.measure(self.spec(key))
            if walked and per_class:
                best = max((Candidate(knobs=knobs, micro_batch=x) for x in walked),
                           key=lambda c: self._score(c) or 0)
                before, now = self._score(best), self._score(key)
                noise = self._noise(key, best)
                best_m = best.micro_batch
                if now is None or (before is not None and now <= before * (1 + noise)):
                    later = list(fitting[i + 1:])
                    if later and self._time_the_other_end(knobs, later[-1], len(walked) + 1):
                        later = later[:-1]
                    if later:
                        self.skipped.append(
                            f"{label}: micro-batches {', '.join(map(str, later))} not timed: "
                            f"{m} was not faster than {best_m} by more than the noise "
                            f"({noise:.0%})")
                    return
            walked.append(m)

    def _sibling_says_no(self, knobs: Knobs, walked: Sequence[int],
                         micro_batch: int) -> str | None:
        """Why stepping a setting near the leader down to ``micro_batch`` cannot pay, if it
        cannot: another setting timed at both ``micro_batch`` and this one's best so far went no
        faster at ``micro_batch`` (its own walk down), so this one, scaled by the sibling's
        ratio, is predicted not faster than its best by more than the noise. What grows with
        the micro-batch is the same work in both (the knobs between them change how much, not
        the trend).

        A compiled setting, the leader's too, needs that evidence the other way to be walked
        (each micro-batch it steps down costs a compile of its own): time per micro-batch
        linear in its size, plus one update per step, makes a smaller micro-batch only add
        accumulation steps; what breaks that line (memory pressure, a working set that fits a
        cache) shows as allocator retries at its best, as its own walk getting faster, or as a
        sibling timed faster at ``micro_batch``. Without any it is not walked: in the committed
        oracles a compiled setting bound by memory beat its largest fit with the next smaller
        micro-batch by more than 10% in 3 of 255 settings, none of the 75 within 0.90 of the best
        (``benchmarks/rule_checks.py`` (8)). The leader's eager setting is always walked (the
        pick is decided there, and an eager step costs no compile). A setting under memory
        pressure (allocator retries at its best) or the objective with compile time is not
        predicted; None: time it."""
        compiled = knobs.compile_mode != "off"
        if not walked or self.settings.train_steps or (
                knobs == self._leaders_setting() and not compiled):
            return None
        best_m = max(walked, key=lambda x: self._score(Candidate(knobs=knobs,
                                                                 micro_batch=x)) or 0.0)
        best = Candidate(knobs=knobs, micro_batch=best_m)
        best_result = self.results.get(best)
        if best_result is None or best_result.num_alloc_retries or not self._score(best) or (
                compiled and best_m != max(walked)):  # its own walk got faster: time on
            return None

        def pair(other: Knobs) -> tuple[Candidate, Candidate] | None:
            at, at_best = (Candidate(knobs=other, micro_batch=x) for x in (micro_batch, best_m))
            runs = [self.results.get(c) for c in (at, at_best)]
            if other == knobs or any(r is None or r.num_alloc_retries for r in runs):
                return None
            if any(self._score(c, full=True) is None for c in (at, at_best)):
                return None
            return at, at_best

        siblings = [(k, p) for k in {c.knobs for c in self.results} if (p := pair(k))]
        if not siblings:
            if not compiled:
                return None
            return (f"a smaller micro-batch only adds accumulation steps (time per "
                    f"micro-batch linear in its size, plus one update per step) and costs a "
                    f"compile of its own: {best_m} ran without allocator retries, and no "
                    f"setting timed at both {micro_batch} and {best_m} ran faster at "
                    f"{micro_batch} (--micro-batches all times them)")
        sibling, (at, at_best) = max(siblings, key=lambda t: _alike(t[0], knobs))
        ratio = (self._score(at, full=True) or 0.0) / (self._score(at_best, full=True) or 1.0)
        noise = self._noise(best, at, at_best)
        if ratio > 1 + noise:
            return None
        predicted = (best_result.samples_per_s() or 0.0) * ratio
        return (f"predicted {predicted:,.1f} samples/s at {micro_batch} from "
                f"{sibling.label()}'s own ratio of micro-batch {micro_batch} to {best_m} "
                f"({ratio:.2f}x, both timed): not faster than {best_m} by more than the noise "
                f"({noise:.0%})")

    def _time_the_other_end(self, knobs: Knobs, smallest: int, num_timed: int) -> bool:
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
        per_class = self.settings.micro_batches_per_class
        share = self._share(self._class_best(knobs))
        if (share is None or share < self.settings.refine_within
                or (per_class and num_timed >= per_class)):
            return False
        compiled = knobs.compile_mode != "off"
        always = knobs == self._leaders_setting() and not compiled
        why_not = None if always else self._predicted_to_lose(knobs, smallest,
                                                              must_gain=compiled)
        if why_not:  # the leader's own eager setting is timed anyway: the pick is decided there
            self.skipped.append(why_not)
            return False
        self.measure(self.spec(Candidate(knobs=knobs, micro_batch=smallest)))
        return True

    def _leaders_setting(self) -> Knobs | None:
        """The probed setting the leader is, or was screened from (the most alike: further
        knobs timed at its micro-batch share its probe)."""
        leader = self._leader()
        if leader is None or not self.probes:
            return None
        return max(self.probes, key=lambda k: sum(
            getattr(k, f.name) == getattr(leader.knobs, f.name) for f in dataclasses.fields(k)))

    def _predicted_to_lose(self, knobs: Knobs, micro_batch: int, *,
                           must_gain: bool = False) -> str | None:
        """Why a micro-batch of a setting cannot beat the setting's best, predicted from its
        timed micro-batches (``timing.predict_step_s``: per micro-batch time linear in its
        size, plus one update per step), if it cannot: its predicted throughput is below the
        best's by more than the noise, or (``must_gain``: a run that costs a compile) not above
        it by more than the noise. A line that cannot be extended to ``micro_batch`` (its time
        per micro-batch at or below zero there: the larger micro-batches grew faster than their
        size) predicts nothing; with ``must_gain`` that is no predicted gain either, so such a
        run is not made (``benchmarks/rule_checks.py`` (5)). None when it could win, or
        nothing predicts it (without ``must_gain``)."""
        timed = {m: r for m in self.micro_batches if (r := self.results.get(
            Candidate(knobs=knobs, micro_batch=m))) is not None and r.ok and r.step_times_s}
        points = [(m, *_split(r, self.per_device // m)) for m, r in timed.items()]
        step_s = predict_step_s(points, micro_batch, self.per_device)
        best = max(timed, key=lambda m: self._score(Candidate(knobs=knobs, micro_batch=m)) or 0)
        best_sps = self.results[Candidate(knobs=knobs, micro_batch=best)].samples_per_s()
        sizes = ", ".join(str(m) for m in sorted(timed))
        if not best_sps or self.settings.train_steps:
            return None
        if step_s is None:
            if not must_gain or len(timed) < 2:
                return None
            return (f"{knobs.label()}: micro-batch {micro_batch} not timed: the line through "
                    f"micro-batches {sizes} (time per micro-batch linear in its size, plus one "
                    f"update per step) puts its time per micro-batch at or below zero at "
                    f"{micro_batch}: it predicts no gain there, and a compiled micro-batch "
                    "costs a compile of its own")
        predicted = self.per_device / step_s
        noise = self._noise(*(Candidate(knobs=knobs, micro_batch=m) for m in timed))
        # A gain worth a compile must clear the prediction's own interval too: each timed
        # point at least the machine's run-to-run noise, carried along the line.
        widths = [max(self.settings.confirm_within, r.halfwidth() or 0.0)
                  for r in timed.values()]
        spread = (prediction_halfwidth(points, widths, micro_batch, self.per_device) or 0.0
                  if must_gain else 0.0)
        if predicted > best_sps * (1 + max(noise, spread)) or (
                not must_gain and predicted >= best_sps * (1 - noise)):
            return None
        if predicted < best_sps * (1 - noise):
            verdict = f"behind by more than the noise ({noise:.0%})"
        elif predicted > best_sps * (1 + noise):
            verdict = (f"not ahead by more than the prediction's own interval (+-{spread:.0%}: "
                       f"each timed point known to {min(widths):.0%} or worse, carried from "
                       f"{sizes} to {micro_batch}), and a compiled micro-batch costs a "
                       "compile of its own")
        else:
            verdict = (f"not ahead by more than the noise ({noise:.0%}), and a compiled "
                       "micro-batch costs a compile of its own")
        return (f"{knobs.label()}: micro-batch {micro_batch} not timed: predicted "
                f"{predicted:,.1f} samples/s from the line through micro-batches {sizes} "
                f"(time per micro-batch linear in its size, plus one update per step), "
                f"{predicted / best_sps:.2f}x micro-batch {best}'s: {verdict}")

    def _why_not_smaller(self, knobs: Knobs, fitting: list[int]) -> str | None:
        """Why a compiled class's smaller micro-batches are not worth their compiles, if not.

        A smaller micro-batch only adds accumulation steps, unless memory pressure slows the
        largest (allocator retries, or a boundary below the whole per-device batch). Each one
        costs a compile of its own (``dynamic=False``): a compiled class that runs the whole
        per-device batch without retries is not refined."""
        if knobs.compile_mode == "off" or len(fitting) < 2:
            return None
        largest = self.results.get(Candidate(knobs=knobs, micro_batch=fitting[0]))
        if fitting[0] < self.per_device or largest is None or largest.num_alloc_retries:
            return None
        rest = ", ".join(str(m) for m in fitting[1:])
        return (f"{knobs.label()}: micro-batches {rest} not timed: {fitting[0]} (the "
                "whole per-device batch) ran without allocator retries, so a smaller one "
                "only adds accumulation steps, each at the cost of a compile "
                "(--micro-batches all times them)")

    def confirm(self) -> None:
        """Re-measure the leader and its close contenders; keep each one's better run. A
        contender timed only by a search before (the local study store) is re-measured once
        here, the leader and the runner-up at least: if its stored timing is no longer within
        the noise of what it runs at now, the fresh run replaces it.

        A clear leader, compiled and not yet run as a first launch compiles it, has stage 6's
        run made here: it is a second run of the leader too, so the drift between its two
        runs is known before the race is settled (``_within_drift``, ``_interleave``)."""
        keys = self._contenders()
        if not keys or (len(keys) < 2 and keys[0] not in self.stored
                        and not self._unchecked_launch(keys[0])):
            return
        if all(k in self.stored for k in keys):
            # A repeated search: its first confirmed the race; the re-check only asks whether
            # the two leaders still run as stored, timed until their medians are known.
            keys = keys[:2]
        ran = self._remeasure(keys)
        cold = self.cold.get(keys[0])
        if keys[0] in ran and cold is not None and not cold.fits(self.report.usable_bytes()):
            # Its run compiled afresh, as a first launch does, did not fit: stage 6 now.
            self.stage = "first launch"
            self._rule_out(keys[0], cold)
            return
        ran.update(self._remeasure(self._within_drift(), cold_first=False))
        self._interleave(ran)

    def recheck_stored_pick(self) -> None:
        """A stored timing never picks alone: while the pick would be a candidate timed only
        by a search before (the local study store), not run in this one, it is re-checked
        (``_remeasure``; its fresh run counts where the stored one is stale) and the pick
        made again. The two leaders' re-checks can drop both behind a third known only from
        the store; each round re-runs one candidate, so it ends."""
        while (winner := self._winner()) is not None and winner in self.stored:
            self._remeasure([winner], cold_first=False)

    def _round_pair(self) -> tuple[Candidate, Candidate, Candidate, float] | None:
        """The leader and its best challenger where their gap is within the widest drift
        between two runs of one config in this search, and that drift is wider than a
        machine's run-to-run noise (``confirm_within``): the leader, the challenger, the
        config that drifted and by how much. None otherwise, or where the objective counts
        compile time (``train_steps``: rounds compare step speed)."""
        widest = max(self.drift.items(), key=lambda kv: kv[1], default=None)
        if self.settings.train_steps or widest is None or \
                widest[1] <= self.settings.confirm_within:
            return None
        ranked = [k for k in self._ranked() if k not in self.stored]
        if len(ranked) < 2 or ranked[0] != self._leader():
            return None
        top, second = (self._score(k, full=True) or 0.0 for k in ranked[:2])
        if not top or second < top * (1 - widest[1]):
            return None
        return ranked[0], ranked[1], *widest

    def _interleave(self, first: Mapping[Candidate, TrialResult]) -> None:
        """Stage 5's interleaved rounds (module docstring): where runs of one config drifted
        further apart than the leader's gap to its best challenger, the two run back to back,
        the order reversed each round, until one is ahead in most rounds (two, a third where
        they split). The runs of ``first`` (the re-measures just made, in order) are the
        first round where the two ran one after the other. Each round's ratio lands in
        ``round_shares``; ``pick_winner`` follows the rounds over the best runs."""
        pair = self._round_pair()
        if pair is None:
            return
        leader, challenger, config, drift = pair
        gap = 1 - (self._score(challenger, full=True) or 0.0) / (
            self._score(leader, full=True) or 1.0)
        shares: list[float] = []
        ran = list(first)
        order = [k for k in ran if k in (leader, challenger)]
        ratio = _ratio(first.get(challenger), first.get(leader))
        if ratio is not None and abs(ran.index(leader) - ran.index(challenger)) == 1:
            shares.append(ratio)
            order.reverse()
        else:  # not run back to back (or one run failed): two rounds of their own
            order = [leader, challenger]
        while len(shares) < _ROUNDS or (
                len(shares) < _ROUNDS + 1 and sum(s > 1 for s in shares) * 2 == len(shares)):
            runs = self._remeasure(order, cold_first=False, in_round=True)
            ratio = _ratio(runs.get(challenger), runs.get(leader))
            if ratio is None:  # a run failed (out of memory: that candidate is out)
                break
            shares.append(ratio)
            order.reverse()
        if len(shares) < _ROUNDS:  # a run failed: the best runs stand (an out one is out)
            return
        self.round_shares[challenger] = tuple(shares)
        self.round_shares[leader] = tuple(1 / s for s in shares)
        ahead = sum(s > 1 for s in shares)
        picked = challenger if ahead * 2 > len(shares) else leader
        self.skipped.append(
            f"{challenger.key()} and {leader.key()} ran in {len(shares)} interleaved rounds, "
            "back to back, the order reversed each round: two runs of "
            f"{config.key()} drifted {drift:.0%} apart here, wider than their {gap:.0%} "
            f"gap. {challenger.key()} ran "
            + ", ".join(f"{s:.2f}x" for s in shares)
            + f" the other's samples/s: ahead in {ahead} of {len(shares)}; "
            f"{picked.key()} stands as the pick of the two")

    def _within_drift(self) -> list[Candidate]:
        """Up to ``num_confirm`` candidates run once (in full, or stopped early behind) whose
        gap to the leader is within the widest drift between two runs of one config in this
        search, best first, each said in ``skipped``: a run of a shared machine lands that far
        from another of the same config, so one run that far behind is not behind at all."""
        widest = max(self.drift.items(), key=lambda kv: kv[1], default=None)
        leader = self._leader()
        if widest is None or leader is None or not widest[1]:
            return []
        top, (config, drift) = self._score(leader, full=True) or 0.0, widest
        once = sorted((k for k in self.results if k != leader and self.runs.get(k, 1) < 2
                       and k not in self.stored and (self._score(k) or 0.0) >= top * (
                           1 - drift)),
                      key=lambda k: -(self._score(k) or 0.0))[:self.settings.num_confirm]
        for key in once:
            share = (self._score(key) or 0.0) / top
            self.skipped.append(
                f"{key.key()} re-measured: timed once at {share:.2f}x the leader "
                f"({leader.key()}), within the {drift:.0%} two runs of {config.key()} drifted "
                "apart here")
        return once

    def _remeasure(self, keys: Sequence[Candidate], *, cold_first: bool = True,
                   in_round: bool = False) -> dict[Candidate, TrialResult]:
        """Stage 5's runs: each of ``keys`` once more, keeping its better run; the first (the
        leader) compiled afresh where its first launch is unchecked (``cold_first``). One
        re-measured before (a resumed search) is not run again, unless ``in_round``.
        The runs made, in order."""
        ran: dict[Candidate, TrialResult] = {}
        for key in keys:
            recheck = key in self.stored
            if self.runs.get(key, 1) >= 2 and not (recheck or in_round):
                continue  # re-measured before a resume
            if cold_first and key == keys[0] and not recheck and \
                    self._unchecked_launch(key):
                # The leader's re-measure compiles afresh: it is also stage 6's check that it
                # fits a first launch, where the leader is most often the winner.
                ran[key] = self._cold_run(key)
                continue
            candidate = key
            spec = self.spec(candidate, early_stop=False)
            if recheck:
                spec = replace(spec, timing_precision=self.settings.rank_precision)
            spec = self._limited(spec)
            self._progress(candidate, None)
            with self.study.running(candidate, self.micro_batches) as trial:
                again = self._run_child(spec, "re-measure")
                rec, value = classify(candidate, again, self.results, self.baseline,
                                      self.report, self.settings)
                self.study.tell(trial, again, value, kind="re-measure")
            self.runs[key] = self.runs.get(key, 1) + 1
            self._progress(candidate, rec)  # the re-run's own figures
            stored = self.results[key]
            if recheck and again.ok and stored.workload_fingerprint and \
                    again.workload_fingerprint not in ("", stored.workload_fingerprint):
                raise _Stale(
                    f"stored runs not reused: the workload changed since they were measured "
                    f"(re-check of {key.key()}: fingerprint {again.workload_fingerprint}, "
                    f"stored {stored.workload_fingerprint}: its parameter or batch shapes "
                    "differ); every candidate was measured again")
            if not recheck:  # a stored run is another session's: its gap is not this one's drift
                self._note_drift(key, stored, again)
            self.results[key] = keep_better(stored, again)
            if recheck:
                self.stored.discard(key)
                self.skipped.append(self._rechecked(key, stored, again))
            ran[key] = again
        return ran

    def fit_cold(self) -> None:
        """Stage 6 (module docstring): check that the compiled winner fits as a first launch
        compiles it, on a device whose peak counts the compile."""
        if not backend_for(self.report.device.device).compile_in_peak:
            return
        usable = self.report.usable_bytes()
        while True:
            self.recheck_stored_pick()  # the next pick after one ruled out: re-checked first
            winner = self._winner()
            if winner is None or winner.knobs.compile_mode == "off":
                return
            if winner not in self.cold and self._fits_by_sibling(winner):
                return
            cold = self.cold.get(winner) or self._cold_run(winner)
            if cold.fits(usable) or not self._rule_out(winner, cold):
                return

    def _rule_out(self, winner: Candidate, cold: TrialResult) -> bool:
        """The winner's run compiled afresh did not fit: it is out (``_out_cold``), and its
        setting's next smaller micro-batch is timed where it could win
        (``_time_below_out``). False where that run ended otherwise (it says nothing of
        memory: the winner stands, said unchecked)."""
        if not (cold.ok or cold.status in OUT_OF_MEMORY):
            self.skipped.append(self._unchecked(
                winner, f"its run compiled afresh ended {cold.status}"))
            return False
        speed = self.results[winner].samples_per_s()
        self._out_cold(winner, cold)
        self._time_below_out(winner, speed)
        return True

    def _time_below_out(self, out: Candidate, speed: float | None) -> None:
        """A compiled winner is out as a first launch: time its setting at the next smaller
        micro-batch, compiled afresh (the one run times it and checks its first launch), unless
        that ran already. Its boundary as a first launch may be there, and stage 4 walks a
        compiled setting down only on evidence that a smaller micro-batch can gain. Only where
        it could still win: a smaller micro-batch adds accumulation steps, so the out winner's
        speed bounds it, and the next pick must be behind that. A checkpointed setting is not
        timed where its setting without checkpointing fits as a first launch
        (``_recompute_floor``): it recomputes, so there it runs no faster, and a lead it shows
        there is noise; where that is not known, the setting without checkpointing is timed
        there first, compiled afresh (it may be the faster of the two)."""
        smaller = [m for m in self.micro_batches if m < out.micro_batch]
        if not smaller or not speed:
            return
        key = Candidate(knobs=out.knobs, micro_batch=max(smaller))
        after = self._winner()
        if key in self.results or (after is not None and (self._score(after) or 0.0) >= speed):
            return
        twin_key = Candidate(knobs=out.knobs.with_(checkpointing="off"),
                             micro_batch=key.micro_batch)
        if out.knobs.checkpointing != "off" and twin_key not in self.results and \
                self._recompute_floor(out.knobs) < key.micro_batch and \
                skip_reason(twin_key.knobs, self.traits) is None:
            # Its setting without checkpointing first (never timed there: a knob screened on
            # the checkpointed leader): where that fits as a first launch it is the faster of
            # the two (checkpointing recomputes), and the checkpointed one is not run.
            self.measure(replace(self.spec(twin_key, early_stop=False), cold_compile=True))
        floor = self._recompute_floor(out.knobs)
        if floor >= key.micro_batch:
            twin = out.knobs.with_(checkpointing="off")
            self.skipped.append(
                f"{key.key()} not timed (below {out.key()}, out as a first launch): "
                f"checkpointing recomputes, so it runs no faster where {twin.label()} fits "
                f"without it ({twin.label()}/{floor} fits, compiled afresh as a first launch "
                "compiles it, without allocator retries)")
            return
        self.measure(replace(self.spec(key, early_stop=False), cold_compile=True))

    def _recompute_floor(self, knobs: Knobs) -> int:
        """For a checkpointed setting, the largest micro-batch its setting without checkpointing
        is known to fit as a user's first launch runs it: a timed run without allocator
        retries within the usable budget that, compiled, also fit with its graphs compiled
        afresh (``self.cold``; eager code compiles nothing). 0: none known, or ``knobs`` does
        not checkpoint."""
        if knobs.checkpointing == "off":
            return 0
        twin, usable = knobs.with_(checkpointing="off"), self.report.usable_bytes()

        def first_launch_fits(key: Candidate) -> bool:
            cold = self.cold.get(key)
            return key.knobs.compile_mode == "off" or (cold is not None and cold.fits(usable))

        return max((c.micro_batch for c, r in self.results.items()
                    if c.knobs == twin and r.fits(usable) and r.step_times_s
                    and not r.num_alloc_retries and first_launch_fits(c)), default=0)

    def _sibling_bound(self, key: Candidate) -> tuple[int, int, Candidate] | None:
        """Where a run of the same graphs (another optimizer implementation on its setting)
        compiled them afresh and ran: the candidate's own peak, that run's peak and the sibling.
        That run's peak holds its compile's memory, so the two peaks' sum bounds the
        candidate's peak as a first launch. None without such a run."""
        own = self.results[key].peak_bytes if key in self.results else None
        siblings = [(cold.peak_bytes, other) for other, cold in self.cold.items()
                    if other.graph() == key.graph() and cold.ok and cold.peak_bytes is not None]
        if own is None or not siblings:
            return None
        peak, sibling = min(siblings, key=lambda s: s[0])
        return own, peak, sibling

    def _vouched_by_sibling(self, key: Candidate) -> bool:
        """Whether ``_sibling_bound`` puts the candidate's first launch within the usable
        budget."""
        bound = self._sibling_bound(key)
        return bound is not None and bound[0] + bound[1] <= self.report.usable_bytes()

    def _fits_by_sibling(self, winner: Candidate) -> bool:
        """``_vouched_by_sibling``, said in ``skipped`` when it holds."""
        bound = self._sibling_bound(winner)
        if bound is None or not self._vouched_by_sibling(winner):
            return False
        own, peak, sibling = bound
        self.skipped.append(
            f"{winner.key()}: not run again compiled afresh: {sibling.key()} compiled the same "
            f"graphs afresh at a peak of {format_bytes(peak)}; compiling adds at most that to "
            f"its own {format_bytes(own)}: {format_bytes(own + peak)}, within the "
            f"{format_bytes(self.report.usable_bytes())} usable")
        return True

    def _unchecked_launch(self, key: Candidate) -> bool:
        """Whether a compiled candidate's fit as a first launch is still to check (stage 6):
        on a device whose peak counts the compile, no run of it compiled its graphs afresh,
        and no sibling's run afresh bounds it within the usable budget (``_sibling_bound``)."""
        if not (key.knobs.compile_mode != "off" and key not in self.cold
                and backend_for(self.report.device.device).compile_in_peak):
            return False
        return not self._vouched_by_sibling(key)

    def _winner(self) -> Candidate | None:
        """The candidate the outcome would pick now (``pick_winner`` over the verdicts)."""
        records = {k: self._record(k, r) for k, r in self.results.items()}
        best = pick_winner(tuple(records.values()), self.settings)
        return next((k for k, rec in records.items() if rec is best), None)

    def _unchecked(self, winner: Candidate, why: str) -> str:
        return (f"{winner.key()}: not checked as a first launch compiles it (its runs loaded "
                f"its graphs from inductor's cache, which lowers the peak): {why}")

    def _cold_run(self, winner: Candidate) -> TrialResult:
        """The winner run as its timed runs were, every step, with an empty inductor cache of
        its own: its peak is a first launch's, its timing one more run of it (each candidate
        keeps its better run). Over the budget, it is out (``_out_cold``)."""
        spec = replace(self.spec(winner, early_stop=False), cold_compile=True)
        try:
            spec = self._limited(spec)
        except _Stop as stop:
            self.skipped.append(self._unchecked(winner, str(stop)))
            raise
        self._progress(winner, None)
        with self.study.running(winner, self.micro_batches) as trial:
            cold = self._run_child(spec, "re-measure")
            rec, value = classify(winner, cold, self.results, self.baseline, self.report,
                                  self.settings)
            self.study.tell(trial, cold, value, kind="re-measure")
        self.runs[winner] = self.runs.get(winner, 1) + 1
        self._progress(winner, rec)
        self.cold[winner] = cold  # compiled afresh, whatever its counters say
        if cold.ok:
            # compiling afresh does not slow the steps after it (benchmarks/cold_vs_cached.py)
            self._note_drift(winner, self.results[winner], cold)
            self.results[winner] = keep_better(self.results[winner], cold)
        return cold

    def _note_drift(self, key: Candidate, one: TrialResult, two: TrialResult) -> None:
        """How far apart two full timings of one candidate landed (``self.drift``)."""
        medians = [m for r in (one, two) if r.ok and len(r.step_times_s) >= MIN_STEPS_TO_STOP
                   and (m := r.median_step_s())]
        if len(medians) == 2:
            gap = max(medians) / min(medians) - 1
            self.drift[key] = max(gap, self.drift.get(key, 0.0))

    def _out_cold(self, winner: Candidate, cold: TrialResult) -> None:
        """The winner is out: the run that compiled its graphs afresh did not fit."""
        usable = self.report.usable_bytes()
        if cold.ok:
            what = (f"peaked at {format_bytes(cold.peak_bytes or 0)}, over the "
                    f"{format_bytes(usable)} usable")
        else:
            first = cold.message.splitlines()[0] if cold.message else ""
            what = f"ended {cold.status}" + (f" ({first})" if first else "")
        why = ("fits only when its compiled graphs load from inductor's cache: compiled "
               f"afresh, as a first launch does, it {what}")
        self.results[winner] = replace(self.results[winner], status="oom", message=why)
        self.skipped.append(f"{winner.key()}: {why}")

    def _note_cold(self, key: Candidate, result: TrialResult) -> None:
        """Keep a compiled run that loaded nothing from inductor's cache (``self.cold``): a
        timed one that ran (a memory probe runs fewer micro-batches and steps: its peak is no
        timed run's), or one that ran out of memory (other endings say nothing of memory)."""
        if key.knobs.compile_mode == "off" or result.compile_cache_hits != 0 or not (
                result.compile_cache_misses or result.num_graphs):  # caches off: no counts
            return
        if not ((result.ok and result.step_times_s) or result.status in OUT_OF_MEMORY):
            return
        usable = self.report.usable_bytes()
        known = self.cold.get(key)
        if known is None or (known.fits(usable) and (
                not result.fits(usable) or (result.peak_bytes or 0) > (known.peak_bytes or 0))):
            self.cold[key] = result

    def _rechecked(self, key: Candidate, stored: TrialResult, again: TrialResult) -> str:
        """Keep the fresh run alone when the stored one is faster beyond the noise (stale:
        measured on a quieter machine, or another version of something the key cannot see);
        say what the re-check found."""
        before, now = stored.samples_per_s(), again.samples_per_s()
        if not again.ok or now is None or before is None:
            self.results[key] = again
            return (f"re-check of {key.key()} (stored run): it now ends {again.status}: the "
                    "fresh run counts")
        noise = max(self.settings.confirm_within, math.hypot(
            stored.halfwidth() or 0.0, again.halfwidth() or 0.0))
        if now < before * (1 - noise):
            self.results[key] = again
            verdict = f"slower beyond the noise ({noise:.0%}): the fresh run counts"
        elif now > before * (1 + noise):
            verdict = f"faster beyond the noise ({noise:.0%}): the fresh run counts"
        else:
            verdict = f"within the noise ({noise:.0%}): the better run counts"
        return (f"re-check of {key.key()} (stored run): {before:,.1f} samples/s stored, "
                f"{now:,.1f} now, {verdict}")

    def _ranked(self) -> list[Candidate]:
        """Candidates with a complete timed run, best first."""
        return sorted((k for k in self.results if self._score(k, full=True) is not None),
                      key=lambda k: -(self._score(k, full=True) or 0.0))

    def _contenders(self) -> list[Candidate]:
        """The leader and up to ``num_confirm`` candidates whose gap to it is within the noise
        (``confirm_within``, or the interval of the two runs' ratio); says why when there are
        none. A leader whose timing came from the study store comes with the next best (run
        in full or stopped early behind it) whatever the gap: a stored run is re-checked."""
        if self.settings.num_confirm <= 0:
            return []
        ranked = self._ranked()
        if len(ranked) == 1 and ranked[0] in self.stored:
            # A stored timing never picks alone, even where every other run stopped early
            # behind it: re-check it beside the best of those.
            behind = sorted((k for k in self.results if k != ranked[0] and self._score(k)),
                            key=lambda k: -(self._score(k) or 0.0))
            return [ranked[0], *behind[:1]]
        if len(ranked) < 2:
            return []
        leader, top = ranked[0], self._score(ranked[0], full=True) or 0.0

        def noise(key: Candidate) -> float:
            return self._noise(key, leader)

        close = [k for k in ranked[1:]
                 if (self._score(k, full=True) or 0.0) >= top * (1 - noise(k))]
        if not close and self.stored & {leader, ranked[1]}:
            close = ranked[1:2]  # a stored timing never picks alone: re-check the two
        if not close:
            runner_up = ranked[1]
            share = (self._score(runner_up, full=True) or 0.0) / top
            self.skipped.append(
                f"no re-measurement: the runner-up ({runner_up.key()}) is {share:.2f}x the "
                f"leader ({leader.key()}), a gap wider than the noise measured "
                f"({noise(runner_up):.0%}: 95% interval of the ratio, at least --confirm-within "
                f"{self.settings.confirm_within:g})")
        return [leader, *close[:self.settings.num_confirm]]

    # -- one run ---------------------------------------------------------------------------

    def spec(self, candidate: Candidate, *, early_stop: bool = True,
             timed: bool = True) -> TrialSpec:
        """A probe of the candidate's memory that also times its config (``timed``), or
        only measures its memory."""
        if not timed:
            return probe_spec(self.report.workload, self.report.device.device,
                              candidate.knobs, candidate.micro_batch,
                              self.report.budget_bytes, self.settings.timeout_s,
                              ranks=self.report.nproc_per_node)
        is_base_class = candidate.knobs == self.base
        spec = probe_spec(self.report.workload, self.report.device.device,
                          candidate.knobs, candidate.micro_batch,
                          self.report.budget_bytes, self.settings.timeout_s,
                          per_device_batch=self.per_device,
                          num_timed_steps=self.settings.num_timed_steps,
                          count_flops=is_base_class, ranks=self.report.nproc_per_node)
        spec = replace(spec, min_timed_s=self.settings.min_timed_s)
        if not early_stop:  # a re-measurement of a contender: every step, in full
            return spec
        spec = replace(spec, timing_precision=self.settings.rank_precision)
        # Only a run that fits sets the bar: one over the usable budget is faster than anything
        # that can be picked, and would stop a real contender "behind" it.
        usable = self.report.usable_bytes()
        medians = [r.median_step_s() for r in self.results.values()
                   if r.ok and r.fits(usable) and r.median_step_s()]
        if is_base_class or not medians:
            return spec
        best_s = min(m for m in medians if m is not None)
        best_window_s = max(best_s * self.settings.num_timed_steps, self.settings.min_timed_s)
        spec = replace(spec, max_timed_s=self.settings.slower_factor * best_window_s)
        if self.settings.train_steps:  # compile time counts too: a slow step may still win
            return spec
        return replace(spec, stop_above_step_s=best_s * (1 + self._stop_margin()))

    def _stop_margin(self) -> float:
        """How much slower than the leader's median a candidate's fastest steps must be to
        stop timing it: ``stop_margin`` (the run-to-run noise of a machine), or the width of
        the leader's own interval when wider (a noisy leader's median says less), at most
        ``slower_factor``."""
        leader = self._leader()
        width = (self.results[leader].halfwidth() or 0.0) if leader is not None else 0.0
        return min(max(self.settings.stop_margin, width), self.settings.slower_factor - 1)

    def measure(self, spec: TrialSpec) -> TrialResult:
        """Run a spec in a child (or reuse the study's result for it) and record it."""
        candidate = key = Candidate.of(spec)
        timed = spec.num_timed_steps > 0
        self.reached.add(key)
        if key in self.held:  # asked for, as the search that ran it had
            self.results[key] = self.held.pop(key)
            self._begin(key.knobs)
        if key in self.results:  # a trial answers a memory probe too
            return self.results[key]
        if not timed and key in self.probe_runs:
            return self.probe_runs[key]
        spec = self._limited(spec)
        self._progress(candidate, None)
        with self.study.running(candidate, self.micro_batches) as trial:
            result = self._run_child(spec, "trial" if timed else "probe")
            if self.traits is None and result.traits is not None:
                self.traits = result.traits
            if not timed:  # its line comes from the probe's on_step
                self.study.tell(trial, result, None, kind="probe")
                self.probe_runs[key] = result
                return result
            self.results[key] = result
            rec, value = classify(candidate, result, self.results, self.baseline, self.report,
                                  self.settings)
            self.study.tell(trial, result, value)
        self._progress(candidate, rec)
        return result

    def _limited(self, spec: TrialSpec) -> TrialSpec:
        """The spec with a timeout that ends within the time budget; a ``_Stop`` when a limit
        (``--max-trials``, ``--time-budget``) allows no further child run."""
        if self.num_runs >= self.settings.max_trials:
            raise _Stop(f"--max-trials reached ({self.num_runs} child runs): best so far")
        timeout_s = self.settings.timeout_s
        if self.settings.time_budget_s is not None:
            left = self.settings.time_budget_s - (self.clock() - self.start)
            if left < MIN_CHILD_S:
                raise _Stop("--time-budget reached: best so far")
            timeout_s = min(timeout_s, left)
        self._begin(spec.knobs)
        return replace(spec, timeout_s=timeout_s)

    def _begin(self, knobs: Knobs) -> None:
        """A run of ``knobs`` begins (or the study answers for one): its stage, its setting
        and, in stage 3, the knobs it changes count as reached (``_not_reached``)."""
        self.ran_in.add(self.stage)
        self.considered.add((knobs.precision, knobs.compile_mode))
        if self.stage == "knobs":
            self.screened.update(knobs.changed())

    def _run_child(self, spec: TrialSpec, kind: RunKind) -> TrialResult:
        """Run one limited spec. A run the time budget cut short says nothing of its
        candidate: it ends the search (its Optuna trial fails) instead of being recorded."""
        start_s = self.clock() - self.start
        result = self._run(spec)
        self.num_runs += 1
        timed_s = sum(result.step_times_s)
        self.run_log.append(run_record(
            len(self.run_log), kind, Candidate.of(spec), result, self.report.usable_bytes(),
            start_s=start_s, compiled=spec.compile_mode != "off"))
        self.cost["child_s"] += result.wall_s or 0.0
        self.cost["compile_s"] += (result.compile_s or 0.0) if spec.compile_mode != "off" else 0.0
        self.cost["timed_s"] += timed_s
        if result.compile_cache_hits is not None:
            self.compiles[0] += 1
            self.compiles[1] += bool(result.compile_cache_hits
                                     and not result.compile_cache_misses)
        key = Candidate.of(spec)
        self._note_cold(key, result)
        self.timed_s[key] = self.timed_s.get(key, 0.0) + timed_s
        if result.status == "timeout" and spec.timeout_s < self.settings.timeout_s:
            raise _Stop(f"--time-budget reached during a run of {Candidate.of(spec).key()} "
                        "(stopped): best so far")
        return result

    def _release_held(self) -> None:
        """The stored runs this search did not ask for (another search's, in a shared study)
        join the race: the confirm stage and the pick see every run the study holds."""
        for key, result in self.held.items():
            self.results.setdefault(key, result)
        self.held.clear()

    def outcome(self, interrupted: bool, stop_reason: str) -> SearchOutcome:
        self._release_held()  # a search stopped early picks from all it knows too
        if self.baseline is None:  # stopped while probing it: its largest fit timed so far
            self.baseline = self._known_baseline()
        stored_pick = self._winner() if interrupted else None
        if stored_pick is not None and stored_pick in self.stored:
            self.skipped.append(
                f"{stored_pick.key()}: picked on its stored timing alone (a search before "
                "measured it): this one stopped before re-checking it")
        if interrupted and backend_for(self.report.device.device).compile_in_peak:
            winner = self._winner()
            if winner is not None and winner.knobs.compile_mode != "off" and not (
                    winner in self.cold and self.cold[winner].ok):
                self.skipped.append(self._unchecked(winner, stop_reason))
        traits = self.traits
        if (traits is not None and traits.num_blocks < 2 and any(
                k.knobs.strategy.startswith("fsdp") for k in self.results)):
            self.skipped.append(
                "fsdp: no repeated blocks to shard one by one, so FSDP2 shards the root alone "
                "(every parameter gathered at once in forward and backward: less memory saved "
                "at the peak); name them with Workload(blocks=...)")
        records = tuple(
            replace(self._record(k, r), number=i, num_runs=self.runs.get(k, 1),
                    timed_s=self.timed_s.get(k) or None)
            for i, (k, r) in enumerate(self.results.items()))
        return SearchOutcome(records=records, results=self.results, baseline=self.baseline,
                             first_launch=self._first_launch(), drift=dict(self.drift),
                             probes=tuple(self.probes.values()),
                             skipped=tuple(dict.fromkeys(self.skipped)),
                             interrupted=interrupted, stop_reason=stop_reason,
                             not_reached=self._not_reached() if interrupted else (),
                             num_runs=self.num_runs,
                             runs=tuple(self.run_log), study=self.study.record,
                             ledger=self.study,
                             cost=SearchCost(num_runs=self.num_runs, **self.cost,
                                             num_compiled_runs=self.compiles[0],
                                             num_cached_compiles=self.compiles[1]))

    def _not_reached(self) -> tuple[str, ...]:
        """What a search stopped early never began: the settings not probed, the knobs not
        screened, each later stage not entered (``TunedConfig.not_reached``)."""
        probes = [k.label() for k in self.classes
                  if (k.precision, k.compile_mode) not in self.considered]
        knobs = [k.name for k in KNOBS[2:] if k.name not in self.screened and any(
            v != getattr(self.base, k.name) and skip_reason(  # one the workload could use
                self.base.with_(**{k.name: v}), self.traits) is None
            for v in self.values.get(k.name, ()))]
        first_launch = backend_for(self.report.device.device).compile_in_peak and any(
            k.compile_mode != "off" for k in self.classes)
        planned = {"probe": f"the memory probes of {', '.join(probes)}" if probes else "",
                   "knobs": f"knob screening ({', '.join(knobs)})" if knobs else "",
                   "refine": "the smaller micro-batches",
                   "confirm": "the re-measure of the leaders",
                   "first launch": "the first-launch check" if first_launch else ""}
        # The stage it stopped in (the last entered) counts only where a run of it began.
        reached = set(self.entered[:-1]) | (set(self.entered[-1:]) & self.ran_in)
        return tuple(text for stage, text in planned.items() if text and (
            stage in ("probe", "knobs") or stage not in reached))

    def _record(self, key: Candidate, result: TrialResult) -> TrialRecord:
        """``classify``'s record, with the candidate's interleaved rounds."""
        rec = classify(key, result, self.results, self.baseline, self.report, self.settings)[0]
        return replace(rec, round_shares=self.round_shares.get(key, ()))

    def _first_launch(self) -> dict[Candidate, str]:
        """``SearchOutcome.first_launch``: what is unknown or against each compiled candidate's
        fit as a first launch (on a device whose peak counts the compile)."""
        if not backend_for(self.report.device.device).compile_in_peak:
            return {}
        usable, notes = self.report.usable_bytes(), {}
        for key in self.results:
            cold = self.cold.get(key)
            if key.knobs.compile_mode == "off" or (cold is not None and cold.fits(usable)):
                continue
            if cold is None and self._vouched_by_sibling(key):
                continue
            notes[key] = ("unchecked (its runs loaded their compiled graphs from inductor's "
                          "cache, which lowers the peak)" if cold is None else
                          "it does not fit (compiled afresh it "
                          + (f"peaked at {format_bytes(cold.peak_bytes or 0)}"
                             if cold.ok else f"ended {cold.status}")
                          + f", over the {format_bytes(usable)} usable)")
        return notes

    def _known_baseline(self) -> Candidate | None:
        """fp32 eager at the largest micro-batch timed so far that fits: the baseline of a
        search stopped (Ctrl-C, a limit) before the baseline's memory probe ended."""
        usable = self.report.usable_bytes()
        fits = [c for c, r in self.results.items()
                if c.knobs == self.base and r.fits(usable)]
        return max(fits, key=lambda c: c.micro_batch, default=None)

    # -- measures of progress --------------------------------------------------------------

    def _why_not_mode(self, knobs: Knobs) -> str | None:
        """Why a compile mode beyond off/default is not tried for this precision, if not."""
        if not self.settings.refine_within:
            return None
        same = [c for c in self.probes if c.precision == knobs.precision]
        if not same:
            return None  # nothing measured predicts it: try it
        share = self._share(max((self._class_best(c) or 0.0 for c in same), default=0.0))
        if share is not None and share >= self.settings.refine_within:
            return None
        self.considered.add((knobs.precision, knobs.compile_mode))
        return f"{knobs.label()} not tried: {self._behind(share, knobs.precision)}"

    def _behind(self, share: float | None, precision: str | None = None) -> str:
        what = f"{precision}'s best" if precision else "its best"
        if share is None:
            return f"{what} did not run"
        digits = 2 if round(share, 2) < self.settings.refine_within else 3  # 0.897, not 0.90
        leader = self._leader()
        return (f"{what} is {share:.{digits}f}x the leader's "
                f"({leader.key() if leader else '-'}), under the "
                f"{self.settings.refine_within:.2f} that refinement needs (--refine-within)")

    def _noise(self, *keys: Candidate) -> float:
        """Relative gap two runs need before it counts: ``confirm_within`` (the run-to-run
        noise of a machine), or the 95% interval of the runs' ratio when wider (their medians'
        half-widths in quadrature: a short or noisy timing says less)."""
        widths = [r.halfwidth() or 0.0 for k in keys if (r := self.results.get(k)) is not None]
        return max(self.settings.confirm_within, math.hypot(*widths))

    def _score(self, key: Candidate, *, full: bool = False) -> float | None:
        """Larger-is-better objective of a run that counts (``full``: all timed steps ran)."""
        result = self.results.get(key)
        if result is None:
            return None
        rec, value = classify(key, result, self.results, self.baseline,
                              self.report, self.settings)
        if rec.verdict not in (("ok",) if full else ("ok", "slower")):
            return None
        return score(value, self.settings)

    def _precision_best(self, precision: str) -> float:
        """The best score of the settings of one precision probed so far (0: none)."""
        return max((self._class_best(k) or 0.0 for k in self.probes
                    if k.precision == precision), default=0.0)

    def _class_best(self, knobs: Knobs) -> float | None:
        scores = [self._score(Candidate(knobs=knobs, micro_batch=m)) for m in self.micro_batches]
        return max((s for s in scores if s is not None), default=None)

    def _leader(self) -> Candidate | None:
        """The candidate with the best score of a complete timed run so far."""
        scored = [(s, k) for k in self.results if (s := self._score(k, full=True)) is not None]
        return max(scored, key=lambda t: t[0])[1] if scored else None

    def _share(self, best: float | None) -> float | None:
        leader = self._leader()
        top = self._score(leader, full=True) if leader else None
        return best / top if best is not None and top else None

    def _progress(self, candidate: Candidate, rec: TrialRecord | None) -> None:
        if self._on_trial is not None:
            self._on_trial(self.num_runs, self.stage, candidate, rec)
