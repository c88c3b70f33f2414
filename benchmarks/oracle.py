"""Helpers the search benchmarks share (CPU and GPU): the exhaustive oracle, the naive baseline,
machine facts and result files.

The oracle times every candidate (knob setting x micro-batch) with the real isolated runner under
the same cap as the search and with the same spec (``timing_spec``), in passes that alternate
direction (interleaved repeats), and keeps each candidate's best median: a busy period of a shared
machine only ever inflates times.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.config import TrialResult, TrialSpec, WorkloadSpec, WorkloadTraits
from autotune.files import write_json_atomic
from autotune.knobs import BASELINE, HasKnobs, Knobs
from autotune.memory import probe_spec
from autotune.runner import run_isolated
from autotune.search import Candidate, SearchSettings
from autotune.serialize import to_json_dict

HERE = Path(__file__).resolve().parent
Runner = Callable[[TrialSpec], TrialResult]
WINDOW_S = SearchSettings().min_timed_s  # each candidate timed over the search's window


def naive_micro_batch(target_batch: int, fits: Callable[[int], bool]) -> int:
    """What an untuned user runs: the target if it fits, else the largest power of two that fits.

    Args:
        target_batch: the effective batch wanted (one device).
        fits: whether a micro-batch runs under the memory cap.

    Returns:
        The micro-batch (0 when not even 1 fits). Accumulation makes up the rest:
        ``target_batch // micro_batch`` steps, exact when the result divides the target.
    """
    if fits(target_batch):
        return target_batch
    power = 1 << (target_batch.bit_length() - 1)
    if power == target_batch:
        power //= 2
    while power >= 1:
        if fits(power):
            return power
        power //= 2
    return 0


def key(precision: str, compile_mode: str, micro_batch: int) -> str:
    """The name of a candidate whose further knobs are at their defaults, as autotune.search
    names it (``Candidate.key``)."""
    return Candidate(knobs=as_knobs((precision, compile_mode)), micro_batch=micro_batch).key()


@dataclass(kw_only=True)
class OracleCandidate(HasKnobs):
    """One candidate's runs in the oracle."""

    knobs: Knobs
    micro_batch: int
    runs: list[TrialResult] = field(default_factory=list)
    excluded: str = ""
    """Why the oracle did not run it (the workload cannot take it, or a duplicate of another
    candidate's run); empty when it ran or was never reached."""
    past_deadline: bool = False
    """Not run in pass 1: the oracle's deadline had passed (a later oracle's ``stored``
    measures it)."""

    def key(self) -> str:
        return Candidate(knobs=self.knobs, micro_batch=self.micro_batch).key()

    def ran_ok_every_time(self) -> bool:
        """Ran (no OOM, no crash) on every repeat under the cap."""
        return bool(self.runs) and all(r.ok for r in self.runs)

    def fits_usable(self, usable_bytes: int) -> bool:
        """Ran every time and every peak stayed within the budget minus headroom."""
        return self.ran_ok_every_time() and all(
            r.peak_bytes is not None and r.peak_bytes <= usable_bytes for r in self.runs)

    def best_median_s(self) -> float | None:
        medians = [r.median_step_s() for r in self.runs if r.ok and r.median_step_s()]
        return min(medians) if medians else None

    def samples_per_s(self, per_device: int) -> float | None:
        best = self.best_median_s()
        return per_device / best if best else None

    def summary(self, per_device: int, usable_bytes: int) -> dict:
        best = self.best_median_s()
        ok_runs = [r for r in self.runs if r.ok]
        return {
            "key": self.key(), "label": self.knobs.label(), "precision": self.precision,
            "compile_mode": self.compile_mode, "knobs": dataclasses.asdict(self.knobs),
            "changed": list(self.knobs.changed()),
            "micro_batch": self.micro_batch, "accumulate_steps": per_device // self.micro_batch,
            "excluded": self.excluded, "past_deadline": self.past_deadline,
            "statuses": [r.status for r in self.runs],
            "medians_s": [r.median_step_s() for r in self.runs],
            "num_timed_steps": [len(r.step_times_s) for r in self.runs],
            "spreads": [r.spread() for r in self.runs],
            "best_median_s": best,
            "samples_per_s": self.samples_per_s(per_device),
            "peak_bytes": max((r.peak_bytes or 0) for r in ok_runs) if ok_runs else None,
            "run_peak_bytes": [r.peak_bytes for r in self.runs],
            "compile_s": min((r.compile_s or 0.0) for r in ok_runs) if ok_runs else None,
            "ran_ok_every_time": self.ran_ok_every_time(),
            "fits_usable": self.fits_usable(usable_bytes),
            "wall_s": [r.wall_s for r in self.runs],
            "cache_hits": [r.compile_cache_hits for r in self.runs],
            "cache_misses": [r.compile_cache_misses for r in self.runs],
        }


def _afresh(r: TrialResult) -> bool | None:
    """Whether a compiled run compiled its graphs afresh (no inductor cache hit); None when
    the run does not say (older results)."""
    return None if r.compile_cache_hits is None else r.compile_cache_hits == 0


def first_launch_fits(candidates: Sequence[OracleCandidate], usable_bytes: int
                      ) -> dict[tuple[Knobs, int], bool]:
    """Per compiled candidate (knobs, micro-batch), whether it fits as a first launch compiles
    it (on CPU a compile's memory is in the peak, and a run that loads its graphs from
    inductor's cache peaks lower), by the search's rule (``_Search.fit_cold``): every run of
    it fit, and one of them compiled afresh. The search runs a candidate without such a run
    afresh; the oracle cannot, so it adds to its largest peak what compiling afresh added
    where a candidate of the same graphs (``Knobs.graph``) ran both ways (else the median of
    that over the workload's candidates). Results without cache counts: a candidate fits
    unless a run of its graphs ran out of memory."""
    def key(c: OracleCandidate) -> tuple[Knobs, int]:
        return (c.knobs.graph(), c.micro_batch)

    compiled = [c for c in candidates if c.compile_mode != "off" and c.runs]
    added: dict[tuple[Knobs, int], list[int]] = {}
    for c in compiled:
        cold = [r.peak_bytes for r in c.runs if _afresh(r) and r.ok and r.peak_bytes]
        warm = [r.peak_bytes for r in c.runs if _afresh(r) is False and r.ok and r.peak_bytes]
        if cold and warm:
            added.setdefault(key(c), []).append(max(cold) - min(warm))
    everywhere = [v for vs in added.values() for v in vs]
    ran_out = {key(c) for c in compiled if any(r.status == "oom" for r in c.runs)}
    fits: dict[tuple[Knobs, int], bool] = {}
    for c in compiled:
        if not c.fits_usable(usable_bytes):
            fits[(c.knobs, c.micro_batch)] = False
        elif any(_afresh(r) for r in c.runs):
            fits[(c.knobs, c.micro_batch)] = True
        elif everywhere:
            more = statistics.median(added.get(key(c)) or everywhere)
            peak = max(r.peak_bytes or 0 for r in c.runs)
            fits[(c.knobs, c.micro_batch)] = peak + more <= usable_bytes
        else:
            fits[(c.knobs, c.micro_batch)] = key(c) not in ran_out
    return fits


def fits_first_launch(c: OracleCandidate, usable_bytes: int,
                      fits: Mapping[tuple[Knobs, int], bool]) -> bool:
    """``fits_usable``, and a compiled candidate fits as a first launch compiles it
    (``first_launch_fits``)."""
    return c.fits_usable(usable_bytes) and (
        c.compile_mode == "off" or fits.get((c.knobs, c.micro_batch), True))


def stored_runs(summary: dict) -> list[TrialResult]:
    """A stored oracle candidate's runs (``OracleCandidate.summary`` in an earlier results
    file), as far as the summary keeps them: each run's status, peak, wall time and median
    step (its timed steps all at the median: the spread is not kept), the candidate's compile
    time. What the oracle compares (best median, fit, first-pass wall time) reads the same."""
    runs = []
    n = len(summary["statuses"])
    hits, misses = summary.get("cache_hits", [None] * n), summary.get("cache_misses", [None] * n)
    for i, status in enumerate(summary["statuses"]):
        median = summary["medians_s"][i]
        steps = summary["num_timed_steps"][i] if median else 0
        runs.append(TrialResult(
            status=status, peak_bytes=summary["run_peak_bytes"][i],
            wall_s=summary["wall_s"][i], step_times_s=(median,) * steps,
            compile_s=summary["compile_s"] if status == "ok" else None,
            samples_per_step=summary["micro_batch"] * summary["accumulate_steps"],
            compile_cache_hits=hits[i], compile_cache_misses=misses[i], message="stored"))
    return runs


def timing_spec(workload: WorkloadSpec, device: str, knobs: Knobs, micro_batch: int,
                per_device: int, budget_bytes: int | None, num_timed_steps: int, timeout_s: float,
                max_timed_s: float | None = None, min_timed_s: float = WINDOW_S) -> TrialSpec:
    """The spec autotune.search times a candidate with (``_Search.spec``: a memory probe that
    also times the config, the same warm-up, step counts and timing window; the baseline
    counts FLOPs and is never stopped early), with the oracle's own early-stop limit."""
    is_base_class = knobs == BASELINE
    spec = probe_spec(workload, device, knobs, micro_batch, budget_bytes, timeout_s,
                      per_device_batch=per_device, num_timed_steps=num_timed_steps,
                      count_flops=is_base_class)
    return replace(spec, min_timed_s=min_timed_s,
                   max_timed_s=None if is_base_class else max_timed_s)


Exclude = Callable[[Knobs, WorkloadTraits | None], "str | None"]
"""Why the oracle leaves a setting out given the workload's traits (None: it runs it)."""


def as_knobs(setting: Knobs | tuple[str, str]) -> Knobs:
    """A space key: knobs, or a (precision, compile mode) pair (the other knobs at defaults;
    a compile mode followed by further knobs, ``default+opt=fused``, as a label reads)."""
    if isinstance(setting, Knobs):
        return setting
    precision, compile_mode = setting
    return Knobs.from_label(f"{precision}/{compile_mode}")


def run_oracle(workload: WorkloadSpec, device: str, per_device: int,
               space: Mapping[Knobs, Sequence[int]] | Mapping[tuple[str, str], Sequence[int]],
               *, budget_bytes: int | None,
               num_timed_steps: int = 10, repeats: int = 2, slower_factor: float = 3.0,
               timeout_s: float = 900.0, run: Runner = run_isolated,
               deadline_s: float | None = None, min_timed_s: float = WINDOW_S,
               exclude: Exclude | None = None,
               log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
               stored: Mapping[str, Sequence[TrialResult]] | None = None,
               ) -> tuple[list[OracleCandidate], float]:
    """Time every candidate of ``space`` (knob setting, or (precision, compile mode), ->
    micro-batches), each with the spec the search times it with (``timing_spec``).

    Pass 1 goes through the settings (fp32 eager first) in increasing micro-batch; a setting
    stops at its first failure (memory grows with the micro-batch). ``exclude`` leaves out a
    setting the workload cannot take, judged by the traits the runs so far reported (fp32 eager
    runs first, so from the first run on). Later passes alternate direction and re-run what
    pass 1 ran, the first failure included (near the boundary a fit can flip). A candidate
    already ``slower_factor`` times slower than the best median so far stops timing early.
    Past ``deadline_s`` seconds no new run starts (the GPU suite's time box, a CPU oracle
    measured over several sessions): what did not run has no runs, and a setting goes on to
    the stored runs of its larger micro-batches (no run is not a failure). ``stored``: runs
    of an earlier oracle on the same machine, by candidate key (``stored_runs``): a pass that
    has one for a candidate takes it instead of running (an oracle extended over several
    sessions, e.g. to smaller micro-batches); stored runs of passes beyond ``repeats`` are
    kept too (no run starts for them).

    Returns:
        The candidates with their runs, and the oracle's wall time in seconds (stored runs'
        wall time included).
    """
    start = time.perf_counter()
    settings = sorted(((as_knobs(s), mbs) for s, mbs in space.items()),
                      key=lambda t: t[0] != BASELINE)
    candidates = [OracleCandidate(knobs=k, micro_batch=m)
                  for k, mbs in settings for m in sorted(set(mbs))]
    best: list[float] = []
    traits: list[WorkloadTraits] = []

    reused = [0.0]

    def one(cand: OracleCandidate, tag: str) -> TrialResult | None:
        earlier = (stored or {}).get(cand.key(), ())
        if len(earlier) > len(cand.runs):
            result = earlier[len(cand.runs)]
            cand.runs.append(result)
            reused[0] += result.wall_s or 0.0
            median = result.median_step_s()
            if result.ok and median:
                best.append(median)
            log(f"  oracle {tag} {cand.key():44s} {result.status:8s} (stored run)")
            return result
        if deadline_s is not None and time.perf_counter() - start > deadline_s:
            log(f"  oracle {tag} {cand.key()}: not run (deadline {deadline_s:.0f} s)")
            return None
        limit = slower_factor * max(min(best) * num_timed_steps, min_timed_s) if best else None
        spec = timing_spec(workload, device, cand.knobs, cand.micro_batch, per_device,
                           budget_bytes, num_timed_steps, timeout_s, limit, min_timed_s)
        result = run(spec)
        cand.runs.append(result)
        if result.traits is not None and not traits:
            traits.append(result.traits)
        median = result.median_step_s()
        if result.ok and median and len(result.step_times_s) >= num_timed_steps:
            best.append(median)
        log(f"  oracle {tag} {cand.key():44s} {result.status:8s} "
            f"median {median or 0:.3f}s steps {len(result.step_times_s)} "
            f"peak {(result.peak_bytes or 0) / 2**20:.0f}MiB wall {result.wall_s or 0:.0f}s")
        return result

    ran: list[OracleCandidate] = []
    stopped: dict[Knobs, str] = {}
    for cand in candidates:
        if cand.knobs in stopped:
            cand.excluded = stopped[cand.knobs]
            continue
        why = exclude(cand.knobs, traits[0] if traits else None) if exclude else None
        if why:
            stopped[cand.knobs] = cand.excluded = why
            log(f"  oracle pass 1 {cand.knobs.label()}: left out ({why})")
            continue
        result = one(cand, "pass 1")
        if result is None:  # past the deadline: not run, not a failure
            cand.past_deadline = True
            continue
        ran.append(cand)
        if not result.ok:
            stopped[cand.knobs] = ""
    for rep in range(1, repeats):
        for cand in (reversed(ran) if rep % 2 else ran):
            one(cand, f"pass {rep + 1}")
    for cand in ran:  # a stored pass beyond ``repeats`` is kept: its runs are measurements
        while len((stored or {}).get(cand.key(), ())) > len(cand.runs):
            one(cand, f"pass {len(cand.runs) + 1}")
    return candidates, time.perf_counter() - start + reused[0]


def run_side_by_side(workload: WorkloadSpec, device: str, per_device: int,
                     contenders: Sequence[tuple[Knobs, int]], *, rounds: int,
                     budget_bytes: int | None, num_timed_steps: int = 10,
                     timeout_s: float = 900.0, run: Runner = run_isolated,
                     min_timed_s: float = WINDOW_S,
                     log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
                     ) -> dict[str, list[TrialResult]]:
    """Time a few configs against each other under the same conditions: ``rounds`` rounds,
    each running every contender once in a fresh child (the spec the search times with,
    never stopped early), the order reversed every other round, so a busy period of a
    shared machine falls on all of them alike. What one exhaustive pass cannot say: its best
    is the highest of many single noisy runs, so a pick judged against it scores low even
    when it runs as fast.

    Returns each contender's runs by key (``Candidate.key``), in round order."""
    keys = [Candidate(knobs=k, micro_batch=m).key() for k, m in contenders]
    if len(set(keys)) != len(keys):
        raise ValueError(f"side by side: each contender once, got {keys}")
    runs: dict[str, list[TrialResult]] = {k: [] for k in keys}
    order = list(zip(keys, contenders, strict=True))
    for i in range(rounds):
        for key, (knobs, micro_batch) in (order if i % 2 == 0 else order[::-1]):
            spec = timing_spec(workload, device, knobs, micro_batch, per_device, budget_bytes,
                               num_timed_steps, timeout_s, None, min_timed_s)
            result = run(spec)
            runs[key].append(result)
            median = result.median_step_s()
            log(f"  side by side round {i + 1} {key:44s} {result.status:8s} "
                f"{per_device / median if median else 0:.1f} samples/s "
                f"wall {result.wall_s or 0:.0f}s")
    return runs


def side_by_side_summary(runs: Mapping[str, Sequence[TrialResult]], per_device: int,
                         first: str) -> dict:
    """Each contender's samples/s per round and their median, and ``first`` (the tuned
    config) against each other one: the ratio of the medians, and the lowest and highest
    ratio within a round (the two ran back to back there)."""
    def sps(r: TrialResult) -> float | None:
        median = r.median_step_s() if r.ok else None
        return per_device / median if median else None

    per_round = {k: [sps(r) for r in rs] for k, rs in runs.items()}
    medians = {k: median_or_none([v for v in vs if v]) for k, vs in per_round.items()}
    against = {}
    for key, values in per_round.items():
        if key == first:
            continue
        pairs = [a / b for a, b in zip(per_round[first], values, strict=True) if a and b]
        against[key] = {
            "ratio": medians[first] / medians[key] if medians[first] and medians[key] else None,
            "lowest": min(pairs, default=None), "highest": max(pairs, default=None)}
    return {"first": first, "samples_per_s": per_round, "median_samples_per_s": medians,
            "statuses": {k: [r.status for r in rs] for k, rs in runs.items()},
            # near the boundary a peak moves run to run, and a run that loads its graphs from
            # inductor's cache (hits) peaks apart from one that compiles them
            "peak_bytes": {k: [r.peak_bytes for r in rs] for k, rs in runs.items()},
            "cache_hits": {k: [r.compile_cache_hits for r in rs] for k, rs in runs.items()},
            "against": against}


def per_round_cell(summary: dict, key: str) -> str:
    """One contender's samples/s per round of a side-by-side summary, a failed run by its
    status (``oom``), for the results tables."""
    return ", ".join(f"{v:.1f}" if v else status for v, status in zip(
        summary["samples_per_s"][key], summary["statuses"][key], strict=True))


def machine() -> dict:
    """Machine, device and versions for the results files."""
    import optuna
    import torch
    import transformers

    info = {"platform": platform.platform(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "optuna": optuna.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), "")
        info["cpu_model"] = name
    except OSError:
        pass
    if torch.cuda.is_available():  # NVML, not a CUDA context: the children need the memory
        from autotune.device import describe_device

        info["gpu"] = describe_device("cuda").name
        info["cuda"] = torch.version.cuda
    for name in ("lightning", "accelerate"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    return info


def write_results(name: str, data: dict, markdown: str, folder: Path | None = None) -> Path:
    """Write ``<name>.json`` and ``<name>.md`` into ``folder`` (default benchmarks/results)."""
    folder = folder or HERE / "results"
    # Atomically: a run cut off while writing (a device call's limit, Ctrl-C) leaves the
    # files it had, never half of one.
    write_json_atomic(folder / f"{name}.json", json.dumps(to_json_dict(data), indent=2) + "\n",
                      force=True)
    write_json_atomic(folder / f"{name}.md", markdown, force=True)
    return folder / f"{name}.md"


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
