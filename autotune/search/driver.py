"""The driver: the table of contents of a search, its stages in order (``STAGES``).

Each stage is named (the name each run's progress says), has a body in ``stages/`` and says
what a search stopped before it never began (``TunedConfig.not_reached``);
``docs/search.md`` states the algorithm and every rule once. Every run goes through the
executor; every decision not to run something is a ``Skip`` of a rule in ``bounds`` or
``policy``, kept in the evidence and said in the outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from autotune.config import Knobs, ProbeReport, StopReason
from autotune.knob_rules import skip_reason
from autotune.knobs import KNOBS, Knob
from autotune.memory import OnStep
from autotune.runner import run_isolated
from autotune.search import fits
from autotune.search._records import SearchSettings, classify
from autotune.search.evidence import Evidence
from autotune.search.executor import Executor, OnTrial, Runner, Stale, Stop
from autotune.search.outcome import SearchOutcome, outcome
from autotune.search.plan import Plan
from autotune.search.slots import Slots
from autotune.search.stages import joint, knobs, probe, race, refine
from autotune.search.tally import Reach
from autotune.signals import SignalGuard


@dataclass(frozen=True)
class Stage:
    """One stage of the search."""

    name: str
    """Said with each run's progress, and counted as reached (``Reach``)."""
    body: Callable[[Executor], bool | None] | None
    """Runs the stage (False: the search ends there); None: it runs in the loop of the stage
    before it."""
    not_reached: Callable[[Evidence, Reach], str | tuple[str, ...]]
    """What a search stopped before the stage began says it never did ("": nothing to say;
    several items: a tuple)."""
    partial: bool = False
    """Whether ``not_reached`` lists what is left of the stage even where it began (settings
    not probed, knobs not screened)."""


def _probes_left(ev: Evidence, reach: Reach) -> str:
    left = [k.label() for k in ev.plan.classes
            if (k.precision, k.compile_mode) not in reach.considered]
    return f"the memory probes of {', '.join(left)}" if left else ""


def _knobs_left(ev: Evidence, reach: Reach) -> tuple[str, ...]:
    """The knobs whose screening never began, and each value of a knob screened per class
    (``shapes``) that no run tried on any setting, before its screening ended."""
    left, values = [], []
    for k in KNOBS[2:]:
        never = _values_left(ev, reach, k) if k.per_class else []
        if never:
            values.append(f"{k.name} {', '.join(never)}: never timed")
        elif k.name not in reach.screened and any(
                v != getattr(ev.plan.base, k.name) and skip_reason(  # one the workload could use
                    ev.plan.base.with_(**{k.name: v}), ev.traits) is None
                for v in ev.plan.values.get(k.name, ())):
            left.append(k.name)
    return (*([f"knob screening ({', '.join(left)})"] if left else []), *values)


def _values_left(ev: Evidence, reach: Reach, knob: Knob) -> list[str]:
    """The values of ``knob`` the search may try that no run began with, where one could run
    as itself on a class (not as another value, ``Knob.runs_as``: eager ``dynamic`` is
    ``longest``); none once its screening on every class ended (what it left untried, a rule
    decided)."""
    if knob.name in reach.classes_screened or ev.traits is None:
        return []  # (traits unknown: which values apply is not known, ``knob screening``)
    ran = {getattr(k, knob.name) for k in reach.began}
    return [v for v in ev.plan.values.get(knob.name, ()) if v not in ran and any(
        skip_reason(c.with_(**{knob.name: v}), ev.traits) is None for c in ev.plan.classes)]


def _first_launch(ev: Evidence, reach: Reach) -> str:
    """Not begun; or begun (a limit cut its run) with the pick still unchecked."""
    if not (ev.plan.compile_in_peak and any(k.compiled for k in ev.plan.classes)):
        return ""
    pick = ev.winner() if "first launch" in reach.ran_in else None
    if "first launch" in reach.ran_in and (pick is None or not fits.unchecked_launch(ev, pick)):
        return ""
    return "the first-launch check"


def _race_left(ev: Evidence, reach: Reach) -> str:
    """The race not begun: the confirm stage not entered, or the search stopped in it before
    a run of its race (its first re-measures and the joint screen again are no race)."""
    if "race" in reach.parts or "first launch" in reach.entered:
        return ""
    return "the re-measure of the leaders"


def _joint_again(ex: Executor) -> None:
    """The joint screen once more, from the confirm stage, where the race's first
    re-measures ran (``race.run``): a second run can make another candidate its
    setting's best, and the joint screen combines the knobs there (it proposes only runs
    not made yet). Its runs are said as the joint stage's."""
    ex.stage = "joint"
    joint.run(ex)
    ex.stage = "confirm"


STAGES = (
    Stage("probe", probe.run, _probes_left, partial=True),
    Stage("knobs", knobs.run, _knobs_left, partial=True),
    Stage("refine", refine.run, lambda ev, reach: "the smaller micro-batches"),
    Stage("joint", joint.run, lambda ev, reach: "the joint screen of the knobs"),
    Stage("confirm", lambda ex: race.run(ex, rescreen=_joint_again), _race_left,
          partial=True),
    Stage("first launch", None, _first_launch, partial=True),  # one loop with the race
)
"""The stages in order (``docs/search.md``)."""


def run_search(report: ProbeReport, classes: Sequence[Knobs], settings: SearchSettings,
               *, values: Mapping[str, Sequence[str]] | None = None, run: Runner = run_isolated,
               on_trial: OnTrial | None = None, on_step: OnStep | None = None,
               guard: SignalGuard | None = None,
               clock: Callable[[], float] = time.perf_counter,
               slots: Slots | None = None) -> SearchOutcome:
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
        slots: where a stage's batch of runs goes at once (``--parallel``,
            ``search.slots``); None: one run at a time through ``run``.

    Raises:
        ConfigError: a storage that cannot be opened or holds another search.
        WorkloadError: the workload fails.
    """
    plan = Plan.of(report, classes, values)
    assert plan.base in plan.classes, "fp32 eager is the baseline: the api adds it"
    ex = Executor(Evidence(plan, settings), run, on_trial, on_step, clock,
                  reserve=race.launch_reserve_s, slots=slots)
    stop_reason = StopReason()
    try:
        with (guard or SignalGuard()).armed():
            try:
                try:
                    stages(ex)
                except Stale as stale:  # the stored runs measured another model: afresh
                    gave_up = ex.study
                    ex = Executor(Evidence(plan, replace(settings, fresh=True)), run,
                                  on_trial, on_step, clock, before=ex,
                                  reserve=race.launch_reserve_s, slots=slots)
                    ex.study.note(gave_up.record.note if not gave_up.ok else "")
                    ex.study.note(str(stale))
                    stages(ex)
            except Stop as stop:
                if not stop.kept_s:
                    raise
                stop_reason = stop.reason  # the time kept for the first-launch check: used
                race.kept_check(ex, stop.kept_s)
    except Stop as stop:
        stop_reason = stop.reason
    except KeyboardInterrupt as exc:
        stop_reason = StopReason.signal(exc)
    return outcome(ex.ev, ex, stop_reason,
                   not_reached(ex.ev, ex.reach) if stop_reason.interrupted else ())



def stages(ex: Executor) -> None:
    """What the study holds, said first; then the stages in order (``STAGES``)."""
    ex.stage = "stored"  # what the study holds, said before it answers the stages
    best = {k: ex.ev.held_best(k) for k in ex.ev.held}
    for key, result in best.items():
        ex.progress(key, classify(key, result, best, None, ex.plan.report,
                                  ex.settings)[0])
    for stage in STAGES:
        if stage.body is None:
            continue
        ex.stage = stage.name
        if stage.body(ex) is False:
            return  # no baseline: the api says what it would take


def not_reached(ev: Evidence, reach: Reach) -> tuple[str, ...]:
    """What a search stopped early never began: the settings not probed, the knobs not
    screened, each later stage not entered (``TunedConfig.not_reached``)."""
    # The stage it stopped in (the last entered) counts only where a run of it began.
    reached = set(reach.entered[:-1]) | (set(reach.entered[-1:]) & reach.ran_in)
    said = [stage.not_reached(ev, reach) for stage in STAGES
            if stage.partial or stage.name not in reached]
    return tuple(text for one in said for text in ((one,) if isinstance(one, str) else one)
                 if text)
