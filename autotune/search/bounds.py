"""The bounds: can a candidate, or a region of candidates, still win? One function per rule.

Each function reads the evidence and returns a ``Skip`` (its rule id from ``rules.RULES``, the
setting it is about, the sentence and its figures) when the region cannot win: its optimistic
bound on samples/s (a measured interval, or a prediction of a named model) stays behind the
leader by more than the noise. None: run it. Pure: nothing here runs or records anything.
Each rule is stated once, with the oracle figures that back it, in ``docs/search.md``; the
checks themselves are ``benchmarks/rule_checks.py``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from autotune.config import Knobs, TrialResult
from autotune.search._records import Candidate
from autotune.search.evidence import Evidence
from autotune.search.intervals import Interval
from autotune.search.plan import alike
from autotune.search.rules import Skip, skip
from autotune.timing import (
    MIN_STEPS_TO_STOP,
    gain_ceiling,
    predict_step_s,
    prediction_halfwidth,
)
from autotune.units import accumulate_steps


def _split(result: TrialResult, accumulate: int) -> tuple[float, float]:
    """(seconds per micro-batch, seconds per update) of a timed run's median step; the whole
    step counts as micro-batches when the run did not time its update apart (a stored run)."""
    step_s = result.median_step_s() or 0.0
    update_s = statistics.median(result.update_times_s) if result.update_times_s else 0.0
    return (step_s - update_s) / accumulate, update_s


def larger(ev: Evidence, timed: Candidate, *, own_pair: bool = False) -> Skip | None:
    """Why no micro-batch larger than a setting's largest fit so far can win, if none
    can: the most a larger one gains (``timing.gain_ceiling``, from a sibling's two timed
    micro-batches: the per-micro-batch overhead spread over more samples) leaves it
    behind the leader by more than the noise. Its memory probe then stops there (a
    compiled setting's probe above its fit costs a compile, and often ends in an OOM).
    A run of the pair stopped early behind the leader counts with its interval measured
    (three steps or more: its width is in the noise); one cut by the time limit before
    that does not. ``own_pair``: the setting's own two timed micro-batches count too (a
    bound for what it gains above its largest fit without a probe of its own). None: probe
    on (the setting leads, was not timed there, or nothing predicts)."""
    leader = ev.leader()
    result = ev.results.get(timed)
    if leader is None or result is None or ev.settings.train_steps \
            or timed.micro_batch >= ev.plan.per_device:
        return None
    sps, top = result.samples_per_s(), ev.score(leader, full=True)
    if not sps or not top:
        return None

    def usable(c: Candidate) -> bool:
        r = ev.results.get(c)
        return r is not None and not r.num_alloc_retries and ev.score(c) is not None \
            and (ev.score(c, full=True) is not None
                 or len(r.step_times_s) >= MIN_STEPS_TO_STOP)

    pairs = [(c.knobs, c.micro_batch, d.micro_batch) for c in ev.results
             for d in ev.results if c.knobs == d.knobs
             and (own_pair or c.knobs != timed.knobs)
             and c.micro_batch < d.micro_batch and usable(c) and usable(d)]
    if not pairs:
        return None
    sibling, small, large = max(pairs, key=lambda t: (
        *alike(t[0], timed.knobs), -abs(math.log(t[1] / timed.micro_batch)), -t[2]))
    at_small, at_large = (Candidate(knobs=sibling, micro_batch=m) for m in (small, large))
    ratio = (ev.score(at_large) or 0.0) / (ev.score(at_small) or 1.0)
    ceiling = gain_ceiling(ratio, small, large, timed.micro_batch, ev.plan.per_device)
    noise = ev.noise(timed, leader, at_small, at_large)
    if ceiling is None or not Interval(top, noise).beats(sps * ceiling):
        return None
    return skip(
        "gain-ceiling", timed.knobs.label(), micro_batch=timed.micro_batch, sps=sps,
        share=sps / top, leader=leader.key(), ceiling=ceiling, per_device=ev.plan.per_device,
        sibling=sibling.label(), small=small, large=large, ratio=ratio, reach=sps * ceiling,
        noise=noise)

def below(ev: Evidence, over: Candidate) -> Skip | None:
    """Why a compiled setting's micro-batches below ``over`` (a run that peaked over the
    usable budget, while nothing smaller has fit yet) cannot win, if they cannot: ``over``
    ran behind the leader by more than refinement allows (``--refine-within``), even at
    the top of its interval, and a smaller micro-batch of a compiled setting only adds
    accumulation steps (time per micro-batch linear in its size, plus one update per
    step), each at a compile of its own. In the committed oracles, of 46 compiled
    settings that ran over the usable budget above a fit, the fit below beat that run by
    more than 5% in 2 (up to 1.16x); of the 26 whose run over the budget was under 0.90 of
    the best, the fit below came to at most 0.95x of it (``benchmarks/rule_checks.py``
    (10)): the pick is not among them. None: probe on (an eager setting, whose smaller
    micro-batch can stay in cache and costs no compile; ``over`` not timed, under memory
    pressure, or near the leader; every micro-batch timed: ``--micro-batches all``)."""
    leader, result = ev.leader(), ev.results.get(over)
    if not over.knobs.compiled or leader is None or result is None \
            or not result.ok or result.num_alloc_retries or ev.settings.train_steps \
            or not ev.settings.micro_batches_per_class \
            or len(result.step_times_s) < MIN_STEPS_TO_STOP:
        return None
    sps, top = result.samples_per_s(), ev.score(leader, full=True)
    if not sps or not top:
        return None
    noise = ev.noise(over, leader)
    if Interval(sps, noise).high >= top * ev.settings.refine_within:
        return None
    return skip(
        "over-budget-below", over.knobs.label(), micro_batch=over.micro_batch, sps=sps,
        share=sps / top, leader=leader.key(), refine_within=ev.settings.refine_within,
        noise=noise)

def frees_nothing(ev: Evidence, leader: Candidate) -> Skip | None:
    """Why freeing memory cannot help the leader, if it cannot: it already runs the whole
    per-device batch without allocator retries (a measured fact, said with its peak)."""
    result = ev.results.get(leader)
    if leader.micro_batch < ev.plan.per_device or result is None or result.num_alloc_retries:
        return None
    return skip(
        "frees-nothing", leader.key(), leader=leader.key(), per_device=ev.plan.per_device,
        peak=_bytes(result.peak_bytes), usable=ev.usable)

def recompute(ev: Evidence, leader: Candidate) -> Skip | None:
    """Why checkpointing cannot win on the leader's setting, if it cannot: it recomputes
    each checkpointed block's forward, so at a micro-batch the setting fits without it, it
    runs no faster (in the committed oracles, checkpointed against not at the same
    micro-batch: at most 1.01x in the Xeon causal LM's at 8-64, at most 0.97x in the CNN's
    and the masked LM's at 8-64; with their micro-batches 1-4 measured once on noisier
    days, up to 1.32x and 1.42x, fp32/default+ckpt=alternate+opt=foreach at 1-2, at 0.33x
    and 0.47x of the best; at most 1.28x in the CNN's at 1-64, at 0.32x of the best:
    ``benchmarks/rule_checks.py`` (2)); it is worth a run only for a
    micro-batch larger than the setting's largest fit. Where the setting's largest timed
    fit ``M`` is behind the leader (which runs a smaller micro-batch of it) by more than
    what a larger micro-batch can gain (``_why_not_larger``, the setting's own pair of timed
    micro-batches counting), no larger micro-batch can win, checkpointed or not: in the
    committed oracles, of 24 checkpointed candidates above a setting that got slower with
    its larger micro-batch, 4 ran over that bound by more than 5%, at most 1.09x
    (``rule_checks.py`` (9)), so a skip behind by more than the noise (5% at least) misses
    at most a few percent. None: screen it (the leader runs the setting's largest timed
    fit, nothing bounds the gain, or that fit ran under memory pressure)."""
    usable = ev.usable
    timed = [c for c, r in ev.results.items() if c.knobs == leader.knobs
             and r.fits(usable) and ev.score(c) is not None]
    if not timed:
        return None
    largest = max(timed, key=lambda c: c.micro_batch)
    result = ev.results[largest]
    if largest == leader or result.num_alloc_retries:
        return None
    why = larger(ev, largest, own_pair=True)
    if why is None:
        return None
    assert why.rule == "gain-ceiling" and not why.variant  # its sentence is said inside
    return skip("recompute-twin", leader.knobs.label(), **why.figures,
                setting=leader.knobs.label(), largest=largest.micro_batch)

def capped_reach(ev: Evidence, best: Candidate, leader: Candidate) -> Skip | None:
    """Why checkpointing cannot make a class memory caps win, if it cannot (rule
    ``capped-class``, ``stages.knobs.screen_capped``): a step at a larger micro-batch takes
    no less time than at a smaller one, and checkpointing's recompute makes it no faster,
    so at the whole per-device batch the class's setting runs at most each of its timed
    micro-batches' samples/s x the per-device batch over that micro-batch (the largest of
    these: a run read slow by the noise bounds nothing). Behind the leader beyond the noise
    even so: the skip; None: probe it."""
    top = ev.score(leader, full=True) or 0.0
    timed = [(sps, c) for c in ev.results if c.knobs == best.knobs
             and (sps := ev.score(c)) is not None]
    if not top or not timed:
        return None
    sps, at = max(timed, key=lambda t: t[0] * ev.plan.per_device / t[1].micro_batch)
    reach = sps * ev.plan.per_device / at.micro_batch
    noise = ev.noise(at, leader)
    if not Interval(top, noise).beats(reach):
        return None
    return skip("capped-class", best.knobs.label(), share=sps / top, leader=leader.key(),
                micro_batch=at.micro_batch, per_device=ev.plan.per_device,
                reach=reach / top, noise=noise)


def compiled_whole_batch(ev: Evidence, knobs: Knobs, fitting: list[int]) -> Skip | None:
    """Why a compiled class's smaller micro-batches are not worth their compiles, if not.

    A smaller micro-batch only adds accumulation steps, unless memory pressure slows the
    largest (allocator retries, or a boundary below the whole per-device batch). Each one
    costs a compile of its own (``dynamic=False``): a compiled class that runs the whole
    per-device batch without retries is not refined."""
    if not knobs.compiled or len(fitting) < 2:
        return None
    largest = ev.results.get(Candidate(knobs=knobs, micro_batch=fitting[0]))
    if fitting[0] < ev.plan.per_device or largest is None or largest.num_alloc_retries:
        return None
    # (its figure even from a run stopped early behind the leader: a smaller one of this
    # class may be that leader)
    top = ev.score(Candidate(knobs=knobs, micro_batch=fitting[0]))
    for m in fitting[1:]:  # a smaller one timed already (a probe's) that is not behind it:
        smaller = Candidate(knobs=knobs, micro_batch=m)  # the line does not hold here
        sps = ev.score(smaller, full=True)
        if top and sps and not Interval(top, ev.noise(smaller, Candidate(
                knobs=knobs, micro_batch=fitting[0]))).beats(sps):
            return None
    return skip("compiled-whole-batch", knobs.label(), context="not-timed",
                untimed=", ".join(str(m) for m in fitting[1:]), largest=fitting[0])


def sibling_ratio(ev: Evidence, knobs: Knobs, walked: Sequence[int],
                  micro_batch: int) -> Skip | None:
    """Why stepping a setting near the leader down to ``micro_batch`` cannot pay, if it
    cannot: another setting timed at both ``micro_batch`` and this one's best so far went no
    faster at ``micro_batch`` (its own walk down), so this one, scaled by the sibling's
    ratio, is predicted not faster than its best by more than the noise. What grows with
    the micro-batch is the same work in both (the knobs between them change how much, not
    the trend). An eager setting takes a sibling of its own precision only: the bytes per
    element set the micro-batch whose working set fits a cache, so another precision's
    ratio does not carry over (the replay's precision-swap tables: bf16 eager ran 1.6x at
    micro-batch 1 what it ran at 2, where fp32's ratio said 1.05x, and was never timed
    there: 0.70 of the best).

    A compiled setting, the leader's too, needs that evidence the other way to be walked
    (each micro-batch it steps down costs a compile of its own): time per micro-batch
    linear in its size, plus one update per step, makes a smaller micro-batch only add
    accumulation steps; what breaks that line (memory pressure, a working set that fits a
    cache) shows as allocator retries at its best, as its own walk getting faster or not
    slower (its last step tied with its best within the noise: the line says each step down
    is slower, and a gain under the noise at each step is still a gain, as on issue 59's
    non-monotone tables), or as a sibling timed faster at ``micro_batch`` (for the leader's
    own setting, one not slower there beyond the noise: a tie is no evidence of a loss, as
    its own walk's tie is not). Without any it
    is not walked: in the committed oracles a compiled setting bound by memory beat its
    largest fit with the next smaller micro-batch by more than 10% in 3 of 255 settings,
    none of the 75 within 0.90 of the best (``benchmarks/rule_checks.py`` (8)). The
    leader's eager setting is always walked (the pick is decided there, and an eager step
    costs no compile). A setting under memory pressure (allocator retries at its best) or
    the objective with compile time is not predicted; None: time it."""
    compiled = knobs.compiled
    if not walked or ev.settings.train_steps or (
            knobs == ev.leaders_setting() and not compiled):
        return None
    best_m = max(walked, key=lambda x: ev.score(Candidate(knobs=knobs,
                                                          micro_batch=x)) or 0.0)
    best = Candidate(knobs=knobs, micro_batch=best_m)
    best_result = ev.results.get(best)
    if best_result is None or best_result.num_alloc_retries or not ev.score(best) or (
            compiled and (best_m != max(walked) or _tied(ev, best, knobs, min(walked))
                          or _slower_above(ev, knobs, best))):
        return None  # its own walk got faster, or did not get slower: time on

    def pair(other: Knobs) -> tuple[Candidate, Candidate] | None:
        at, at_best = (Candidate(knobs=other, micro_batch=x) for x in (micro_batch, best_m))
        runs = [ev.results.get(c) for c in (at, at_best)]
        if other == knobs or any(r is None or r.num_alloc_retries for r in runs) or (
                not compiled and other.precision != knobs.precision):
            return None
        if any(ev.score(c, full=True) is None for c in (at, at_best)):
            return None
        return at, at_best

    siblings = [(k, p) for k in dict.fromkeys(c.knobs for c in ev.results) if (p := pair(k))]
    if not siblings:
        if not compiled:
            return None
        return skip("sibling-ratio", knobs.label(), "no-sibling", best=best_m,
                    micro_batch=micro_batch)
    sibling, (at, at_best) = max(siblings, key=lambda t: alike(t[0], knobs))
    ratio = (ev.score(at, full=True) or 0.0) / (ev.score(at_best, full=True) or 1.0)
    noise = ev.noise(best, at, at_best)
    if Interval(1.0, noise).beaten_by(ratio) or (knobs == ev.leaders_setting()
                                                  and not Interval(1.0, noise).beats(ratio)):
        return None  # (the leader's own setting: a sibling within the noise there)
    predicted = (best_result.samples_per_s() or 0.0) * ratio
    return skip("sibling-ratio", knobs.label(), predicted=predicted, micro_batch=micro_batch,
                sibling=sibling.label(), best=best_m, ratio=ratio, noise=noise)


def _slower_above(ev: Evidence, knobs: Knobs, best: Candidate) -> bool:
    """Whether a run of ``knobs`` at a micro-batch larger than ``best``'s, one its walk
    did not take (over the budget, or its first launch was), ran slower than ``best``: the
    step from it down to ``best`` got faster, as a walk's does when its best is not its
    largest (issue 59's non-monotone tables: compiled bf16 at 32, over the budget, ran
    0.90x its fit at 16, whose best lay at 4, never timed)."""
    sps = ev.results[best].samples_per_s() or 0.0
    return any(c.knobs == knobs and c.micro_batch > best.micro_batch and r.ok
               and r.step_times_s and (r.samples_per_s() or 0.0) < sps
               for c, r in ev.results.items())


def _tied(ev: Evidence, best: Candidate, knobs: Knobs, micro_batch: int) -> bool:
    """Whether ``knobs`` at ``micro_batch``, a step below its best, ran within the noise of
    ``best`` (not behind it beyond the noise)."""
    step = Candidate(knobs=knobs, micro_batch=micro_batch)
    now = ev.score(step)
    return step != best and now is not None and not Interval(
        ev.score(best) or 0.0, ev.noise(best, step)).beats(now)


def line_predicts_loss(ev: Evidence, knobs: Knobs, micro_batch: int, *,
                       must_gain: bool = False) -> Skip | None:
    """Why a micro-batch of a setting cannot beat the setting's best, predicted from its
    timed micro-batches (``timing.predict_step_s``: per micro-batch time linear in its
    size, plus one update per step), if it cannot: its predicted throughput is below the
    best's by more than the noise, or (``must_gain``: a run that costs a compile) not above
    it by more than the noise. A line that cannot be extended to ``micro_batch`` (its time
    per micro-batch at or below zero there: the larger micro-batches grew faster than their
    size) predicts nothing; with ``must_gain`` that is no predicted gain either, so such a
    run is not made (``benchmarks/rule_checks.py`` (5)). None when it could win, or
    nothing predicts it (without ``must_gain``)."""
    timed = {m: r for m in ev.plan.micro_batches if (r := ev.results.get(
        Candidate(knobs=knobs, micro_batch=m))) is not None and r.ok and r.step_times_s}
    points = [(m, *_split(r, accumulate_steps(ev.plan.per_device, m))) for m, r in timed.items()]
    step_s = predict_step_s(points, micro_batch, ev.plan.per_device)
    best = max(timed, key=lambda m: ev.score(Candidate(knobs=knobs, micro_batch=m)) or 0)
    best_sps = ev.results[Candidate(knobs=knobs, micro_batch=best)].samples_per_s()
    sizes = ", ".join(str(m) for m in sorted(timed))
    if not best_sps or ev.settings.train_steps:
        return None
    if step_s is None:
        if not must_gain or len(timed) < 2:
            return None
        return skip("line-predicts-loss", knobs.label(), "no-line",
                    context="micro-batch-not-timed", micro_batch=micro_batch, sizes=sizes)
    predicted = ev.plan.per_device / step_s
    noise = ev.noise(*(Candidate(knobs=knobs, micro_batch=m) for m in timed))
    # A gain worth a compile must clear the prediction's own interval too: each timed
    # point at least the machine's run-to-run noise, carried along the line.
    widths = [max(ev.settings.confirm_within, r.halfwidth() or 0.0)
              for r in timed.values()]
    spread = (prediction_halfwidth(points, widths, micro_batch, ev.plan.per_device) or 0.0
              if must_gain else 0.0)
    at_best = Interval(best_sps, noise)
    if Interval(best_sps, max(noise, spread)).beaten_by(predicted) or (
            not must_gain and not at_best.beats(predicted)):
        return None
    if at_best.beats(predicted):
        verdict = ""  # behind by more than the noise
    elif at_best.beaten_by(predicted):
        verdict = "within-interval"
    else:
        verdict = "within-noise"
    return skip(
        "line-predicts-loss", knobs.label(), verdict, context="micro-batch-not-timed",
        micro_batch=micro_batch, predicted=predicted, sizes=sizes, share=predicted / best_sps,
        best=best, noise=noise, spread=spread, known=min(widths))


def refines(ev: Evidence, share: float | None) -> bool:
    """Whether a best at ``share`` of the leader's score is refined: at least
    ``Evidence.refine_floor`` (``--refine-within`` less the measured noise)."""
    return share is not None and share >= ev.refine_floor()


def mode(ev: Evidence, knobs: Knobs) -> Skip | None:
    """Why a compile mode beyond off/default is not tried for this precision, if not."""
    if not ev.settings.refine_within:
        return None
    same = [c for c in ev.probes if c.precision == knobs.precision]
    if not same:
        return None  # nothing measured predicts it: try it
    share = ev.share(max((ev.class_best(c) or 0.0 for c in same), default=0.0))
    if refines(ev, share):
        return None
    return behind(ev, knobs.label(), share, knobs.precision).within("not-tried", knobs.label())


def behind(ev: Evidence, target: str, share: float | None, precision: str | None = None) -> Skip:
    """``behind-refine``: a setting (``precision``: a class of it) is behind the leader by
    more than refinement can gain and the noise (``refine_floor``), or did not run."""
    of_class = {"precision": precision} if precision else {}
    if share is None:
        return skip("behind-refine", target, "class-did-not-run" if precision else "did-not-run",
                    share=0.0, **of_class)
    floor = ev.refine_floor()
    digits = 2 if round(share, 2) < round(floor, 3) else 3  # 0.854, not 0.855
    leader = ev.leader()
    return skip("behind-refine", target, "class-noise" if precision else "noise", share=share,
                digits=digits, leader=leader.key() if leader else "-",
                refine_within=ev.settings.refine_within, floor=floor,
                noise=ev.noise_level, **of_class)


def _bytes(num_bytes: int | None) -> int | str:
    """A peak as a figure: its bytes, or ``-`` where it was not measured."""
    return "-" if num_bytes is None else num_bytes
