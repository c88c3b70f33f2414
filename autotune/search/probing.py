"""The probe and knob stages: each setting's largest fitting micro-batch, and each further
knob screened on the leader, one at a time.

``Prober.probe`` finds a setting's boundary (``memory.probe_memory``), stopped early where a
bound says the rest cannot win (``bounds.larger`` above, ``bounds.below`` below); ``screen``
times each knob value on the leader, probes the values that free memory where memory binds,
and the values that peaked lower above the leader's micro-batch. ``docs/search.md`` states the
rules once.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.config import Knobs, MemoryProbe
from autotune.errors import BROKEN
from autotune.knobs import KNOBS, Knob, skip_reason
from autotune.memory import broken_uncapped, hint_for, probe_memory
from autotune.search import bounds
from autotune.search._records import Candidate
from autotune.search.evidence import Evidence
from autotune.search.executor import Executor
from autotune.search.rules import Skip, skip
from autotune.skip_sentences import Context


class Prober:
    """The probe and knob stages of one search, on its evidence and executor."""

    def __init__(self, ev: Evidence, ex: Executor) -> None:
        self.ev, self.ex, self.plan = ev, ex, ev.plan

    def probe(self, knobs: Knobs, *, above: int = 0) -> MemoryProbe:
        """Find the setting's largest fitting micro-batch, and time it.

        A probe that may be the largest fit times its config in the same run; bisection
        points only measure memory. When the boundary turns out to be such a point, it is
        timed afterwards. ``above``: only larger micro-batches are considered (the probe
        starts at the next one up: the smaller ones cannot win, ``probe_recompute``)."""

        def candidate(micro_batch: int) -> Candidate:
            return Candidate(knobs=knobs, micro_batch=micro_batch)

        def free(micro_batch: int) -> bool:
            # The baseline always finds its boundary; a run already measured (a resumed study)
            # costs nothing: the probe goes on as the first search's did.
            key = candidate(micro_batch)
            return knobs == self.plan.base or key in self.ev.results or key in self.ev.held \
                or key in self.ev.probe_runs

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
            return None if free(above) else said(bounds.larger(self.ev, candidate(fit)),
                                                 "above-not-probed", probed_above=fit)

        def stop_below(over: int, below: int) -> str | None:
            return None if free(below) else said(bounds.below(self.ev, candidate(over)),
                                                 "below-not-probed", probed_below=over)

        def timed(micro_batch: int, may_be_largest: bool) -> bool:
            # A compiled setting's probe above its largest fit so far times its config too:
            # should it fit, timing it in a run of its own costs another child and another
            # load of its graphs, where the timed steps alone cost seconds.
            if may_be_largest or knobs.compile_mode == "off":
                return may_be_largest
            return 0 < self.ev.largest_fit(knobs) < micro_batch

        considered = [m for m in self.plan.micro_batches if m > above]
        probe = probe_memory(
            self.plan.report.workload, self.plan.report.device.device, knobs, considered,
            budget_bytes=self.plan.report.budget_bytes, usable_bytes=self.plan.usable,
            timeout_s=self.ev.settings.timeout_s,
            hint=considered[0] if above else hint_for(knobs, self.ev.probes.values()),
            run=self.ex.measure, on_step=self.ex.on_step, stop_above=stop_above,
            stop_below=stop_below,
            make_spec=lambda m, largest: self.ex.spec(candidate(m), timed=timed(m, largest)),
            known={c.micro_batch: r for c, r in [*self.ev.probe_runs.items(),
                                                 *self.ev.results.items()]
                   if c.knobs == knobs and c in self.ev.reached})
        self.ev.probes[knobs] = probe
        self.ev.skips += [stopped.get(n) or _probe_note(knobs.label(), n) for n in probe.notes
                          if n.startswith(("micro-batches above", "micro-batches below"))]
        if not probe.max_micro_batch and any(n.startswith("micro-batches below")
                                             for n in probe.notes):
            del self.ev.probes[knobs]  # its smaller micro-batches were never tried: not "none"
        if probe.max_micro_batch:
            self.ex.measure(self.ex.spec(candidate(probe.max_micro_batch)))  # reused when timed
        return probe

    def rescue_baseline(self) -> bool:
        """fp32 eager fits nothing: try the values that free memory on it, most first; the
        first that fits is the baseline (what fits with the least change). False when none
        does (the api then says what the budget would need), and at once when fp32 eager
        failed at the smallest micro-batch in a way no memory changes (``BROKEN``: a hang,
        a non-finite loss; or a crash, of its process or of one rank of its job, that the
        same run without the memory cap shows is not the cap's doing,
        ``memory.broken_uncapped``: the api names the workload's failure)."""
        smallest = self.plan.micro_batches[0]
        first = [s.status for s in self.ev.probes[self.plan.base].steps
                 if s.micro_batch == smallest]
        if any(status in BROKEN for status in first):
            return False
        if "crash" in first:
            # A crash under the cap can be the cap's doing (a stack that cannot grow): one
            # run without it says which, before any setting that frees memory is tried.
            self.ev.uncapped = self.ex.uncapped(Candidate(knobs=self.plan.base,
                                                          micro_batch=smallest))
            if broken_uncapped(self.ev.uncapped, self.plan.usable):
                return False
        for knob in KNOBS[2:]:
            for value in knob.frees_memory:
                if value not in self.plan.values.get(knob.name, ()):
                    continue
                knobs = self.plan.base.with_(**{knob.name: value})
                why = skip_reason(knobs, self.ev.traits)
                if why:
                    self.ev.skips.append(skip("not-applicable", knobs.label(),
                                              context="not-tried", reason=why))
                    continue
                probe = self.probe(knobs)
                if probe.max_micro_batch:
                    self.ev.baseline = Candidate(knobs=knobs, micro_batch=probe.max_micro_batch)
                    self.ev.skips.append(skip(
                        "baseline-rescued", self.ev.baseline.key(),
                        base=self.plan.base.label(), usable=self.plan.usable))
                    return True
        return False

    def screen(self, *, timing_only: bool = False) -> None:
        """The knobs stage: each further knob on the leader, one at a time (``docs/search.md``).

        ``timing_only``: only the knobs whose values free no memory, at the leader's
        micro-batch (after refinement moved the leader to another micro-batch, where their
        effect can differ: an optimizer step weighs more beside smaller micro-batches)."""
        lowered: list[tuple[str, str, Candidate]] = []  # (knob, value, where it was timed)
        after: dict[str, Candidate] = {}  # per timing knob, the leader once it was screened
        for knob in KNOBS[2:]:
            if timing_only and knob.frees_memory:
                continue
            leader = self.ev.leader()
            if leader is None:
                return
            knobs_after = self.screen_knob(knob, leader, lowered)
            if knobs_after and len(self.plan.values.get(knob.name, ())) > 1:
                after[knob.name] = knobs_after  # (a knob of one value screens nothing)
        if not timing_only:
            for knob in KNOBS[2:]:
                if knob.per_class:
                    self.screen_per_class(knob)
        self.probe_lowered(lowered)
        final = self.ev.leader()
        stale = {name: on for name, on in after.items() if final is not None
                 and on.knobs != final.knobs and on.micro_batch == final.micro_batch}
        if not timing_only and stale and final is not None:
            # A knob screened before a later one changed the leader's setting: its best value
            # can depend on the other's (an optimizer implementation on channels_last), so
            # its values are timed again on the final leader, once. (A leader at another
            # micro-batch is screened again after refinement, ``stages``.)
            known = len(self.ev.results)
            self.screen(timing_only=True)
            if len(self.ev.results) > known:
                on = next(iter(stale.values()))
                self.ev.skips.append(skip(
                    "rescreen", final.key(), "" if len(stale) == 1 else "several",
                    knobs=", ".join(stale), on=on.knobs.label()))

    def screen_per_class(self, knob: Knob) -> None:
        """A knob whose best value depends on the class (``Knob.per_class``) on each other
        class's best setting, where it could make that class win: that class's best times the
        most the knob can gain (``WorkloadTraits.padding_ceiling``: the worst-case length over
        the mean length, no policy does less work than the real tokens) reaches the leader's
        score within the noise (rule ``per-class``)."""
        leader = self.ev.leader()
        if leader is None or not any(
                v != knob.default and skip_reason(leader.knobs.with_(**{knob.name: v}),
                                                  self.ev.traits) is None
                for v in self.plan.values.get(knob.name, ())):
            return  # no value beyond its default applies here (a fixed-shape workload)
        top = self.ev.score(leader) or 0.0
        gain = max(1.0, self.ev.traits.padding_ceiling if self.ev.traits else 1.0)
        for cls in self.plan.classes:
            if (cls.precision, cls.compile_mode) == (leader.knobs.precision,
                                                     leader.knobs.compile_mode):
                continue
            # A run stopped early behind the leader counts: at the default value a class that
            # could win with another is often clearly behind (its few steps are its speed).
            timed = [(s, c) for c in self.ev.results if c.knobs.precision == cls.precision
                     and c.knobs.compile_mode == cls.compile_mode
                     and getattr(c.knobs, knob.name) == knob.default
                     and (s := self.ev.score(c)) is not None]
            if not timed or not top:
                continue
            score, best = max(timed, key=lambda t: t[0])
            noise = self.ev.noise(best, leader)
            if score * gain < top * (1 - noise):
                self.ev.skips.append(skip(
                    "per-class", best.knobs.label(), knob=knob.name, share=score / top,
                    leader=leader.key(), gain=gain, noise=noise))
                continue
            self.screen_knob(knob, best, [])

    def screen_knob(self, knob: Knob, leader: Candidate,
                    lowered: list[tuple[str, str, Candidate]]) -> Candidate | None:
        """The knobs stage for one knob: each of its values on ``leader`` (``screen``); a value that
        peaked below the leader joins ``lowered``. For a knob that frees no memory, the
        leader after it (None for one that does)."""
        for value in self.plan.values.get(knob.name, ()):
            if value == getattr(leader.knobs, knob.name):
                continue
            knobs = leader.knobs.with_(**{knob.name: value})
            timed_here = Candidate(knobs=knobs, micro_batch=leader.micro_batch)
            recompute = knob.name == "checkpointing" and value in knob.frees_memory
            if knobs in self.ev.probes or (timed_here in self.ev.results and not recompute):
                continue  # (a recompute's run there, stored, says nothing of its probe)
            reason = skip_reason(knobs, self.ev.traits)
            why = skip("not-applicable", knobs.label(), reason=reason) if reason else None
            if why is None and value in knob.frees_memory:
                why = bounds.frees_nothing(self.ev, leader)
            if why is None and recompute:
                why = bounds.recompute(self.ev, leader)
            if why:
                self.ev.skips.append(why.within("not-tried", knobs.label()))
            elif recompute:
                self.probe_recompute(knobs)
            elif value in knob.frees_memory:
                self.probe(knobs)
            else:
                result = self.ex.measure(self.ex.spec(timed_here))
                if result.status == "oom":  # it needs more memory than the leader's
                    self.probe(knobs)
                elif self.ev.lower_peak(leader, timed_here):
                    # its boundary may be above the leader's
                    lowered.append((knob.name, value, timed_here))
        now = self.ev.leader()
        self.ex.screened.add(knob.name)
        return None if knob.frees_memory else now

    def probe_recompute(self, knobs: Knobs) -> None:
        """Probe a checkpointing value above the largest micro-batch its setting fits without
        it: checkpointing recomputes each checkpointed block's forward, so at a micro-batch
        the setting fits without it (without allocator retries: memory pressure is what
        freeing memory can relieve), it runs no faster (``bounds.recompute``) and is not
        run there. The probe starts at the next micro-batch up, timed; where that does not
        fit either, the value fits nothing that could win, and is left out of the probes (its
        smaller micro-batches were never tried: "fits none" would be wrong), with the reason."""
        twin = knobs.with_(checkpointing="off")
        usable = self.plan.usable
        # A fit under memory pressure (allocator retries) is no floor: there, freeing memory
        # can make a step faster.
        fit = self.ev.largest_fit(twin, calm=True)
        if not fit:  # nothing known to fit without it: the whole range is open
            self.probe(knobs)
            return
        if fit >= self.plan.per_device:
            self.ev.skips.append(skip(
                "recompute-twin", knobs.label(), "whole-batch", context="not-tried",
                twin=twin.label(), per_device=self.plan.per_device, largest=fit))
            return
        probe = self.probe(knobs, above=fit)
        if probe.max_micro_batch:
            self.ev.skips.append(skip("recompute-twin", knobs.label(), "below-fit",
                                      twin=twin.label(), largest=fit))
            return
        del self.ev.probes[knobs]
        first = probe.steps[0] if probe.steps else None
        seen: dict[str, int | str] = {} if first is None else {"first": first.micro_batch} | (
            {"first_peak": _bytes(first.peak_bytes), "usable": usable}
            if first.status == "ok" else {"status": first.status})
        variant = ("fits-none" if first is None else
                   "fits-none-peak" if first.status == "ok" else "fits-none-status")
        self.ev.skips.append(skip("recompute-twin", knobs.label(), variant, twin=twin.label(),
                                  largest=fit, **seen))

    def probe_lowered(self, lowered: Sequence[tuple[str, str, Candidate]]) -> None:
        """Probe above the leader's micro-batch the knob values that peaked below it there
        (``lowered``: each value with the candidate it was timed as, on the leader then).

        Their savings add up: two values that alone fit no larger micro-batch may fit one
        together (e.g. a multi-tensor optimizer's and another memory format's), so the
        lowest-peak value of each knob is first timed together on the leader at its
        micro-batch (unless that setting ran already: one of them became the leader, and the
        next was timed on it). Then, lowest peak first, each is probed above where the next
        micro-batch may fit by the growth per sample (``Evidence.growth``); one whose peak is
        not below
        a setting whose probe fit nothing larger is not (it would end in an out-of-memory
        too). The gain ceiling still decides each step of a probe (``bounds.larger``)."""
        leader = self.ev.leader()
        if leader is None:
            return
        here = [(name, value, c) for name, value, c in lowered
                if c.micro_batch == leader.micro_batch and self.ev.results.get(c) is not None]
        peak = {c: self.ev.results[c].peak_bytes or 0 for _, _, c in here}
        changes: dict[str, str] = {}
        for name, value, _c in sorted(here, key=lambda t: peak[t[2]]):
            changes.setdefault(name, value)
        together = Candidate(knobs=leader.knobs.with_(**changes), micro_batch=leader.micro_batch)
        if together.knobs != leader.knobs and together not in self.ev.results \
                and together.knobs not in self.ev.probes \
                and skip_reason(together.knobs, self.ev.traits) is None:
            self.ex.measure(self.ex.spec(together))
            if self.ev.lower_peak(leader, together):
                peak[together] = self.ev.results[together].peak_bytes or 0
        pool = [c for c in peak if c.knobs not in self.ev.probes]
        none_above: Candidate | None = None  # the lowest peak whose probe fit nothing larger
        for c in sorted(pool, key=peak.__getitem__):
            m = c.micro_batch
            above = next(x for x in self.plan.micro_batches if x > m)
            growth = self.ev.growth(c.knobs, m)
            need = None if growth is None else peak[c] + growth * (above - m)
            if none_above is not None:
                self.ev.skips.append(skip(
                    "peak-not-below", c.knobs.label(), micro_batch=m, peak=peak[c],
                    other=none_above.knobs.label(), other_peak=peak[none_above]))
            elif need is not None and need > self.plan.usable:
                self.ev.skips.append(skip(
                    "growth-over-budget", c.knobs.label(), micro_batch=m, peak=peak[c],
                    need=int(need), above=above, growth=int(growth or 0),
                    usable=self.plan.usable))
            else:
                steps = self.probe(c.knobs).steps
                if not any(s.fits for s in steps if s.micro_batch > m) and any(
                        s.micro_batch > m for s in steps):  # tried above: nothing larger fit
                    none_above = c

def _bytes(num_bytes: int | None) -> int | str:
    """A peak as a figure: its bytes, or ``-`` where it was not measured."""
    return "-" if num_bytes is None else num_bytes


def _probe_note(target: str, note: str) -> Skip:
    """A memory probe's stop note said in its words (``memory.probe_memory`` made it: the
    line through the peaks), under the rule it came from."""
    if note.startswith("micro-batches below"):
        rule = "over-budget-below"
    else:
        rule = "peak-line" if "the line through the peaks" in note else "gain-ceiling"
    return skip(rule, target, "" if rule == "peak-line" else "probe-note", note=note)
