"""The knobs stage: each further knob screened on the leader, one at a time, in a fixed order;
the best value becomes the leader for the next knob.

``screen`` times each knob value on the leader, probes the values that free memory where
memory binds (checkpointing only above its setting's fit without it: ``probe_recompute``), and
the values that peaked lower above the leader's micro-batch (``probe_lowered``); a knob whose
best value depends on the class is screened on the other classes' best too
(``screen_per_class``). ``docs/search.md`` states the rules once.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.config import Knobs
from autotune.knob_rules import skip_reason
from autotune.knobs import KNOB, KNOBS, Knob
from autotune.memory import Steps, drive
from autotune.search import bounds, fits
from autotune.search._records import Candidate
from autotune.search.batch import run_chains
from autotune.search.executor import Executor
from autotune.search.intervals import Interval
from autotune.search.plan import recompute_twin
from autotune.search.rules import skip
from autotune.search.stages.probe import probe_setting, setting_steps


def run(ex: Executor) -> None:
    """The stage (``docs/search.md``)."""
    screen(ex)


def screen(ex: Executor, *, timing_only: bool = False) -> None:
    """The knobs stage: each further knob on the leader, one at a time (``docs/search.md``).

    ``timing_only``: only the knobs whose values free no memory, at the leader's
    micro-batch (after refinement moved the leader to another micro-batch, where their
    effect can differ: an optimizer step weighs more beside smaller micro-batches)."""
    lowered: list[tuple[str, str, Candidate]] = []  # (knob, value, where it was timed)
    after: dict[str, Candidate] = {}  # per timing knob, the leader once it was screened
    for knob in KNOBS[2:]:
        if timing_only and knob.frees_memory:
            continue
        leader = ex.ev.leader()
        if leader is None:
            return
        knobs_after = screen_knob(ex, knob, leader, lowered)
        if knobs_after and len(ex.plan.values.get(knob.name, ())) > 1:
            after[knob.name] = knobs_after  # (a knob of one value screens nothing)
    if not timing_only:
        for knob in KNOBS[2:]:
            if knob.per_class:
                screen_per_class(ex, knob)
                ex.reach.classes_screened.add(knob.name)
        screen_capped(ex)
    probe_lowered(ex, lowered)
    final = ex.ev.leader()
    stale = {name: on for name, on in after.items() if final is not None
             and on.knobs != final.knobs and on.micro_batch == final.micro_batch}
    if not timing_only and stale and final is not None:
        # A knob screened before a later one changed the leader's setting: its best value
        # can depend on the other's (an optimizer implementation on channels_last), so
        # its values are timed again on the final leader, once. (A leader at another
        # micro-batch is screened again after refinement, ``refine.run``.)
        known = len(ex.ev.results)
        screen(ex, timing_only=True)
        if len(ex.ev.results) > known:
            on = next(iter(stale.values()))
            ex.ev.decide(skip(
                "rescreen", final.key(), "" if len(stale) == 1 else "several",
                knobs=", ".join(stale), on=on.knobs.label()))


def screen_per_class(ex: Executor, knob: Knob) -> None:
    """A knob whose best value depends on the class (``Knob.per_class``) on each other
    class's best setting, where it could make that class win: that class's best times the
    most the knob can gain (``WorkloadTraits.padding_ceiling``: the worst-case length over
    the mean length, no policy does less work than the real tokens) reaches the leader's
    score within the noise (rule ``per-class``)."""
    leader = ex.ev.leader()
    if leader is None or not any(
            v != knob.default and skip_reason(leader.knobs.with_(**{knob.name: v}),
                                              ex.ev.traits) is None
            for v in ex.plan.values.get(knob.name, ())):
        return  # no value beyond its default applies here (a fixed-shape workload)
    top = ex.ev.score(leader) or 0.0
    gain = max(1.0, ex.ev.traits.padding_ceiling if ex.ev.traits else 1.0)
    for score, best in other_classes_best(ex, leader, knob):
        if not top:
            continue
        noise = ex.ev.noise(best, leader)
        if Interval(top, noise).beats(score * gain):
            ex.ev.decide(skip(
                "per-class", best.knobs.label(), knob=knob.name, share=score / top,
                leader=leader.key(), gain=gain, noise=noise))
            continue
        screen_knob(ex, knob, best, [])


def now_or_beside(ex: Executor, chain: Steps[object], chains: list[Steps[object]]) -> None:
    """With one slot, ``chain`` runs now (what comes after it is decided on its runs); with
    several, it joins ``chains``, which ``batch.run_chains`` runs side by side."""
    if ex.slots is None:
        drive(chain, ex.measure)
    else:
        chains.append(chain)


def other_classes_best(ex: Executor, leader: Candidate, knob: Knob
                       ) -> list[tuple[float, Candidate]]:
    """Each class other than the leader's: its best candidate with ``knob`` at its default,
    and its score. A run stopped early behind the leader counts: at the default value a
    class that could win with another is often clearly behind (its few steps are its
    speed)."""
    found = []
    for cls in ex.plan.classes:
        if (cls.precision, cls.compile_mode) == (leader.knobs.precision,
                                                 leader.knobs.compile_mode):
            continue
        timed = [(s, c) for c in ex.ev.results if c.knobs.precision == cls.precision
                 and c.knobs.compile_mode == cls.compile_mode
                 and getattr(c.knobs, knob.name) == knob.default
                 and (s := ex.ev.score(c)) is not None]
        if timed:
            found.append(max(timed, key=lambda t: t[0]))
    return found


def screen_capped(ex: Executor) -> None:
    """Checkpointing on each other class's best where memory caps that class (its largest
    calm fit is below the per-device batch), probed above that fit (``recompute_steps``)
    where a larger micro-batch could make the class win (``bounds.capped_reach``, rule
    ``capped-class``): the knobs stage screens checkpointing on the leader alone, and a
    class behind at the micro-batches it fits can lead at one only checkpointing fits
    (the replay's budget-shrink table of BERT on the Xeon: bf16 eager 0.74x the leader at 2
    and 0.45x at 4, its largest fit, checkpointed at 8 the best, 1.26x it, where no smaller
    micro-batch said so; issue 59's successive-halving baseline, which times every memory
    class at its fit, found it)."""
    leader = ex.ev.leader()
    ckpt = KNOB["checkpointing"]
    values = [v for v in ex.plan.values.get("checkpointing", ()) if v in ckpt.frees_memory]
    if leader is None or not values:
        return
    chains: list[Steps[object]] = []
    for _, best in other_classes_best(ex, leader, ckpt):
        fit = fits.largest_fit(ex.ev, best.knobs, calm=True)
        if not fit or fit >= ex.plan.per_device:
            continue
        untried = [knobs for v in values if (knobs := best.knobs.with_(checkpointing=v))
                   not in ex.ev.probes and skip_reason(knobs, ex.ev.traits) is None]
        if not untried:
            continue
        why = bounds.capped_reach(ex.ev, best, leader)
        if why is not None:
            ex.ev.decide(why)
            continue
        for knobs in untried:
            now_or_beside(ex, recompute_steps(ex, knobs), chains)
    run_chains(ex, chains)


def screen_knob(ex: Executor, knob: Knob, leader: Candidate,
                lowered: list[tuple[str, str, Candidate]]) -> Candidate | None:
    """The knobs stage for one knob: each of its values on ``leader`` (``screen``); a value that
    peaked below the leader joins ``lowered``. For a knob that frees no memory, the
    leader after it (None for one that does). Each value's runs are a chain of their own
    (``value_steps``, ``probe_recompute``, ``setting_steps``): one after another with one
    slot; with several, the values' chains side by side (``batch.run_chains``), each decided
    on the leader as the knob's screening began."""
    chains: list[Steps[object]] = []
    for value in ex.plan.values.get(knob.name, ()):
        if value == getattr(leader.knobs, knob.name):
            continue
        knobs = leader.knobs.with_(**{knob.name: value})
        timed_here = Candidate(knobs=knobs, micro_batch=leader.micro_batch)
        recompute = knob.name == "checkpointing" and value in knob.frees_memory
        if knobs in ex.ev.probes or (timed_here in ex.ev.results and not recompute):
            continue  # (a recompute's run there, stored, says nothing of its probe)
        reason = skip_reason(knobs, ex.ev.traits)
        why = skip("not-applicable", knobs.label(), reason=reason) if reason else None
        if why is None and value in knob.frees_memory:
            why = bounds.frees_nothing(ex.ev, leader)
        if why is None and recompute:
            why = bounds.recompute(ex.ev, leader)
        if why:
            ex.ev.decide(why.within("not-tried", knobs.label()))
            continue
        chain = recompute_steps(ex, knobs) if recompute else setting_steps(ex, knobs) \
            if value in knob.frees_memory else value_steps(ex, knob, value, leader, lowered)
        now_or_beside(ex, chain, chains)
    run_chains(ex, chains)
    now = ex.ev.leader()
    ex.reach.screen(knob.name)
    return None if knob.frees_memory else now


def value_steps(ex: Executor, knob: Knob, value: str, leader: Candidate,
                lowered: list[tuple[str, str, Candidate]]) -> Steps[None]:
    """A value of a knob that frees no memory timed on the leader at its micro-batch;
    probed where it needs more memory than the leader's, or joins ``lowered`` where it
    peaked lower (``screen_knob``)."""
    knobs = leader.knobs.with_(**{knob.name: value})
    timed_here = Candidate(knobs=knobs, micro_batch=leader.micro_batch)
    result = yield ex.spec(timed_here)
    if result.status == "oom":  # it needs more memory than the leader's
        yield from setting_steps(ex, knobs)
    elif fits.lower_peak(ex.ev, leader, timed_here):  # its boundary may be above the leader's
        lowered.append((knob.name, value, timed_here))


def probe_recompute(ex: Executor, knobs: Knobs) -> None:
    """``recompute_steps`` one run at a time."""
    drive(recompute_steps(ex, knobs), ex.measure)


def recompute_steps(ex: Executor, knobs: Knobs) -> Steps[None]:
    """Probe a checkpointing value above the largest micro-batch its setting fits without
    it: checkpointing recomputes each checkpointed block's forward, so at a micro-batch
    the setting fits without it (without allocator retries: memory pressure is what
    freeing memory can relieve), it runs no faster (``bounds.recompute``) and is not
    run there. The probe starts at the next micro-batch up, timed; where that does not
    fit either, the value fits nothing that could win, and is left out of the probes (its
    smaller micro-batches were never tried: "fits none" would be wrong), with the reason."""
    twin = recompute_twin(knobs)
    usable = ex.plan.usable
    # A fit under memory pressure (allocator retries) is no floor: there, freeing memory
    # can make a step faster.
    fit = fits.largest_fit(ex.ev, twin, calm=True)
    if not fit:  # nothing known to fit without it: the whole range is open
        yield from setting_steps(ex, knobs)
        return
    if fit >= ex.plan.per_device:
        ex.ev.decide(skip(
            "recompute-twin", knobs.label(), "whole-batch", context="not-tried",
            twin=twin.label(), per_device=ex.plan.per_device, largest=fit))
        return
    probe = yield from setting_steps(ex, knobs, above=fit)
    if probe.max_micro_batch:
        ex.ev.decide(skip("recompute-twin", knobs.label(), "below-fit",
                          twin=twin.label(), largest=fit))
        return
    ex.ev.unfound(knobs)
    first = probe.steps[0] if probe.steps else None
    seen: dict[str, int | str] = {} if first is None else {"first": first.micro_batch} | (
        {"first_peak": _bytes(first.peak_bytes), "usable": usable}
        if first.status == "ok" else {"status": first.status})
    variant = ("fits-none" if first is None else
               "fits-none-peak" if first.status == "ok" else "fits-none-status")
    ex.ev.decide(skip("recompute-twin", knobs.label(), variant, twin=twin.label(),
                      largest=fit, **seen))


def probe_lowered(ex: Executor, lowered: Sequence[tuple[str, str, Candidate]]) -> None:
    """Probe above the leader's micro-batch the knob values that peaked below it there
    (``lowered``: each value with the candidate it was timed as, on the leader then).

    Their savings add up: two values that alone fit no larger micro-batch may fit one
    together (e.g. a multi-tensor optimizer's and another memory format's), so the
    lowest-peak value of each knob is first timed together on the leader at its
    micro-batch (unless that setting ran already: one of them became the leader, and the
    next was timed on it). Then, lowest peak first, each is probed above where the next
    micro-batch may fit by the growth per sample (``fits.growth``); one whose peak is
    not below
    a setting whose probe fit nothing larger is not (it would end in an out-of-memory
    too). The gain ceiling still decides each step of a probe (``bounds.larger``)."""
    leader = ex.ev.leader()
    if leader is None:
        return
    here = [(name, value, c) for name, value, c in lowered
            if c.micro_batch == leader.micro_batch and ex.ev.results.get(c) is not None]
    peak = {c: ex.ev.results[c].peak_bytes or 0 for _, _, c in here}
    changes: dict[str, str] = {}
    for name, value, _c in sorted(here, key=lambda t: peak[t[2]]):
        changes.setdefault(name, value)
    together = Candidate(knobs=leader.knobs.with_(**changes), micro_batch=leader.micro_batch)
    if together.knobs != leader.knobs and together not in ex.ev.results \
            and together.knobs not in ex.ev.probes \
            and skip_reason(together.knobs, ex.ev.traits) is None:
        ex.measure(ex.spec(together))
        if fits.lower_peak(ex.ev, leader, together):
            peak[together] = ex.ev.results[together].peak_bytes or 0
    pool = [c for c in peak if c.knobs not in ex.ev.probes]
    none_above: Candidate | None = None  # the lowest peak whose probe fit nothing larger
    for c in sorted(pool, key=peak.__getitem__):
        m = c.micro_batch
        above = next(x for x in ex.plan.micro_batches if x > m)
        growth = fits.growth(ex.ev, c.knobs, m, above)
        need = None if growth is None else peak[c] + growth * (above - m)
        if none_above is not None:
            ex.ev.decide(skip(
                "peak-not-below", c.knobs.label(), micro_batch=m, peak=peak[c],
                other=none_above.knobs.label(), other_peak=peak[none_above]))
        elif need is not None and need > ex.plan.usable:
            ex.ev.decide(skip(
                "growth-over-budget", c.knobs.label(), micro_batch=m, peak=peak[c],
                need=int(need), above=above, growth=int(growth or 0),
                usable=ex.plan.usable))
        else:
            steps = probe_setting(ex, c.knobs).steps
            if not any(s.fits for s in steps if s.micro_batch > m) and any(
                    s.micro_batch > m for s in steps):  # tried above: nothing larger fit
                none_above = c


def _bytes(num_bytes: int | None) -> int | str:
    """A peak as a figure: its bytes, or ``-`` where it was not measured."""
    return "-" if num_bytes is None else num_bytes
