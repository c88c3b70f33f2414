"""``autotune.json``'s records of what a search spent (``SearchCost``) and where it recorded its
runs (``StudyRecord``). ``autotune.schema`` re-exports them. No torch import here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autotune.schema_types import Count, Float
from autotune.serialize import STRICT_FIELDS, Text


@dataclass(frozen=True, kw_only=True)
class SearchCost:
    """Where a search's time went, over every child run (memory probes included)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    num_runs: Count
    child_s: Float
    """Wall time of the child runs, start-up included."""
    compile_s: Float
    """Of that, compiling (the compiled runs' warm-up beyond the same steps once compiled)."""
    num_compiled_runs: Count = 0
    num_cached_compiles: Count = 0
    """Compiled runs whose graphs all came from inductor's on-disk caches (compiled before,
    by another child of the same setting and micro-batch, or an earlier search)."""
    timed_s: Float
    """Of that, timed steps."""
    parallel: Count = 1
    """Slots the search ran children on at once (``--parallel``)."""
    wall_s: Float | None = None
    """The search's wall time, from its first run to its last (None: not recorded)."""
    device_s: Float | None = None
    """Device-seconds its children held: each run's wall times the devices its job held."""

    def describe(self) -> str:
        """``12 child runs, 310 s (compile 95 s, timed steps 120 s; 2 of 6 compiled runs
        reused inductor's cache)``; with several slots, their wall time and device-seconds."""
        cached = (f"; {self.num_cached_compiles} of {self.num_compiled_runs} compiled runs "
                  "reused inductor's cache" if self.num_compiled_runs else "")
        slots = (f"; on {self.parallel} slots at once: {self.wall_s:,.0f} s wall, "
                 f"{self.device_s:,.0f} device-seconds" if self.parallel > 1
                 and self.wall_s is not None and self.device_s is not None else "")
        return (f"{self.num_runs} child runs, {self.child_s:,.0f} s (compile "
                f"{self.compile_s:,.0f} s, timed steps {self.timed_s:,.0f} s{cached}){slots}")


@dataclass(frozen=True, kw_only=True)
class StudyRecord:
    """The Optuna study the search recorded its runs in."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    storage: Text = ""
    """Its storage URL (the local study store, or ``--storage``); empty: kept in memory only."""
    name: Text = ""
    note: Text = ""
    """What the store said: why it was not used, or a damaged file moved aside."""

    @property
    def failed(self) -> bool:
        """Whether the store failed during the search (its note says so, ``STORE_FAILED``):
        the runs from then on are not recorded."""
        return self.note.startswith(STORE_FAILED) or f"; {STORE_FAILED}" in self.note


STORE_FAILED = "failed while "
"""How the study's note says the store failed during the search (``search._ledger``)."""
