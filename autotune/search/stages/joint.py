"""The joint screen: the knobs that free no memory, screened where they interact with the
others (issue 59), after the knobs stage's screen of one knob at a time on the leader.

A knob's gain can hold on one setting and not another (an optimizer implementation that gains
on eager code, whose compiled graph fuses the update already; a gain that holds only without
checkpointing, where checkpointing leads at a larger micro-batch), and a value that needs more
memory can tie where the leader's micro-batch presses it and win one divisor down. So the
values are screened on each setting's best (an "anchor": a setting with those knobs at their
defaults, its best candidate) that could win with them (``reach_bounds.knob_reach``), and a value
that did not fit or tied with the leader at its anchor's micro-batch is timed one divisor
down; one that did not fit is timed with each checkpointing value that frees memory too. A
run over the budget that could win, of any setting at any micro-batch, is timed there with
checkpointing and with each timing knob's value (``relieved``).

The runs are proposed as one batch from the evidence (``proposals``: a list of ``Proposal``,
each a run the evidence takes in any order); one worker runs them, and the next batch is
proposed from what they found, until none is left. ``docs/search.md`` states the rules once.
"""

from __future__ import annotations

from autotune.config import Knobs
from autotune.knob_rules import skip_reason
from autotune.knobs import KNOB, KNOBS
from autotune.search import reach_bounds
from autotune.search._records import OUT_OF_MEMORY, Candidate, objective, score
from autotune.search.batch import run_batches
from autotune.search.evidence import Evidence
from autotune.search.executor import Executor, Proposal
from autotune.search.intervals import Interval
from autotune.search.rules import Skip, skip

TIMING = tuple(k for k in KNOBS[2:] if not k.frees_memory and not k.per_class)
"""The knobs the joint screen times: those whose values change speed, not memory's growth."""
ROUNDS = 4
"""Most batches proposed in turn (each proposes only runs not made yet: it ends anyway)."""


def run(ex: Executor) -> None:
    """The stage: batches of proposals, each run, until none is left (``proposals``; with
    several slots, proposed again as each result is told: ``batch.run_batches``)."""
    run_batches(ex, lambda: proposals(ex), ROUNDS)


def anchor_of(knobs: Knobs) -> Knobs:
    """The setting with the timing knobs at their defaults (what they are screened on)."""
    return knobs.with_(**{k.name: k.default for k in TIMING})


def anchors(ev: Evidence) -> dict[Knobs, Candidate]:
    """Per anchor setting, its best candidate with a complete timed run (the timing knobs at
    any value), best first."""
    best: dict[Knobs, Candidate] = {}
    for c in ev.ranked():
        best.setdefault(anchor_of(c.knobs), c)
    return best


def ties(ev: Evidence) -> list[tuple[Knobs, Candidate, Candidate]]:
    """(anchor setting, a tied candidate, the anchor's best) for each other micro-batch of an
    anchor whose best ties with the anchor's best within the noise of the two (``Interval``),
    and for each other value of the timing knobs at the best's own micro-batch that ties with
    it, rule ``joint`` (``tie``): on a noisy machine one run does not settle at which
    micro-batch a setting runs best, nor which of two values of a knob does, and a knob's gain
    on one is not the same on the other (an optimizer's update is a larger share of a smaller
    micro-batch's step; channels_last and a fused update each behind the plain setting by one
    unlucky run, their pair the best, never timed)."""
    best = anchors(ev)
    found: list[tuple[Knobs, Candidate, Candidate]] = []
    seen: set[tuple[Knobs, int, Knobs | None]] = set()
    for c in ev.ranked():
        a_knobs = anchor_of(c.knobs)
        top = best.get(a_knobs)
        # a micro-batch's best; at the best's own micro-batch, each other value
        mark = (a_knobs, c.micro_batch, c.knobs if c.micro_batch == top.micro_batch else None) \
            if top is not None else None
        if top is None or c == top or mark in seen:
            continue
        seen.add(mark)
        score, top_score = ev.score(c, full=True), ev.score(top, full=True)
        if score and top_score and not Interval(top_score, ev.noise(c, top)).beats(score):
            found.append((a_knobs, c, top))
    return found


def proposals(ex: Executor) -> list[Proposal]:
    """The next runs of the joint screen, from the evidence now, each said (``joint``) or its
    anchor's skip said (``knob-reach``): the timing knobs' values on each anchor that could
    win with them, and one divisor down (or with checkpointing) where a value tied or did not
    fit (``down``)."""
    ev = ex.ev
    leader = ev.leader()
    if leader is None or ev.settings.train_steps:
        return []
    batch: dict[Candidate, Proposal] = {}
    said = {(s.rule, s.target) for s in ev.skips}

    def decide(note: Skip) -> None:
        if (note.rule, note.target) not in said:
            said.add((note.rule, note.target))
            ev.decide(note)

    def propose(key: Candidate, probed: bool = False) -> None:
        if key not in ev.results and key not in batch and (probed or key.knobs not in ev.probes) \
                and key.micro_batch in ev.plan.micro_batches \
                and skip_reason(key.knobs, ev.traits) is None:
            batch[key] = Proposal(key, ex.spec(key))

    tie_list = ties(ev)
    tied = {c: top for _, c, top in tie_list}
    for a_knobs, anchor in [*anchors(ev).items(), *((a, c) for a, c, _ in tie_list)]:
        twin = ev.results.get(Candidate(knobs=a_knobs, micro_batch=anchor.micro_batch))
        if twin is not None and twin.status in OUT_OF_MEMORY:
            continue  # a value's own saving got it there: the knobs stage probed those
        untried = [(k.name, v) for k in TIMING for v in ev.plan.values.get(k.name, ())
                   if v != getattr(anchor.knobs, k.name) and (c := Candidate(
                       knobs=anchor.knobs.with_(**{k.name: v}), micro_batch=anchor.micro_batch))
                   not in ev.results and (anchor in tied or c.knobs not in ev.probes)
                   and skip_reason(c.knobs, ev.traits) is None]
        if not untried:
            continue
        why, reach = reach_bounds.knob_reach(ev, anchor, {name for name, _ in untried})
        if why is not None:
            decide(why)
            continue
        if anchor in tied and reach is not None:
            top = tied[anchor]
            decide(skip("joint", anchor.key(),
                        "tie" if anchor.micro_batch != top.micro_batch else "value-tie",
                        knobs=reach.figures["knobs"],
                        best=top.key(), share=(ev.score(anchor, full=True) or 0.0)
                        / (ev.score(top, full=True) or 1.0), noise=ev.noise(anchor, top)))
        elif anchor != leader and reach is not None:
            decide(reach)
        for name, value in untried:  # (at a tie, a value whose memory was probed too: the
            # refine stage walked it from its own fit, or not at all where it came later)
            propose(Candidate(knobs=anchor.knobs.with_(**{name: value}),
                              micro_batch=anchor.micro_batch), probed=anchor in tied)
    for key, note in [*down(ev, leader), *relieved(ev, leader)]:
        if key not in ev.results and key not in batch:
            decide(note)
        propose(key)
    return list(batch.values())


def relieved(ev: Evidence, leader: Candidate) -> list[tuple[Candidate, Skip]]:
    """Each run that ran every step but peaked over the usable budget (inside the headroom:
    over the cap it would not have run), timed at its micro-batch with each checkpointing
    value that frees memory (other than its own) and with each value of the timing knobs, one
    changed (``joint``, ``over-budget``), where that change could reach the leader within the
    noise: checkpointing frees memory and runs it no faster (the run is its optimistic
    bound), and an optimizer implementation or a memory format moves the peak a little
    either way, so either may land it under, at up to the gain that value showed elsewhere
    (``value_gains``). Any setting's, checkpointed or not, at any micro-batch, not only its
    class's smallest (``near-miss``): the knobs stage screens checkpointing on the leader
    alone, whose fit may hold no gain, while a class whose larger micro-batch ran ahead over
    the budget wins there with it (the replay's budget-shrink and precision-swap tables:
    compiled code over the budget at 8, ahead of the leader; checkpointed at 8, the best),
    and a checkpointed run just over the budget lands under it with a memory format that
    both frees a little and runs faster (the budget-shrink tables of a CNN)."""
    top = ev.score(leader, full=True) or 0.0
    ckpt = KNOB["checkpointing"]
    gains = value_gains(ev)
    found: list[tuple[Candidate, Skip]] = []
    for key, result in ev.results.items():
        if not top or fits(ev, key) or result.status in OUT_OF_MEMORY:
            continue
        sps = score(objective(result, ev.settings), ev.settings)
        noise = ev.noise(key, leader)
        if not sps:
            continue
        offered = [(ckpt, v, 1.0) for v in ckpt.frees_memory
                   if v in ev.plan.values.get("checkpointing", ())
                   and v != key.knobs.checkpointing]
        timing = [(k, v, gains.get((k.name, v), 1.0)) for k in TIMING
                  for v in ev.plan.values.get(k.name, ()) if v != getattr(key.knobs, k.name)]
        alone = not Interval(top, noise).beats(sps)  # (its speed alone reaches the leader)
        for knob, v, gain in [*offered, *timing]:
            c = replace_knob(key, knob.name, v)
            if Interval(top, noise).beats(sps * gain) or skip_reason(c.knobs, ev.traits):
                continue
            found.append((c, skip(
                "joint", c.key(), "over-budget" if alone else "over-budget-gain",
                over=key.key(), share=sps / top, leader=leader.key(),
                peak=result.peak_bytes or 0, usable=ev.plan.usable, noise=noise,
                **({} if alone else {"value": f"{knob.tag}={v}", "gain": gain}))))
    return found


def value_gains(ev: Evidence) -> dict[tuple[str, str], float]:
    """Per timing knob's value, the most it ran faster than its setting without it (the knob
    at its default, the rest the same) at one micro-batch, over every pair timed in full:
    what a run over the budget may gain with it (``relieved``). At least 1: a value not timed
    beside its default yet is bounded by the run alone."""
    gains: dict[tuple[str, str], float] = {}
    for key in ev.results:
        sps = ev.score(key, full=True)
        for k in TIMING:
            value = getattr(key.knobs, k.name)
            if value == k.default or not sps:
                continue
            base = ev.score(replace_knob(key, k.name, k.default), full=True)
            if base:
                gains[(k.name, value)] = max(gains.get((k.name, value), 1.0), sps / base)
    return gains


def down(ev: Evidence, leader: Candidate) -> list[tuple[Candidate, Skip]]:
    """Values timed at an anchor's micro-batch that did not fit there where their setting
    without them fit, or that need more
    memory than their setting without them and tie with it there, within the noise of the
    leader (memory presses them: below, they may gain): each one divisor down, and one that
    did not fit with each checkpointing value that frees memory at the anchor's
    micro-batch."""
    top = ev.score(leader, full=True) or 0.0
    found: list[tuple[Candidate, Skip]] = []
    ckpt = KNOB["checkpointing"]
    for a_knobs, anchor in anchors(ev).items():
        twin = Candidate(knobs=a_knobs, micro_batch=anchor.micro_batch)
        base, base_score = ev.results.get(twin), ev.score(twin)
        for key, result in ev.results.items():
            if anchor_of(key.knobs) != a_knobs or key.knobs == a_knobs \
                    or key.micro_batch != anchor.micro_batch:
                continue
            below = [m for m in ev.plan.micro_batches if m < key.micro_batch]
            score = ev.score(key)
            if not fits(ev, key) and base_score:  # the value's own memory
                how = f"did not fit, where {twin.key()} fit"
                if key.knobs.checkpointing == ckpt.default:
                    found += [(replace_knob(key, "checkpointing", v), skip(
                        "joint", replace_knob(key, "checkpointing", v).key(), "down",
                        above=key.micro_batch, how=how)) for v in ckpt.frees_memory
                        if v in ev.plan.values.get("checkpointing", ())]
            elif score is not None and base is not None and base_score \
                    and (result.peak_bytes or 0) > (base.peak_bytes or 0) \
                    and not Interval(base_score, ev.noise(key, twin)).beaten_by(score) \
                    and not Interval(top, ev.noise(key, leader)).beats(score):
                how = (f"peaked above {twin.key()} and ran {score / base_score:.2f}x it, "
                       f"not faster beyond the noise, {score / top:.2f}x the leader")
            else:
                continue
            if below:
                target = Candidate(knobs=key.knobs, micro_batch=max(below))
                found.append((target, skip("joint", target.key(), "down",
                                           above=key.micro_batch, how=how)))
    return found


def fits(ev: Evidence, key: Candidate) -> bool:
    """Whether a run's candidate fits: it did not run out of memory, nor peak over the usable
    budget (a run that ran, but over the headroom, does not fit either: its value needs
    more memory at that micro-batch, and one divisor down it may win)."""
    result = ev.results[key]
    return result.status not in OUT_OF_MEMORY and ev.record(key, result).verdict not in (
        "oom", "over_budget")


def replace_knob(key: Candidate, name: str, value: str) -> Candidate:
    """``key`` with one knob set to ``value``."""
    return Candidate(knobs=key.knobs.with_(**{name: value}), micro_batch=key.micro_batch)
