"""What the pick reads of the evidence: each candidate's figure (the typical of its runs, a
pair of the interleaved rounds as the rounds said) and its record, and the winner now.

``Figures`` is a part of ``Evidence`` (its base), kept apart so that each file holds one job:
the evidence keeps the runs and answers the stages' queries; this says them as the outcome
and the pick read them (``docs/search.md``: "the pick").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from autotune.config import TrialResult
from autotune.schema import TrialRecord
from autotune.search._records import (
    Candidate,
    SearchSettings,
    as_rounds_said,
    classify,
    typical_run,
)
from autotune.search.intervals import SINGLE_RUN_GAPS
from autotune.search.pick import pick_winner
from autotune.search.plan import Plan
from autotune.search.rules import Skip


class Figures:
    """The pick's reading of ``Evidence`` (whose fields these name)."""

    plan: Plan
    settings: SearchSettings
    timed: dict[Candidate, list[TrialResult]]
    round_shares: dict[Candidate, tuple[float, ...]]
    rivals: dict[Candidate, Candidate]
    out: dict[Candidate, Skip]
    baseline: Candidate | None
    results: Mapping[Candidate, TrialResult]  # (``Evidence``'s, each candidate's better run)
    drift_beside: Callable[[Candidate], float]  # (``Evidence.drift_beside``)

    def record(self, key: Candidate, result: TrialResult,
               results: Mapping[Candidate, TrialResult] | None = None) -> TrialRecord:
        """``classify``'s record, with the candidate's interleaved rounds (its speedup over
        the baseline's run in ``results``, ``results`` by default)."""
        rec = classify(key, result, self.results if results is None else results,
                       self.baseline, self.plan.report, self.settings)[0]
        return replace(rec, round_shares=self.round_shares.get(key, ()))

    def figure(self, key: Candidate) -> TrialResult:
        """The run ``key``'s record shows and the pick reads: the typical of its runs
        (``_typical``), and for one of the interleaved rounds, scaled so the pair reads
        as the rounds said (``as_rounds_said``); one judged out, as judged."""
        result = self.results[key]
        if key in self.out or key not in self.timed:
            return result
        run = self._typical(key)
        rival = self.rivals.get(key)
        if rival is not None and rival in self.timed and rival not in self.out:
            run = as_rounds_said(run, self._typical(rival), self.round_shares[key])
        return run

    def _typical(self, key: Candidate) -> TrialResult:
        """``typical_run`` of ``key``'s runs: two read as their mean within ``SINGLE_RUN_GAPS``
        of the gap two runs of the other configs showed here (``drift_beside``)."""
        return typical_run(self.timed[key], SINGLE_RUN_GAPS * self.drift_beside(key))

    def figured(self) -> dict[Candidate, TrialRecord]:
        """Each candidate's record of its ``figure``, its speedup over the baseline's
        ``figure``: what the table shows and the pick reads."""
        base = self.baseline
        results = {base: self.figure(base)} if base in self.results else {}
        return {k: self.record(k, self.figure(k), results)  # type: ignore[arg-type]
                for k in self.results}

    def winner(self) -> Candidate | None:
        """The candidate the outcome would pick now (``pick_winner`` over the records of the
        candidates' ``figure``)."""
        records = self.figured()
        best = pick_winner(tuple(records.values()), self.settings)
        return next((k for k, rec in records.items() if rec is best), None)
