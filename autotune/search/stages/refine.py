"""The refine stage: smaller micro-batches of the settings near the leader, largest first,
while each is faster than the last by more than the noise; then the smallest that fits, once,
where it could still win. Where that moved the leader to another micro-batch, the knobs that
free no memory are screened again there (the knobs stage's ``screen``).
``docs/search.md`` states the rules once.
"""

from __future__ import annotations

from autotune.config import Knobs, MemoryProbe
from autotune.search import bounds, policy
from autotune.search._records import Candidate
from autotune.search.batch import walk_ahead
from autotune.search.executor import Executor
from autotune.search.intervals import Interval
from autotune.search.rules import skip
from autotune.search.stages.knobs import screen
from autotune.search.stages.remeasure import remeasure


def run(ex: Executor) -> None:
    """The stage (``docs/search.md``)."""
    ev = ex.ev
    screened = ev.leader()
    # Eager settings first, best first: their steps cost no compile, and their walks are
    # the evidence a compiled setting is walked down on (``bounds.sibling_ratio``).
    for probe in sorted(ev.probes.values(), key=lambda p: (
            p.knobs.compiled, -(ev.class_best(p.knobs) or 0.0))):
        refine(ex, probe)
    if ev.leader() != screened:  # the knobs were screened at another micro-batch
        ex.stage = "knobs"
        screen(ex, timing_only=True)


def refine(ex: Executor, probe: MemoryProbe) -> None:
    """Time smaller micro-batches of one class, largest first, while each is faster than
    the class's best by more than the noise (one run's luck is no trend to follow). In an
    eager setting a micro-batch not faster is followed by the next one down once (speed
    need not be monotone in the micro-batch: a working set that fits a cache), and the walk
    stops at the second in a row (that step is the stop's check: it does not count against
    ``--micro-batches``); a compiled one goes past only one that ties with the best within
    the noise, and stops at the first behind it beyond the noise (each step costs a compile,
    and in the committed oracles a compiled walk turned faster again once in 214; but a gain
    under the noise at each step is still a gain: issue 59's non-monotone tables).

    Micro-batches already measured (a resumed study) are walked through the same rule, so
    a resumed search stops where the first one did."""
    knobs, per_class = probe.knobs, ex.ev.settings.micro_batches_per_class
    label = knobs.label()
    fitting = sorted(probe.fitting(), reverse=True)
    why_not = bounds.compiled_whole_batch(ex.ev, knobs, fitting)
    if why_not and per_class:
        ex.ev.decide(why_not)
        return
    walked: list[int] = []  # largest first, each measured
    missed = 0  # micro-batches in a row not faster than the best before them
    past = 0  # walked past one not faster: the stop's check, not counted (--micro-batches)
    for i, m in enumerate(fitting):
        key = Candidate(knobs=knobs, micro_batch=m)
        rest = ", ".join(str(x) for x in fitting[i:])
        if key not in ex.ev.results:
            if per_class and len(walked) - past >= per_class:
                ex.ev.decide(skip("micro-batch-limit", label, context="not-timed",
                                  untimed=rest, per_class=per_class))
                return
            if per_class and not settled_refines(ex, knobs):
                share = ex.ev.share(ex.ev.class_best(knobs))
                ex.ev.decide(bounds.behind(ex.ev, label, share).within(
                    "not-timed", label, untimed=rest))
                return
            why_not = bounds.sibling_ratio(ex.ev, knobs, walked, m) if per_class else None
            if why_not:
                ex.ev.decide(why_not.within("not-timed", label, untimed=rest))
                return
            if not knobs.compiled:  # several slots: the walk's next steps at once
                walk_ahead(ex, [Candidate(knobs=knobs, micro_batch=x) for x in fitting[
                    i:i + (per_class - len(walked) + past if per_class else len(fitting))]])
            ex.measure(ex.spec(key))
        if walked and per_class:
            best = max((Candidate(knobs=knobs, micro_batch=x) for x in walked),
                       key=lambda c: ex.ev.score(c) or 0)
            before, now = ex.ev.score(best), ex.ev.score(key)
            noise = ex.ev.noise(key, best)
            best_m = best.micro_batch
            if now is None or (before is not None
                               and not Interval(before, noise).beaten_by(now)):
                missed += 1
                # (a compiled step costs a compile: past one that ties within the noise,
                # not one behind beyond it)
                tie = before is not None and now is not None \
                    and not Interval(before, noise).beats(now)
                if now is not None and missed < 2 and i + 1 < len(fitting) \
                        and (not knobs.compiled or tie):
                    walked.append(m)  # the next one down may still be faster
                    past += 1
                    continue
                later = list(fitting[i + 1:])
                if later and time_the_other_end(ex, knobs, later[-1],
                                                len(walked) - past + 1):
                    later = later[:-1]
                # (several slots: those timed ahead of the walk, ``walk_ahead``, were timed)
                later = [x for x in later if Candidate(knobs=knobs, micro_batch=x)
                         not in ex.ev.results]
                if later:
                    ex.ev.decide(skip(
                        "walk-not-faster", label, context="not-timed",
                        untimed=", ".join(map(str, later)), micro_batch=m, best=best_m,
                        noise=noise))
                return
            missed = 0
        walked.append(m)


def settled_refines(ex: Executor, knobs: Knobs) -> bool:
    """Whether the setting's best is near enough the leader to refine (``bounds.refines``);
    where it is not on a single run that this machine's slowest runs could have put there
    (``policy.remeasure_first``), that run is timed again first, and its better run decides.
    With no leader (no run that fits has timed its steps: the only one did not fit when
    timed again), no setting is behind one: each is walked down to what fits."""
    best = ex.ev.setting_best(knobs)
    if ex.ev.leader() is None or knobs == ex.ev.leaders_setting() or bounds.refines(
            ex.ev, ex.ev.share(ex.ev.class_best(knobs))):
        return True  # (the leader's own setting: behind only by what its knobs gained)
    note = policy.remeasure_first(ex.ev, best) if best is not None else None
    if note is None or best is None:
        return False
    ex.ev.decide(note)
    remeasure(ex, [best], cold_first=False)
    return bounds.refines(ex.ev, ex.ev.share(ex.ev.class_best(knobs)))


def time_the_other_end(ex: Executor, knobs: Knobs, smallest: int, num_timed: int) -> bool:
    """A walk down stopped at a micro-batch that was not faster: time the smallest that fits
    too, once, for the leader's setting when it runs eager, and for any other eager setting
    near the leader where the line through its timed micro-batches predicts the smallest
    could win (speed is not always monotone in the micro-batch: on a CPU a small one can
    stay in cache, and one noisy middle point must not hide the range's other end).

    A compiled setting (the leader's too) pays a compile of its own for that run, and in
    the committed oracles a compiled setting's smallest micro-batch beat its walked best
    once in 214 walks (by 1.10x, where its line said 0.82x), never where its line
    predicted a tie (5 walks) or a gain (2), while eager ones did 32 times in 330, by up to
    2.4x (``benchmarks/rule_checks.py`` (5)): it is timed only where the line predicts it
    ahead by more than the noise and by more than that prediction's own interval (each
    timed point's error carried along the line: ``timing.prediction_halfwidth``), not for
    a predicted tie.
    False when it is not worth a run (the setting is behind the leader by more than
    ``--refine-within``, not predicted to gain, or ``--micro-batches`` allows no more)."""
    per_class = ex.ev.settings.micro_batches_per_class
    share = ex.ev.share(ex.ev.class_best(knobs))
    if not bounds.refines(ex.ev, share) or (per_class and num_timed >= per_class):
        return False
    compiled = knobs.compiled
    always = knobs == ex.ev.leaders_setting() and not compiled
    why_not = None if always else bounds.line_predicts_loss(ex.ev, knobs, smallest,
                                                            must_gain=compiled)
    if why_not:  # the leader's own eager setting is timed anyway: the pick is decided there
        ex.ev.decide(why_not)
        return False
    ex.measure(ex.spec(Candidate(knobs=knobs, micro_batch=smallest)))
    return True
