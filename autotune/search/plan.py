"""The plan: the candidate space of one search and the relations between its settings.

What a search may try (the memory classes the device supports and the user allows, the knob
values, the divisors of the per-device batch), in which order, and how two settings relate:
the same memory class (``memory_class``), the most alike (``alike``), the recompute twin
(``Knobs.with_(checkpointing="off")``), the same graphs (``Candidate.graph``). The algorithm
that walks it is stated once in ``docs/search.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.config import Knobs, ProbeReport
from autotune.device import backend_for
from autotune.knobs import KNOBS, job_baseline, timed_baseline
from autotune.space import divisors

FIRST_MODES = ("off", "default")
"""The compile modes every precision is probed with first; the others refine ``default``."""


@dataclass(frozen=True)
class Plan:
    """The space one search walks: fixed when it starts."""

    report: ProbeReport
    classes: tuple[Knobs, ...]
    values: Mapping[str, tuple[str, ...]]
    """Per knob beyond precision and compile mode, the values it may screen."""

    @classmethod
    def of(cls, report: ProbeReport, classes: Sequence[Knobs],
           values: Mapping[str, Sequence[str]] | None) -> Plan:
        return cls(report, tuple(classes), {k: tuple(v) for k, v in (values or {}).items()})

    @property
    def per_device(self) -> int:
        return self.report.per_device_batch()

    @property
    def micro_batches(self) -> list[int]:
        """The divisors of the per-device batch: the effective batch stays exact."""
        return divisors(self.per_device)

    @property
    def base(self) -> Knobs:
        """fp32 eager in the job's strategy: what an untuned user runs (the baseline)."""
        return job_baseline(self.values.get("strategy", ("none",))[0])

    def baseline_setting(self, knobs: Knobs) -> bool:
        """Whether ``knobs`` is the base class or the baseline's timed setting on it (each
        batch padded to its longest, ``knobs.timed_baseline``): timed in full, its FLOPs
        counted."""
        return knobs in (self.base, timed_baseline(self.base, True))

    @property
    def usable(self) -> int:
        return self.report.usable_bytes()

    @property
    def compile_in_peak(self) -> bool:
        """Whether a compile's own memory counts in the peak (CPU): a compiled candidate then
        fits a user's first launch only if a run that compiled its graphs afresh fit."""
        return backend_for(self.report.device.device).compile_in_peak

    @property
    def peaks_flatten(self) -> bool:
        """Whether this device's peaks grow less per sample at larger micro-batches before a
        probe shows it (CPU: ``DeviceBackend.peaks_flatten``)."""
        return backend_for(self.report.device.device).peaks_flatten

    def allowed(self, knobs: Knobs) -> bool:
        """Whether a stored run's setting is in this search's space (a resumed or shared study
        may hold settings this search is restricted from); the baseline's is always."""
        if self.baseline_setting(knobs):
            return True
        return (knobs.precision, knobs.compile_mode) in {
            (c.precision, c.compile_mode) for c in self.classes} and all(
            getattr(knobs, k.name) == k.default or getattr(knobs, k.name) in self.values.get(
                k.name, ()) for k in KNOBS[2:])

    def first_classes(self) -> list[Knobs]:
        """The classes probed first: eager and default-compiled, the baseline first, eager
        before compiled (the probe stage reorders the compiled ones by their precision's
        eager speed as it goes)."""
        return sorted((c for c in self.classes if c.compile_mode in FIRST_MODES),
                      key=lambda c: (c != self.base, c.compiled))

    def refining_classes(self) -> list[Knobs]:
        """The compile modes beyond off and default: refinements of ``default``."""
        return [c for c in self.classes if c.compile_mode not in FIRST_MODES]


def alike(other: Knobs, knobs: Knobs) -> tuple[bool, int]:
    """How alike two settings are, for picking a sibling to predict from: the same precision
    and compile mode first, then the number of knobs they share."""
    return ((other.precision, other.compile_mode) == (knobs.precision, knobs.compile_mode),
            sum(getattr(other, f.name) == getattr(knobs, f.name)
                for f in dataclasses.fields(knobs)))


def memory_class(knobs: Knobs) -> tuple[str, ...]:
    """The knobs that set how a setting's peak grows with the micro-batch: precision, compile
    mode and the values that free memory (checkpointing, allocator, strategy). An optimizer
    implementation or memory format moves the peak by a fixed amount."""
    return tuple(getattr(knobs, k.name) for k in KNOBS
                 if k.frees_memory or k.name in ("precision", "compile_mode"))


def recompute_twin(knobs: Knobs) -> Knobs:
    """The setting without checkpointing: where it fits, checkpointing runs no faster."""
    return knobs.with_(checkpointing="off")
