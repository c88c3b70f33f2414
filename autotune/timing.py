"""How long to time a candidate, and how sure a comparison of two is (torch-free).

A timed run stops as soon as what it measured is enough to rank it (``stop_reason``): its
median step time is known to within the precision asked (the 95% interval of the median), or
it is clearly behind the leader, or a limit was reached. Fixed step counts waste a slow
workload's minutes on candidates whose first few steps already told the story.

The interval of a median from a handful of steps is Student's t interval of the mean scaled by
the median's efficiency (its standard error is about 1.2533 times the mean's for normal noise):
a few steps of a quiet machine are enough; a noisy one keeps timing until its median settles
or the step limit is reached.

``lead`` says how far the winner is ahead of the runner-up, with the interval of that ratio
(the two runs' relative half-widths added in quadrature), for the report's "ahead by 9.0% +-
3.9%".

``predict_step_s`` is the model of what grows with the micro-batch: an optimizer step is k
micro-batches plus one update, and a micro-batch's time is about linear in its size, so two
timed micro-batch sizes of one setting predict the others.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TimingStop = Literal["steps", "precise", "behind", "time_limit", ""]
"""Why a timed run stopped: it ran its most steps (``steps``); its median was known to the
precision asked (``precise``); it was clearly behind the leader (``behind``); it spent its
time limit (``time_limit``). ``""``: a run recorded before the reason was (a stored study)."""

MIN_STEPS_TO_STOP = 3
"""Timed steps a run takes before it may stop for precision or for being behind: with fewer,
one step's luck decides, and no spread can be measured."""

_MEDIAN_EFFICIENCY = 1.2533  # standard error of a median over that of the mean (normal noise)
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201,
          2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)
"""Student's t at 97.5% for 1..20 degrees of freedom (a two-sided 95% interval)."""


def t_975(degrees: int) -> float:
    """Student's t quantile at 97.5% for ``degrees`` degrees of freedom (at least 1)."""
    if degrees < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {degrees}")
    if degrees <= len(_T_975):
        return _T_975[degrees - 1]
    return 1.96 + 2.4 / degrees  # within 0.5% of the exact quantile beyond 20


def relative_halfwidth(times: Sequence[float]) -> float | None:
    """Half-width of the 95% interval of the median of ``times``, over that median.

    None with fewer than 2 times (no spread to measure) or a median that is not positive."""
    if len(times) < 2:
        return None
    median = statistics.median(times)
    if not median > 0:
        return None
    standard_error = _MEDIAN_EFFICIENCY * statistics.stdev(times) / math.sqrt(len(times))
    return t_975(len(times) - 1) * standard_error / median


def stop_reason(times: Sequence[float], *, max_steps: int, elapsed_s: float,
                min_elapsed_s: float = 0.0, max_elapsed_s: float | None = None,
                precision: float | None = None,
                stop_above_s: float | None = None) -> TimingStop | None:
    """Why timing should stop after these step times, or None to time another step.

    Args:
        times: the timed steps so far, in seconds.
        max_steps: the most timed steps (reached, once ``min_elapsed_s`` was timed too).
        elapsed_s: seconds since timing began.
        min_elapsed_s: time at least this long (fast steps: a median over a window this long
            is not one short busy period of the machine).
        max_elapsed_s: stop once timing took this long (at least one step timed).
        precision: stop once the median's relative 95% half-width is at most this (after
            ``MIN_STEPS_TO_STOP`` steps and ``min_elapsed_s``); None: time ``max_steps``.
        stop_above_s: the leader's median plus the noise: stop once ``MIN_STEPS_TO_STOP``
            steps were all slower than this (even the fastest loses).
    """
    if not times:
        return None
    n = len(times)
    if max_elapsed_s is not None and elapsed_s > max_elapsed_s:
        return "time_limit"
    if stop_above_s is not None and n >= MIN_STEPS_TO_STOP and min(times) > stop_above_s:
        return "behind"
    if elapsed_s < min_elapsed_s:
        return None
    if n >= max_steps:
        return "steps"
    if precision is not None and n >= MIN_STEPS_TO_STOP:
        halfwidth = relative_halfwidth(times)
        if halfwidth is not None and halfwidth <= precision:
            return "precise"
    return None


@dataclass(frozen=True)
class Lead:
    """How far one run is ahead of another: ``gap`` (0.09: 9% faster) +- ``halfwidth``."""

    gap: float
    halfwidth: float | None
    """The 95% half-width of the gap; None when a run had too few steps to measure it."""

    @property
    def is_clear(self) -> bool:
        """The interval of the gap excludes zero: the winner is ahead beyond the noise."""
        return self.halfwidth is not None and self.gap > self.halfwidth

    def describe(self) -> str:
        """``9.0% +- 3.9%``, ``35% +- 12%``, or ``9.0% (spread not measured)``: a tenth of a
        percent below 10%, so a gap and a width that differ never read alike."""
        digits = 1 if abs(self.gap) < 0.1 or (self.halfwidth or 0.0) < 0.1 else 0
        if self.halfwidth is None:
            return f"{self.gap:.{digits}%} (spread not measured)"
        return f"{self.gap:.{digits}%} +- {self.halfwidth:.{digits}%}"


def lead(winner_speed: float, winner_halfwidth: float | None, other_speed: float,
         other_halfwidth: float | None) -> Lead:
    """The winner's lead over another run, from their speeds (larger is better) and the
    relative 95% half-widths of the medians they were measured from (``relative_halfwidth``;
    None: not measured)."""
    if not (winner_speed > 0 and other_speed > 0):
        raise ValueError(f"speeds must be positive, not {winner_speed} and {other_speed}")
    ratio = winner_speed / other_speed
    if winner_halfwidth is None or other_halfwidth is None:
        return Lead(gap=ratio - 1, halfwidth=None)
    return Lead(gap=ratio - 1, halfwidth=ratio * math.hypot(winner_halfwidth, other_halfwidth))


def predict_step_s(points: Sequence[tuple[int, float, float]], micro_batch: int,
                   per_device_batch: int) -> float | None:
    """Predicted optimizer step time at ``micro_batch``, from timed micro-batch sizes.

    Args:
        points: (micro-batch, seconds per micro-batch, seconds per optimizer update) of the
            same setting, at two or more distinct micro-batches.
        micro_batch: the micro-batch to predict (a divisor of ``per_device_batch``).
        per_device_batch: samples per device per optimizer step.

    Returns:
        ``k * (a + b * micro_batch) + update`` with ``k = per_device_batch / micro_batch``, the
        line through the points' micro-batch times (least squares) and their median update
        time; None with fewer than two distinct micro-batches or a non-positive prediction.
    """
    sizes = {m for m, _, _ in points}
    if len(sizes) < 2 or micro_batch < 1:
        return None
    xs = [float(m) for m, _, _ in points]
    ys = [t for _, t, _ in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
             / sum((x - mean_x) ** 2 for x in xs))
    per_micro_batch = mean_y + slope * (micro_batch - mean_x)
    if per_micro_batch <= 0:
        return None
    update = statistics.median(u for _, _, u in points)
    return per_device_batch / micro_batch * per_micro_batch + update


def prediction_halfwidth(points: Sequence[tuple[int, float, float]],
                         halfwidths: Sequence[float], micro_batch: int,
                         per_device_batch: int) -> float | None:
    """How sure ``predict_step_s``'s prediction is: its 95% interval's half-width over it.

    Each point's time per micro-batch is known to its run's relative half-width
    (``halfwidths``, in the order of ``points``); the least-squares line weighs each point by
    ``1/n + (micro_batch - mean) (m_i - mean) / sum((m - mean)^2)``, so a prediction far
    outside the timed sizes carries their errors multiplied (from 8 and 16 to 1: 1.9 times
    the error at 8 and 0.9 times that at 16, against the small time per micro-batch left at
    1), added in quadrature (independent runs). None where ``predict_step_s`` predicts
    nothing.
    """
    step_s = predict_step_s(points, micro_batch, per_device_batch)
    if step_s is None or len(halfwidths) != len(points):
        return None
    xs = [float(m) for m, _, _ in points]
    mean_x = statistics.fmean(xs)
    spread = sum((x - mean_x) ** 2 for x in xs)
    weights = [1 / len(xs) + (micro_batch - mean_x) * (x - mean_x) / spread for x in xs]
    sigma = math.hypot(*(w * h * t for w, h, (_, t, _) in  # (no underflow in the squares)
                         zip(weights, halfwidths, points, strict=True)))
    return per_device_batch / micro_batch * sigma / step_s


def gain_ceiling(ratio: float, small: int, large: int, micro_batch: int,
                 largest: int) -> float | None:
    """The most a larger micro-batch can gain, from a measured pair of another setting.

    Per sample, a step costs ``A / m + C``: a fixed share per micro-batch (launches, the
    per-micro-batch overhead) spread over its ``m`` samples, and what each sample costs
    (``C``, the optimizer update spread over the per-device batch included). A pair of timed
    micro-batches (``small`` < ``large``, throughput ``ratio`` = large's / small's) gives
    ``A / C``; the gain from ``micro_batch`` up to ``largest`` is then
    ``(A / C / micro_batch + 1) / (A / C / largest + 1)``, and no larger micro-batch gains
    more (what slows large micro-batches, cache misses and memory pressure, only lowers it).

    Returns:
        The ceiling (1.0: a larger micro-batch gains nothing, the pair did not get faster),
        or None when the pair gained as much as its size ratio or more (the model does not
        explain it: no ceiling can be drawn).
    """
    if not (0 < small < large and 0 < micro_batch <= largest and ratio > 0):
        raise ValueError(f"need 0 < small < large and 0 < micro_batch <= largest, not "
                         f"{small}, {large}, {micro_batch}, {largest} (ratio {ratio})")
    if ratio >= large / small:
        return None
    overhead = max(0.0, (ratio - 1) / (1 / small - ratio / large))  # A / C
    return (overhead / micro_batch + 1) / (overhead / largest + 1)
