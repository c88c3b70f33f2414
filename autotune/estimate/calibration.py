"""Correct an estimate by a measured peak of the same config (``autotune.json``'s calibration).

The estimate counts tensors; what a real step holds beyond them (kernel scratch, a CUDA context,
allocator caching) is measured by a search and stored beside the estimate of the same config.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.units import format_bytes

MAX_GROWTH = 4.0
"""Most a calibration may scale the estimate's per-sample growth: a measured growth beyond it is
implausible (noise between two close points, or a measured peak of another model)."""


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """A search's measured peak beside the estimate of the same config: it corrects later
    estimates of that memory class, and never turns a miss into a fit.

    The estimate counts tensors, so what it misses is mostly a constant (kernel scratch, a
    CUDA context, allocator caching): the measured peak's excess over the estimate is added as
    a constant, never subtracted. When the search measured two micro-batches far enough apart,
    the part that grows with the micro-batch is scaled by the measured growth over the
    estimated one, bounded to [1, ``MAX_GROWTH``]. So ``apply(e) >= e`` always.
    """

    micro_batch: int
    """Where the peak was measured and traced."""
    measured_peak_bytes: int
    estimate_bytes: int
    growth: float = 1.0
    """Measured per-sample growth over the estimate's, bounded to [1, ``MAX_GROWTH``]."""
    notes: tuple[str, ...] = ()
    """What was implausible in the stored figures, and how it was bounded."""

    @classmethod
    def from_record(cls, record: dict[str, int], label: str) -> Calibration | None:
        """The calibration stored in ``autotune.json`` for one memory class (``label``); None
        when it holds nothing usable (the note says so through ``describe``)."""
        m = record.get("micro_batch", 0)
        measured = record.get("measured_peak_bytes", 0)
        traced = record.get("estimate_bytes", 0)
        if min(m, measured, traced) <= 0:
            return None
        growth, notes = 1.0, []
        m0 = record.get("growth_micro_batch", 0)
        measured0 = record.get("growth_measured_peak_bytes", 0)
        traced0 = record.get("growth_estimate_bytes", 0)
        if 0 < m0 < m and traced > traced0 > 0 and measured0 > 0:
            raw = (measured - measured0) / (traced - traced0)
            growth = min(max(raw, 1.0), MAX_GROWTH)
            if not 1 / MAX_GROWTH <= raw <= MAX_GROWTH:
                notes.append(f"{label}'s stored calibration is implausible: it measured "
                             f"{raw:.2f}x the estimated growth per sample between micro-batches "
                             f"{m0} and {m}; bounded to {growth:.2f}x")
        ratio = measured / traced
        if ratio < 1 / MAX_GROWTH:  # the trace counts tensors a real step holds too
            notes.append(f"{label}'s stored calibration is implausible (measured peak "
                         f"{ratio:.3g}x the estimate at micro-batch {m}): it only ever adds to "
                         "the estimate, so the check stays on the safe side")
        return cls(micro_batch=m, measured_peak_bytes=measured, estimate_bytes=traced,
                   growth=growth, notes=tuple(notes))

    @classmethod
    def ratio(cls, ratio: float) -> Calibration:
        """A plain measured/estimate ratio (``assert_fits(calibration=...)``), applied to the
        growth and never below 1."""
        return cls(micro_batch=1, measured_peak_bytes=0, estimate_bytes=0,
                   growth=min(max(float(ratio), 1.0), MAX_GROWTH))

    def offset_bytes(self) -> int:
        """What the measured peak had beyond the (growth-scaled) estimate: never negative."""
        return max(0, self.measured_peak_bytes - int(self.estimate_bytes * self.growth))

    def apply(self, traced_bytes: int) -> int:
        """A traced peak corrected by the measurement: at least the traced peak."""
        return int(traced_bytes * self.growth) + self.offset_bytes()

    def traced_limit(self, usable_bytes: int) -> int:
        """The largest traced peak whose corrected figure stays within ``usable_bytes``."""
        return int((usable_bytes - self.offset_bytes()) / self.growth)

    def describe(self) -> str:
        """E.g. ``+12.0 MiB measured beyond the estimate at micro-batch 8, growth x1.00``."""
        return (f"+{format_bytes(self.offset_bytes())} measured beyond the estimate at "
                f"micro-batch {self.micro_batch}, per-sample growth x{self.growth:.2f}")
