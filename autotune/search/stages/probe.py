"""The probe stage: each memory class's largest fitting micro-batch, found and timed.

fp32 eager (the baseline) first: its largest fit is what an untuned user runs (where the workload
declares lengths, timed with each batch padded to its longest: ``name_baseline``); where it fits
nothing, the first value that frees memory is the baseline (``rescue_baseline``). The compiled
classes follow, the most promising precision first, and the compile modes beyond default only
for a precision near the leader (``bounds.mode``). ``probe_setting`` finds a setting's
boundary (``memory.probe_memory``), stopped early where a bound says the rest cannot win
(``bounds.larger`` above, ``bounds.below`` below); the knobs stage probes with it too.
``docs/search.md`` states the rules once.
"""

from __future__ import annotations

from autotune.config import Knobs, MemoryProbe, TrialSpec
from autotune.errors import BROKEN
from autotune.knob_rules import skip_reason
from autotune.knobs import KNOB, KNOBS, timed_baseline
from autotune.memory import (
    Steps,
    broken_uncapped,
    hint_for,
    probe_step,
    probe_steps,
    refuted,
)
from autotune.search import bounds, fits, reach_bounds
from autotune.search._records import Candidate
from autotune.search.batch import Chain, measure_all, run_chains
from autotune.search.executor import Executor
from autotune.search.rules import Skip, skip
from autotune.search.stages.remeasure import proposals, remeasure, tell
from autotune.skip_sentences import Context


def run(ex: Executor) -> bool:
    """The stage (``docs/search.md``); False where fp32 eager fits nothing and no value that
    frees memory rescues it: no baseline, the search ends (the api says what it would take)."""
    ev, plan = ex.ev, ex.plan
    first = plan.first_classes()
    noisy = False  # the noise's re-measure left to run beside the next probes
    for i, knobs in enumerate(first):
        if ex.slots is not None and i:
            # Several slots: the classes after the baseline probed at once, each its own
            # chain of runs (one class's probe does not wait for another's), eager first,
            # beside the noise's re-measure (told before any of them goes on: every cut
            # reads it).
            rest = sorted(first[i:], key=lambda c: (
                c.compiled, -ev.precision_best(c.precision) if c.compiled else 0.0))
            probes = [setting_steps(ex, k) for k in rest]
            run_chains(ex, [noise_steps(ex), *probes] if noisy else probes, first=noisy)
            break
        if knobs.compiled:  # the most promising precision first (its eager
            # run's speed): a strong leader early lets the probes after it stop sooner
            first[i:] = sorted(first[i:], key=lambda c: -ev.precision_best(c.precision))
            knobs = first[i]
            floor = reach_bounds.compile_floor(ev, knobs, [
                k for k, p in ev.probes.items() if fits.fit_nothing(ev, k, p)])
            if floor is not None:
                ex.reach.consider(knobs)
                ev.decide(floor)
                ev.floored.append(knobs)
                continue
        if knobs == plan.base:
            probe_ahead(ex, knobs)
        probe_setting(ex, knobs)
        if knobs == plan.base:
            base = ev.probes[plan.base]
            if base.max_micro_batch:
                name_baseline(ex, Candidate(knobs=knobs, micro_batch=base.max_micro_batch))
                noisy = ex.slots is not None and len(first) > 1  # beside the next probes
                if not noisy:
                    measure_noise(ex)
            elif not rescue_baseline(ex):
                return False
    if not hold_baseline(ex):
        return False
    for knobs in first:
        if knobs != plan.base:  # the baseline's near miss is its rescue's
            near_miss(ex, knobs)
    left = []  # (several slots: the refinements worth a probe, probed at once)
    for knobs in plan.refining_classes():
        why_not = bounds.mode(ev, knobs)
        if why_not:
            ex.reach.consider(knobs)
            ev.decide(why_not)
        elif ex.slots is None:
            probe_setting(ex, knobs)
        else:
            left.append(knobs)
    run_chains(ex, [setting_steps(ex, k) for k in left])
    out_of_memory_everywhere(ex)
    return True


PROBE_AHEAD = 4
"""The most runs of one memory probe made at once with several slots. The baseline's probe
runs its largest micro-batches at once (``probe_ahead``), where fp32 eager's largest fit
lies on 93% of the generated tables (develop 167 of 178, judge 163 of 177: the largest
itself on 37-40%, one of the three below it on the rest; three would cover 59-63%;
``benchmarks/probe_fits.py``). Four is the fit and the failure above it in one round on
those tables. Each probe costs a child's start and warm-up whatever its micro-batch, and one
below a fit above it is wasted: more would spend device-seconds where memory is ample (the
largest fits) for rounds on a few tables. Any probe's descent below a failure
(``memory.probe_steps``'s ``ahead``) runs at once what one slot would run next were each run
to fail: the next micro-batch below and the smallest, two runs, in every fan of the replays
at 8 slots (develop 127, judge 124, recorded 9; ``probe_fits.py``); the bound holds the rest."""


def probe_ahead(ex: Executor, knobs: Knobs) -> None:
    """Several slots: the baseline's memory probe run ahead, its largest micro-batches at
    once on the free slots (``PROBE_AHEAD`` at most, one a slot), then decided as one slot
    decides it (``probe_steps`` takes them as known runs; it goes on below them where none
    fit) and its boundary timed. The largest is timed, as a probe's first run is (where
    memory is ample it is the boundary: no run after it); the others only measure memory.
    The baseline always finds its boundary, so each is a run its probe may make; one after
    another it waits for each (two to five on the generated tables), at once for one round
    and the boundary's timing. With one slot, nothing."""
    if ex.slots is None or ex.slots.width < 2:
        return
    largest = ex.plan.micro_batches[-1]
    known = {*ex.ev.probe_runs, *ex.ev.results}
    open_ = [m for m in ex.plan.micro_batches
             if Candidate(knobs=knobs, micro_batch=m) not in known]
    if len(open_) < 2 or open_[-1] != largest:
        return  # (a resumed search: its probe goes on as the first search's did)
    ahead = open_[::-1][:min(ex.slots.width, PROBE_AHEAD)]

    def said(spec: TrialSpec) -> None:
        key = Candidate.of(spec)
        result = ex.ev.probe_runs.get(key)
        if ex.on_step is not None and spec.num_timed_steps <= 0 and result is not None:
            ex.on_step(knobs, probe_step(key.micro_batch, result, ex.plan.usable))

    measure_all(ex, [ex.spec(Candidate(knobs=knobs, micro_batch=m), timed=m == largest)
                     for m in ahead], told=said)


def measure_noise(ex: Executor) -> None:
    """This machine's run-to-run noise, measured before any cut is made: the baseline timed
    once more, in full (rule ``noise``); the gap between its two runs is the first figure
    of ``Evidence.noise_level``, which every bound and cut reads. Not where the baseline's
    timing came from the store (its re-check is the race's), nothing is re-measured
    (``--confirm 0``) or its run did not time every step."""
    base = _noise_key(ex)
    if base is not None:
        remeasure(ex, [base], cold_first=False, paired=True)
        _noise_said(ex, base)


def noise_steps(ex: Executor) -> Chain[None]:
    """``measure_noise`` as a chain of one run (``batch.run_chains``: with several slots,
    beside the next classes' first runs)."""
    base = _noise_key(ex)
    if base is None:
        return
    proposal = proposals(ex, [base], cold_first=False)[0]
    again, rec = yield proposal
    tell(ex, proposal, again, rec, paired=True)
    _noise_said(ex, base)


def _noise_key(ex: Executor) -> Candidate | None:
    """The baseline, where its noise is measured (``measure_noise``); else None."""
    ev, base = ex.ev, ex.ev.baseline
    if base is None or base in ev.stored or ev.settings.num_confirm <= 0 \
            or ev.runs.get(base, 1) >= 2 or ev.score(base, full=True) is None:
        return None
    return base


def _noise_said(ex: Executor, base: Candidate) -> None:
    """The gap between the baseline's two runs, said (rule ``noise``)."""
    ev = ex.ev
    gap = ev.drift.get(base)
    if gap is not None:
        ev.decide(skip("noise", base.key(), gap=gap, noise=ev.noise_level,
                       confirm_within=ev.settings.confirm_within))


def probe_setting(ex: Executor, knobs: Knobs, *, above: int = 0,
                  hint: int | None = None) -> MemoryProbe:
    """Find the setting's largest fitting micro-batch, and time it (``setting_steps``: one
    run at a time, or with several slots a descent's fan at once, ``batch.run_chains``)."""
    return run_chains(ex, [setting_steps(ex, knobs, above=above, hint=hint)])[0]


def setting_steps(ex: Executor, knobs: Knobs, *, above: int = 0,
                  hint: int | None = None) -> Steps[MemoryProbe]:
    """Find the setting's largest fitting micro-batch, and time it: a chain of runs
    (``memory.Steps``), each decided on the evidence as it stands when the one before ends.

    A probe that may be the largest fit times its config in the same run; bisection
    points only measure memory. When the boundary turns out to be such a point, it is
    timed afterwards. ``above``: only larger micro-batches are considered (the probe
    starts at the next one up: the smaller ones cannot win, ``probe_recompute``); ``hint``:
    the first micro-batch tried (default: the most alike setting's boundary)."""

    def candidate(micro_batch: int) -> Candidate:
        return Candidate(knobs=knobs, micro_batch=micro_batch)

    def free(micro_batch: int) -> bool:
        # The baseline always finds its boundary; a run already measured (a resumed study)
        # costs nothing: the probe goes on as the first search's did.
        key = candidate(micro_batch)
        return knobs == ex.plan.base or key in ex.ev.results or key in ex.ev.held \
            or key in ex.ev.probe_runs

    # ``probe_memory`` says a stop in its words ("micro-batches above 8 not probed: " and
    # the bound's sentence); each note keeps the typed skip behind it, said in that context.
    stopped: dict[str, Skip] = {}

    def said(why: Skip | None, context: Context, **where: int) -> str | None:
        if why is None:
            return None
        said_in = why.within(context, knobs.label(), **where)
        stopped[said_in.text.removeprefix(f"{knobs.label()}: ")] = said_in
        return why.text

    def stop_above(fit: int, above: int) -> str | None:
        return None if free(above) else said(bounds.larger(ex.ev, candidate(fit)),
                                             "above-not-probed", probed_above=fit)

    def stop_below(over: int, below: int) -> str | None:
        return None if free(below) else said(bounds.below(ex.ev, candidate(over)),
                                             "below-not-probed", probed_below=over)

    def timed(micro_batch: int, may_be_largest: bool) -> bool:
        # A compiled setting's probe above its largest fit so far times its config too:
        # should it fit, timing it in a run of its own costs another child and another
        # load of its graphs, where the timed steps alone cost seconds.
        if may_be_largest or not knobs.compiled:
            return may_be_largest
        return 0 < fits.largest_fit(ex.ev, knobs) < micro_batch

    considered = [m for m in ex.plan.micro_batches if m > above]
    probe = yield from probe_steps(
        ex.plan.report.workload, ex.plan.report.device.device, knobs, considered,
        budget_bytes=ex.plan.report.budget_bytes, usable_bytes=ex.plan.usable,
        timeout_s=ex.ev.settings.timeout_s,
        hint=considered[0] if above or (hint is None and fits.floor_over(ex.ev, knobs)) else
        hint or hint_for(knobs, ex.ev.probes.values()),
        on_step=ex.on_step, stop_above=stop_above,
        stop_below=stop_below,
        make_spec=lambda m, largest: ex.spec(candidate(m), timed=timed(m, largest)),
        known={c.micro_batch: r for c, r in [*ex.ev.probe_runs.items(),
                                             *ex.ev.results.items()]
               if c.knobs == knobs and c in ex.ev.reached},
        flat=fits.flat(ex.ev),
        ahead=1 if ex.slots is None else min(ex.slots.width, PROBE_AHEAD),
        floor_first=fits.floor_first(ex.ev, knobs) and not above)
    ex.ev.found(probe)
    for note in probe.notes:
        if note.startswith(("micro-batches above", "micro-batches below")):
            ex.ev.decide(stopped.get(note) or _probe_note(knobs.label(), note))
    if not probe.max_micro_batch and any(n.startswith("micro-batches below")
                                         for n in probe.notes):
        ex.ev.unfound(knobs)  # its smaller micro-batches were never tried: not "none"
    while probe.max_micro_batch:  # timed at its fit (reused where the probe timed it)
        result = yield ex.spec(candidate(probe.max_micro_batch))
        lower = refuted(probe, result, ex.plan.usable) if result is not None else None
        if lower is None:
            break
        probe = lower  # that run went over where the probe's fit: the next one down
        ex.ev.found(probe)
    return probe


def name_baseline(ex: Executor, fit: Candidate) -> None:
    """The baseline: ``fit`` (fp32 eager's largest fit, or what rescued it) as an untuned
    user runs it. Where the workload declares lengths that is each batch padded to its own
    longest sample (``timed_baseline``: a collate's padding), timed here at ``fit``'s
    micro-batch; its memory is ``fit``'s probe at the worst case. Should that run fail,
    ``fit`` stays the baseline."""
    traits = ex.ev.traits
    knobs = timed_baseline(fit.knobs, traits is not None and traits.has_lengths)
    key = Candidate(knobs=knobs, micro_batch=fit.micro_batch)
    if key != fit and not ex.measure(ex.spec(key)).ok:
        key = fit
    ex.ev.name_baseline(key)


def hold_baseline(ex: Executor) -> bool:
    """Whether the baseline still fits with every run of it counted: peaks vary from run to
    run, and the noise's re-measure can peak over the usable memory where the first run did
    not (an EPYC deep GPT at a shrunk budget: 20.1 then 24.7 MiB of 22.8). Where it does not,
    its probe's fit steps down (``memory.refuted``): the next micro-batch down, timed, is the
    baseline, or where none is left the values that free memory rescue it
    (``rescue_baseline``; before, the search went on without a baseline that fit and ended
    with no winner). False: nothing does."""
    ev = ex.ev
    while ev.baseline is not None:
        key = ev.baseline
        result, probe = ev.results.get(key), ev.probes.get(key.knobs)
        lower = refuted(probe, result, ex.plan.usable) if result is not None \
            and probe is not None and probe.max_micro_batch == key.micro_batch else None
        if lower is None:
            return True
        ev.found(lower)
        ev.name_baseline(None)
        if lower.max_micro_batch:
            fit = Candidate(knobs=key.knobs, micro_batch=lower.max_micro_batch)
            ex.measure(ex.spec(fit))
            name_baseline(ex, fit)
    return rescue_baseline(ex)


def rescue_baseline(ex: Executor) -> bool:
    """fp32 eager fits nothing: try the values that free memory on it, most first; the
    first that fits is the baseline (what fits with the least change). False when none
    does (the api then says what the budget would need), and at once when fp32 eager
    failed at the smallest micro-batch in a way no memory changes (``BROKEN``: a hang,
    a non-finite loss; or a crash, of its process or of one rank of its job, that the
    same run without the memory cap shows is not the cap's doing,
    ``memory.broken_uncapped``: the api names the workload's failure)."""
    smallest = ex.plan.micro_batches[0]
    first = [s.status for s in ex.ev.probes[ex.plan.base].steps if s.micro_batch == smallest]
    if any(status in BROKEN for status in first):
        return False
    if "crash" in first:
        # A crash under the cap can be the cap's doing (a stack that cannot grow): one run
        # without it says which, before any setting that frees memory is tried.
        uncapped = ex.uncapped(Candidate(knobs=ex.plan.base, micro_batch=smallest))
        ex.ev.took_uncapped(uncapped)
        if broken_uncapped(uncapped, ex.plan.usable):
            return False
    for knob in KNOBS[2:]:
        for value in knob.frees_memory:
            if value not in ex.plan.values.get(knob.name, ()) or ex.ev.baseline is not None:
                continue
            knobs = ex.plan.base.with_(**{knob.name: value})
            why = skip_reason(knobs, ex.ev.traits)
            if why:
                ex.ev.decide(skip("not-applicable", knobs.label(),
                                  context="not-tried", reason=why))
                continue
            probe = probe_setting(ex, knobs)
            if probe.max_micro_batch:
                name_baseline(ex, Candidate(knobs=knobs, micro_batch=probe.max_micro_batch))
                ex.ev.decide(skip(
                    "baseline-rescued", ex.ev.baseline.key(),
                    base=ex.plan.base.label(), usable=ex.plan.usable))
    near_miss(ex, ex.plan.base)
    return ex.ev.baseline is not None


def near_miss(ex: Executor, setting: Knobs) -> None:
    """``setting``'s smallest micro-batch peaked over the usable memory, inside the headroom
    or out of memory within what a value may take off a peak (``fits.near_miss``, rule
    ``near-miss``): each value the plan offers of a knob that frees
    no memory by design is probed on it from there up (one knob changed, as the rescue's),
    for it may land under; one that fits is a setting like any probed. Where nothing rescued
    the baseline (``setting`` fp32 eager), the first that fits here is the baseline."""
    missed, smallest = fits.near_miss(ex.ev, setting), ex.plan.micro_batches[0]
    if missed is None:
        return
    peak, headroom = missed
    tried = [knobs for knob in KNOBS[2:] for value in ex.plan.values.get(knob.name, ())
             if value != knob.default and value not in knob.frees_memory
             and not skip_reason(knobs := setting.with_(**{knob.name: value}), ex.ev.traits)
             and knobs not in ex.ev.probes]
    if tried:
        ex.ev.decide(skip("near-miss", Candidate(knobs=setting, micro_batch=smallest).key(),
                          "" if headroom else "oom", peak=peak,
                          usable=ex.plan.usable, budget=ex.plan.report.budget_bytes,
                          drop=fits.VALUE_PEAK_DROP, tried=", ".join(k.label() for k in tried)))
    for knobs in tried:
        probe = probe_setting(ex, knobs, hint=smallest)
        if probe.max_micro_batch and ex.ev.baseline is None and setting == ex.plan.base:
            name_baseline(ex, Candidate(knobs=knobs, micro_batch=probe.max_micro_batch))
            ex.ev.decide(skip("baseline-rescued", ex.ev.baseline.key(),
                              base=ex.plan.base.label(), usable=ex.plan.usable))


def out_of_memory_everywhere(ex: Executor) -> None:
    """Each compiled class that ran out of memory at every micro-batch down to the smallest
    (none timed: the joint stage's ``relieved`` needs a run that ran), or was not probed for
    it could fit no more than one that did (``Evidence.floored``), probed with the
    checkpointing value that frees most where it could win so (``reach_bounds.oom_class_reach``,
    rule ``oom-class-reach``): as fp32 eager's rescue frees memory for the baseline. Where
    one's probe fit nothing, a class whose eager class peaks no lower is not probed
    (``reach_bounds.oom_class_peak``)."""
    ev = ex.ev
    ckpt = KNOB["checkpointing"]
    missed: list[Knobs] = []  # the classes whose probe with it fit nothing
    # The most promising precision first (its best), compile mode default before the
    # others: what one finds bounds the next.
    everywhere = [(k, p) for k, p in ev.probes.items() if fits.fit_nothing(ev, k, p)]
    for knobs, _ in sorted([*everywhere, *((k, None) for k in ev.floored)], key=lambda t: (
            -ev.precision_best(t[0].precision), t[0].compile_mode != "default")):
        freed = next((f for v in ckpt.frees_memory if v in ex.plan.values.get(ckpt.name, ())
                      and (f := knobs.with_(checkpointing=v)) not in ev.probes
                      and skip_reason(f, ev.traits) is None), None)
        if freed is None:
            continue
        why_not, note = reach_bounds.oom_class_reach(ev, knobs, freed.checkpointing)
        why_not = why_not or reach_bounds.oom_class_peak(ev, knobs, missed, freed.checkpointing)
        if why_not is not None:
            ev.decide(why_not)
        elif note is not None:
            ev.decide(note)
            if not probe_setting(ex, freed).max_micro_batch:
                missed.append(knobs)


def _probe_note(target: str, note: str) -> Skip:
    """A memory probe's stop note said in its words (``memory.probe_memory`` made it: the
    line through the peaks), under the rule it came from."""
    if note.startswith("micro-batches below"):
        rule = "over-budget-below"
    else:
        rule = "peak-line" if "the line through the peaks" in note else "gain-ceiling"
    return skip(rule, target, "" if rule == "peak-line" else "probe-note", note=note)
