"""What a search spent (``Tally``) and how far it got (``Reach``): the executor keeps both."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.knobs import Knobs
from autotune.schema import RunRecord


@dataclass
class Tally:
    """What a search spent, from its start: child runs, their cost and every run's record."""

    start: float
    num_runs: int = 0
    cost: dict[str, float] = field(default_factory=lambda: {
        "child_s": 0.0, "compile_s": 0.0, "timed_s": 0.0})
    compiles: list[int] = field(default_factory=lambda: [0, 0])
    """Compiled runs, and those whose graphs all came from inductor's on-disk cache."""
    run_log: list[RunRecord] = field(default_factory=list)
    """Every child run: the study's stored ones first, then this search's, in order."""


@dataclass
class Reach:
    """How far a search got: what one stopped early never reached is said in
    ``TunedConfig.not_reached`` (``driver.not_reached``)."""

    stage: str = ""
    """The stage running now (said with each run's progress)."""
    entered: list[str] = field(default_factory=list)
    """The stages entered, in order."""
    ran_in: set[str] = field(default_factory=set)
    """The stages where a run began (``begin``)."""
    considered: set[tuple[str, str]] = field(default_factory=set)
    """(precision, compile mode) of the settings a run began on, or ruled out."""
    began: set[Knobs] = field(default_factory=set)
    """The settings a run began on (or the study answered for)."""
    screened: set[str] = field(default_factory=set)
    """The knobs whose screening ran a value or ended."""
    part: str = ""
    """The part of the stage running now whose reach is said apart ("": none): the confirm
    stage's race (``race``), after its first re-measures and the joint screen again."""
    parts: set[str] = field(default_factory=set)
    """The parts where a run began (``begin``)."""
    classes_screened: set[str] = field(default_factory=set)
    """The knobs screened per class (``Knob.per_class``) whose screening on every class
    ended: a value no run tried was ruled out, not left unreached."""

    def enter(self, name: str) -> None:
        if name != self.stage:
            self.part = ""
        self.stage = name
        if name not in self.entered:
            self.entered.append(name)

    def begin(self, knobs: Knobs) -> None:
        """A run of ``knobs`` begins (or the study answers for one): its stage, its setting
        and, in the knobs stage, the knobs it changes count as reached."""
        self.ran_in.add(self.stage)
        if self.part:
            self.parts.add(self.part)
        self.began.add(knobs)
        self.consider(knobs)
        if self.stage == "knobs":
            self.screened.update(knobs.changed())

    def consider(self, knobs: Knobs) -> None:
        """A setting a run began on, or that a bound ruled out, counts as reached."""
        self.considered.add((knobs.precision, knobs.compile_mode))

    def screen(self, name: str) -> None:
        """A knob's screening ran a value or ended: it counts as reached."""
        self.screened.add(name)
