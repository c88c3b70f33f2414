"""What the product of factors predicts of a candidate from the others timed at its
micro-batch: each knob a factor on speed, so where ``A`` differs from ``K`` in some knobs,
``B`` in the others and ``C`` in all of them, ``K`` runs at about ``A x B / C`` (a
parallelogram of runs). A prediction, never a decision: ``policy.remeasure_first`` reads it
to time again a single run that came out far below it (a run that stalled is only slower,
and nothing in it says so), ``docs/search.md``.
"""

from __future__ import annotations

import dataclasses
import itertools

from autotune.search._records import Candidate
from autotune.search.evidence import Evidence


def predicted(ev: Evidence, key: Candidate) -> tuple[float, tuple[Candidate, ...]] | None:
    """The largest score the parallelograms of runs at ``key``'s micro-batch predict for
    ``key`` (each ``A x B / C``), with the three candidates it came from; None where no
    three such runs are there. ``A`` and ``B`` may be runs stopped early behind the leader;
    ``C`` is a full run. A run that stalled is only slower: as ``A`` or ``B`` it puts the
    prediction down (a surprise missed), as ``C`` up (every other corner's prediction
    beyond what it runs), and the run stopped early is the one most likely to have
    stalled. On the generated tables (2026-12-01, keyed noise, against full runs only):
    develop within 3% +0.0026, judge +0.0023, cost +0.0006 and +0.0014 of a pass; stopped
    runs as ``C`` too cost +0.0047 on the judge set for the same picks."""
    here = {c: s for c in ev.results if c.micro_batch == key.micro_batch and c != key
            and (s := ev.score(c)) is not None}
    full = {c: s for c in here if (s := ev.score(c, full=True)) is not None}
    best: tuple[float, tuple[Candidate, ...]] | None = None
    for far, far_score in full.items():
        differ = [f.name for f in dataclasses.fields(key.knobs)
                  if getattr(key.knobs, f.name) != getattr(far.knobs, f.name)]
        for size in range(1, len(differ)):
            for some in itertools.combinations(differ, size):
                try:
                    near_a, near_b = _swap(key, far, some), _swap(far, key, some)
                except ValueError:  # a combination the knobs do not allow
                    continue
                a, b = here.get(near_a), here.get(near_b)
                if a and b and (best is None or a * b / far_score > best[0]):
                    best = (a * b / far_score, (near_a, near_b, far))
    return best


def _swap(into: Candidate, source: Candidate, fields: tuple[str, ...]) -> Candidate:
    """``into`` with ``fields`` of its knobs taken from ``source``."""
    knobs = dataclasses.replace(into.knobs, **{f: getattr(source.knobs, f) for f in fields})
    return Candidate(knobs=knobs, micro_batch=into.micro_batch)
