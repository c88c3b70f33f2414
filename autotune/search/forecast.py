"""The forecast: how many child runs a search will make in all, and how long they will take,
from the plan and the evidence it has now (said with each run's progress).

An estimate, never a decision: the stages decide what runs (``docs/search.md``); this counts
what the plan leaves them to try, stage by stage, as the typical search spends it (a bisection
per setting, a run per knob value, one smaller micro-batch per setting, the leader and its
contenders re-measured). It changes as evidence arrives (a bound that rules a setting out, a
stage that ends early), and never says less than the runs made so far plus the one starting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.knob_rules import skip_reason
from autotune.knobs import KNOBS

if TYPE_CHECKING:
    from autotune.search.evidence import Evidence

STAGE_ORDER = ("probe", "knobs", "refine", "confirm", "first launch")
"""The stages whose runs are counted, in the order they run (``driver.STAGES``)."""


@dataclass(frozen=True)
class RunCount:
    """Where a search stands, said with each run's progress: runs made, the runs it will
    make in all (an estimate from the plan it has now) and the seconds they leave."""

    done: int
    """Child runs made so far."""
    total: int
    """Child runs in all: the runs made plus the plan's estimate of those to come, at most
    ``--max-trials``."""
    left_s: float | None = None
    """Seconds the runs to come are estimated to take (their number times the mean child
    run so far; at most what ``--time-budget`` leaves); None before any run ended."""


def forecast(ev: Evidence, stage: str, done: int, child_s: float, elapsed_s: float, *,
             starting: bool, in_stage: int = 0) -> RunCount:
    """The runs a search will make in all and the seconds left, as it stands in ``stage``
    having made ``done`` runs (``in_stage`` of them in this stage) that took ``child_s``
    seconds, ``elapsed_s`` since it began; ``starting``: a run begins now (it counts in the
    total)."""
    settings = ev.settings
    total = min(max(done + runs_left(ev, stage, in_stage), done + starting),
                max(settings.max_trials, done))
    left_s = None
    if done:
        left_s = (total - done) * child_s / done
        if settings.time_budget_s is not None:
            left_s = min(left_s, max(settings.time_budget_s - elapsed_s, 0.0))
    return RunCount(done=done, total=total, left_s=left_s)


def runs_left(ev: Evidence, stage: str, in_stage: int = 0) -> int:
    """The child runs the plan leaves: those of the current stage not yet made (the probe
    and knobs stages count what is left to try; the later ones their estimate less the
    ``in_stage`` runs made in them), and of every later stage."""
    at = STAGE_ORDER.index(stage) if stage in STAGE_ORDER else -1
    counts = {"probe": _probe_runs, "knobs": _knob_runs, "refine": _refine_runs,
              "confirm": _confirm_runs, "first launch": _first_launch_runs}
    later = sum(counts[name](ev) for name in STAGE_ORDER[max(at, 0) + 1:])
    if at < 0:  # what the study holds, said first: every stage is to come
        return later + counts["probe"](ev)
    here = counts[stage](ev)
    return later + (here if stage in ("probe", "knobs") else max(here - in_stage, 0))


def _probe_runs(ev: Evidence) -> int:
    """The settings not probed yet (a setting ruled out counts as probed): the first a
    bisection over the divisors and its largest fit timed, each later one two runs (it
    starts at the boundary the others found: that fits, timed, and the next one up does
    not); less the runs the setting being probed has made."""
    ruled_out = {s.target for s in ev.skips}
    left = [k for k in ev.plan.classes if k not in ev.probes and k.label() not in ruled_out]
    first = math.ceil(math.log2(len(ev.plan.micro_batches) + 1)) + 1
    runs = sum(2 if ev.probes or i else first for i, _ in enumerate(left))
    made = sum(1 for c in {*ev.probe_runs, *ev.results} if c.knobs in left)
    return max(runs - made, 0)


def _knob_runs(ev: Evidence) -> int:
    """One run per knob value the workload can use, beyond those already timed."""
    tried = {(k.name, getattr(c.knobs, k.name)) for c in ev.results for k in KNOBS[2:]}
    base = ev.plan.base
    return sum(1 for knob in KNOBS[2:] for value in ev.plan.values.get(knob.name, ())
               if value != getattr(base, knob.name) and (knob.name, value) not in tried
               and skip_reason(base.with_(**{knob.name: value}), ev.traits) is None)


def _refine_runs(ev: Evidence) -> int:
    """One smaller micro-batch per setting near the leader (``refine_within``) that has one
    (most walks stop there: the next is no faster beyond the noise); one per setting not
    probed yet."""
    if ev.settings.micro_batches_per_class == 1:
        return 0
    near = [k for k, p in ev.probes.items() if len(p.fitting()) > 1
            and (ev.share(ev.class_best(k)) or 0.0) >= ev.settings.refine_within]
    return len(near) + sum(1 for k in ev.plan.classes if k not in ev.probes)


def _confirm_runs(ev: Evidence) -> int:
    """The leader and its contenders (those within ``confirm_within`` of it, at most
    ``num_confirm``) re-measured; none where the lead is clear. Before any is timed: the
    leader and ``num_confirm``."""
    settings = ev.settings
    ranked = [s for k in ev.ranked() if (s := ev.score(k, full=True))]
    if settings.num_confirm <= 0:
        return 0
    if not ranked:
        return settings.num_confirm + 1
    close = sum(1 for s in ranked[1:] if s >= ranked[0] * (1 - settings.confirm_within))
    return 1 + min(close, settings.num_confirm) if close else 0


def _first_launch_runs(ev: Evidence) -> int:
    """A compiled winner's run as a first launch compiles, where a compile's memory counts
    in the peak."""
    return int(ev.plan.compile_in_peak and any(k.compiled for k in ev.plan.classes))
