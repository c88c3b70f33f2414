"""The race and its first-launch check, stages 5 and 6, one loop: re-measure the leader and
its close contenders, decide close gaps in interleaved rounds, and check that a compiled
winner fits a first launch; where it does not, it is out and the next pick is re-checked and
checked in turn.

One loop because each feeds the other: the leader's re-measure, compiled afresh, is also its
first-launch check (a run that does not fit rules it out during the race), and a winner ruled
out hands the pick to the next, whose stored timing is re-checked before its own first launch
is checked. Who races and when a race stops is the policy's (``policy``); this module makes
the runs through the executor and tells the evidence what they found. ``docs/search.md``
states the algorithm once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from autotune.config import TrialResult
from autotune.knob_rules import skip_reason
from autotune.search import fits
from autotune.search._records import OUT_OF_MEMORY, Candidate
from autotune.search.executor import Executor, Proposal
from autotune.search.pick import rounds_ahead, won_rounds
from autotune.search.plan import recompute_twin
from autotune.search.policy import (
    MOST_ROUNDS,
    ROUNDS,
    another_round,
    contenders,
    round_pair,
    surprises,
    unchecked,
    within_drift,
)
from autotune.search.rules import skip
from autotune.search.stages.remeasure import _run, remeasure, tell

ROUNDS_SAID = {3: "three", 4: "four", 5: "five"}
"""The ``rounds`` note's variant by the number of rounds (two: none)."""


def _ratio(one: TrialResult | None, other: TrialResult | None) -> float | None:
    """``one``'s samples/s over ``other``'s (None: either did not run its timed steps)."""
    a, b = (r.samples_per_s() if r is not None and r.ok else None for r in (one, other))
    return a / b if a and b else None


def confirm(ex: Executor) -> None:
    """Re-measure the leader and its close contenders; keep each one's better run. A
    contender timed only by a search before (the local study store) is re-measured once
    here, the leader and the runner-up at least: if its stored timing is no longer within
    the noise of what it runs at now, the fresh run replaces it.

    A clear leader, compiled and not yet run as a first launch compiles it, has the first-launch
    check's run made here: it is a second run of the leader too, so the drift between its two
    runs is known before the race is settled (``policy.within_drift``, ``interleave``)."""
    keys = contenders(ex.ev)
    if not keys or (len(keys) < 2 and keys[0] not in ex.ev.stored
                    and not fits.unchecked_launch(ex.ev, keys[0])):
        return
    if all(k in ex.ev.stored for k in keys):
        # A repeated search: its first confirmed the race; the re-check only asks whether
        # the two leaders still run as stored, timed until their medians are known.
        keys = keys[:2]
    ran = remeasure(ex, keys)
    cold = ex.ev.cold.get(keys[0])
    if keys[0] in ran and cold is not None and not cold.fits(ex.plan.usable):
        # Its run compiled afresh, as a first launch does, did not fit: the first-launch stage now.
        ex.stage = "first launch"
        _rule_out(ex, keys[0], cold)
        return
    ran.update(remeasure(ex, within_drift(ex.ev), cold_first=False))
    interleave(ex, ran)


def recheck_stored_pick(ex: Executor) -> None:
    """A stored timing never picks alone: while the pick would be a candidate timed only
    by a search before (the local study store), not run in this one, it is re-checked
    (``remeasure``; its fresh run counts where the stored one is stale) and the pick
    made again. The two leaders' re-checks can drop both behind a third known only from
    the store; each round re-runs one candidate, so it ends."""
    while (winner := ex.ev.winner()) is not None and winner in ex.ev.stored:
        remeasure(ex, [winner], cold_first=False)


def interleave(ex: Executor, first: Mapping[Candidate, TrialResult]) -> None:
    """The confirm stage's interleaved rounds (``docs/search.md``): where runs of one config drifted
    further apart than the leader's gap to its best challenger, the two run back to back,
    the order reversed each round, until one is ahead in two rounds more than the other or
    five have run (``policy.another_round``). The runs of ``first`` (the re-measures just
    made, in order) are the first round where the two ran one after the other. Each round's
    ratio lands in ``round_shares``; ``pick_winner`` follows the rounds over the best
    runs."""
    pair = round_pair(ex.ev)
    if pair is None:
        return
    leader, challenger, config, drift = pair
    gap = 1 - (ex.ev.score(challenger, full=True) or 0.0) / (
        ex.ev.score(leader, full=True) or 1.0)
    shares: list[float] = []
    ran = list(first)
    order = [k for k in ran if k in (leader, challenger)]
    ratio = _ratio(first.get(challenger), first.get(leader))
    if ratio is not None and abs(ran.index(leader) - ran.index(challenger)) == 1:
        shares.append(ratio)
        order.reverse()
    else:  # not run back to back (or one run failed): two rounds of their own
        order = [leader, challenger]
    while another_round(shares):
        runs = remeasure(ex, order, cold_first=False)
        ratio = _ratio(runs.get(challenger), runs.get(leader))
        if ratio is None:  # a run failed (out of memory: that candidate is out)
            break
        shares.append(ratio)
        order.reverse()
    if len(shares) < ROUNDS:  # a run failed: the best runs stand (an out one is out)
        return
    ahead = rounds_ahead(shares)
    picked = challenger if won_rounds(shares) else leader
    assert ROUNDS <= len(shares) <= MOST_ROUNDS, shares  # ``another_round``
    note = skip(
        "rounds", picked.key(), ROUNDS_SAID.get(len(shares), ""),
        challenger=challenger.key(), leader=leader.key(), config=config.key(), ahead=ahead,
        rounds=len(shares), drift=drift, gap=gap,
        **{f"share_{i}": s for i, s in enumerate(shares, 1)})
    ex.ev.raced(leader, challenger, shares, note)


def run(ex: Executor, rescreen: Callable[[Executor], None]) -> None:
    """Stages 5 and 6 (``docs/search.md``), one loop: the race (``confirm``), then the pick's
    first launch (``first_launch``). First, the single runs far under what the others
    predict of them are timed again (``policy.surprises``); where any was, ``rescreen`` (the
    driver's joint screen) runs before the contenders are chosen: a knob value whose one run
    stalled kept its setting's other values from being combined with it (the joint screen
    combines on each setting's best), and its second run can make it that best."""
    # A resumed search answers the first re-measures and what ``rescreen`` asks from the
    # study in the order they were made: the runs of candidates never asked for join after.
    if remeasure(ex, surprises(ex.ev), cold_first=False, finalists=False):
        rescreen(ex)
    ex.ev.release_held()
    ex.reach.part = "race"  # (a stop before a run of it never raced: ``driver.STAGES``)
    confirm(ex)
    first_launch(ex)


def first_launch(ex: Executor, *, recheck: bool = True) -> None:
    """Until the pick stands: its stored timing re-checked (``recheck_stored_pick``; not with
    ``recheck``: the time kept for the check pays for no other run) and, on a device whose
    peak counts the compile, its fit as a first launch: vouched for by a sibling's run
    afresh, or run afresh itself; one that does not fit is out (``_rule_out``) and the next
    pick goes round again."""
    usable = ex.plan.usable
    while True:
        if recheck:  # the next pick after one ruled out: re-checked first
            recheck_stored_pick(ex)
        ex.stage = "first launch"
        if not ex.plan.compile_in_peak:
            return
        winner = ex.ev.winner()
        if winner is None or not winner.knobs.compiled:
            return
        if winner not in ex.ev.cold and _fits_by_sibling(ex, winner):
            return
        cold = ex.ev.cold.get(winner) or cold_run(ex, winner)
        if cold.fits(usable) or not _rule_out(ex, winner, cold):
            return


RESERVE_MARGIN = 1.25
"""How much longer than its estimate the time kept for a first-launch check is: two runs of
one config on a shared machine drift apart (the committed oracles' passes: medians 1.6-23%
apart, ``benchmarks/rule_checks.py`` (7)), and a compile from nothing varies as much."""


def launch_reserve_s(ex: Executor) -> float:
    """The seconds of ``--time-budget`` kept for the pick's first-launch check
    (``Executor.limited``): on a device whose peak counts the compile, while the pick is
    compiled and its fit as a first launch unchecked (``fits.unchecked_launch``), the run
    that checks it estimated from the pick's own run: its wall seconds with its compile as
    one from nothing takes (the longest of any run of its graphs, and of the runs that
    compiled the model afresh: in its compile mode where there are some), every timed step a
    check times (``spec(early_stop=False)``), times ``RESERVE_MARGIN``. 0 without a time
    budget or nothing to check."""
    ev = ex.ev
    if ex.settings.time_budget_s is None or not ex.plan.compile_in_peak:
        return 0.0
    pick = ev.winner()
    run = ev.measured.get(pick) if pick is not None else None
    if pick is None or run is None or not run.wall_s or not fits.unchecked_launch(ev, pick):
        return 0.0
    timed = sum(run.step_times_s)
    full = max(timed, (run.median_step_s() or 0.0) * ex.settings.num_timed_steps,
               ex.settings.min_timed_s)
    own = run.compile_s or 0.0
    graph = [r.compile_s for r in ex.tally.run_log if r.compile_s and Candidate(
        knobs=r.knobs, micro_batch=r.micro_batch).graph() == pick.graph()]
    # Its graphs may only ever have loaded from inductor's cache: then a compile from nothing
    # of the same model, in its mode where one was made, says what one takes.
    mode = (pick.knobs.compile_mode, pick.knobs.compile_scope)
    cold = [(r.compile_s, (k.knobs.compile_mode, k.knobs.compile_scope) == mode)
            for k, r in ev.cold.items() if r.ok and r.compile_s]
    afresh = [s for s, same in cold if same] or [s for s, _ in cold]
    return RESERVE_MARGIN * (max(0.0, run.wall_s - timed - own) + max([own, *graph, *afresh])
                             + full)


def kept_check(ex: Executor, kept_s: float) -> None:
    """The time kept for the first-launch check stopped the other runs
    (``Executor.limited``): said (``first-launch-reserve``), then the check runs in it
    (``first_launch``, no re-check of a stored timing)."""
    pick = ex.ev.winner()
    if pick is not None:
        left = (ex.settings.time_budget_s or 0.0) - (ex.clock() - ex.tally.start)
        ex.ev.decide(skip("first-launch-reserve", pick.key(), kept=kept_s, left=max(left, 0.0)))
    first_launch(ex, recheck=False)


def _rule_out(ex: Executor, winner: Candidate, cold: TrialResult) -> bool:
    """The winner's run compiled afresh did not fit: it is out (``_out_cold``), and its
    setting's next smaller micro-batch is timed where it could win
    (``_time_below_out``). False where that run ended otherwise (it says nothing of
    memory: the winner stands, said unchecked)."""
    if not (cold.ok or cold.status in OUT_OF_MEMORY):
        ex.ev.decide(unchecked(winner, f"its run compiled afresh ended {cold.status}"))
        return False
    speed = ex.ev.results[winner].samples_per_s()
    _out_cold(ex, winner, cold)
    _time_below_out(ex, winner, speed)
    return True


def _time_below_out(ex: Executor, out: Candidate, speed: float | None) -> None:
    """A compiled winner is out as a first launch: time its setting at the next smaller
    micro-batch, compiled afresh (the one run times it and checks its first launch), unless
    that ran already. Its boundary as a first launch may be there, and the refine stage walks a
    compiled setting down only on evidence that a smaller micro-batch can gain. Only where
    it could still win: a smaller micro-batch adds accumulation steps, so the out winner's
    speed bounds it, and the next pick must be behind that. A checkpointed setting is not
    timed where its setting without checkpointing fits as a first launch
    (``fits.recompute_floor``): it recomputes, so there it runs no faster, and a lead it shows
    there is noise; where that is not known, the setting without checkpointing is timed
    there first, compiled afresh (it may be the faster of the two)."""
    smaller = [m for m in ex.plan.micro_batches if m < out.micro_batch]
    if not smaller or not speed:
        return
    key = Candidate(knobs=out.knobs, micro_batch=max(smaller))
    after = ex.ev.winner()
    if key in ex.ev.results or (after is not None and (ex.ev.score(after) or 0.0) >= speed):
        return
    twin_key = Candidate(knobs=recompute_twin(out.knobs), micro_batch=key.micro_batch)
    if out.knobs.checkpointing != "off" and twin_key not in ex.ev.results and \
            fits.recompute_floor(ex.ev, out.knobs) < key.micro_batch and \
            skip_reason(twin_key.knobs, ex.ev.traits) is None:
        # Its setting without checkpointing first (never timed there: a knob screened on
        # the checkpointed leader): where that fits as a first launch it is the faster of
        # the two (checkpointing recomputes), and the checkpointed one is not run.
        ex.measure(replace(ex.spec(twin_key, early_stop=False), cold_compile=True))
    floor = fits.recompute_floor(ex.ev, out.knobs)
    if floor >= key.micro_batch:
        twin = recompute_twin(out.knobs)
        ex.ev.decide(skip(
            "recompute-twin", key.knobs.label(), "first-launch", candidate=key.key(),
            out=out.key(), twin=twin.label(), largest=floor))
        return
    ex.measure(replace(ex.spec(key, early_stop=False), cold_compile=True))


def _fits_by_sibling(ex: Executor, winner: Candidate) -> bool:
    """``fits.vouched_by_sibling``, said in ``skipped`` when it holds."""
    bound = fits.sibling_bound(ex.ev, winner)
    if bound is None or not fits.vouched_by_sibling(ex.ev, winner):
        return False
    own, peak, sibling = bound
    ex.ev.decide(skip(
        "first-launch-sibling", winner.key(), sibling=sibling.key(), sibling_peak=peak,
        own=own, peak=own + peak, usable=ex.plan.usable))
    return True


def _out_cold(ex: Executor, winner: Candidate, cold: TrialResult) -> None:
    """The winner is out: the run that compiled its graphs afresh did not fit."""
    usable = ex.plan.usable
    first = cold.message.splitlines()[0] if cold.message else ""
    if cold.ok:
        out = skip("first-launch-out", winner.key(), peak=cold.peak_bytes or 0, usable=usable)
    elif first:
        out = skip("first-launch-out", winner.key(), "ended-message", status=cold.status,
                   message=first)
    else:
        out = skip("first-launch-out", winner.key(), "ended", status=cold.status)
    ex.ev.rule_out(winner, out)  # judged out of memory, in the rule's words


def cold_run(ex: Executor, winner: Candidate) -> TrialResult:
    """The winner run as its timed runs were, every step, with an empty inductor cache of
    its own: its peak is a first launch's, its timing one more run of it (each candidate
    keeps its better run). Over the budget, it is out (``_rule_out``)."""
    proposal = Proposal(winner, replace(ex.spec(winner, early_stop=False), cold_compile=True),
                        cold=True, stored=ex.ev.answer(winner))
    cold, rec = _run(ex, proposal)
    tell(ex, proposal, cold, rec)
    return cold
