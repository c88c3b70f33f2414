"""The race's runs, one batch of proposals: each of some candidates timed once more in full
(the leader compiled afresh where its first launch is unchecked), told to the evidence as it
ends, in any order (``Evidence.remeasured``). The race (``race``), the noise's early measure
(``probe.measure_noise``) and a re-measure before a cut (``refine``) all time through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from autotune.config import TrialResult
from autotune.schema import TrialRecord
from autotune.search import fits
from autotune.search._records import Candidate
from autotune.search.batch import run_proposals
from autotune.search.executor import Executor, Proposal, Stale, Stop
from autotune.search.policy import rechecked, unchecked


def remeasure(ex: Executor, keys: Sequence[Candidate], *, cold_first: bool = True,
              paired: bool = False, finalists: bool = True) -> dict[Candidate, TrialResult]:
    """The race's runs: each of ``keys`` once more, keeping its better run; the first (the
    leader) compiled afresh where its first launch is unchecked (``cold_first``). The runs
    made, in order: proposed at once (``proposals``), run one after another, each told to the
    evidence as it ends (``tell``: in any order, one worker or several); a resumed search
    answers each from the study's runs in the order they were made."""
    ran: dict[Candidate, TrialResult] = {}
    # The finalists (the confirm stage's) run alone: no neighbour shares their machine
    # (``finalists`` False: a single run's second, before the finalists are chosen).
    for proposal, again, rec in run_proposals(
            ex, proposals(ex, keys, cold_first=cold_first), refused=partial(_refused, ex),
            alone=finalists and ex.stage in ("confirm", "first launch")):
        tell(ex, proposal, again, rec, paired=paired)
        ran[proposal.candidate] = again
    return ran


def proposals(ex: Executor, keys: Sequence[Candidate], *,
              cold_first: bool = True) -> list[Proposal]:
    """``keys`` as one batch of runs, each spec built from the evidence now (``remeasure``)."""
    batch: list[Proposal] = []
    for key in keys:
        recheck = key in ex.ev.stored
        # The leader's re-measure compiles afresh where its first launch is unchecked: it is
        # also the first-launch check, where the leader is most often the winner.
        cold = cold_first and key == keys[0] and not recheck and fits.unchecked_launch(ex.ev,
                                                                                       key)
        spec = ex.spec(key, early_stop=False)
        if not recheck and (stored := ex.ev.answer(key)) is not None:
            batch.append(Proposal(key, spec, cold=cold, stored=stored))
        elif cold:
            batch.append(Proposal(key, replace(spec, cold_compile=True), cold=True))
        elif recheck:
            batch.append(Proposal(key, replace(
                spec, timing_precision=ex.settings.rank_precision), recheck=True))
        else:
            batch.append(Proposal(key, spec))
    assert len({p.candidate for p in batch}) == len(batch), "one run per candidate a batch"
    return batch


def _run(ex: Executor, proposal: Proposal) -> tuple[TrialResult, TrialRecord]:
    """``Executor.run_proposal``; a first-launch check that a limit stops before it runs
    says the winner unchecked (``_refused``)."""
    try:
        return ex.run_proposal(proposal)
    except Stop as stop:
        _refused(ex, proposal, stop)
        raise


def _refused(ex: Executor, proposal: Proposal, stop: Stop) -> None:
    """A first-launch check that a limit stops before it runs says the winner unchecked."""
    if proposal.cold and not stop.cut:
        ex.ev.decide(unchecked(proposal.candidate, str(stop)))


def tell(ex: Executor, proposal: Proposal, again: TrialResult, rec: TrialRecord, *,
         paired: bool = False) -> None:
    """A proposed run's result into the evidence (``Evidence.remeasured``); a stored timing
    re-checked keeps the fresh run where the stored one is stale (``policy.rechecked``).

    Raises:
        Stale: a re-check ran another model than the stored runs did.
    """
    key = proposal.candidate
    if proposal.stored is None:  # the re-run's own figures (the study's were said first)
        ex.progress(key, rec)
    before = ex.ev.results[key]
    if proposal.recheck and again.ok and before.workload_fingerprint and \
            again.workload_fingerprint not in ("", before.workload_fingerprint):
        raise Stale(
            f"stored runs not reused: the workload changed since they were measured "
            f"(re-check of {key.key()}: fingerprint {again.workload_fingerprint}, "
            f"stored {before.workload_fingerprint}: its parameter or batch shapes "
            "differ); every candidate was measured again")
    ex.ev.remeasured(key, again, cold=proposal.cold, paired=paired)
    if proposal.recheck:
        fresh, note = rechecked(key, before, again, ex.settings)
        ex.ev.rechecked(key, again, fresh=fresh, note=note)
