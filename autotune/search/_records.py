"""What a search works with: candidates, settings, and the verdict on each run."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from autotune.config import Knobs, ProbeReport, TrialResult, TrialSpec
from autotune.device import backend_for
from autotune.schema import (
    RunKind,
    RunRecord,
    TrialRecord,
)
from autotune.timing import MIN_STEPS_TO_STOP
from autotune.units import accumulate_steps, format_bytes

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
        return _candidate_of_key(key)

    @classmethod
    def of(cls, spec: TrialSpec) -> Candidate:
        """The candidate a spec runs."""
        return cls(knobs=spec.knobs, micro_batch=spec.micro_batch)

    def graph(self) -> Candidate:
        """The candidate whose compiled graphs it runs (``Knobs.graph``)."""
        return Candidate(knobs=self.knobs.graph(), micro_batch=self.micro_batch)


@functools.lru_cache(maxsize=4096)
def _candidate_of_key(key: str) -> Candidate:
    """``Candidate.from_key``, kept per key (a candidate is frozen): the replay's tables name
    candidates by key, read back many thousand times a replayed search."""
    label, _, micro_batch = key.rpartition("/")
    return Candidate(knobs=Knobs.from_label(label), micro_batch=int(micro_batch))


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
    join: bool = False
    """Share ``storage``'s study with the searches of other nodes (``--join``): each
    candidate is claimed before it runs, so together they run it once (``claims``)."""
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
    """Most contenders re-measured with the leader before the pick (0: none); the race's
    bounds read each one's better run, since a slow period of the machine only ever inflates
    times (its record, the typical of its runs: ``typical_run``)."""
    confirm_within: float = 0.05
    """A candidate is a contender, re-measured with the leader, when its score is within this
    share of the leader's or within the step-time spread either run measured: a lead wider
    than the noise stands without a second run."""


def run_record(number: int, kind: RunKind, candidate: Candidate, result: TrialResult,
               usable_bytes: int, *, start_s: float = 0.0, compiled: bool,
               stored_at: str | None = None, cut: bool = False) -> RunRecord:
    """A child run as the report draws it (``cut``: the time budget cut it short)."""
    return RunRecord(
        number=number, kind=kind, knobs=candidate.knobs, micro_batch=candidate.micro_batch,
        status=result.status, fits=result.fits(usable_bytes), peak_bytes=result.peak_bytes,
        start_s=max(start_s, 0.0), wall_s=result.wall_s,
        compile_s=result.compile_s if compiled else None,
        timed_s=sum(result.step_times_s), stored_at=stored_at, cut=cut)


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


def classify(candidate: Candidate, result: TrialResult,
             results: Mapping[Candidate, TrialResult],
             baseline: Candidate | None, report: ProbeReport,
             settings: SearchSettings) -> tuple[TrialRecord, float | None]:
    """The record of one run: its figures, and a verdict before the winner is known."""
    per_device = report.per_device_batch()
    base = results.get(baseline) if baseline is not None else None
    base_sps = base.samples_per_s() if base is not None else None
    sps = result.samples_per_s()
    verdict, reason = judge(candidate, result, base, report, settings)
    value = objective(result, settings) if verdict in ("ok", "slower") else None
    tokens = sps * result.tokens_per_sample if sps and result.tokens_per_sample else None
    per_sample = flops_per_sample(base)
    tflops = per_sample * sps / 1e12 if per_sample and sps else None
    peak = backend_for(report.device.device).peak_tflops(report.device.name,
                                                         candidate.knobs.precision)
    record = TrialRecord(
        number=0, micro_batch=candidate.micro_batch,
        accumulate_steps=accumulate_steps(per_device, candidate.micro_batch),
        knobs=candidate.knobs,
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


def judge(candidate: Candidate, result: TrialResult, base: TrialResult | None,
          report: ProbeReport, settings: SearchSettings) -> tuple[str, str]:
    """``classify``'s verdict and its reason alone (``base``: the baseline's run), for a
    reader of the verdict only (``Evidence.score``, at every comparison)."""
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
    return verdict, reason


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


def typical_run(runs: Sequence[TrialResult], noise: float = 0.0) -> TrialResult:
    """The run a candidate's figures are read from (its record, the table, the speedups and
    the pick), of all its runs (``Evidence.timed``). With three or more full timed runs (ok,
    not stopped early), the one whose median step time is their median (of an even count the
    faster of the middle two). With two full runs within ``noise`` of each other (how far
    apart two runs of one config land on this machine: ``Evidence.figure`` gives twice the
    others' typical gap, ``intervals.SINGLE_RUN_GAPS``), their geometric mean
    (``mean_of_two``); with two further apart, or fewer, the better of its runs
    (``keep_better``: a slow period of the machine only inflates times, and two runs further
    apart than the noise says one of them stalled). Best-of-k favours a candidate timed more
    often: under symmetric noise its best run is its luckiest, and the pick leaned to
    whatever was re-measured most (issue 59). Either way it carries the largest peak of its
    runs, and a run that ran out of memory or leaked wins (the candidate is out,
    ``keep_better``)."""
    kept = functools.reduce(keep_better, runs)
    full = sorted((r for r in runs if r.ok and r.median_step_s() and not r.leak_note()
                   and len(r.step_times_s) >= MIN_STEPS_TO_STOP
                   and r.timing_stop not in ("behind", "time_limit")),
                  key=lambda r: r.median_step_s() or math.inf)
    if not kept.ok or kept.leak_note() or len(full) < 2:
        return kept
    if len(full) == 2:
        return mean_of_two(full[0], full[1], noise, kept)
    return replace(full[(len(full) - 1) // 2], peak_bytes=kept.peak_bytes)


def mean_of_two(faster: TrialResult, slower: TrialResult, noise: float, kept: TrialResult
                ) -> TrialResult:
    """Of two full runs, ``faster`` with its step times scaled to the geometric mean of the
    two medians where they lie within ``noise`` of each other (two draws of one config: the
    better of two is the luckier), else ``kept`` (the better run: one of them stalled).
    Either way with ``kept``'s peak (the larger of the two)."""
    fast, slow = faster.median_step_s() or 0.0, slower.median_step_s() or 0.0
    if not fast or slow / fast - 1 > noise:
        return kept
    scale = math.sqrt(slow / fast)
    return replace(faster, step_times_s=tuple(t * scale for t in faster.step_times_s),
                   peak_bytes=kept.peak_bytes)


def as_rounds_said(run: TrialResult, rival: TrialResult, shares: Sequence[float]
                   ) -> TrialResult:
    """``run`` with its step times scaled so that, against its rival of the confirm stage's
    interleaved rounds, the two read as the rounds said: their samples/s in the ratio of
    the median round (``shares``: ``run``'s samples/s over the rival's in each round),
    about the geometric mean of their own figures (``typical_run``). The rounds ran the two
    back to back, so their ratio is the pair's best-measured figure; its median is above 1
    exactly where ``run`` was ahead in most rounds (``pick.won_rounds``), so the winner of
    the rounds is never shown slower than the other."""
    own, other = run.samples_per_s(), rival.samples_per_s()
    if not (run.ok and rival.ok and own and other and shares):
        return run
    # The median round on a log scale: the two sides' shares are each other's inverses, so
    # the pair reads one ratio from either side (of two rounds, their geometric mean).
    ratio = math.exp(statistics.median(math.log(s) for s in shares))
    target = math.sqrt(own * other * ratio)
    return replace(run, step_times_s=tuple(t * own / target for t in run.step_times_s))


def flops_per_sample(baseline: TrialResult | None) -> float | None:
    """Model FLOPs per sample, from the FLOPs the baseline counted on its first step."""
    if baseline is None or not baseline.flops_per_step or not baseline.samples_per_step:
        return None
    return baseline.flops_per_step / baseline.samples_per_step
