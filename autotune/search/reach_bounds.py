"""The bounds on a setting no run of it has shown yet: whether the timing knobs could make a
setting's best win (``knob_reach``, the joint screen), and whether a compiled class that ran
out of memory at every micro-batch could win checkpointed (``oom_class_reach``,
``oom_class_peak``, the probe stage), and whether a compiled class could fit where another
precision's fit nothing (``compile_floor``). Pure, as ``bounds``: each returns ``Skip`` notes and
runs nothing; each rule is stated once in ``docs/search.md``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from autotune.config import Knobs
from autotune.search._records import Candidate
from autotune.search.evidence import Evidence
from autotune.search.intervals import Interval
from autotune.search.rules import Skip, skip

UNBOUNDED_FORMAT = ("a memory layout's gain has no bound the runs can show: eager "
                    "convolutions gain from it what inductor's own layouts already have")
"""Why the joint screen bounds no memory format's gain (``knob_reach``): on CPU tables eager
convolutions ran up to 1.7x with channels_last where compiled code gained 1.06x, so a ceiling
of ``1 / --refine-within`` (1.11x) cut the eager class that won with it."""


def knob_reach(ev: Evidence, anchor: Candidate,
               knobs: set[str]) -> tuple[Skip | None, Skip | None]:
    """Whether the timing knobs ``knobs`` could make ``anchor`` (a setting's best, those knobs
    at their defaults) win: its score times the most they can gain reaches the leader's
    within the noise. The most: for an optimizer implementation alone, the whole update
    saved (the step over the step less its update, as ``anchor``'s run timed them apart:
    no implementation runs the update in less than no time); for any other, or where the
    update was not timed apart, what refinement gains at most (1 / ``--refine-within``).
    Returns (``knob-reach``: it cannot, None: it can; ``joint``: the note saying why it
    is screened there)."""
    leader, result = ev.leader(), ev.results.get(anchor)
    sps, top = ev.score(anchor, full=True), ev.score(leader, full=True) if leader else None
    if leader is None or result is None or not sps or not top:
        return None, None
    step_s = result.median_step_s() or 0.0
    update_s = statistics.median(result.update_times_s) if result.update_times_s else 0.0
    unbounded = 1 / ev.settings.refine_within if ev.settings.refine_within else math.inf
    if knobs == {"optimizer_impl"} and 0 < update_s < step_s:
        ceiling, why = step_s / (step_s - update_s), \
            f"the whole update saved, {update_s / step_s:.0%} of its step"
    elif "memory_format" in knobs:
        ceiling, why = math.inf, UNBOUNDED_FORMAT
    else:
        ceiling, why = unbounded, "what refinement gains at most, 1 / --refine-within"
    noise = ev.noise(anchor, leader)
    figures = {"knobs": ", ".join(sorted(knobs)), "share": sps / top, "leader": leader.key(),
               "why": why, "noise": noise}
    if anchor != leader and Interval(top, noise).beats(sps * ceiling):
        return skip("knob-reach", anchor.key(), ceiling=ceiling, **figures), None
    if math.isinf(ceiling):
        return None, skip("joint", anchor.key(), "unbounded", **figures)
    return None, skip("joint", anchor.key(), ceiling=ceiling, **figures)


UNMEASURED_COMPILE_GAIN = ("no other compiled class ran here, and no cap holds on what "
                           "compiling gains (benchmarks/rule_checks.py (4): up to 248x its "
                           "eager twin)")
"""Why a compiled class out of memory everywhere is probed with checkpointing where nothing
bounds its compile gain (``oom_class_reach``)."""


def oom_class_reach(ev: Evidence, knobs: Knobs,
                    value: str) -> tuple[Skip | None, Skip | None]:
    """Whether a compiled class that ran out of memory at every micro-batch (``knobs``: none timed)
    could win with the checkpointing value that frees most (``value``): its optimistic
    bound, its precision's eager class's best times the most compiling gained here (any
    other compiled class's best, checkpointed ones too, over its precision's eager best; 1
    at least: in the oracles fp32 compiled ran 0.59-0.77x its eager class on the Xeon BERT,
    where bf16 compiled gained 1.30x and won checkpointed) times checkpointing's cost (1: it
    recomputes, so it runs no faster than the same run without it, ``recompute-twin``),
    reaches the leader within the noise. In the oracles that bound held a class that came
    within 3% of the best in each case (``benchmarks/rule_checks.py`` (12)), though one
    precision's gain ran past another's by up to 8.9x. Where no other compiled class ran,
    nothing bounds the gain (``UNMEASURED_COMPILE_GAIN``): probed. Returns
    (``oom-class-reach``: it cannot, or its eager class was not timed (nothing says what it
    runs): not probed, None: probe it; the note said where it is probed)."""
    leader = ev.leader()
    top = ev.score(leader, full=True) if leader else None
    eager = ev.setting_best(knobs.with_(compile_mode="off"))
    if leader is None or not top:
        return None, None
    if eager is None or not (sps := ev.score(eager)):
        return skip("oom-class-reach", knobs.label(), "no-eager",
                    eager=knobs.with_(compile_mode="off").label(), value=value), None
    pairs = [(c_best / e_best, e, c) for c in ev.probes if c.compiled
             and (c.precision, c.compile_mode) != (knobs.precision, knobs.compile_mode)
             and (e := ev.setting_best(c.with_(compile_mode="off", checkpointing="off")))
             is not None and (e_best := ev.score(e)) and (c_best := ev.class_best(c))]
    figures: dict[str, float | int | str] = {
        "eager": eager.key(), "sps": sps, "share": sps / top, "leader": leader.key(),
        "value": value}
    if not pairs:
        return None, skip("oom-class-reach", knobs.label(), "unbounded",
                          why=UNMEASURED_COMPILE_GAIN, **figures)
    measured, e, c = max(pairs, key=lambda t: t[0])
    gain = max(1.0, measured)  # a loss elsewhere says nothing of this precision's gain
    best = ev.setting_best(c)
    noise = ev.noise(eager, leader, e, *([best] if best else []))
    figures |= {"gain": gain, "measured": measured, "compiled": c.label(),
                "its_eager": e.key(), "reach": sps * gain, "noise": noise}
    if Interval(top, noise).beats(sps * gain):
        return skip("oom-class-reach", knobs.label(), **figures), None
    return None, skip("oom-class-reach", knobs.label(), "probed", **figures)


def eager_peaks(ev: Evidence, knobs: Knobs) -> dict[int, int]:
    """The peaks of ``knobs``'s eager class (checkpointing off) by micro-batch, where its
    probe's runs ended ok."""
    probe = ev.probes.get(knobs.with_(compile_mode="off", checkpointing="off"))
    return {s.micro_batch: s.peak_bytes for s in (probe.steps if probe else ())
            if s.status == "ok" and s.peak_bytes}


def no_lower(mine: dict[int, int], theirs: dict[int, int]) -> int | None:
    """The smallest micro-batch two eager classes both ran (``eager_peaks``) where ``mine``
    peaked no lower than ``theirs`` at every one of them; None where it peaked lower at one,
    or they share none. Every micro-batch, not one: bf16 eager peaks below fp32's at the
    largest (its activations are half the bytes) and above at the small ones (its cast
    weights), where a compile's floor shows (``compile_floor``)."""
    common = sorted(set(mine) & set(theirs))
    return common[0] if common and all(mine[m] >= theirs[m] for m in common) else None


def compile_floor(ev: Evidence, knobs: Knobs, missed: Sequence[Knobs]) -> Skip | None:
    """Why a compiled class (``knobs``) is not probed, if so (rule ``compile-floor``): a
    compiled class of another precision and the same compile mode (in ``missed``) fit no
    micro-batch down to the smallest, and ``knobs``'s eager class peaked no lower than that
    one's eager class at every micro-batch both ran (at least one). What was over there is
    what compiling adds, not the activations a smaller micro-batch sheds; a precision that
    needs no less memory eager needs no less compiled (``no_lower``: on the generated and
    recorded tables this bound skipped 67 classes and none that fits, where the largest
    micro-batch alone would have skipped 4 that fit, ``docs/search.md``). None: probe it."""
    mine = eager_peaks(ev, knobs)
    for other in missed:
        if (other.precision == knobs.precision or other.compile_mode != knobs.compile_mode
                or other.checkpointing != knobs.checkpointing):
            continue
        theirs = eager_peaks(ev, other)
        if (m := no_lower(mine, theirs)) is not None:
            return skip("compile-floor", knobs.label(), other=other.label(), micro_batch=m,
                        peak=mine[m], other_peak=theirs[m],
                        common=len(set(mine) & set(theirs)))
    return None


def oom_class_peak(ev: Evidence, knobs: Knobs, missed: Sequence[Knobs],
                   value: str) -> Skip | None:
    """Why a compiled class out of memory everywhere is not probed with checkpointing
    (``value``) after another such class's probe with it fit nothing (``missed``), if so: its
    eager class peaked no lower than that class's eager class at every micro-batch both ran
    (``no_lower``; checkpointing frees activations, not what compiling adds: a class that
    needs more memory eager fits no more compiled). None: probe it (no such class, or no
    common point). Until 2026-11-30 at the largest micro-batch both ran alone."""
    mine = eager_peaks(ev, knobs)
    for other in missed:
        theirs = eager_peaks(ev, other)
        if (m := no_lower(mine, theirs)) is not None:
            return skip("oom-class-reach", knobs.label(), "peak-not-below", value=value,
                        other=other.label(), micro_batch=m, peak=mine[m],
                        other_peak=theirs[m], common=len(set(mine) & set(theirs)))
    return None
