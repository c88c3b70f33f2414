"""The boundary search: the largest candidate micro-batch whose peak fits, in few measurements.

Peaks grow about linearly with the micro-batch. The search starts at a hint (a boundary found
before, or a micro-batch already measured) or at the largest candidate; once two runs measured
a peak, a least-squares line through every measured peak predicts the largest candidate that
fits, and the next measurement confirms it (or moves the bracket); before that it bisects in log
space. The memory probe (real capped steps, ``memory.probe_memory``) and the estimator
(fake-tensor traces, ``estimate.fits.largest_fitting``) both search with it. No torch here.

Candidates are any sorted sequence (a ``range`` too, for "every positive integer"): the search
looks them up by bisection, never by listing them.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Point:
    """One measured micro-batch."""

    micro_batch: int
    peak_bytes: int | None
    """The peak the run measured; None when it measured none (an OOM, a crash)."""
    fits: bool
    """Ran to the end with its peak within the usable bytes."""


def bracket(points: Sequence[Point]) -> tuple[int, float]:
    """(largest micro-batch known to fit, smallest known not to): 0 and inf when unknown."""
    lo = max((p.micro_batch for p in points if p.fits), default=0)
    hi = min((p.micro_batch for p in points if not p.fits), default=math.inf)
    return lo, hi


def open_candidates(candidates: Sequence[int], points: Sequence[Point]) -> Sequence[int]:
    """The candidates strictly inside the bracket: what is still to decide."""
    lo, hi = bracket(points)
    start = bisect.bisect_right(candidates, lo)
    end = len(candidates) if math.isinf(hi) else bisect.bisect_left(candidates, hi)
    return candidates[start:end]


def first_candidate(candidates: Sequence[int], hint: int | None) -> int:
    """Where a search with nothing measured starts: the hint when it is a candidate, else the
    largest candidate (the expected boundary when memory is ample)."""
    return hint if hint is not None and _contains(candidates, hint) else candidates[-1]


def fit_line(points: Sequence[Point]) -> tuple[float, float] | None:
    """Least-squares (slope, intercept) of peak over micro-batch through every measured peak;
    None with fewer than two micro-batches measured."""
    measured = {p.micro_batch: p.peak_bytes for p in points if p.peak_bytes is not None}
    if len(measured) < 2:
        return None
    xs, ys = list(measured), list(measured.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
    return slope, mean_y - slope * mean_x


LINEAR_WITHIN = 0.05
"""How far a peak may fall under the line through two smaller ones before the peaks are said
to flatten (``flattens``), and how close three or more peaks must lie to their line for it
to be trusted anywhere (``line_reach``)."""


def flattens(points: Sequence[Point]) -> bool:
    """Whether these measured peaks grow less per sample at larger micro-batches: the line
    through two of them puts the next larger one over its measured peak by more than
    ``LINEAR_WITHIN``. A CPU's peak does so at small sizes (the process's baseline and the
    allocator's arenas are a large share of it): in the replay's recorded CPU tables
    (``benchmarks/replay_tables.py``) the line through the peaks at 1 and 2 put 4 at up to
    2.5x its peak (34 of 111 such triples on the EPYC over 1.1x), through 4 and 8 put 16 at
    up to 1.6x; on the H200 none was over (12 triples)."""
    measured = sorted({p.micro_batch: p.peak_bytes for p in points if p.peak_bytes}.items())
    triples = zip(measured, measured[1:], measured[2:], strict=False)  # the last two: none
    return any(b1 + (b1 - b0) / (m1 - m0) * (m2 - m1) > b2 * (1 + LINEAR_WITHIN)
               for (m0, b0), (m1, b1), (m2, b2) in triples)


def line_reach(points: Sequence[Point]) -> float:
    """The largest micro-batch the line through these points' measured peaks may predict a
    peak for, to exclude it without a run, where the peaks were seen to flatten
    (``flattens``: rules ``peak-line``, ``growth-over-budget``): no further beyond its
    largest point than its points are apart, unless three or more peaks lie on it (within
    ``LINEAR_WITHIN``), then anywhere. 0 with fewer than two peaks."""
    measured = {p.micro_batch: p.peak_bytes for p in points if p.peak_bytes is not None}
    line = fit_line(points)
    if line is None:
        return 0
    slope, intercept = line
    if len(measured) >= 3 and all(abs(slope * m + intercept - b) <= LINEAR_WITHIN * b
                                  for m, b in measured.items()):
        return math.inf
    return 2 * max(measured) - min(measured)


def predicted_largest(between: Sequence[int], line: tuple[float, float],
                      usable_bytes: int) -> int | None:
    """The largest open candidate the line predicts to fit, or None (an increasing line
    predicting none); a line that does not increase predicts the largest."""
    slope, intercept = line
    if slope <= 0:
        return between[-1]
    limit = math.floor((usable_bytes - intercept) / slope)
    index = bisect.bisect_right(between, limit) - 1
    return between[index] if index >= 0 else None


def next_candidate(candidates: Sequence[int], points: Sequence[Point], usable_bytes: int,
                   hint: int | None = None, *, over_bytes: float | None = None,
                   flat: bool = False, floor_first: bool = False) -> int | None:
    """The micro-batch to measure next, or None when the boundary is decided.

    After a first run at the hint, its neighbour settles the boundary if the hint was right
    (with ``floor_first``, after a failure there, the smallest candidate instead: a class
    whose need has a floor no micro-batch lowers: ``search.stages.probe.floor_first``);
    with two measured peaks, the largest candidate the line predicts to fit (when it predicts
    none, the one just above the largest fit, to confirm the failure, unless the line puts it
    above ``over_bytes``: ``confirm_over``); with nothing fitting yet, the smallest candidate
    (is anything feasible?); else the candidate nearest the geometric middle of the bracket.
    """
    between = open_candidates(candidates, points)
    if not between:
        return None
    last = points[-1]
    if hint is not None and len(points) == 1 and last.micro_batch == hint:
        return between[0] if last.fits or floor_first else between[-1]
    line = fit_line(points)
    if line is not None:
        predicted = predicted_largest(between, line, usable_bytes)
        if predicted is not None:
            return predicted
        return None if confirm_over(between, points, over_bytes, flat=flat) else between[0]
    lo, hi = bracket(points)
    if lo == 0:
        return between[0]
    upper = hi if math.isfinite(hi) else between[-1] * 2
    middle = math.sqrt(lo * upper)
    index = min(max(bisect.bisect_left(between, middle), 0), len(between) - 1)
    nearby = [between[i] for i in (index - 1, index) if 0 <= i < len(between)]
    return min(nearby, key=lambda c: abs(math.log(c) - math.log(middle)))


def confirm_over(between: Sequence[int], points: Sequence[Point],
                 over_bytes: float | None, *, flat: bool = False) -> float | None:
    """The peak the line through the measured peaks predicts for the smallest open candidate
    when it is above ``over_bytes`` (e.g. a child's hard cap: the run could only end out of
    memory), else None (run it to confirm the failure). Only a line through two fitting runs
    predicts here, and only above the largest of them (no extrapolation below a failure), and
    where this machine's peaks flatten (``flat``, or these points do: ``flattens``), no
    further than ``line_reach``: beyond it, the run is made."""
    fitting = [p for p in points if p.fits]
    line = fit_line(fitting)
    if over_bytes is None or line is None or not between:
        return None
    if (flat or flattens(points)) and between[0] > line_reach(fitting):
        return None
    slope, intercept = line
    predicted = slope * between[0] + intercept
    return predicted if slope > 0 and predicted > over_bytes else None


def may_be_largest(micro_batch: int, candidates: Sequence[int], points: Sequence[Point],
                   usable_bytes: int) -> bool:
    """Whether the evidence so far allows nothing larger to fit: the largest candidate still
    open, or the largest the line predicts to fit (bisection points are neither)."""
    between = open_candidates(candidates, points)
    if not between or micro_batch == between[-1]:
        return True
    line = fit_line(points)
    return line is not None and micro_batch == predicted_largest(between, line, usable_bytes)


def _contains(candidates: Sequence[int], value: int) -> bool:
    index = bisect.bisect_left(candidates, value)
    return index < len(candidates) and candidates[index] == value
