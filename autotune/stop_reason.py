"""Why a search ended: a value the search hands to the report, the page and the exit code.
``autotune.config`` re-exports it with the other values that pass between the stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class StopReason:
    """Why a search ended, as a value from the search to the report, the page and the exit
    code (nothing parses its sentence back). ``autotune.json`` keeps its written form
    (``TunedConfig.stopped_by``)."""

    kind: Literal["end", "max-trials", "time-budget", "signal"] = "end"
    """``end``: it ran to its end; a limit; or a signal (Ctrl-C, SIGTERM)."""
    detail: str = ""
    """``max-trials``: the child runs made; ``time-budget``: the candidate whose run it cut
    ("" between runs); ``signal``: the signal's name (``SIGINT`` for Ctrl-C)."""
    during: str = ""
    """After the search: what the signal cut (e.g. ``calibrating``); "" during it."""

    @classmethod
    def signal(cls, exc: BaseException, during: str = "") -> StopReason:
        """The stop a Ctrl-C or a signal made (``exc``: ``KeyboardInterrupt``, or
        ``Interrupted`` naming its signal), during the search or after it (``during``)."""
        return cls("signal", getattr(exc, "signal_name", None) or "SIGINT", during)

    @property
    def interrupted(self) -> bool:
        """Whether it ended before its end (a limit or a signal): best so far."""
        return self.kind != "end"

    @property
    def by_signal(self) -> bool:
        return self.kind == "signal"

    @property
    def exit_code(self) -> int:
        """The CLI's exit status for a signal: 143 for SIGTERM, 130 for Ctrl-C."""
        return 143 if self.detail == "SIGTERM" else 130

    @property
    def stopped_by(self) -> str:
        """What stopped it, as ``autotune.json`` writes it (``TunedConfig.stopped_by``), e.g.
        ``--max-trials reached (60 child runs)``; "" when it ran to its end."""
        if self.kind == "max-trials":
            return f"--max-trials reached ({self.detail} child runs)"
        if self.kind == "time-budget":
            return "--time-budget reached" + (
                f" during a run of {self.detail} (stopped)" if self.detail else "")
        if self.kind == "signal":
            said = "Ctrl-C" if self.detail == "SIGINT" else self.detail
            return f"interrupted ({said})" + (f" while {self.during}" if self.during else "")
        return ""

    def __str__(self) -> str:
        if not self.interrupted:
            return "every class was tried or pruned with a reason"
        return self.stopped_by + (": best config kept" if self.during else ": best so far")
