"""The outcome of a search, built where it is: its records, skips, cost and run log, what it
never reached (``SearchOutcome``), and the ``autotune.json`` content that describes its pick
with every trial and skip (``tuned_config``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from autotune import __version__
from autotune.config import MemoryProbe, ProbeReport, StopReason, TrialResult
from autotune.errors import NoFeasibleConfigError, WorkloadError
from autotune.schema import (
    MemoryRecord,
    RunnerUp,
    RunRecord,
    SearchCost,
    SkipRecord,
    StudyRecord,
    TrialRecord,
    TunedConfig,
)
from autotune.search import fits
from autotune.search._ledger import Ledger
from autotune.search._records import Candidate, SearchSettings, flops_per_sample
from autotune.search.evidence import Evidence
from autotune.search.executor import Executor
from autotune.search.intervals import Interval, noise_between
from autotune.search.pick import break_even_steps, pick_winner, rounds_ahead
from autotune.search.policy import unchecked
from autotune.search.rules import Skip, skip
from autotune.timing import Lead, lead


@dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    """What the driver hands back to the api."""

    records: tuple[TrialRecord, ...]
    results: dict[Candidate, TrialResult]
    baseline: Candidate | None
    """fp32 eager at its largest fitting micro-batch; None when fp32 eager fits nothing."""
    probes: tuple[MemoryProbe, ...]
    """The knob settings probed, in the order they were."""
    skips: tuple[Skip, ...]
    """What was not run, each with its rule id, figures and sentence (``rules``)."""
    interrupted: bool
    stop_reason: StopReason
    not_reached: tuple[str, ...] = ()
    """A search stopped early: the stages and knobs it never began (``TunedConfig``)."""
    num_runs: int = 0
    """Child processes this search started (stored results it reused not counted)."""
    cost: SearchCost | None = None
    runs: tuple[RunRecord, ...] = ()
    """Every child run, stored ones first (``schema.RunRecord``)."""
    study: StudyRecord | None = None
    ledger: Ledger | None = field(default=None, repr=False, compare=False)
    """The study itself, still open: the estimator's calibration keeps its figures in it."""
    first_launch: Mapping[Candidate, str] = field(default_factory=dict)
    """Compiled candidates on a device whose peak counts the compile (CPU) that no run showed
    fitting as a first launch compiles them, each with what is known: all their runs loaded
    their graphs from inductor's cache, or the run that compiled them did not fit."""
    drift: Mapping[Candidate, float] = field(default_factory=dict)
    """Candidates this search timed twice (a close race's re-measure, a first-launch check),
    each with how far apart its two runs' medians were (0.3: the slower 30% slower)."""
    uncapped: TrialResult | None = None
    """fp32 eager's smallest micro-batch without the memory cap, where it crashed under it
    (``Evidence.uncapped``): the api names the workload's failure from it."""

    @property
    def skipped(self) -> tuple[str, ...]:
        """What was not run, each as its sentence (``skip_sentences.render``)."""
        return tuple(s.text for s in self.skips)


def outcome(ev: Evidence, ex: Executor, stop: StopReason,
            not_reached: tuple[str, ...] = ()) -> SearchOutcome:
    """What the search hands back: every record, the skips, the cost and the run log, and
    (stopped early) what it never began (``driver.not_reached``)."""
    interrupted = stop.interrupted
    ev.release_held(asked=True)  # a search stopped early picks from all it knows too
    if ev.baseline is None:  # stopped while probing it: its largest fit timed so far
        ev.name_baseline(fits.known_baseline(ev))
    stored_pick = ev.winner() if interrupted else None
    if stored_pick is not None and stored_pick in ev.stored:
        ev.decide(skip("stored-pick", stored_pick.key()))
    if interrupted and ev.plan.compile_in_peak:
        winner = ev.winner()
        if winner is not None and winner.knobs.compiled and not (
                winner in ev.cold and ev.cold[winner].ok):
            ev.decide(unchecked(winner, str(stop)))
    traits = ev.traits
    if (traits is not None and traits.num_blocks < 2 and any(
            k.knobs.sharded for k in ev.results)):
        ev.decide(skip("fsdp-root", ""))
    first: dict[str, Skip] = {}
    for one in ev.skips:  # each sentence once, where it was first said
        first.setdefault(one.text, one)
    skips = tuple(first.values())
    records = tuple(
        replace(rec, number=i, num_runs=ev.runs.get(k, 1), timed_s=ev.timed_s.get(k) or None)
        for i, (k, rec) in enumerate(ev.figured().items()))
    runs = list(ex.tally.run_log)  # and in a joined study, what the other nodes ran meanwhile
    runs += [replace(r, number=len(runs) + i)
             for i, r in enumerate(ex.study.others_runs(ex.plan.usable))]
    return SearchOutcome(records=records, results=ev.results, baseline=ev.baseline,
                         first_launch=fits.first_launch(ev), drift=dict(ev.drift),
                         uncapped=ev.uncapped,
                         probes=tuple(ev.probes.values()),
                         skips=skips,
                         interrupted=interrupted, stop_reason=stop,
                         not_reached=not_reached,
                         num_runs=ex.tally.num_runs,
                         runs=tuple(runs), study=ex.study.record,
                         ledger=ex.study,
                         cost=SearchCost(num_runs=ex.tally.num_runs, **ex.tally.cost,
                                         num_compiled_runs=ex.tally.compiles[0],
                                         num_cached_compiles=ex.tally.compiles[1],
                                         **_slots_cost(ex)))


def _slots_cost(ex: Executor) -> dict[str, Any]:
    """With several slots (``--parallel``): how many, the wall time and device-seconds."""
    if ex.slots is None:
        return {}
    devices = max(1, ex.plan.report.nproc_per_node)
    return {"parallel": ex.slots.width, "wall_s": ex.clock() - ex.tally.start,
            "device_s": ex.tally.cost["child_s"] * devices}


def tuned_config(report: ProbeReport, outcome: SearchOutcome,
                 settings: SearchSettings) -> TunedConfig:
    """Pick the winner and describe it, with every trial, as ``autotune.json`` content.

    Raises:
        NoFeasibleConfigError: no candidate ran to the end with sound numerics.
    """
    assert outcome.baseline is not None, "search() refuses an outcome without a baseline"
    winner = pick_winner(outcome.records, settings)
    if winner is None:
        seen = ", ".join(f"{r.label()}: {r.verdict}" for r in outcome.records) or "none ran"
        leaks = [(key.key(), note) for key, r in outcome.results.items()
                 if (r.ok or r.status == "oom") and (note := r.leak_note())]
        if leaks:
            key, note = leaks[0]
            raise WorkloadError(
                f"no candidate completed its timed steps ({seen}): they fit their warm-up steps, "
                f"then ran out of memory or grew at every step; {key}: {note}. A larger budget "
                "only delays it: fix the workload")
        raise NoFeasibleConfigError(f"no candidate completed its timed steps ({seen})")
    baseline = next(r for r in outcome.records if r.is_baseline)
    records = tuple(replace(r, verdict="winner", reason="fastest") if r is winner else
                    _lost(r, winner) for r in outcome.records)
    key = Candidate(knobs=winner.knobs, micro_batch=winner.micro_batch)
    result = outcome.results[key]
    memory = MemoryRecord(
        device_total_bytes=report.device.total_memory_bytes, budget_bytes=report.budget_bytes,
        headroom=report.headroom, usable_bytes=report.usable_bytes(),
        peak_bytes=winner.peak_bytes,
        max_micro_batch={p.knobs.label(): p.max_micro_batch for p in report.probes},
        allocator=report.allocator,
        peak_definition=("max_memory_reserved + CUDA context" if report.device.is_cuda else
                         "address-space growth of the child over its baseline"),
        peak_verified=key not in outcome.first_launch,
        peak_unverified=_unverified(key, outcome),
    )
    return TunedConfig(
        autotune_version=__version__, created_at=datetime.now(timezone.utc).isoformat(),
        workload=report.workload, workload_name=result.workload_name,
        workload_fingerprint=result.workload_fingerprint, target_batch=report.target_batch,
        requested_batch=report.requested_batch,
        world_size=report.world_size, nproc_per_node=report.nproc_per_node,
        micro_batch=winner.micro_batch,
        accumulate_steps=winner.accumulate_steps, knobs=winner.knobs, memory=memory,
        device=report.device,
        objective="time_to_train" if settings.train_steps else "throughput",
        train_steps=settings.train_steps, median_step_s=winner.median_step_s,
        samples_per_s=winner.samples_per_s, tokens_per_s=winner.tokens_per_s,
        flops_per_sample=flops_per_sample(outcome.results.get(outcome.baseline)),
        mfu=winner.mfu,
        baseline_samples_per_s=baseline.samples_per_s, speedup=winner.speedup,
        break_even_steps=break_even_steps(winner, baseline),
        reason=_why(winner, baseline, records, outcome.first_launch, outcome.drift,
                    settings.confirm_within),
        runner_up=_standing(winner, records, outcome.drift, settings.confirm_within)[1],
        trials=records,
        skips=skip_records(report.skipped, outcome), interrupted=outcome.interrupted,
        not_reached=outcome.not_reached,
        cost=outcome.cost, runs=outcome.runs, study=outcome.study,
    )


def _unverified(winner: Candidate, outcome: SearchOutcome) -> str:
    """Why the winner's fit as a first launch is unknown (``MemoryRecord.peak_unverified``):
    the sentence of its ``first-launch-unchecked`` skip without its target, or what
    ``SearchOutcome.first_launch`` says; "" where it is known."""
    if winner not in outcome.first_launch:
        return ""
    said = next((s.text for s in outcome.skips if s.rule == "first-launch-unchecked"
                 and s.target == winner.key()), None)
    return said.removeprefix(f"{winner.key()}: ") if said else outcome.first_launch[winner]


def skip_records(notes: tuple[str, ...], outcome: SearchOutcome) -> tuple[SkipRecord, ...]:
    """The file's typed skips: the space's notes (rule ``space``), then the search's own, each
    with its rule id, figures, variant and context, and its sentence as rendered (for readers
    of the JSON)."""
    return (*(SkipRecord(rule="space", text=text) for text in notes),
            *(SkipRecord(rule=s.rule, target=s.target, text=s.text, figures=dict(s.figures),
                         variant=s.variant, context=s.context)
              for s in outcome.skips))


def _lost(record: TrialRecord, winner: TrialRecord) -> TrialRecord:
    if record.verdict != "ok" or not record.samples_per_s or not winner.samples_per_s:
        return record
    ratio = record.samples_per_s / winner.samples_per_s
    if record.round_shares and winner.round_shares:
        return replace(record, reason=f"{ratio:.2f}x the winner's samples/s; {_rounds(record)}")
    return replace(record, reason=f"{ratio:.2f}x the winner's samples/s")


def _rounds(record: TrialRecord) -> str:
    """A candidate of the confirm stage's interleaved rounds against the other, in words."""
    shares = record.round_shares
    return (f"run back to back with it in {len(shares)} interleaved rounds, "
            + ", ".join(f"{s:.2f}x" for s in shares)
            + f" its samples/s: ahead in {rounds_ahead(shares)} of {len(shares)}")


def _why(winner: TrialRecord, baseline: TrialRecord, records: tuple[TrialRecord, ...],
         first_launch: Mapping[Candidate, str],
         drift: Mapping[Candidate, float] | None = None,
         confirm_within: float = SearchSettings.confirm_within) -> str:
    """The winner against the baseline and the runner-up (with what is unknown of its fit as
    a first launch: "either would do" must not send a user to a config that may not fit).
    The lead is judged by ``_standing``; without a pair of runs of one config, a lead that
    stands on a single run says so."""
    text = f"{winner.label()} won at {winner.samples_per_s:,.1f} samples/s"
    if winner.is_baseline:
        text += " (it is the baseline: nothing tried beat fp32 eager" + (
            ", each batch padded to its longest sample)" if winner.knobs.shapes == "longest"
            else ")")
    elif winner.speedup:
        noise = max(winner.spread or 0.0, baseline.spread or 0.0)
        text += f", {winner.speedup:.2f}x the baseline ({baseline.label()})"
        if winner.speedup - 1 < noise:
            text += f", within the measured noise ({noise:.0%} spread)"
    runner_up, standing, ahead, said = _standing(winner, records, drift, confirm_within)
    if runner_up is None:
        return text
    if standing == "rounds":
        # the confirm stage's rounds decided between the two: the lead is theirs, not the best runs'
        text += (f"; the runner-up {runner_up.label()} ({runner_up.samples_per_s:,.1f}"
                 f" samples/s): {_rounds(winner)} (two runs of one config here drifted "
                 f"further apart than their gap)")
    elif ahead is None:  # the objective is not samples/s: no lead in it
        text += f"; runner-up {runner_up.label()} ({runner_up.reason})"
    else:
        sure = ("beyond the noise" if standing == "behind" else
                f"within the noise: either would do{said}")
        if standing == "behind-once":
            # The interval is each run's own spread. Between two runs of one config a shared
            # machine drifts further (the committed oracles' passes: a median 1.6-23% apart,
            # `benchmarks/rule_checks.py` (7)), and a lead this wide was not re-measured.
            once = "the winner" if winner.num_runs < 2 else "the runner-up"
            sure = (f"beyond the spread within each run, but {once} ran once: the drift "
                    "between runs of a shared machine is not in that; --confirm-within "
                    "re-measures leads up to that share")
        text += (f"; ahead of the runner-up {runner_up.label()} by {ahead.describe()}"
                 f"{f' ({sure})' if sure else ''}")
    unknown = first_launch.get(Candidate(knobs=runner_up.knobs, micro_batch=runner_up.micro_batch))
    if unknown:
        text += f"; the runner-up's fit as a first launch: {unknown}"
    return text


def _standing(winner: TrialRecord, records: tuple[TrialRecord, ...],
              drift: Mapping[Candidate, float] | None = None,
              confirm_within: float = SearchSettings.confirm_within,
              ) -> tuple[TrialRecord | None, RunnerUp, Lead | None, str]:
    """The runner-up, how the winner stands against it (``TunedConfig.runner_up``), the lead
    (None: the objective is not samples/s, or rounds decided) and, for a lead within the
    noise, what set the noise.

    The search's one comparison decides (``Interval.beats``): the winner's samples/s with the
    noise around it beats the runner-up's, or not. The noise is the two runs' interval (their
    half-widths in quadrature), at least ``confirm_within`` where one of them ran once (as
    the race judged them, ``noise_of``), widened to the widest ``drift`` this search saw
    between two runs of one candidate (runs of one config drift further apart than their
    steps do on a shared machine): of any candidate where one of them ran once, else of the
    two themselves."""
    others = [r for r in records if r.verdict == "ok" and r.samples_per_s]
    if not others or not winner.samples_per_s:
        return None, "", None, ""
    runner_up = max(others, key=lambda r: r.samples_per_s or 0.0)
    paired = next((r for r in others if r.round_shares), None)
    if winner.round_shares and paired is not None:
        return paired, "rounds", None, ""
    if winner.time_to_train_s is not None:
        return runner_up, "", None, ""
    ahead = lead(winner.samples_per_s, winner.halfwidth, runner_up.samples_per_s or 0.0,
                 runner_up.halfwidth)
    once = min(winner.num_runs, runner_up.num_runs) < 2
    # One of them ran once: a machine's run-to-run noise between its runs is unmeasured, and
    # ``confirm_within`` stands for it, as it did when the race chose what to re-measure.
    noise = noise_between(confirm_within if once else 0.0, winner.halfwidth,
                          runner_up.halfwidth)
    said = (f": the noise is --confirm-within {confirm_within:g}"
            if once and noise == confirm_within else "")
    # The drift of any config counts for a pair one of which ran once (one run that far
    # behind is not behind at all, ``policy.within_drift``); two re-measured runs each speak
    # for themselves, so then only their own drift counts.
    pair = {Candidate(knobs=r.knobs, micro_batch=r.micro_batch) for r in (winner, runner_up)}
    drifts = {k: g for k, g in (drift or {}).items() if once or k in pair}
    key, widest = max(drifts.items(), key=lambda kv: kv[1], default=(None, 0.0))
    if key is not None and widest > noise:
        noise, said = widest, f": two runs of {key.key()} here were {widest:.0%} apart"
        if ahead.halfwidth is not None and widest > ahead.halfwidth:
            ahead = Lead(gap=ahead.gap, halfwidth=widest)  # said as the lead's interval
    if not Interval(winner.samples_per_s, noise).beats(runner_up.samples_per_s or 0.0):
        return runner_up, "within-noise", ahead, said
    return runner_up, "behind-once" if once and not drift else "behind", ahead, ""
