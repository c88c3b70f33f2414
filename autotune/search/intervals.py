"""A figure with the noise around it (``Interval``), and the noise two runs need between them
before their gap counts (``noise_of``): what every bound, cut and race of the search compares
through (``docs/search.md``), said once. ``Evidence`` measures the machine's noise level; this
module says what a noise does to a figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.config import TrialResult
from autotune.search._records import SearchSettings

SINGLE_RUN_GAPS = 2.0
"""How many of this machine's typical gaps between two runs of one config (their median, as
measured on the other configs: ``Evidence.drift_beside``) a candidate's own two runs may land
apart and still read as two draws of one config, their geometric mean, before one of them
counts as a run that stalled and the better is read (``Evidence.figure``,
``_records.typical_run``). Under normal noise of a run's sigma the gap between two runs has a
median of 0.95 sigma and twice that is its 82nd percentile; a stall (a neighbour, a slow
minute) is 1.5x and more. At one typical gap, half of all pairs of one config read as a stall,
and their better run, the luckier draw, made the pick lean to whatever ran twice."""


PAIR_STALL = 1.5
"""How much slower one of the noise's two runs of the baseline is, at least, for the pair to
read as one run that stalled (its better run kept) rather than two draws of one config (their
geometric mean, ``Evidence.remeasured``'s ``paired``): a stall is 1.5x and more."""


@dataclass(frozen=True)
class Interval:
    """A figure (a score, a speed, a ratio) with the noise around it, relative: another figure
    differs from it only outside ``[low, high]``. Every bound, cut and race of the search
    compares through it ("beats the leader beyond the noise", ``docs/search.md``), so what the
    noise is, and how it widens the figure, is said here once."""

    value: float
    noise: float

    @property
    def low(self) -> float:
        """The figure's pessimistic end."""
        return self.value * (1 - self.noise)

    @property
    def high(self) -> float:
        """The figure's optimistic end."""
        return self.value * (1 + self.noise)

    def beats(self, other: float) -> bool:
        """Whether this figure beats ``other`` beyond the noise (``other`` under its low end)."""
        return other < self.low

    def beaten_by(self, other: float) -> bool:
        """Whether ``other`` beats this figure beyond the noise (``other`` over its high end)."""
        return other > self.high


def noise_of(settings: SearchSettings, *results: TrialResult, level: float = 0.0) -> float:
    """Relative gap runs need before it counts: the run-to-run noise of this machine as the
    search measured it (``level``, ``Evidence.noise_level``; ``confirm_within`` its floor),
    or the 95% interval of the runs' ratio when wider (their medians' half-widths in
    quadrature: a short or noisy timing says less)."""
    return max(level, noise_between(settings.confirm_within,
                                    *(r.halfwidth() for r in results)))


def noise_between(confirm_within: float, *halfwidths: float | None) -> float:
    """``noise_of`` from the runs' relative half-widths (a record's ``halfwidth``; None: not
    measured), without the machine's measured level."""
    return max(confirm_within, math.hypot(*(h or 0.0 for h in halfwidths)))
