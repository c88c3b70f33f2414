"""The outcome of a search: its records, skips, cost and run log, and what it never reached."""

from __future__ import annotations

from dataclasses import replace

from autotune.knobs import KNOBS, skip_reason
from autotune.schema import SearchCost
from autotune.search._records import SearchOutcome
from autotune.search.evidence import Evidence
from autotune.search.executor import Executor
from autotune.search.policy import unchecked
from autotune.search.rules import Skip, skip


def outcome(ev: Evidence, ex: Executor, interrupted: bool, stop_reason: str) -> SearchOutcome:
    """What the search hands back: every record, the skips, the cost and the run log."""
    ev.release_held(asked=True)  # a search stopped early picks from all it knows too
    if ev.baseline is None:  # stopped while probing it: its largest fit timed so far
        ev.baseline = ev.known_baseline()
    stored_pick = ev.winner() if interrupted else None
    if stored_pick is not None and stored_pick in ev.stored:
        ev.skips.append(skip("stored-pick", stored_pick.key()))
    if interrupted and ev.plan.compile_in_peak:
        winner = ev.winner()
        if winner is not None and winner.knobs.compile_mode != "off" and not (
                winner in ev.cold and ev.cold[winner].ok):
            ev.skips.append(unchecked(winner, stop_reason))
    traits = ev.traits
    if (traits is not None and traits.num_blocks < 2 and any(
            k.knobs.strategy.startswith("fsdp") for k in ev.results)):
        ev.skips.append(skip("fsdp-root", ""))
    first: dict[str, Skip] = {}
    for one in ev.skips:  # each sentence once, where it was first said
        first.setdefault(one.text, one)
    skips = tuple(first.values())
    records = tuple(
        replace(ev.record(k, r), number=i, num_runs=ev.runs.get(k, 1),
                timed_s=ev.timed_s.get(k) or None)
        for i, (k, r) in enumerate(ev.results.items()))
    return SearchOutcome(records=records, results=ev.results, baseline=ev.baseline,
                         first_launch=ev.first_launch(), drift=dict(ev.drift),
                         uncapped=ev.uncapped,
                         probes=tuple(ev.probes.values()),
                         skips=skips,
                         interrupted=interrupted, stop_reason=stop_reason,
                         not_reached=not_reached(ev, ex) if interrupted else (),
                         num_runs=ex.num_runs,
                         runs=tuple(ex.run_log), study=ex.study.record,
                         ledger=ex.study,
                         cost=SearchCost(num_runs=ex.num_runs, **ex.cost,
                                         num_compiled_runs=ex.compiles[0],
                                         num_cached_compiles=ex.compiles[1]))


def not_reached(ev: Evidence, ex: Executor) -> tuple[str, ...]:
    """What a search stopped early never began: the settings not probed, the knobs not
    screened, each later stage not entered (``TunedConfig.not_reached``)."""
    probes = [k.label() for k in ev.plan.classes
              if (k.precision, k.compile_mode) not in ex.considered]
    knobs = [k.name for k in KNOBS[2:] if k.name not in ex.screened and any(
        v != getattr(ev.plan.base, k.name) and skip_reason(  # one the workload could use
            ev.plan.base.with_(**{k.name: v}), ev.traits) is None
        for v in ev.plan.values.get(k.name, ()))]
    first_launch = ev.plan.compile_in_peak and any(
        k.compile_mode != "off" for k in ev.plan.classes)
    planned = {"probe": f"the memory probes of {', '.join(probes)}" if probes else "",
               "knobs": f"knob screening ({', '.join(knobs)})" if knobs else "",
               "refine": "the smaller micro-batches",
               "confirm": "the re-measure of the leaders",
               "first launch": "the first-launch check" if first_launch else ""}
    # The stage it stopped in (the last entered) counts only where a run of it began.
    reached = set(ex.entered[:-1]) | (set(ex.entered[-1:]) & ex.ran_in)
    return tuple(text for stage, text in planned.items() if text and (
        stage in ("probe", "knobs") or stage not in reached))
