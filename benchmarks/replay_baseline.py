"""A strong simple baseline for the replay (issue 59): successive halving over the feasible
candidates, at the search's own cost.

On the same ``ReplayDevice`` (same table, same seed) as the search:

1. **Fits from probes.** Each memory class (precision, compile mode, checkpointing) has its
   largest fitting micro-batch found by a binary search of probes of its first recorded
   setting over the table's micro-batches (memory grows with the micro-batch); a fit is a
   probe that ran with its peak within the usable budget. A probe times its steps, as a
   search's probe does, so a probe that fit is that candidate's first timing.
2. **Candidates.** Every recorded knob combination of the class at the class's fit and at the
   next ``SMALLER`` smaller micro-batches (a knob that needs more memory fits one below).
3. **Rounds.** Every candidate timed once (largest micro-batches first); a run that failed or
   peaked over the usable budget is out. The best third (by samples/s) re-measured, judged on
   the mean of their runs; the best two raced, ``RACE_RUNS`` more runs each, alternating.
4. **First launch.** A compiled pick is run once compiled afresh (``cold_compile``); over the
   usable budget, the runner-up is picked.

The budget: the search's simulated seconds on that seed. Before each run the clock is read;
once it is spent the baseline stops and picks the best mean it has (nothing timed: no pick).
``budget_s=None`` runs every round.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass, field

from replay_device import ReplayDevice
from replay_tables import Table

from autotune.config import TrialSpec
from autotune.knobs import Knobs
from autotune.search._records import Candidate

SMALLER = 2
TIMED_STEPS = 10
RACE_RUNS = 2


def spec_of(table: Table, key: str, *, timed: int = TIMED_STEPS,
            cold: bool = False) -> TrialSpec:
    """A run of candidate ``key`` on ``table``'s device: ``timed`` steps, at the table's
    budget (``cold``: compiled afresh)."""
    c = Candidate.from_key(key)
    return TrialSpec(workload=table.spec, device=table.device.device,
                     micro_batch=c.micro_batch,
                     accumulate_steps=max(1, table.target // c.micro_batch),
                     knobs=c.knobs, num_timed_steps=timed, cold_compile=cold,
                     memory_budget_bytes=table.budget_bytes, timeout_s=1e9)


class _Spent(Exception):
    """The budget ran out."""


@dataclass
class Baseline:
    pick: str | None
    cost: float
    runs: int
    scores: dict[str, list[float]] = field(default_factory=dict)


def _class_of(knobs: Knobs) -> tuple[str, str, str]:
    return knobs.precision, knobs.compile_mode, knobs.checkpointing


class _Halving:
    def __init__(self, table: Table, seed: int, budget_s: float | None,
                 device: ReplayDevice | None = None) -> None:
        self.table, self.budget_s = table, budget_s
        self.device = device or ReplayDevice(table, seed)
        self.scores: dict[str, list[float]] = {}

    def run(self, key: str, timed: int = TIMED_STEPS, cold: bool = False):
        if self.budget_s is not None and self.device.now_s >= self.budget_s:
            raise _Spent
        return self.device(spec_of(self.table, key, timed=timed, cold=cold))

    def fits(self, result) -> bool:
        return result.ok and result.peak_bytes is not None and \
            result.peak_bytes <= self.table.usable_bytes()

    def time(self, key: str) -> bool:
        """Time the candidate once: whether it fits (a failed or over-budget run is out)."""
        result = self.run(key)
        if self.fits(result) and result.step_times_s:
            step = statistics.median(result.step_times_s)
            self.scores.setdefault(key, []).append(result.samples_per_step / step)
            return True
        self.scores[key] = []  # out
        return False

    def mean(self, key: str) -> float:
        return statistics.fmean(self.scores[key]) if self.scores.get(key) else -math.inf

    def ranked(self) -> list[str]:
        return sorted((k for k in self.scores if self.scores[k]), key=self.mean, reverse=True)

    def candidates(self) -> list[str]:
        keys = [Candidate.from_key(k) for k, e in self.table.entries.items() if e.runs]
        classes: dict[tuple, list[Candidate]] = {}
        for c in keys:
            classes.setdefault(_class_of(c.knobs), []).append(c)
        out: list[Candidate] = []
        for members in classes.values():
            probe_label = members[0].knobs.label()
            sizes = sorted({c.micro_batch for c in members
                            if c.knobs.label() == probe_label})
            lo, hi, fit = 0, len(sizes) - 1, None
            while lo <= hi:  # the largest micro-batch whose probe fits
                mid = (lo + hi) // 2
                if self.time(f"{probe_label}/{sizes[mid]}"):
                    fit, lo = mid, mid + 1
                else:
                    hi = mid - 1
            if fit is None:
                continue
            keep = set(sizes[max(0, fit - SMALLER):fit + 1])
            out += [c for c in members if c.micro_batch in keep]
        out.sort(key=lambda c: -c.micro_batch)
        return [c.key() for c in out]

    def halve(self) -> None:
        for key in self.candidates():
            if key not in self.scores:  # a probe that fit timed it already
                self.time(key)
        third = self.ranked()[:max(2, math.ceil(len(self.ranked()) / 3))]
        for key in third:
            self.time(key)
        two = sorted(third, key=self.mean, reverse=True)[:2]
        for _ in range(RACE_RUNS):
            for key in two:
                self.time(key)

    def pick(self) -> str | None:
        for key in self.ranked()[:2]:
            if Candidate.from_key(key).knobs.compile_mode == "off":
                return key
            try:
                first = self.run(key, timed=1, cold=True)
            except _Spent:
                return key  # no time to check its first launch
            if self.fits(first):
                return key
        return None


def successive_halving(table: Table, seed: int, budget_s: float | None = None) -> Baseline:
    """The baseline's pick on ``table`` (seeded as the search's device), within ``budget_s``
    simulated seconds (None: every round)."""
    sh = _Halving(table, seed, budget_s)
    with contextlib.suppress(_Spent):
        sh.halve()
    sh.budget_s = None if budget_s is None else max(budget_s, sh.device.now_s)
    pick = sh.pick() if sh.ranked() else None
    return Baseline(pick=pick, cost=sh.device.now_s / table.pass_s(), runs=sh.device.calls,
                    scores=sh.scores)



