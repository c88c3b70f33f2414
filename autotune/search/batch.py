"""A stage's batch of runs: one after another, or at once on the free slots (``--parallel``).

A stage that has several runs to make whatever their results (the joint screen's proposals, a
re-measure's) hands them over here. With one slot they run as they always did, in order
(``Executor.measure``, ``Executor.run_proposal``). With several, ``slots.dispatch`` starts each
as a slot frees, and each is told to the evidence and the study in the order it ends: the
stages' decisions are the same; only when each result arrives differs. A run whose
candidate a result told meanwhile would have ruled out is not stopped: it ends, and its result
is kept as evidence (a batch is proposed from the evidence before it, as one worker would run
it). The confirm stage's re-measures (the finalists, before the pick) run alone
(``alone``): no neighbour shares their machine; its first ones, before the finalists are
chosen, do not (``remeasure``'s ``finalists``).

A stage whose runs are chains of decisions independent of each other (each class's memory
probe, each value of a knob) hands the chains over (``run_chains``): with several slots each
chain has a run in flight, its next decided as soon as its own run before is told. A stage
whose batches are proposed one from the results of the one before (the joint screen) hands
its proposer over (``run_batches``): with several slots it proposes again as each result is
told, and a slot does not wait for the rest of its batch. An eager walk down (the refine
stage) has its next steps timed at once on the free slots (``walk_ahead``), then decides on
them one by one as it would have.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from autotune.config import TrialResult, TrialSpec
from autotune.schema import RunKind, TrialRecord
from autotune.search._records import Candidate, classify
from autotune.search._study import Asked
from autotune.search.claims import Elsewhere
from autotune.search.executor import Executor, Proposal, Stop
from autotune.search.slots import Begun, Done, Slot, dispatch

R = TypeVar("R")
Refused = Callable[[Proposal, Stop], None]
"""Called when a limit stops a proposal (before it starts, or cutting it short)."""


def measure_all(ex: Executor, specs: Sequence[TrialSpec], *,
                feed: list[TrialSpec] | None = None,
                told: Callable[[TrialSpec], None] | None = None) -> None:
    """Each spec measured (``Executor.measure``): in order with one slot; at once on the
    free slots with several, each told as it ends. Several slots only: ``told`` is called
    with each spec once its result is told (or answered without a run), and specs the
    caller adds to ``feed`` meanwhile start as slots free (``run_batches``)."""
    if ex.slots is None:
        later = []
        for spec in specs:  # in a joined study, what another node runs now is heard last
            try:
                ex.measure(spec, wait=not ex.settings.join)
            except Elsewhere:
                later.append(spec)
        for spec in later:
            ex.measure(spec)
        return

    later: list[TrialSpec] = []

    def start(spec: TrialSpec) -> Begun[TrialSpec]:
        answered = ex.answered(spec)
        if answered is not None:
            return Begun(value=answered)
        kind: RunKind = "trial" if spec.num_timed_steps > 0 else "probe"
        claimed = ex.study.claim(Candidate.of(spec), kind, ex.plan.micro_batches, wait=False)
        if claimed is None:  # another node runs it now: heard after the batch
            later.append(spec)
            return Begun()
        if isinstance(claimed, TrialResult):  # another node's result: no run here
            return Begun(value=ex.heard(spec, claimed))
        return _begin(ex, spec, kind, claimed)

    def end(spec: TrialSpec, run: object, done: Done) -> TrialRecord | None:
        assert isinstance(run, _Run)
        rec = _end(ex, run, done, lambda result: ex.took(run.spec, run.trial, result))
        if rec is not None:
            ex.progress(Candidate.of(spec), rec)
        return rec

    try:
        for spec, _ in dispatch(ex.slots, specs, start, end, partial(_started, ex), feed=feed):
            if told is not None and spec not in later:
                told(spec)
    finally:
        ex.slot = ""
    for spec in later:  # waited for (run here, alone, if its claim went stale)
        ex.measure(spec)
        if told is not None:
            told(spec)


def run_batches(ex: Executor, propose: Callable[[], Sequence[Proposal]], rounds: int
                ) -> None:
    """Batches of runs, each proposed on the evidence the runs before left (``propose``:
    the runs to make now, none made yet; the joint screen's), at most ``rounds`` of them.
    With one slot, a batch at a time: each run in turn (``measure_all``), the next batch
    proposed once it has ended. With several, asynchronously: the first batch starts on
    the free slots, and each time a run's result is told the evidence proposes again, the
    runs it adds (not made, not running) starting as slots free; a slot does not wait for
    the rest of its batch. A run proposed on a result of the k-th batch counts as the
    (k+1)-th (``rounds`` bounds it as one slot's batches)."""
    if ex.slots is None:
        for _ in range(rounds):
            batch = propose()
            if not batch:
                return
            measure_all(ex, [proposal.spec for proposal in batch])
        return
    nth: dict[Candidate, int] = {}  # each run proposed: the batch it counts in

    def more(k: int, feed: list[TrialSpec]) -> None:
        if k <= rounds:
            for proposal in propose():
                if proposal.candidate not in nth:
                    nth[proposal.candidate] = k
                    feed.append(proposal.spec)

    pending: list[TrialSpec] = []
    more(1, pending)
    while pending:  # (again: what runs another node made proposed once the slots were done)
        feed: list[TrialSpec] = []
        measure_all(ex, pending, feed=feed, told=partial(_more_after, more, nth, feed))
        pending = feed


def walk_ahead(ex: Executor, keys: Sequence[Candidate]) -> None:
    """Several slots: a walk's next runs (``keys``, in the order the walk would ask for them,
    the first its next one), measured at once on the free slots (``measure_all``), at most
    one per slot, so that each the walk then asks for is answered without a wait. One
    after another it would wait for each; the walk decides as it would, step by step, on
    the results (a run it stops before is evidence, as a batch's run behind a result is).
    With one slot, nothing: the walk measures its runs as it asks."""
    if ex.slots is None:
        return
    ahead = [k for k in keys[:ex.slots.width] if k not in ex.ev.results]
    if len(ahead) > 1:
        measure_all(ex, [ex.spec(k) for k in ahead])


def _more_after(more: Callable[[int, list[TrialSpec]], None], nth: dict[Candidate, int],
                feed: list[TrialSpec], spec: TrialSpec) -> None:
    """``run_batches``: a run told: the evidence proposes again, counted one batch later."""
    more(nth[Candidate.of(spec)] + 1, feed)


def run_proposals(ex: Executor, batch: Sequence[Proposal], *, alone: bool = False,
                  refused: Refused | None = None,
                  ) -> Iterator[tuple[Proposal, TrialResult, TrialRecord]]:
    """Each proposal run (``Executor.run_proposal``), yielded with its result and record as
    it ends: in order with one slot or ``alone``; at once on the free slots otherwise."""
    if ex.slots is None or alone:
        for proposal in batch:
            try:
                again, rec = ex.run_proposal(proposal)
            except Stop as stop:
                if refused is not None:
                    refused(proposal, stop)
                raise
            yield proposal, again, rec
        return

    def start(proposal: Proposal) -> Begun[Proposal]:
        if proposal.stored is not None:  # the study answers it: no child runs
            return Begun(value=ex.run_proposal(proposal))
        try:
            return _begin(ex, proposal.spec, "re-measure")
        except Stop as stop:
            if refused is not None:
                refused(proposal, stop)
            raise

    def end(proposal: Proposal, run: object, done: Done) -> tuple[TrialResult, TrialRecord]:
        assert isinstance(run, _Run)

        try:
            return _end(ex, run, done, partial(_remeasured, ex, proposal, run))
        except Stop as stop:
            if refused is not None:
                refused(proposal, stop)
            raise

    try:
        for proposal, value in dispatch(ex.slots, batch, start, end, partial(_started, ex)):
            again, rec = value  # type: ignore[misc]
            yield proposal, again, rec
    finally:
        ex.slot = ""


Chain = Generator[Any, Any, R]
"""A chain of runs (as ``memory.Steps``): each step a spec (a probe or a timing, sent its
result), a fan (a tuple of specs, run at once, sent the tuple of their results) or a
``Proposal`` (a re-measure, sent its result and record)."""


def run_chains(ex: Executor, chains: Sequence[Chain[R]], *, first: bool = False
               ) -> list[R]:
    """Chains of runs (``Chain``: each class's memory probe, a knob's values) side by side,
    their answers in the chains' order. With one slot each chain runs to its end in turn
    (``memory.drive``, through ``Executor.measure``). With several, each chain has one step
    at a time on the slots (a fan's runs each on its own): its next is decided (the chain
    resumed with the result) once the step before has ended and been told, and starts as a
    slot frees; the chains do not wait for each other, and no run of a later chain sets a
    bar that stops one of an earlier chain early (``Executor.later``: one slot would run it
    after). ``first``: the first chain's every
    run is told before any other chain's next step is decided (the noise's re-measure,
    which every cut reads: the others' first runs start beside it). A run the evidence or
    the study answers costs none; one another node runs now (a joined study) is waited for
    once the others are done."""
    if ex.slots is None:
        return [_finish(chain, None, ex) for chain in chains]
    answers: dict[int, R] = {}
    told: dict[int, Any] = {}  # per chain, the result its next step is decided on
    steps: dict[int, tuple[Any, list[Any], bool]] = {}  # per chain: its step's runs, their
    # results so far (None: not in yet), and whether it is a fan
    lead: dict[int, int] = {}  # per chain, the run its step started with
    parked: dict[tuple[int, int], TrialSpec] = {}  # runs another node makes now
    held: list[tuple[int, int | None]] = []  # chains told while the first still runs
    feed: list[tuple[int, int | None]] = []
    ran: dict[int, set[Candidate]] = {}  # per chain, the candidates its runs were
    Item = tuple[int, int | None]  # (chain, its step's run; None: the chain's next step)

    def in_(i: int, j: int, result: Any) -> None:
        """Run ``j`` of chain ``i``'s step told: once all are, the chain goes on."""
        _, results, fan = steps[i]
        results[j] = result
        if all(r is not None for r in results):
            del steps[i]
            told[i] = tuple(results) if fan else results[0]
            (held if first and i and 0 not in answers else feed).append((i, None))

    def start(item: Item) -> Begun[Item]:
        i, j = item
        if j is not None:
            return _start_run(i, j)
        ex.later = frozenset(c for k, made in ran.items() if k > i for c in made)
        try:
            return _next_step(i, told.pop(i, None))
        finally:
            ex.later = frozenset()

    def _next_step(i: int, result: Any) -> Begun[Item]:
        while True:
            try:
                step = chains[i].send(result)  # (None: a chain's first step)
            except StopIteration as done:
                answers[i] = done.value
                if i == 0:
                    feed.extend(held)
                    held.clear()
                return Begun()
            runs = step if isinstance(step, tuple) else (step,)
            results = [_answered(run) for run in runs]
            if all(r is not None for r in results):
                result = tuple(results) if isinstance(step, tuple) else results[0]
                continue
            steps[i] = (runs, results, isinstance(step, tuple))
            todo = [k for k, r in enumerate(results) if r is None]
            feed.extend((i, k) for k in todo[1:])  # a fan's other runs, as slots free
            lead[i] = todo[0]
            return _start_run(i, todo[0])

    def _answered(run: Any) -> Any:
        """A run the study answers without a child (a stored re-measure) or the evidence
        does; None: it runs."""
        if isinstance(run, Proposal):
            return ex.run_proposal(run) if run.stored is not None else None
        return ex.answered(run)

    def _start_run(i: int, j: int) -> Begun[Item]:
        run = steps[i][0][j]
        ran.setdefault(i, set()).add(run.candidate if isinstance(run, Proposal)
                                     else Candidate.of(run))
        if isinstance(run, Proposal):
            return _begin(ex, run.spec, "re-measure", proposal=run)
        kind: RunKind = "trial" if run.num_timed_steps > 0 else "probe"
        claimed = ex.study.claim(Candidate.of(run), kind, ex.plan.micro_batches, wait=False)
        if claimed is None:
            parked[i, j] = run
            return Begun()
        if isinstance(claimed, TrialResult):
            in_(i, j, ex.heard(run, claimed))
            return Begun()
        return _begin(ex, run, kind, claimed)

    def end(item: Item, run: object, done: Done) -> None:
        assert isinstance(run, _Run)
        i, j = item
        if run.proposal is not None:
            result = _end(ex, run, done, partial(_remeasured, ex, run.proposal, run))
        else:
            rec = _end(ex, run, done, lambda result: ex.took(run.spec, run.trial, result))
            if rec is not None:
                ex.progress(Candidate.of(run.spec), rec)
            result = done.result
        in_(i, lead[i] if j is None else j, result)

    try:
        for _ in dispatch(ex.slots, [(i, None) for i in range(len(chains))], start, end,
                          partial(_started, ex), feed=feed):
            pass
    finally:
        ex.slot = ""
    for (i, j), spec in parked.items():  # waited for, then the chain goes on alone
        steps[i][1][j] = ex.measure(spec)
    for i in sorted({i for i, _ in parked}):
        _, results, fan = steps.pop(i)
        answers[i] = _finish(chains[i], tuple(results) if fan else results[0], ex)
    return [answers[i] for i in range(len(chains))]


def _finish(chain: Chain[R], result: Any, ex: Executor) -> R:
    """A chain resumed with ``result`` (None: from its start), run to its end one run at a
    time (``Executor.measure``, ``Executor.run_proposal``; a fan's runs in order)."""
    def run(step: Any) -> Any:
        return ex.run_proposal(step) if isinstance(step, Proposal) else ex.measure(step)

    try:
        step = chain.send(result)
        while True:
            step = chain.send(tuple(map(run, step)) if isinstance(step, tuple) else run(step))
    except StopIteration as done:
        return done.value


def _remeasured(ex: Executor, proposal: Proposal, run: _Run, again: TrialResult
                ) -> tuple[TrialResult, TrialRecord]:
    """A re-measure's result classified and told to the study (its evidence is the
    stage's to take: ``remeasure.tell``)."""
    rec, value = classify(proposal.candidate, again, ex.ev.results, ex.ev.baseline,
                          ex.plan.report, ex.settings)
    ex.study.tell(run.trial, again, value, kind="re-measure")
    return again, rec


@dataclass
class _Run:
    """A run started on a slot: what its end needs."""

    spec: TrialSpec
    kind: RunKind
    running: Any
    """The study's trial context (``Ledger.running``), entered."""
    trial: Any
    start_s: float
    kept_s: float
    proposal: Proposal | None = None
    """A re-measure's proposal (a chain's step: ``run_chains``); None for a measure."""


def _begin(ex: Executor, spec: TrialSpec, kind: RunKind, claimed: Asked | None = None,
           proposal: Proposal | None = None) -> Begun[Any]:
    """A run's start: its limits (``Executor.limited``), its study trial (its progress once it
    has a slot: ``_started``); ``claimed``: its claim in a joined study, released when a
    limit stops it."""
    key = Candidate.of(spec)
    try:
        spec = ex.limited(spec, claimed)
    except Stop:
        ex.study.release(claimed)
        raise
    running = ex.study.running(key, ex.plan.micro_batches, claimed)
    trial = running.__enter__()
    ex.in_flight += 1
    return Begun(spec, _Run(spec, kind, running, trial, ex.clock() - ex.tally.start,
                            ex.kept_s, proposal))


def _started(ex: Executor, item: object, run: object, slot: Slot) -> None:
    """A run begun on ``slot``: its progress says so."""
    assert isinstance(run, _Run)
    ex.slot = slot.label
    ex.progress(Candidate.of(run.spec), None)


def _end(ex: Executor, run: _Run, done: Done, told: Callable[[TrialResult], Any]) -> Any:
    """A run's end: its cost and record (``Executor.ran``), then ``told`` (evidence and
    study) inside its study trial, which fails where either raises."""
    ex.in_flight -= 1
    ex.slot = done.slot.label
    try:
        if done.error is not None:
            raise done.error
        assert done.result is not None
        value = told(ex.ran(run.spec, run.kind, done.result, run.start_s, run.kept_s,
                            done.slot.label))
    except BaseException as exc:
        run.running.__exit__(type(exc), exc, exc.__traceback__)
        raise
    run.running.__exit__(None, None, None)
    return value
