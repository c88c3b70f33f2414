"""The pick: the winner among a search's runs, the race's majority rule, and when a compiled
winner's compile is paid back."""

from __future__ import annotations

import math
from collections.abc import Sequence

from autotune.schema import TrialRecord
from autotune.search._records import SearchSettings


def pick_winner(records: tuple[TrialRecord, ...], settings: SearchSettings) -> TrialRecord | None:
    """The fastest candidate that ran every timed step with sound numerics."""
    feasible = [r for r in records if r.verdict == "ok" and r.median_step_s]
    if not feasible:
        return None
    if settings.train_steps:
        return min(feasible, key=lambda r: r.time_to_train_s or math.inf)
    best = max(feasible, key=lambda r: r.samples_per_s or 0.0)
    if best.round_shares and not won_rounds(best.round_shares):
        # Its best run is the fastest, but run back to back with the other of the confirm stage's
        # interleaved rounds it was behind in most: the rounds decide between the two.
        return next((r for r in feasible if r is not best and won_rounds(r.round_shares)),
                    best)
    return best


def rounds_ahead(shares: Sequence[float]) -> int:
    """In how many interleaved rounds a candidate was ahead (``shares``: its samples/s over the
    other's in each round)."""
    return sum(s > 1 for s in shares)


def won_rounds(shares: Sequence[float]) -> bool:
    """The race's majority rule: whether a candidate of the interleaved rounds was ahead in
    most of them."""
    return rounds_ahead(shares) * 2 > len(shares)


def break_even_steps(winner: TrialRecord, baseline: TrialRecord) -> float | None:
    """Optimizer steps after which a compiled winner's compile time is paid back."""
    if not winner.knobs.compiled or not winner.median_step_s or not baseline.median_step_s:
        return None
    saved = baseline.median_step_s - winner.median_step_s
    if saved <= 0:
        return math.inf
    return (winner.compile_s or 0.0) / saved
