"""The policy: which candidates race, when a race stops, and what a re-check keeps.

Pure decisions on the evidence, every threshold from ``SearchSettings``: the contenders of a
leader (those whose gap is within the noise), the ones timed once within the drift two runs of
one config showed, the pair that runs interleaved rounds, the rounds' stopping rule, and the
verdict on a stored timing re-checked. ``docs/search.md`` states the rules once.
"""

from __future__ import annotations

from autotune.config import TrialResult
from autotune.search import factors
from autotune.search._records import Candidate, SearchSettings
from autotune.search.evidence import Evidence
from autotune.search.intervals import Interval, noise_of
from autotune.search.pick import rounds_ahead
from autotune.search.rules import Skip, skip

ROUNDS = 2
"""Interleaved rounds when they agree."""
ROUNDS_LEAD = 2
"""How many rounds more one of the two must be ahead in for the rounds to stop before
``MOST_ROUNDS`` (a sequential sign test: two rounds that agree stop; 2 of 3 go on)."""
MOST_ROUNDS = 5
"""Interleaved rounds at most: an odd number, so that the last decides a tie."""
SURPRISE_NOISES = 4.0
"""How many of this machine's noise levels a single run lies below what the product of
factors predicts of it (``factors.predicted``) for it to be timed again before a cut."""


def rechecked(key: Candidate, stored: TrialResult, again: TrialResult,
              settings: SearchSettings) -> tuple[bool, Skip]:
    """A stored timing re-checked: whether the fresh run alone counts (the stored one is
    faster beyond the noise: stale, measured on a quieter machine, or another version of
    something the key cannot see, or the fresh run failed), and what the re-check found."""
    before, now = stored.samples_per_s(), again.samples_per_s()
    if not again.ok or now is None or before is None:
        return True, skip("recheck", key.key(), "ended", status=again.status)
    noise = noise_of(settings, stored, again)
    fresh = Interval(before, noise).beats(now)
    verdict = "slower" if fresh else "faster" if Interval(before, noise).beaten_by(now) else \
        "within"
    return fresh, skip("recheck", key.key(), verdict, stored=before, now=now, noise=noise)


def unchecked(winner: Candidate, why: str) -> Skip:
    """A compiled winner's fit as a first launch was not checked, and why."""
    return skip("first-launch-unchecked", winner.key(), why=why)


def another_round(shares: list[float]) -> bool:
    """Whether interleaved rounds go on: ``ROUNDS`` at least, then while neither of the two
    is ahead in ``ROUNDS_LEAD`` rounds more than the other, ``MOST_ROUNDS`` at most. Until
    2026-12-01 a third round where two split, and no more: on the generated replay tables
    (keyed noise, 30 seeds) going on to a lead of two lifted the share of picks within 3%
    of the best by 0.004 (develop) and 0.006 (judge), both beyond the replay's noise, for
    0.0028 and 0.0024 of an exhaustive pass."""
    ahead = rounds_ahead(shares)
    lead = abs(2 * ahead - len(shares))
    return len(shares) < ROUNDS or (len(shares) < MOST_ROUNDS and lead < ROUNDS_LEAD)


def contenders(ev: Evidence) -> list[Candidate]:
    """The leader and up to ``num_confirm`` candidates whose gap to it is within the noise
    (``confirm_within``, or the interval of the two runs' ratio); says why when there are
    none. A leader whose timing came from the study store comes with the next best (run
    in full or stopped early behind it) whatever the gap: a stored run is re-checked."""
    if ev.settings.num_confirm <= 0:
        return []
    ranked = ev.ranked()
    if len(ranked) == 1 and ranked[0] in ev.stored:
        # A stored timing never picks alone, even where every other run stopped early
        # behind it: re-check it beside the best of those.
        behind = sorted((k for k in ev.results if k != ranked[0] and ev.score(k)),
                        key=lambda k: -(ev.score(k) or 0.0))
        return [ranked[0], *behind[:1]]
    if len(ranked) < 2:
        return []
    leader, top = ranked[0], ev.score(ranked[0], full=True) or 0.0

    def noise(key: Candidate) -> float:
        return ev.noise(key, leader)

    close = [k for k in ranked[1:]
             if not Interval(top, noise(k)).beats(ev.score(k, full=True) or 0.0)]
    if not close and ev.stored & {leader, ranked[1]}:
        close = ranked[1:2]  # a stored timing never picks alone: re-check the two
    if not close:
        runner_up = ranked[1]
        share = (ev.score(runner_up, full=True) or 0.0) / top
        ev.decide(skip(
            "clear-lead", leader.key(), runner_up=runner_up.key(), share=share,
            noise=noise(runner_up), confirm_within=ev.settings.confirm_within))
    return [leader, *close[:ev.settings.num_confirm]]


def within_drift(ev: Evidence) -> list[Candidate]:
    """Up to ``num_confirm`` settings' best candidates run once (in full, or stopped early
    behind) whose gap to the leader is within the widest drift between two runs of one config
    in this search (``Evidence.stall``), one per setting other than the leader's, best first,
    each said in ``skipped``: a run of a shared machine lands that far from another of the
    same config, so one run that far behind is not behind at all (a setting's other
    micro-batches were judged against its own runs, by its walk)."""
    widest = max(ev.drift.items(), key=lambda kv: kv[1], default=None)
    leader = ev.leader()
    if widest is None or leader is None or not widest[1]:
        return []
    top, (config, drift) = ev.score(leader, full=True) or 0.0, widest
    best: dict[object, Candidate] = {}
    for k in sorted(ev.results, key=lambda k: -(ev.score(k) or 0.0)):
        if ev.score(k) is not None and k.knobs != leader.knobs:
            best.setdefault(k.knobs, k)
    once = [k for k in best.values() if ev.runs.get(k, 1) < 2 and k not in ev.stored
            and not Interval(top, drift).beats(ev.score(k) or 0.0)][:ev.settings.num_confirm]
    for key in once:
        share = (ev.score(key) or 0.0) / top
        ev.decide(skip("within-drift", key.key(), share=share, leader=leader.key(),
                       drift=drift, config=config.key()))
    return once


def surprises(ev: Evidence) -> list[Candidate]:
    """Up to ``num_confirm`` candidates run once whose run came out below what the product of
    factors predicts of them (``factors.predicted``) by more than ``SURPRISE_NOISES`` of this
    machine's noise, where that prediction would be refined (``Evidence.refine_floor``),
    the furthest predicted first: a run that stalled is only slower and nothing in it says
    so, and a class at the whole batch is never walked, so a best one stall put behind is
    timed again here, before the race (each said in ``skipped``)."""
    leader = ev.leader()
    top = ev.score(leader, full=True) if leader is not None else None
    if leader is None or not top:
        return []
    found = sorted(((key, note) for key in ev.results if key != leader
                    and ev.runs.get(key, 1) < 2 and key not in ev.stored
                    and (note := _surprise(ev, key, leader, top))),
                   key=lambda kn: -float(kn[1].figures["predicted"]))[:ev.settings.num_confirm]
    for _, note in found:
        ev.decide(note)
    return [key for key, _ in found]


def _surprise(ev: Evidence, key: Candidate, leader: Candidate, top: float) -> Skip | None:
    """``re-measure-first``'s note where ``key``'s single run lies under what the product of
    factors predicts of it (``factors.predicted``) by more than ``SURPRISE_NOISES`` of this
    machine's noise, and that prediction would be refined (``Evidence.refine_floor``);
    None otherwise, and where the objective counts compile time (``train_steps``: a knob's
    compile is no factor on the steps' speed)."""
    if ev.settings.train_steps:
        return None
    sps, model = ev.score(key), factors.predicted(ev, key)
    level = ev.noise_level
    if not sps or model is None or model[0] < top * ev.refine_floor() or \
            not Interval(model[0], SURPRISE_NOISES * level).beats(sps):
        return None
    return skip("re-measure-first", key.key(), "predicted", share=sps / top,
                leader=leader.key(), under=1 - sps / model[0], predicted=model[0],
                source=", ".join(k.key() for k in model[1]), noises=SURPRISE_NOISES,
                noise=level)


def remeasure_first(ev: Evidence, key: Candidate) -> Skip | None:
    """Why a setting's best, about to be cut behind on a single run, is timed again first, if
    it is: this machine showed runs of one config land further apart than its typical noise
    (``Evidence.stall`` over ``noise_level``: a run that stalled), and this run, that much
    faster, would reach the refinement floor (``Evidence.refine_floor``); or, stall seen or
    not, the run lies far under what the other runs at its micro-batch predict of it
    (``_surprise``). None: its cut stands (it ran twice, came from the store, or is behind
    beyond any stall seen and near what the factors predict)."""
    leader = ev.leader()
    stall, level = ev.stall, ev.noise_level
    if leader is None or key == leader or ev.runs.get(key, 1) >= 2 or key in ev.stored:
        return None
    sps, top = ev.score(key), ev.score(leader, full=True)
    if not sps or not top:
        return None
    if stall > level and sps * (1 + stall) >= top * ev.refine_floor():
        return skip("re-measure-first", key.key(), share=sps / top, leader=leader.key(),
                    stall=stall, noise=level)
    return _surprise(ev, key, leader, top)


def round_pair(ev: Evidence) -> tuple[Candidate, Candidate, Candidate, float] | None:
    """The leader and its best challenger where their gap is within the widest drift
    between two runs of one config in this search, and that drift is wider than a
    machine's run-to-run noise (``confirm_within``): the leader, the challenger, the
    config that drifted and by how much. None otherwise, or where the objective counts
    compile time (``train_steps``: rounds compare step speed)."""
    widest = max(ev.drift.items(), key=lambda kv: kv[1], default=None)
    if ev.settings.train_steps or widest is None or \
            widest[1] <= ev.settings.confirm_within:
        return None
    ranked = [k for k in ev.ranked() if k not in ev.stored]
    if len(ranked) < 2 or ranked[0] != ev.leader():
        return None
    top, second = (ev.score(k, full=True) or 0.0 for k in ranked[:2])
    if not top or Interval(top, widest[1]).beats(second):
        return None
    return ranked[0], ranked[1], *widest
