"""What a search works with: candidates, settings, outcomes, and the verdict on each run."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from autotune import __version__
from autotune.config import (
    Knobs,
    MemoryProbe,
    ProbeReport,
    TrialResult,
    TrialSpec,
    format_bytes,
)
from autotune.device import backend_for
from autotune.errors import NoFeasibleConfigError, WorkloadError
from autotune.schema import (
    MemoryRecord,
    RunKind,
    RunRecord,
    SearchCost,
    SkipRecord,
    StudyRecord,
    TrialRecord,
    TunedConfig,
)
from autotune.search.rules import Skip
from autotune.timing import Lead, lead

if TYPE_CHECKING:
    from autotune.search._ledger import Ledger

# Numerics guard: allowed relative distance of the first loss from fp32 eager's, per precision.
LOSS_TOLERANCE = {"fp32": 0.01, "tf32": 0.01, "bf16": 0.05, "fp16": 0.05}


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One point of the search space: the knobs and the micro-batch. The key of every dict
    of the search (strings exist only at the Optuna boundary and in the report)."""

    knobs: Knobs
    micro_batch: int

    def key(self) -> str:
        """A readable name, e.g. ``bf16/default+ckpt=blocks/16``."""
        return f"{self.knobs.label()}/{self.micro_batch}"

    @classmethod
    def from_key(cls, key: str) -> Candidate:
        """The candidate ``key()`` names."""
        label, _, micro_batch = key.rpartition("/")
        return cls(knobs=Knobs.from_label(label), micro_batch=int(micro_batch))

    @classmethod
    def of(cls, spec: TrialSpec) -> Candidate:
        """The candidate a spec runs."""
        return cls(knobs=spec.knobs, micro_batch=spec.micro_batch)

    def graph(self) -> Candidate:
        """The candidate whose compiled graphs it runs (``Knobs.graph``)."""
        return Candidate(knobs=self.knobs.graph(), micro_batch=self.micro_batch)


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """How to search (everything but the workload, device and memory)."""

    num_timed_steps: int = 10
    """Most timed steps of a run; a re-measurement of the contenders times all of them."""
    rank_precision: float | None = 0.05
    """A first timing stops once its median step time is known within this share (the 95%
    interval's half-width, at least 3 steps): enough to rank it, while the contenders are
    re-measured in full (``num_confirm``). None: every run times ``num_timed_steps``."""
    min_timed_s: float = 1.0
    """Each trial times at least this many seconds (more steps than ``num_timed_steps`` when
    they are fast): the median of a 0.3 s window moved by 30% between runs on a shared CPU."""
    micro_batches_per_class: int = 3
    """Most micro-batches timed per memory class: the largest that fits (its probe), then
    smaller ones while each is faster than the last. 0: every fitting micro-batch of every
    class tried, none skipped."""
    refine_within: float = 0.9
    """Refine only what can still win: smaller micro-batches of a class, and for a precision
    the compile modes beyond off and default (kernel autotuning, CUDA graphs), are tried only
    while the class's (or precision's) best is at least this share of the leader's. 0 tries
    every class the device supports."""
    max_trials: int = 60
    """Most child runs, probes included (each probe that fits also times its config)."""
    time_budget_s: float | None = None
    train_steps: int | None = None
    """Objective: time to train this many optimizer steps, compile included."""
    storage: str | None = None
    """An Optuna RDB URL to resume or share (``--storage``); None: the local study store."""
    study_name: str | None = None
    cache: bool = True
    """Without ``storage``, record runs in the local study store and reuse what it holds for
    the same key (``_store``); False: in memory only (``--no-cache``)."""
    fresh: bool = False
    """Drop the local store's runs for this key first (``--fresh``)."""
    timeout_s: float = 900.0
    slower_factor: float = 2.0
    """Stop timing a candidate once it has spent this many times the best's timed seconds."""
    stop_margin: float = 0.15
    """Sequential stopping: stop timing a candidate once its fastest of 3 or more timed steps
    is this much slower than the leader's median step (or the leader's spread, when wider)."""
    num_confirm: int = 2
    """Most contenders re-measured with the leader before the pick (0: none); each keeps its
    better run, since a slow period of the machine only ever inflates times."""
    confirm_within: float = 0.05
    """A candidate is a contender, re-measured with the leader, when its score is within this
    share of the leader's or within the step-time spread either run measured: a lead wider
    than the noise stands without a second run."""


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
    stop_reason: str
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

    @property
    def skipped(self) -> tuple[str, ...]:
        """What was not run, each as its sentence (``skip_sentences.render``)."""
        return tuple(s.text for s in self.skips)


def run_record(number: int, kind: RunKind, candidate: Candidate, result: TrialResult,
               usable_bytes: int, *, start_s: float = 0.0, compiled: bool,
               stored_at: str | None = None) -> RunRecord:
    """A child run as the report draws it."""
    return RunRecord(
        number=number, kind=kind, knobs=candidate.knobs, micro_batch=candidate.micro_batch,
        status=result.status, fits=result.fits(usable_bytes), peak_bytes=result.peak_bytes,
        start_s=max(start_s, 0.0), wall_s=result.wall_s,
        compile_s=result.compile_s if compiled else None,
        timed_s=sum(result.step_times_s), stored_at=stored_at)


def objective(result: TrialResult, settings: SearchSettings) -> float | None:
    """samples/s (maximized), or with ``train_steps`` the time to train (minimized)."""
    median = result.median_step_s()
    if not result.ok or median is None:
        return None
    if settings.train_steps:
        return (result.compile_s or 0.0) + settings.train_steps * median
    return result.samples_per_s()


def score(value: float | None, settings: SearchSettings) -> float | None:
    """The objective as larger-is-better, so shares of the leader read the same both ways."""
    if value is None or value <= 0:
        return None
    return 1.0 / value if settings.train_steps else value


def classify(candidate: Candidate, result: TrialResult, results: dict[Candidate, TrialResult],
             baseline: Candidate | None, report: ProbeReport,
             settings: SearchSettings) -> tuple[TrialRecord, float | None]:
    """The record of one run: its figures, and a verdict before the winner is known."""
    per_device = report.per_device_batch()
    base = results.get(baseline) if baseline is not None else None
    base_sps = base.samples_per_s() if base is not None else None
    sps = result.samples_per_s()
    verdict, reason = result.status, result.message.splitlines()[0] if result.message else ""
    if result.ok:
        verdict, reason = "ok", ""
        usable = report.usable_bytes()
        # The reference is fp32 eager on the trial's own batches (older stored results lack
        # it: then the baseline's first loss, on batches made the same way).
        ref = result.reference_loss if result.reference_loss is not None else (
            base.first_loss if base is not None else None)
        tol = LOSS_TOLERANCE.get(candidate.knobs.precision, 0.05)
        if result.peak_bytes is not None and result.peak_bytes > usable:
            verdict = "over_budget"
            reason = (f"ran, but its peak {result.peak_bytes / 2**20:,.1f} MiB is over the "
                      f"{usable / 2**20:,.1f} MiB usable (budget minus headroom)")
        elif ref is not None and result.first_loss is not None and ref != 0:
            distance = abs(result.first_loss - ref) / abs(ref)
            if distance > tol:
                verdict = "numerics"
                reason = (f"first loss {result.first_loss:.4g} is {distance:.1%} from fp32 "
                          f"eager's {ref:.4g} on the same batches (allowed {tol:.0%})")
        if verdict == "ok" and (leak := result.leak_note()):
            verdict, reason = "oom", f"{leak}; a run of more steps runs out of memory"
        if verdict == "ok" and _stopped_behind(result, settings):
            verdict = "slower"
            reason = (f"stopped after {len(result.step_times_s)} timed steps: clearly behind "
                      "the leader (its fastest step slower than the leader's median beyond the "
                      f"noise, or over {settings.slower_factor:g}x its time)")
    value = objective(result, settings) if verdict in ("ok", "slower") else None
    tokens = sps * result.tokens_per_sample if sps and result.tokens_per_sample else None
    per_sample = flops_per_sample(base)
    tflops = per_sample * sps / 1e12 if per_sample and sps else None
    peak = backend_for(report.device.device).peak_tflops(report.device.name,
                                                         candidate.knobs.precision)
    record = TrialRecord(
        number=0, micro_batch=candidate.micro_batch,
        accumulate_steps=per_device // candidate.micro_batch, knobs=candidate.knobs,
        verdict=verdict, reason=reason,  # type: ignore[arg-type]
        is_baseline=candidate == baseline, median_step_s=result.median_step_s(),
        spread=result.spread(), halfwidth=result.halfwidth(),
        update_s=statistics.median(result.update_times_s) if result.update_times_s else None,
        num_timed_steps=len(result.step_times_s), samples_per_s=sps,
        tokens_per_s=tokens, peak_bytes=result.peak_bytes, compile_s=result.compile_s,
        first_loss=result.first_loss, num_skipped_steps=result.num_skipped_steps,
        num_graphs=result.num_graphs, num_graph_breaks=result.num_graph_breaks,
        num_alloc_retries=result.num_alloc_retries,
        fragmentation_bytes=result.fragmentation_bytes,
        speedup=sps / base_sps if sps and base_sps else None,
        tflops_per_s=tflops, mfu=tflops / peak if tflops and peak else None,
        time_to_train_s=value if settings.train_steps and value is not None else None,
        wall_s=result.wall_s,
    )
    return record, value


def _stopped_behind(result: TrialResult, settings: SearchSettings) -> bool:
    """The run stopped timing because it was behind the leader or out of time, not because it
    had measured enough (a stored run without the reason: fewer steps than asked)."""
    if result.timing_stop:
        return result.timing_stop in ("behind", "time_limit")
    return len(result.step_times_s) < settings.num_timed_steps


OUT_OF_MEMORY = ("oom", "crash")
"""Endings of a run that say its candidate does not fit (under a hard cap an allocation
failure can also kill the child)."""


def keep_better(first: TrialResult, again: TrialResult) -> TrialResult:
    """Of two runs of one candidate, the one that ran with the lower median step time (a slow
    period of the machine only ever inflates times), carrying the larger peak of the two: a
    config near the memory boundary may not fit twice. A run that ran out of memory wins
    over one that fit: the candidate is out (a user's run may end as that one did); so does
    one whose memory grew at every step (``TrialResult.leak_note``)."""
    for leaked, other in ((again, first), (first, again)):
        if leaked.ok and other.ok and leaked.leak_note() and not other.leak_note():
            return leaked
    for ran_out, fit in ((again, first), (first, again)):
        if ran_out.status in OUT_OF_MEMORY and fit.ok:
            cause, *rest = (ran_out.message or ran_out.status).splitlines()
            note = (f"{cause}; another run of it fit (peak {format_bytes(fit.peak_bytes)}): "
                    "at the memory boundary, it does not fit every run")
            return replace(ran_out, message="\n".join((note, *rest)))
    kept = again if again.ok and (not first.ok or (again.median_step_s() or 1e18) <
                                  (first.median_step_s() or 1e18)) else first
    peaks = [r.peak_bytes for r in (first, again) if r.ok and r.peak_bytes is not None]
    return replace(kept, peak_bytes=max(peaks)) if peaks else kept


def flops_per_sample(baseline: TrialResult | None) -> float | None:
    """Model FLOPs per sample, from the FLOPs the baseline counted on its first step."""
    if baseline is None or not baseline.flops_per_step or not baseline.samples_per_step:
        return None
    return baseline.flops_per_step / baseline.samples_per_step


def pick_winner(records: tuple[TrialRecord, ...], settings: SearchSettings) -> TrialRecord | None:
    """The fastest candidate that ran every timed step with sound numerics."""
    feasible = [r for r in records if r.verdict == "ok" and r.median_step_s]
    if not feasible:
        return None
    if settings.train_steps:
        return min(feasible, key=lambda r: r.time_to_train_s or math.inf)
    best = max(feasible, key=lambda r: r.samples_per_s or 0.0)
    if best.round_shares and not won_rounds(best):
        # Its best run is the fastest, but run back to back with the other of the confirm stage's
        # interleaved rounds it was behind in most: the rounds decide between the two.
        return next((r for r in feasible if r is not best and won_rounds(r)), best)
    return best


def won_rounds(record: TrialRecord) -> bool:
    """Whether a candidate of the confirm stage's interleaved rounds was ahead in most of them."""
    return sum(s > 1 for s in record.round_shares) * 2 > len(record.round_shares)


def break_even_steps(winner: TrialRecord, baseline: TrialRecord) -> float | None:
    """Optimizer steps after which a compiled winner's compile time is paid back."""
    if winner.knobs.compile_mode == "off" or not winner.median_step_s or not baseline.median_step_s:
        return None
    saved = baseline.median_step_s - winner.median_step_s
    if saved <= 0:
        return math.inf
    return (winner.compile_s or 0.0) / saved


# ----------------------------------------------------------------------------------------------
# The winner, assembled as autotune.json content.


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
    result = outcome.results[Candidate(knobs=winner.knobs, micro_batch=winner.micro_batch)]
    memory = MemoryRecord(
        device_total_bytes=report.device.total_memory_bytes, budget_bytes=report.budget_bytes,
        headroom=report.headroom, usable_bytes=report.usable_bytes(),
        peak_bytes=winner.peak_bytes,
        max_micro_batch={p.knobs.label(): p.max_micro_batch for p in report.probes},
        allocator=report.allocator,
        peak_definition=("max_memory_reserved + CUDA context" if report.device.is_cuda else
                         "address-space growth of the child over its baseline"),
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
        reason=_why(winner, baseline, records, outcome.first_launch, outcome.drift),
        trials=records,
        skips=skip_records(report.skipped, outcome), interrupted=outcome.interrupted,
        not_reached=outcome.not_reached,
        cost=outcome.cost, runs=outcome.runs, study=outcome.study,
    )


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
            + f" its samples/s: ahead in {sum(s > 1 for s in shares)} of {len(shares)}")


def _why(winner: TrialRecord, baseline: TrialRecord, records: tuple[TrialRecord, ...],
         first_launch: Mapping[Candidate, str],
         drift: Mapping[Candidate, float] | None = None) -> str:
    """The winner against the baseline and the runner-up (with what is unknown of its fit as
    a first launch: "either would do" must not send a user to a config that may not fit).

    The lead's interval is the two runs' own spread, widened to the widest ``drift`` this
    search saw between two runs of one candidate: runs of one config drift further apart than
    their steps do on a shared machine. Without such a pair, a lead that stands on a single
    run says so."""
    text = f"{winner.label()} won at {winner.samples_per_s:,.1f} samples/s"
    if winner.is_baseline:
        text += " (it is the baseline: nothing tried beat fp32 eager)"
    elif winner.speedup:
        noise = max(winner.spread or 0.0, baseline.spread or 0.0)
        text += f", {winner.speedup:.2f}x the baseline ({baseline.label()})"
        if winner.speedup - 1 < noise:
            text += f", within the measured noise ({noise:.0%} spread)"
    others = [r for r in records if r.verdict == "ok" and r.samples_per_s]
    if not others or not winner.samples_per_s:
        return text
    runner_up = max(others, key=lambda r: r.samples_per_s or 0.0)
    paired = next((r for r in others if r.round_shares), None)
    if winner.round_shares and paired is not None:
        # the confirm stage's rounds decided between the two: the lead is theirs, not the best runs'
        runner_up = paired
        text += (f"; the runner-up {runner_up.label()} (best run {runner_up.samples_per_s:,.1f}"
                 f" samples/s): {_rounds(winner)} (two runs of one config here drifted "
                 f"further apart than their gap)")
    elif winner.time_to_train_s is not None:  # the objective is not samples/s: no lead in it
        text += f"; runner-up {runner_up.label()} ({runner_up.reason})"
    else:
        ahead = lead(winner.samples_per_s, winner.halfwidth, runner_up.samples_per_s or 0.0,
                     runner_up.halfwidth)
        apart = ""
        if drift and ahead.halfwidth is not None:
            key, widest = max(drift.items(), key=lambda kv: kv[1])
            if widest > ahead.halfwidth:
                ahead = Lead(gap=ahead.gap, halfwidth=widest)
                apart = f": two runs of {key.key()} here were {widest:.0%} apart"
        sure = ("beyond the noise" if ahead.is_clear else "within the noise: either would do"
                if ahead.halfwidth is not None else "") + apart
        if not drift and ahead.is_clear and min(winner.num_runs, runner_up.num_runs) < 2:
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
