"""The boundary search's arithmetic (no processes): what it measures next, and where it ends."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.boundary import (
    Point,
    bracket,
    confirm_over,
    first_candidate,
    fit_line,
    flattens,
    line_reach,
    may_be_largest,
    next_candidate,
)
from autotune.space import divisors

DIVISORS_48 = list(divisors(48))  # 1, 2, 3, 4, 6, 8, 12, 16, 24, 48


def fits(micro_batch: int, peak: int) -> Point:
    return Point(micro_batch=micro_batch, peak_bytes=peak, fits=True)


def oom(micro_batch: int) -> Point:
    return Point(micro_batch=micro_batch, peak_bytes=None, fits=False)


def test_fit_line() -> None:
    slope, intercept = fit_line([fits(1, 110), fits(3, 130), fits(5, 150), oom(9)]) or (0, 0)
    assert math.isclose(slope, 10) and math.isclose(intercept, 100)
    assert fit_line([fits(4, 140), oom(8)]) is None  # one measured peak draws no line


def test_line_predicts_the_largest_fitting() -> None:
    points = [oom(48), fits(1, 110), fits(6, 160)]
    # peak = 100 + 10 * m: 16 -> 260 fits in 265, 24 -> 340 does not.
    assert next_candidate(DIVISORS_48, points, 265) == 16
    assert next_candidate(DIVISORS_48, points, 1000) == 24
    assert may_be_largest(16, DIVISORS_48, points, 265)
    assert not may_be_largest(12, DIVISORS_48, points, 265)


def test_line_predicting_nothing_confirms_just_above_lo() -> None:
    assert next_candidate(DIVISORS_48, [oom(48), fits(1, 110), fits(6, 160)], 170) == 8


def test_two_peaks_predict_no_further_beyond_them_than_they_are_apart_where_peaks_flatten(
) -> None:
    # The replay's shrunk EPYC CNN (bf16 eager, channels_last): 9.9 and 11.1 MiB at 1 and 2
    # put 4 at 13.5 MiB, over the 12.8 MiB cap; it peaks 11.0 there. fp32 eager's peaks on
    # the same machine (4.4, 11.5, 12.4 at 1, 2, 4) flatten: the line through 1 and 2 put 4
    # at 25.7. Where peaks flatten, two peaks reach 3: 4 is run.
    fp32 = [fits(1, 44), fits(2, 115), fits(4, 124)]
    assert flattens(fp32) and not flattens([fits(1, 100), fits(2, 120), fits(4, 160)])
    assert line_reach(fp32) == 7  # off their own line: no further than 4 beyond 4
    points = [fits(1, 99), fits(2, 111)]
    assert line_reach(points) == 3
    assert confirm_over([4], points, 128, flat=True) is None
    assert next_candidate([1, 2, 4, 8], points, 115, over_bytes=128, flat=True) == 4
    # Nothing seen to flatten (a GPU's peaks): the line is trusted as before.
    assert next_candidate([1, 2, 4, 8], points, 115, over_bytes=128) is None
    # Three peaks on their line are trusted anywhere.
    assert line_reach([fits(8, 274), fits(16, 312), fits(32, 389)]) == math.inf


def test_a_failure_the_line_puts_over_the_cap_is_not_run_to_confirm() -> None:
    # ckpt=blocks on slow_gpt2 (bf16/default): 16 and 32 fit at 312 and 389 MiB of 432
    # usable; the line puts 64 at 544, over the 480 cap: it could only run out of memory.
    points = [fits(16, 312), fits(32, 389)]
    assert next_candidate([1, 2, 4, 8, 16, 32, 64], points, 432, over_bytes=480) is None
    assert confirm_over([64], points, 480) == 543
    # Under the cap (but over the usable budget) it may still fit: run it.
    assert next_candidate([1, 2, 4, 8, 16, 32, 64], points, 432, over_bytes=560) == 64
    assert next_candidate([1, 2, 4, 8, 16, 32, 64], points, 432) == 64
    # A line through a run that did not fit predicts nothing here.
    assert confirm_over([64], [fits(16, 312), Point(micro_batch=32, peak_bytes=470,
                                                      fits=False)], 480) is None


def test_non_increasing_line_tries_the_largest() -> None:
    assert next_candidate([1, 4, 6, 8, 12], [fits(1, 200), fits(4, 150)], 1000) == 12


def test_nothing_fits_yet_tries_the_smallest() -> None:
    assert next_candidate([1, 2, 3, 4, 6, 48], [oom(48)], 1000) == 1


def test_one_point_bisects_in_log_space() -> None:
    assert next_candidate([1, 2, 4, 8, 16], [oom(16), fits(1, 110)], 1000) == 4


def test_hint_neighbours() -> None:
    candidates = [1, 2, 3, 4, 6, 8, 12, 24]
    assert first_candidate(candidates, 8) == 8 and first_candidate(candidates, 5) == 24
    assert next_candidate(candidates, [fits(8, 100)], 1000, hint=8) == 12
    assert next_candidate(candidates, [oom(8)], 1000, hint=8) == 6
    # floor-first: after a failure at the hint, the smallest (a floor no micro-batch lowers)
    assert next_candidate(candidates, [oom(8)], 1000, hint=8, floor_first=True) == 1
    assert next_candidate(candidates, [fits(8, 100)], 1000, hint=8, floor_first=True) == 12


def test_a_decided_boundary_has_nothing_next() -> None:
    points = [fits(4, 140), oom(6)]
    assert bracket(points) == (4, 6)
    assert next_candidate([1, 2, 3, 4, 6, 12], points, 150) is None


def search(candidates, peak, usable, hint=None, over=None) -> tuple[int, int]:
    """Run the search against a peak function: (largest fit found, measurements); ``over``:
    the cap above which a failure is not run to confirm it."""
    points: list[Point] = []
    micro_batch = first_candidate(candidates, hint)
    while micro_batch is not None:
        value = peak(micro_batch)
        points.append(Point(micro_batch=micro_batch, fits=value <= usable,
                            peak_bytes=value if value <= 2 * usable else None))  # big: an OOM
        micro_batch = next_candidate(candidates, points, usable, hint, over_bytes=over)
    return bracket(points)[0], len(points)


@settings(max_examples=300, deadline=None)
@given(base=st.integers(0, 10_000), slope=st.integers(1, 5_000), curve=st.integers(0, 50),
       usable=st.integers(1, 3_000_000), target=st.sampled_from([12, 48, 64, 96, 360]),
       hint=st.none() | st.integers(1, 64), headroom=st.sampled_from([None, 0.0, 0.1, 0.5]))
def test_the_boundary_found_is_the_true_one(base, slope, curve, usable, target, hint,
                                            headroom) -> None:
    """For any peak that grows with the micro-batch (linear, or convex as attention's seq x seq
    terms are not, but a kernel's padding can be), the search ends at the largest candidate
    that fits: it never stops inside an undecided bracket, also when a failure the line puts
    over the cap (usable / (1 - headroom)) is not run to confirm it."""
    def peak(m: int) -> int:
        return base + slope * m + curve * m * m

    candidates = list(divisors(target))
    over = None if headroom is None else usable / (1 - headroom)
    found, _ = search(candidates, peak, usable, hint, over)
    assert found == max((c for c in candidates if peak(c) <= usable), default=0)


@settings(max_examples=200, deadline=None)
@given(base=st.integers(0, 10_000_000), slope=st.integers(1, 100_000),
       usable=st.integers(10_000_001, 10**10))
def test_every_positive_integer_takes_few_measurements_on_a_line(base, slope, usable) -> None:
    """The estimator's case: any micro-batch up to 65536 is a candidate, and traced peaks are
    linear. Starting from micro-batch 1, the line finds the boundary in a handful of traces."""
    candidates = range(1, 2**16 + 1)
    found, measured = search(candidates, lambda m: base + slope * m, usable, hint=1)
    assert found == min(max((usable - base) // slope, 0), 2**16)
    assert measured <= 6
