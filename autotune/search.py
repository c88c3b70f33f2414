"""The Optuna driver: ask for a candidate, run it isolated, classify the outcome, tell the study.

The only module that imports optuna. The study is the record of the search: with RDB storage
an interrupted search resumes, re-using completed trials, and several processes can share it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import optuna

from autotune.config import (
    ProbeReport,
    TrialResult,
    TrialSpec,
    from_json_dict,
    peak_tflops,
    to_json_dict,
)
from autotune.errors import ConfigError
from autotune.runner import run_isolated
from autotune.schema import TrialRecord

Runner = Callable[[TrialSpec], TrialResult]
# Numerics guard: allowed relative distance of the first loss from fp32 eager's, per precision.
LOSS_TOLERANCE = {"fp32": 0.01, "tf32": 0.01, "bf16": 0.05, "fp16": 0.05}
_INFEASIBLE = 1.0
CONSTRAINT = "ran"
"""Optuna constraint: 0 for a trial that ran to the end, 1 for OOM, crash, timeout, ..."""
optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own progress says what happens


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One point of the search space."""

    precision: str
    compile_mode: str
    micro_batch: int

    def key(self) -> str:
        """Stable name, also the Optuna parameter value."""
        return f"{self.precision}/{self.compile_mode}/{self.micro_batch}"


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """How to search (everything but the workload's probes)."""

    num_timed_steps: int = 10
    micro_batches_per_class: int = 3
    """Time only the largest N fitting micro-batches of each class (0: all)."""
    max_trials: int = 30
    time_budget_s: float | None = None
    train_steps: int | None = None
    """Objective: time to train this many optimizer steps, compile included."""
    storage: str | None = None
    study_name: str | None = None
    timeout_s: float = 900.0
    slower_factor: float = 2.0
    """Stop timing a candidate once it has spent this many times the best's timed seconds."""
    num_confirm: int = 2
    """Leaders re-measured (with the baseline, interleaved) before the pick; each keeps its
    better run, since a slow period of the machine only ever inflates times."""


@dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    """What the driver hands back to the api."""

    records: tuple[TrialRecord, ...]
    results: dict[str, TrialResult]
    baseline: Candidate
    skipped: tuple[str, ...]
    interrupted: bool
    stop_reason: str


def plan_candidates(report: ProbeReport, per_class: int) -> tuple[list[Candidate], list[str]]:
    """Candidates to time, baseline first, and what was left out and why."""
    per_device = report.per_device_batch()
    fp32 = next((p for p in report.probes if p.memory_class.label() == "fp32/off"), None)
    baseline_mb = fp32.max_micro_batch if fp32 and fp32.max_micro_batch else None
    candidates: list[Candidate] = []
    skipped: list[str] = []
    for probe in report.probes:
        fitting = sorted(probe.fitting(), reverse=True)
        label = probe.memory_class.label()
        if not fitting:
            skipped.append(f"{label}: no micro-batch fits, not timed")
            continue
        kept = fitting if per_class <= 0 else fitting[:per_class]
        if len(kept) < len(fitting):
            rest = ", ".join(str(m) for m in fitting[len(kept):])
            skipped.append(
                f"{label}: micro-batches {rest} not timed: smaller than the class's {len(kept)} "
                "largest, they add per-micro-batch overhead and rarely win (--micro-batches all)")
        for m in kept:
            candidates.append(Candidate(precision=probe.memory_class.precision,
                                        compile_mode=probe.memory_class.compile_mode,
                                        micro_batch=m))
    if baseline_mb is None:
        raise ConfigError("fp32 eager does not fit at any micro-batch: there is no baseline")
    baseline = Candidate(precision="fp32", compile_mode="off", micro_batch=baseline_mb)
    ordered = [baseline] + sorted(
        (c for c in candidates if c != baseline),
        key=lambda c: (c.compile_mode != "off", c.precision, -c.micro_batch))
    assert all(per_device % c.micro_batch == 0 for c in ordered)
    return ordered, skipped


def open_study(settings: SearchSettings, identity: dict[str, str],
               direction: str) -> optuna.Study:
    """Create or resume the study; refuse one that belongs to another workload or target.

    Raises:
        ConfigError: the storage cannot be opened, or the study holds another search.
    """
    sampler = optuna.samplers.TPESampler(seed=0)  # reads constraints set on each trial
    name = settings.study_name or ("autotune" if settings.storage else None)
    try:
        study = optuna.create_study(storage=settings.storage, study_name=name,
                                    direction=direction, sampler=sampler, load_if_exists=True)
    except Exception as exc:  # sqlalchemy and optuna raise many types for a bad URL
        raise ConfigError(f"cannot open --storage {settings.storage!r}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0]}; use e.g. sqlite:///autotune.db") from exc
    if study.direction.name.lower() != direction:
        raise ConfigError(f"study {name!r} optimizes {study.direction.name.lower()}; this search "
                          f"would {direction} (objective changed): use another --study-name")
    existing = study.user_attrs.get("autotune_identity")
    if existing is None:
        study.set_user_attr("autotune_identity", identity)
    elif existing != identity:
        diff = {k: (existing.get(k), v) for k, v in identity.items() if existing.get(k) != v}
        raise ConfigError(
            f"study {name!r} in {settings.storage} holds another search ({diff} as stored vs "
            "now): refusing to mix results; use another --study-name")
    return study


def run_search(
    report: ProbeReport,
    settings: SearchSettings,
    *,
    run: Runner = run_isolated,
    on_trial: Callable[[int, int, Candidate, TrialRecord | None], None] | None = None,
) -> SearchOutcome:
    """Time the candidates (baseline first) and classify each outcome.

    Args:
        report: memory probes of the workload on the device.
        settings: trial counts, budgets, objective and storage.
        run: runs a spec (the isolated runner).
        on_trial: progress callback: (index, total, candidate, record or None when starting).
    """
    candidates, skipped = plan_candidates(report, settings.micro_batches_per_class)
    baseline = candidates[0]
    direction = "minimize" if settings.train_steps else "maximize"
    identity = {"workload": report.workload.label(), "target_batch": str(report.target_batch),
                "world_size": str(report.world_size), "device": report.device.name,
                "objective": f"time_to_train:{settings.train_steps}" if settings.train_steps
                else "throughput"}
    study = open_study(settings, identity, direction)
    results = _completed(study)
    if len(candidates) > settings.max_trials:
        skipped.append(f"{len(candidates)} candidates for {settings.max_trials} trials: "
                       "the TPE sampler chose which to time")
    start = time.perf_counter()
    interrupted, stop_reason = False, "every planned candidate was timed"
    runs: dict[str, int] = {}
    planned = min(len(candidates), settings.max_trials)
    by_key = {c.key(): c for c in candidates}
    try:
        # A small space is timed exhaustively (all enqueued); a large one is sampled by TPE.
        for c in candidates if len(candidates) <= planned else candidates[:1]:
            if c.key() not in results:
                study.enqueue_trial({"candidate": c.key()}, skip_if_exists=True)
        attempts = 0
        while len(results) < planned and attempts < 4 * planned:
            attempts += 1
            if settings.time_budget_s and time.perf_counter() - start > settings.time_budget_s:
                interrupted, stop_reason = True, "--time-budget reached: best so far"
                break
            trial = study.ask({"candidate": optuna.distributions.CategoricalDistribution(
                list(by_key))})
            candidate = by_key[trial.params["candidate"]]
            if candidate.key() in results:  # the sampler repeated itself: tell the same value
                _tell(study, trial, results[candidate.key()], direction, settings)
                continue
            if on_trial:
                on_trial(len(results), planned, candidate, None)
            spec = _spec(report, candidate, settings, results, baseline)
            result = run(spec)
            results[candidate.key()] = result
            trial.set_user_attr("result", json.dumps(to_json_dict(result)))
            _tell(study, trial, result, direction, settings)
            if on_trial:
                record = classify(candidate, result, results, baseline, report, settings)[0]
                on_trial(len(results), planned, candidate, record)
        if not interrupted:
            runs = _confirm(report, settings, results, by_key, baseline, run, on_trial)
    except KeyboardInterrupt:
        interrupted, stop_reason = True, "interrupted (Ctrl-C): best so far"
    records = tuple(replace(classify(by_key[k], r, results, baseline, report, settings)[0],
                            number=i, num_runs=runs.get(k, 1))
                    for i, (k, r) in enumerate((k, r) for k, r in results.items() if k in by_key))
    return SearchOutcome(records=records, results=results, baseline=baseline,
                         skipped=tuple(skipped), interrupted=interrupted,
                         stop_reason=stop_reason)


def _confirm(report: ProbeReport, settings: SearchSettings, results: dict[str, TrialResult],
             by_key: dict[str, Candidate], baseline: Candidate, run: Runner,
             on_trial: Callable[[int, int, Candidate, TrialRecord | None], None] | None,
             ) -> dict[str, int]:
    """Re-measure the leaders and the baseline, interleaved; keep each one's better run."""
    ranked = sorted(
        (k for k, r in results.items() if k in by_key and _objective(r, settings) is not None
         and len(r.step_times_s) >= settings.num_timed_steps),
        key=lambda k: _objective(results[k], settings) or 0.0,
        reverse=not settings.train_steps)
    keys = list(dict.fromkeys([baseline.key(), *ranked[:settings.num_confirm]]))
    if settings.num_confirm <= 0 or len(keys) < 2:
        return {}
    runs = {}
    for i, key in enumerate(keys):
        if on_trial:
            on_trial(i, len(keys), by_key[key], None)
        spec = replace(_spec(report, by_key[key], settings, results, baseline), max_timed_s=None)
        again = run(spec)
        runs[key] = 2
        first = results[key]
        if again.ok and (not first.ok or (again.median_step_s() or 1e18) <
                         (first.median_step_s() or 1e18)):
            results[key] = again
    return runs


def _completed(study: optuna.Study) -> dict[str, TrialResult]:
    """Results already in the study (a resumed search runs them again only if they broke)."""
    done: dict[str, TrialResult] = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if "result" in t.user_attrs and "candidate" in t.params:
            done[t.params["candidate"]] = from_json_dict(TrialResult,
                                                         json.loads(t.user_attrs["result"]))
    return done


def _objective(result: TrialResult, settings: SearchSettings) -> float | None:
    median = result.median_step_s()
    if not result.ok or median is None:
        return None
    if settings.train_steps:
        return (result.compile_s or 0.0) + settings.train_steps * median
    return result.samples_per_s()


def _tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult, direction: str,
          settings: SearchSettings) -> None:
    value = _objective(result, settings)
    if value is None:  # infeasible: a constraint violation, so samplers avoid its region
        trial.set_constraint(CONSTRAINT, _INFEASIBLE)
        trial.set_user_attr("status", result.status)
        value = 0.0 if direction == "maximize" else 1e18
    else:
        trial.set_constraint(CONSTRAINT, 0.0)
    study.tell(trial, value)


def _spec(report: ProbeReport, candidate: Candidate, settings: SearchSettings,
          results: dict[str, TrialResult], baseline: Candidate) -> TrialSpec:
    per_device = report.per_device_batch()
    medians = [r.median_step_s() for r in results.values() if r.ok and r.median_step_s()]
    best = min(medians) if medians else None
    return TrialSpec(
        workload=report.workload, device=report.device.device,
        micro_batch=candidate.micro_batch, accumulate_steps=per_device // candidate.micro_batch,
        precision=candidate.precision, compile_mode=candidate.compile_mode,  # type: ignore[arg-type]
        num_warmup_steps=1 if candidate.compile_mode == "off" else 2,
        num_timed_steps=settings.num_timed_steps, memory_budget_bytes=report.budget_bytes,
        timeout_s=settings.timeout_s,
        max_timed_s=None if best is None or candidate == baseline
        else settings.slower_factor * best * settings.num_timed_steps,
        count_flops=candidate == baseline,
    )


def classify(candidate: Candidate, result: TrialResult, results: dict[str, TrialResult],
             baseline: Candidate, report: ProbeReport,
             settings: SearchSettings) -> tuple[TrialRecord, float | None]:
    """The record of one trial: its figures, and a verdict before the winner is known."""
    per_device = report.per_device_batch()
    base = results.get(baseline.key())
    base_sps = base.samples_per_s() if base is not None else None
    sps = result.samples_per_s()
    verdict, reason = result.status, result.message.splitlines()[0] if result.message else ""
    if result.ok:
        verdict, reason = "ok", ""
        # The reference is fp32 eager on the trial's own batches (older stored results lack
        # it: then the baseline's first loss, on batches made the same way).
        ref = result.reference_loss if result.reference_loss is not None else (
            base.first_loss if base is not None else None)
        tol = LOSS_TOLERANCE.get(candidate.precision, 0.05)
        if ref is not None and result.first_loss is not None and ref != 0:
            distance = abs(result.first_loss - ref) / abs(ref)
            if distance > tol:
                verdict = "numerics"
                reason = (f"first loss {result.first_loss:.4g} is {distance:.1%} from fp32 "
                          f"eager's {ref:.4g} on the same batches (allowed {tol:.0%})")
        if verdict == "ok" and len(result.step_times_s) < settings.num_timed_steps:
            verdict = "slower"
            reason = (f"stopped after {len(result.step_times_s)} timed steps: over "
                      f"{settings.slower_factor:g}x the best candidate's time")
    value = _objective(result, settings) if verdict in ("ok", "slower") else None
    tokens = sps * result.tokens_per_sample if sps and result.tokens_per_sample else None
    per_sample = flops_per_sample(base)
    tflops = per_sample * sps / 1e12 if per_sample and sps else None
    peak = peak_tflops(report.device.name, candidate.precision)
    record = TrialRecord(
        number=0, micro_batch=candidate.micro_batch,
        accumulate_steps=per_device // candidate.micro_batch, precision=candidate.precision,
        compile_mode=candidate.compile_mode, verdict=verdict, reason=reason,  # type: ignore[arg-type]
        is_baseline=candidate == baseline, median_step_s=result.median_step_s(),
        spread=result.spread(), num_timed_steps=len(result.step_times_s), samples_per_s=sps,
        tokens_per_s=tokens, peak_bytes=result.peak_bytes, compile_s=result.compile_s,
        first_loss=result.first_loss, num_skipped_steps=result.num_skipped_steps,
        num_graphs=result.num_graphs, num_graph_breaks=result.num_graph_breaks,
        num_alloc_retries=result.num_alloc_retries,
        speedup=sps / base_sps if sps and base_sps else None,
        tflops_per_s=tflops, mfu=tflops / peak if tflops and peak else None,
        time_to_train_s=value if settings.train_steps and value is not None else None,
        wall_s=result.wall_s,
    )
    return record, value


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
    return max(feasible, key=lambda r: r.samples_per_s or 0.0)


def break_even_steps(winner: TrialRecord, baseline: TrialRecord) -> float | None:
    """Optimizer steps after which a compiled winner's compile time is paid back."""
    if winner.compile_mode == "off" or not winner.median_step_s or not baseline.median_step_s:
        return None
    saved = baseline.median_step_s - winner.median_step_s
    if saved <= 0:
        return math.inf
    return (winner.compile_s or 0.0) / saved
