"""Pick quality and search cost of ``autotune.search`` over its default knob space (CPU).

The speedups it finds are reported too.

For each workload, under its memory cap and one target batch (default 16):

1. ``api.search`` with its defaults (fresh inductor cache), timed end to end: on this CPU it
   considers fp32 and bf16 (when native), compile off and default, and screens checkpointing
   (off/blocks/alternate), the optimizer implementation (default/for-loop/foreach/fused) and the
   memory format (contiguous/channels_last) on its leader (the allocator knob is CUDA only);
2. the exhaustive oracle (``oracle.run_oracle``, its own fresh inductor cache): every knob
   setting the search would consider by default on this device (``space.memory_classes`` x
   every value of every further knob from ``space.knob_values``), less what the workload cannot
   take by the search's own rule (``knobs.skip_reason``, with the traits the first run reports),
   x every divisor of the target, each timed with the spec the search times it with
   (``oracle.timing_spec``), in ``--passes`` interleaved passes, best median kept;
3. pick quality = oracle throughput of the tuned config / best oracle throughput among the
   candidates that fit (ran under the cap, peak within the budget minus headroom; compiled,
   also as a first launch compiles: ``oracle.first_launch_fits``, the search's rule), overall
   and in each pass alone; search cost = search wall time / the oracle's first pass (an exhaustive
   search: each candidate run once);
4. the winner's speedup over the best oracle config without the new knobs (every knob beyond
   precision and compile mode at its default) and over the naive run (fp32 eager, micro-batch =
   target if it fits, else the largest power of two that fits); for each workload the largest
   fitting micro-batch with and without checkpointing, from the oracle's runs; a fresh capped
   re-run of the tuned config (no OOM expected);
5. with ``--side-by-side ROUNDS``: the tuned config and the oracle's two best that fit, run in
   interleaved rounds (``oracle.run_side_by_side``): the pick against the oracle's best
   measured under the same conditions, not against the highest of many single noisy runs;
6. the machine's speed during the search against the oracle's runs (``machine_speed``: the
   median over the candidates both timed of the search's samples/s over the oracle's), and the
   cost the search would have had at the oracle's speed, beside the measured one: on a shared
   VM the oracle's runs come from other sittings.

``pick_deep_gpt`` is the checkpointing workload: under ``workloads.deep_gpt_cap_bytes()`` (a
cap measured on the machine: about 53.6 MiB on AMD EPYC, 88.6 MiB on Intel Xeon with AMX; the first
knob benchmarks ran under 50 MiB on AMD EPYC) fp32 eager fits micro-batch 4 of 16 and not 8,
checkpointing every block fits 16. Measured with ``probe_spec`` children (2 warm-up steps of 2
accumulated micro-batches, 3 timed steps at per-device batch 16; peak = address-space growth
over the child's baseline; 2-core AMD EPYC, torch 2.13 CPU): no cap: fp32/off 35.2 MiB at 4,
61.2 MiB at 8; bf16/off 62.4 MiB at 8; fp32/default 130.4 MiB at 4, 157.1 MiB at 8 (the
compile's own memory: compiled settings fit nothing under this cap); fp32/off+ckpt=blocks 21.6
MiB at 8, 34.7 MiB at 16. Under the 50 MiB cap: fp32/off ok 35.0 MiB at 4, oom at 8;
fp32/off+ckpt=blocks ok 34.7 MiB at 16; fp32/off+ckpt=alternate ok 39.3 MiB at 8. A step of 16
samples took 0.20-0.24 s (fp32 eager, with or without checkpointing) when the machine was
quiet.

``slow_gpt2``, ``slow_bert`` and ``slow_cnn`` are for ``--target 64``: under their caps fp32
eager fits micro-batch 8 (bf16 eager 8, 8 and 16; checkpointing every block 16) and one step of
64 samples took 2.6-3.4 s on the quiet machine (figures beside the caps in workloads.py).

Run: ``python benchmarks/search_quality.py [--workloads deep_gpt,gpt2,cnn] [--target 16]
[--passes 2] [--space full|lean] [--min-micro-batch 1] [--side-by-side 3]``; writes
``benchmarks/results/search_quality_knobs.{json,md}``. ``--render NAME`` re-renders a results
file, the older precision x compile-mode ones (``search_quality.json``, target 64) included.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from oracle import (
    HERE,
    Exclude,
    OracleCandidate,
    first_launch_fits,
    fits_first_launch,
    machine,
    naive_micro_batch,
    per_round_cell,
    run_oracle,
    run_side_by_side,
    side_by_side_summary,
    stored_runs,
    write_results,
)
from workloads import (
    SLOW_BERT_CAP_BYTES,
    SLOW_CNN_CAP_BYTES,
    SLOW_GPT2_CAP_BYTES,
    deep_gpt_cap_bytes,
)

from autotune import api
from autotune.config import DeviceInfo, Knobs, TrialSpec, WorkloadSpec, WorkloadTraits
from autotune.knob_rules import meaningful, skip_reason
from autotune.knobs import BASELINE
from autotune.runner import run_isolated
from autotune.schema import SearchResult, TrialRecord
from autotune.search import Candidate, SearchSettings
from autotune.space import divisors, knob_values, memory_classes, timed_precisions
from autotune.units import MIB, format_bytes

TARGET = 16
HEADROOM = 0.1
TRAIN_STEPS = 1000  # for the end-to-end time, compile included
NAME = "search_quality_knobs"
BELOW = 0.8  # timed seconds on candidates that ended below this share of the winner
SIDE_BY_SIDE_TOP = 2  # the oracle's best configs run side by side with the tuned one


@dataclass(frozen=True)
class Bench:
    """One workload of the benchmark and its memory cap."""

    short: str
    title: str
    factory: str
    cap: int | Callable[[], int]
    """The memory cap, or how to measure it on this machine."""

    @property
    def budget_bytes(self) -> int:
        return self.cap() if callable(self.cap) else self.cap

    def spec(self) -> WorkloadSpec:
        return WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:{self.factory}")


WORKLOADS = (  # the checkpointing workload first: under its cap compiled settings fit nothing
    Bench("deep_gpt", "deep GPT (plain torch, 6x64, seq 256): memory binds", "pick_deep_gpt",
          deep_gpt_cap_bytes),
    Bench("gpt2", "causal LM (GPT-2, 2x64, seq 64)", "pick_gpt2", 1024 * MIB),
    Bench("cnn", "CNN (3 conv blocks, 32x32)", "pick_cnn", 1024 * MIB),
    Bench("bert", "masked LM (BERT, 2x64, seq 64)", "pick_bert", 1024 * MIB),
    # slow steps (>= 2 s per step of 64 samples, fp32 eager): for --target 64
    Bench("slow_gpt2", "causal LM (GPT-2, 4x256, seq 128): memory binds, >= 2 s steps",
          "slow_gpt2", SLOW_GPT2_CAP_BYTES),
    Bench("slow_bert", "masked LM (BERT, 4x256, seq 128): memory binds, >= 2 s steps",
          "slow_bert", SLOW_BERT_CAP_BYTES),
    Bench("slow_cnn", "CNN (4 conv blocks, 128x128): memory binds, >= 2 s steps",
          "slow_cnn", SLOW_CNN_CAP_BYTES),
)
BY_SHORT = {b.short: b for b in WORKLOADS}
DEFAULT_WORKLOADS = ("deep_gpt", "gpt2", "cnn")
ORACLE_NOTE = ("oracle space: every knob setting the search considers by default on this device "
               "(every memory class x every value of every further knob, before the search "
               "prunes any), less what the workload cannot take by the search's own rule "
               "(knobs.skip_reason), at every divisor of the target")
V1_TARGET = 64
V1_ORACLE_NOTE = ("oracle space: every memory class the search considers by default on this "
                  "device (before it prunes any) at every divisor of the target")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fresh_inductor_cache() -> str:
    """Point the children at an empty inductor cache: both the search and the oracle pay for
    their compiles cold (the oracle's later candidates reuse its own earlier compiles, as an
    exhaustive search would)."""
    path = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    # And an empty study store: a search measured again must not answer from the last one.
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-store-")
    return path


def default_settings(info: DeviceInfo) -> tuple[list[Knobs], list[str]]:
    """Every knob setting ``api.search`` considers by default on ``info`` (before a workload's
    traits rule any out), fp32 eager first, and the device's notes on what it leaves out."""
    values, base, notes = knob_values(info)
    precisions, not_timed = timed_precisions(info, None)
    classes, skipped = memory_classes(info, precisions, base=base)
    names = list(values)
    settings = list(dict.fromkeys(  # an eager setting's scope means nothing: no duplicates
        meaningful(cls.with_(**dict(zip(names, combo, strict=True))))
        for cls in classes for combo in itertools.product(*values.values())))
    settings.sort(key=lambda k: k != BASELINE)
    return settings, [*skipped, *not_timed, *notes]


def lean_duplicate(knobs: Knobs, traits: WorkloadTraits | None) -> str | None:
    """Why ``knobs`` runs exactly what another setting of the space runs on this device (None:
    it does not, or the traits are not known yet): an optimizer implementation that is the one
    the optimizer as built already runs (AdamW on CPU: torch picks for-loop there)."""
    if traits is None:
        return None
    impl = knobs.optimizer_impl
    if impl != "default" and impl == traits.optimizer_default:
        return (f"{traits.optimizer} as built runs {impl} on this device: the same run as "
                f"{knobs.with_(optimizer_impl='default').label()}")
    return None


def exclusion(lean: bool, keep: Knobs | None = None) -> Exclude:
    """What the oracle leaves out: what the search's own rule skips for the workload and, with
    ``lean``, exact duplicates of another setting's run; never ``keep`` (the tuned setting)."""

    def exclude(knobs: Knobs, traits: WorkloadTraits | None) -> str | None:
        if knobs == keep:
            return None
        why = skip_reason(knobs, traits)
        if why:
            return f"the search skips it: {why}"
        dup = lean_duplicate(knobs, traits) if lean else None
        return f"lean: {dup}" if dup else None

    return exclude


def oracle_space(settings: Sequence[Knobs], target: int, min_micro_batch: int,
                 tuned: Candidate) -> dict[Knobs, list[int]]:
    """Each setting at every divisor of the target from ``min_micro_batch``; the tuned
    candidate always in it."""
    mbs = [m for m in divisors(target) if m >= min_micro_batch]
    space = {k: list(mbs) for k in settings}
    space.setdefault(tuned.knobs, [])
    if tuned.micro_batch not in space[tuned.knobs]:
        space[tuned.knobs].append(tuned.micro_batch)
    return space


def largest_fits(candidates: Sequence[OracleCandidate], usable: int) -> dict:
    """The largest fitting micro-batch (0: none) per checkpointing value, over all settings and
    for fp32 eager (the other knobs at their defaults), from the oracle's runs."""
    out: dict[str, dict[str, int]] = {"any": {}, "fp32/off": {}}
    graphs = first_launch_fits(candidates, usable)
    for c in candidates:
        value = c.knobs.checkpointing
        fits = fits_first_launch(c, usable, graphs)
        for scope, inside in (("any", True), ("fp32/off", c.knobs.with_(checkpointing="off")
                                                == BASELINE)):
            if inside:
                best = out[scope].get(value, 0)
                out[scope][value] = max(best, c.micro_batch if fits else 0)
    return out


def per_pass(row: dict, passes: int) -> dict:
    """Pick quality in each oracle pass alone, and the oracle's own noise floor: its pass-1
    winner judged by pass 2 and its pass-2 winner judged by pass 1 (what one timed run per
    candidate can promise on this machine). From the stored summaries, so older results
    render it too."""
    target = row.get("target_batch", V1_TARGET)
    fitting = [c for c in row["oracle"]["candidates"]
               if c.get("fits_first_launch", c["fits_usable"])]

    def sps(c: dict, i: int) -> float | None:
        ok = len(c["statuses"]) > i and c["statuses"][i] == "ok" and c["medians_s"][i]
        return target / c["medians_s"][i] if ok else None

    tuned = next(c for c in row["oracle"]["candidates"] if c["key"] == row["search"]["tuned"])
    out: dict = {"pick_quality": [], "self_agreement": []}
    winners, bests = [], []
    for i in range(passes):
        scored = [(v, c) for c in fitting if (v := sps(c, i))]
        if not scored:
            return out
        best, winner = max(scored, key=lambda t: t[0])
        winners.append(winner)
        bests.append(best)
        out["pick_quality"].append((sps(tuned, i) or 0.0) / best)
    if passes >= 2:
        for i, winner in ((1, winners[0]), (0, winners[1])):
            out["self_agreement"].append((sps(winner, i) or 0.0) / bests[i])
    return out


def runs_per_candidate(row: dict) -> int:
    """The most runs an oracle candidate of the row holds: its passes, stored ones included
    (a one-pass extension keeps the stored oracle's second pass)."""
    return max((len(c["statuses"]) for c in row["oracle"]["candidates"]), default=0)


def search_runs(result: SearchResult) -> dict:
    """Child runs the search started: timed trials (re-measurements counted), memory-only
    probe steps, and the estimator calibration after the pick."""
    cfg = result.config
    trials = sum(t.num_runs for t in cfg.trials)
    probes = sum(not step.timed for p in result.probe.probes for step in p.steps)
    calibration = len(cfg.memory.calibration or {})
    return {"num_runs": trials + probes, "num_trial_runs": trials, "num_probe_runs": probes,
            "num_calibration_runs": calibration}


def oracle_names(value: str) -> str:
    """``--oracle-from``, checked when it is parsed (argparse exits 2 with the message): names
    separated by commas, each a results file of this benchmark (``results/NAME.json``), none
    empty and none a path."""
    names = [n.strip() for n in value.split(",")]
    for name in names:
        if not name or name != Path(name).name or name in (".", ".."):
            raise argparse.ArgumentTypeError(
                f"{value!r}: {name!r} is not a results file name (names separated by commas, "
                "each as in benchmarks/results/NAME.json, without .json or a folder)")
        if not (HERE / "results" / f"{name}.json").is_file():
            raise argparse.ArgumentTypeError(
                f"{value!r}: no {HERE / 'results' / (name + '.json')} (name a results file of "
                "this benchmark, without .json)")
    return value


def stored_oracle(names: str, bench: Bench, target: int) -> tuple[dict, dict, str]:
    """Earlier results files' oracles for this workload (``--oracle-from``, names separated
    by commas): their runs by candidate key (where several hold one, the one with more runs:
    e.g. a two-pass oracle, and its extension to smaller micro-batches run once), what they
    left out by setting label, and where they came from."""
    runs: dict = {}
    left_out: dict = {}
    sources = []
    for name in names.split(","):
        some, out, source = _stored_oracle(name.strip(), bench, target)
        for key, these in some.items():
            if len(these) > len(runs.get(key, ())):
                runs[key] = these
        left_out.update(out)
        sources.append(source)
    return runs, left_out, ", ".join(sources)


def _stored_oracle(name: str, bench: Bench, target: int) -> tuple[dict, dict, str]:
    path = HERE / "results" / f"{name}.json"
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--oracle-from {name}: cannot read {path}: {exc}") from exc
    row = next((r for r in out.get("rows", []) if r.get("short") == bench.short), None)
    if row is None or row.get("target_batch") != target \
            or row.get("budget_bytes") != bench.budget_bytes:
        raise SystemExit(f"--oracle-from {name}: no oracle of {bench.short} at target {target} "
                         f"under {format_bytes(bench.budget_bytes)} in {path}")
    here, then = machine(), out.get("machine", {})
    if (then.get("cpu_model"), then.get("cpus")) != (here.get("cpu_model"), here.get("cpus")):
        raise SystemExit(f"--oracle-from {name}: measured on {then.get('cpu_model')} with "
                         f"{then.get('cpus')} CPUs, this is {here.get('cpu_model')} with "
                         f"{here.get('cpus')}: its times do not compare with a search here")
    from autotune.device import describe_device

    native = describe_device("cpu").native_bf16
    if not isinstance(out.get("native_bf16", native), bool):
        raise SystemExit(f"--oracle-from {name}: native_bf16 in {path} is "
                         f"{out['native_bf16']!r}, not true or false: a damaged results file")
    if out.get("native_bf16", native) != native:  # one model name, another CPU (Zen 3, Zen 4)
        raise SystemExit(f"--oracle-from {name}: measured on a {then.get('cpu_model')} CPU "
                         f"{'with' if out['native_bf16'] else 'without'} native bf16, this one "
                         f"{'has' if native else 'has not'}: another CPU under the same name, "
                         "its times do not compare with a search here (and its space lacks "
                         "the bf16 settings this one searches)")
    candidates = row["oracle"]["candidates"]
    runs = {c["key"]: stored_runs(c) for c in candidates if c["statuses"]}
    left_out = {c["label"]: c["excluded"] for c in candidates if c["excluded"]}
    return runs, left_out, f"{name}.json ({out['machine']['date']})"


def search_settings(confirm_within: float | None,
                    rank_precision: float | None) -> SearchSettings | None:
    """The search's settings: its defaults, but for the options this benchmark passes on."""
    changed = {k: v for k, v in (("confirm_within", confirm_within),
                                 ("rank_precision", rank_precision)) if v is not None}
    return SearchSettings(**changed) if changed else None


def bench_workload(bench: Bench, info: DeviceInfo, *, target: int, passes: int, lean: bool,
                   min_micro_batch: int, oracle_from: str | None = None,
                   oracle_deadline_s: float | None = None, side_by_side: int = 0,
                   confirm_within: float | None = None,
                   rank_precision: float | None = None) -> dict:
    spec = bench.spec()
    stored, left_out, source = stored_oracle(oracle_from, bench, target) if oracle_from \
        else ({}, {}, "")
    budget = bench.budget_bytes
    usable = int(budget * (1 - HEADROOM))
    log(f"== {bench.title}: search (target {target}, cap {format_bytes(budget)})")
    fresh_inductor_cache()
    start = time.perf_counter()
    result = api.search(spec, target_batch=target, device="cpu", memory_budget=budget,
                        headroom=HEADROOM, out=tempfile.mkdtemp(prefix="bench-search-"),
                        force=True, settings=search_settings(confirm_within, rank_precision))
    search_s = time.perf_counter() - start
    cfg = result.config
    tuned = Candidate(knobs=cfg.knobs, micro_batch=cfg.micro_batch)
    runs = search_runs(result)
    log(f"   tuned {tuned.key()} at {cfg.samples_per_s:.1f} samples/s in {search_s:.0f} s, "
        f"{runs['num_runs']} child runs (+{runs['num_calibration_runs']} calibration)")

    settings, device_notes = default_settings(info)
    space = oracle_space(settings, target, min_micro_batch, tuned)
    log(f"== {bench.title}: oracle over {len(space)} settings x micro-batches "
        f"{sorted({m for mbs in space.values() for m in mbs})}, {passes} pass(es)"
        f"{' (lean)' if lean else ''}")
    fresh_inductor_cache()
    exclude = exclusion(lean, tuned.knobs)
    candidates, oracle_s = run_oracle(
        spec, "cpu", target, space, budget_bytes=budget, repeats=passes, log=log,
        exclude=lambda k, traits: exclude(k, traits) or (
            left_out.get(k.label()) if k != tuned.knobs else None),
        stored=stored, deadline_s=oracle_deadline_s)
    by_key = {c.key(): c for c in candidates}
    graphs = first_launch_fits(candidates, usable)
    fitting = [c for c in candidates
               if fits_first_launch(c, usable, graphs) and c.samples_per_s(target)]
    best = max(fitting, key=lambda c: c.samples_per_s(target) or 0.0, default=None)
    plain = max((c for c in fitting if not c.knobs.changed()),
                key=lambda c: c.samples_per_s(target) or 0.0, default=None)
    tuned_c = by_key[tuned.key()]
    fp32_eager = {c.micro_batch: c for c in candidates if c.knobs == BASELINE}
    naive_mb = naive_micro_batch(
        target, lambda m: m in fp32_eager and fp32_eager[m].ran_ok_every_time())
    naive = fp32_eager.get(naive_mb)

    def sps(c: OracleCandidate | None) -> float | None:
        return c.samples_per_s(target) if c is not None else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    def e2e_s(c: OracleCandidate | None) -> float | None:
        if c is None or c.best_median_s() is None:
            return None
        s = c.summary(target, usable)
        return (s["compile_s"] or 0.0) + TRAIN_STEPS * s["best_median_s"]

    duel = None
    if side_by_side:
        # the oracle's two best that fit, beside the tuned config (when it is one of them,
        # the next one instead)
        top = sorted((c for c in fitting if c.key() != tuned.key()),
                     key=lambda c: -(c.samples_per_s(target) or 0.0))[:SIDE_BY_SIDE_TOP]
        log(f"== {bench.title}: side by side, {side_by_side} rounds: {tuned.key()} and "
            + ", ".join(c.key() for c in top))
        duel = side_by_side_summary(run_side_by_side(
            spec, "cpu", target, [(tuned.knobs, tuned.micro_batch),
                                  *((c.knobs, c.micro_batch) for c in top)],
            rounds=side_by_side, budget_bytes=budget, log=log), target, tuned.key())
    log(f"== {bench.title}: re-run the tuned config under the cap")
    rerun = run_isolated(TrialSpec(
        workload=spec, device="cpu", micro_batch=cfg.micro_batch,
        accumulate_steps=cfg.accumulate_steps, knobs=cfg.knobs, num_warmup_steps=2,
        num_timed_steps=0, memory_budget_bytes=budget, timeout_s=900))
    first_pass = [c.runs[0].wall_s or 0.0 for c in candidates if c.runs]
    excluded = Counter({c.knobs: c.excluded for c in candidates if c.excluded}.values())
    return {
        "workload": bench.title, "short": bench.short, "spec": spec, "target_batch": target,
        "budget_bytes": budget, "usable_bytes": usable,
        "search": {
            "wall_s": search_s, "tuned": tuned.key(), "knobs": cfg.knobs,
            "accumulate_steps": cfg.accumulate_steps,
            "samples_per_s_reported": cfg.samples_per_s,
            "baseline_samples_per_s_reported": cfg.baseline_samples_per_s,
            "num_trials": len(cfg.trials),
            "num_probes": sum(p.num_probes for p in result.probe.probes), **runs,
            "max_micro_batch": cfg.memory.max_micro_batch, "skipped": cfg.skipped,
            "trials": [{"label": t.label(), "verdict": t.verdict,
                        "samples_per_s": t.samples_per_s, "wall_s": t.wall_s,
                        "num_runs": t.num_runs, "timed_s": t.timed_s,
                        "num_timed_steps": t.num_timed_steps, "halfwidth": t.halfwidth,
                        "compile_s": t.compile_s} for t in cfg.trials],
            "cost": dataclasses.asdict(cfg.cost) if cfg.cost else None,
            "timed_below_s": timed_below(cfg.trials, cfg.samples_per_s),
            "reason": cfg.reason,
        },
        "space": {"mode": "lean" if lean else "full", "passes": passes,
                  "micro_batches": sorted({m for mbs in space.values() for m in mbs}),
                  "min_micro_batch": min_micro_batch, "num_settings": len(space),
                  "num_candidates": len(candidates),
                  "num_settings_excluded": len({c.knobs for c in candidates if c.excluded}),
                  "excluded": dict(excluded), "device_notes": device_notes,
                  "num_lean_duplicates": sum(n for why, n in excluded.items()
                                             if why.startswith("lean:"))},
        "oracle": {"wall_s": oracle_s, "first_pass_s": sum(first_pass),
                   "num_runs": sum(len(c.runs) for c in candidates),
                   "num_first_pass_runs": len(first_pass),
                   "candidates": [{**c.summary(target, usable), "fits_first_launch":
                                   fits_first_launch(c, usable, graphs)} for c in candidates],
                   "best": best.key() if best else None,
                   "best_without_new_knobs": plain.key() if plain else None,
                   "note": ORACLE_NOTE, "stored_from": source,
                   "num_stored_runs": sum(r.message == "stored" for c in candidates
                                          for r in c.runs)},
        "pick_quality": ratio(sps(tuned_c), sps(best)),
        "cost_ratio": search_s / sum(first_pass) if sum(first_pass) else None,
        "cost_ratio_all_passes": search_s / oracle_s if oracle_s else None,
        "tuned_samples_per_s": sps(tuned_c), "best_samples_per_s": sps(best),
        "without_new_knobs": {"key": plain.key() if plain else None, "samples_per_s": sps(plain),
                              "tuned_speedup": ratio(sps(tuned_c), sps(plain)),
                              "best_speedup": ratio(sps(best), sps(plain))},
        "largest_fit": largest_fits(candidates, usable),
        "naive": {"key": naive.key() if naive else None, "samples_per_s": sps(naive)},
        "speedup_vs_naive": ratio(sps(tuned_c), sps(naive)),
        "side_by_side": duel,
        "train_steps": TRAIN_STEPS, "tuned_e2e_s": e2e_s(tuned_c), "naive_e2e_s": e2e_s(naive),
        "tuned_rerun": {"status": rerun.status, "peak_bytes": rerun.peak_bytes,
                        "message": rerun.message[:300]},
    }


def fits_column(c: dict) -> str:
    """A candidate's fit in the oracle's table: ``yes``, ``no``, or ``cached only`` (compiled,
    its graphs fit only when loaded from inductor's cache)."""
    if not c["fits_usable"]:
        return "no"
    return "yes" if c.get("fits_first_launch", True) else "cached only"


def timed_below(trials: Sequence[TrialRecord], winner_sps: float | None,
                share: float = BELOW) -> float:
    """Seconds of timed steps the search spent on candidates that ended below ``share`` of the
    winner's samples/s (by the search's own figures): time the measurement could have saved."""
    if not winner_sps:
        return 0.0
    return sum(t.timed_s or 0.0 for t in trials
               if t.samples_per_s is not None and t.samples_per_s < share * winner_sps)


def first_pass_s(row: dict) -> float:
    """The oracle's first pass: every candidate's first run (child wall time)."""
    return sum(c["wall_s"][0] or 0.0 for c in row["oracle"]["candidates"] if c["wall_s"])


def _f(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render(out: dict) -> str:
    """The markdown of a results file (this benchmark's, or the older precision x compile one)."""
    return render_knobs(out) if out.get("schema") == "knobs" else render_v1(out)


def cost_table(out: dict) -> list[str]:
    """Where each search's time went, from its own cost record."""
    lines = [
        "Where the search's time went (its own cost record): child runs' wall time, of it "
        "compiling and timed steps, and the timed seconds spent on candidates that ended "
        f"below {BELOW}x the winner's samples/s.", "",
        "| workload | child runs | child s | compile s (cached / compiled runs) | timed s "
        f"| timed s below {BELOW}x |", "|---|---:|---:|---:|---:|---:|"]
    for r in out["rows"]:
        c = r["search"].get("cost")
        if c:
            lines.append(
                f"| {r['workload']} | {c['num_runs']} | {c['child_s']:.0f} | "
                f"{c['compile_s']:.0f} ({c['num_cached_compiles']} / {c['num_compiled_runs']}) "
                f"| {c['timed_s']:.0f} | {r['search']['timed_below_s']:.0f} |")
    return [*lines, ""]


def machine_speed(row: dict) -> dict | None:
    """How fast the machine ran during the search against the oracle's runs: for each
    candidate both timed, the search's samples/s over the oracle's best (the median of those
    ratios, their range, how many), and the search's wall time scaled by that median (about
    what it would have taken at the oracle's speed; compiles are taken to slow alike). None
    where no candidate was timed by both. On a shared VM the oracle's runs come from other
    sittings, so its pass and the search may have run at different speeds."""
    oracle = {c["key"]: c["samples_per_s"] for c in row["oracle"]["candidates"]
              if c.get("samples_per_s")}
    shares = []
    for t in row["search"]["trials"]:
        name, _, shape = t["label"].rpartition(" ")
        key = f"{name}/{shape.partition('x')[0]}"
        if t.get("samples_per_s") and key in oracle:
            shares.append(t["samples_per_s"] / oracle[key])
    if not shares:
        return None
    median = statistics.median(shares)
    at_speed = row["search"]["wall_s"] * median
    first = row["oracle"]["first_pass_s"]
    return {"median": median, "low": min(shares), "high": max(shares), "num": len(shares),
            "search_s": at_speed, "cost_ratio": at_speed / first if first else None}


def speed_table(out: dict) -> list[str]:
    """The machine's speed during each search against the oracle's runs (``machine_speed``)."""
    rows = [(r, m) for r in out["rows"] if (m := machine_speed(r)) is not None]
    if not rows:
        return []
    lines = [
        "The machine's speed during the search against the oracle's runs: for each candidate "
        "both timed, the search's samples/s over the oracle's (median, range). On a shared "
        "VM the speed drifts between sittings, and the oracle's runs are other hours' (its "
        "best median kept), so a search may run slower or faster throughout. Its wall time "
        "scaled by that median is about what it would have taken at the oracle's speed "
        "(compiles taken to slow alike), and its cost against the pass at that speed; the "
        "cost above is the measured one, and the target is judged on it.", "",
        "| workload | candidates timed by both | search's samples/s over the oracle's: median "
        "(range) | search s at the oracle's speed | cost at the oracle's speed |",
        "|---|---:|---:|---:|---:|"]
    for r, m in rows:
        lines.append(f"| {r['workload']} | {m['num']} | {m['median']:.2f}x "
                     f"({m['low']:.2f}-{m['high']:.2f}x) | {m['search_s']:.0f} | "
                     f"{_f(m['cost_ratio'])} |")
    return [*lines, ""]


def side_by_side_table(out: dict) -> list[str]:
    """The tuned config run beside the oracle's best (``--side-by-side``), when it was."""
    rows = [r for r in out["rows"] if r.get("side_by_side")]
    if not rows:
        return []
    rounds = max(len(v) for r in rows for v in r["side_by_side"]["samples_per_s"].values())
    lines = ["", f"Side by side (`--side-by-side {rounds}`): the tuned config and the oracle's "
             f"{SIDE_BY_SIDE_TOP} best that fit, each run once a round in a fresh child (the "
             "search's timing spec, never stopped early), the order reversed every other "
             "round. Tuned over each: the ratio of the medians, and in brackets the lowest "
             "and highest within a round (run back to back).", "",
             "| workload | config | samples/s per round | median samples/s | tuned over it |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        d = r["side_by_side"]
        for key in d["samples_per_s"]:
            vs = d["against"].get(key)
            runs = per_round_cell(d, key)
            cell = "(tuned)" if key == d["first"] else (
                f"{_f(vs['ratio'])} ({_f(vs['lowest'])}-{_f(vs['highest'])})")
            lines.append(f"| {r['workload']} | {key} | {runs} | "
                         f"{_f(d['median_samples_per_s'][key], '.1f')} | {cell} |")
    return lines


def _first_launch(out: dict) -> bool:
    """Whether the results judge compiled fits as a first launch (newer results files)."""
    return any("fits_first_launch" in c for r in out["rows"] for c in r["oracle"]["candidates"])


def render_knobs(out: dict) -> str:
    m = out["machine"]
    passes = out["passes"]
    lines = [
        "# Search quality and cost over the knob space (CPU testbed)", "",
        f"{m['date']}; {m.get('cpu_model') or m['processor']}, {m['cpus']} CPUs, "
        f"{m['platform']}; torch {m['torch']}, transformers {m['transformers']}, optuna "
        f"{m['optuna']}. Run {out['wall_s']:.0f} s: `{out.get('command', '')}`.", "",
        f"Target batch {out['target_batch']}, headroom {HEADROOM:.0%}, each workload under its "
        "own cap per child (RLIMIT_AS over its baseline). `api.search` with its defaults"
        + "".join(f" (but --{flag} {out[key]:g})" for key, flag in (
            ("confirm_within", "confirm-within"), ("rank_precision", "rank-precision"))
            if out.get(key) is not None) + " "
        f"considers the classes {', '.join(out.get('classes', []))} (native bf16 on this CPU: "
        f"{out.get('native_bf16')}) and screens on its leader the further knobs "
        + "; ".join(f"{k} {', '.join(v)}" for k, v in out.get("knob_values", {}).items())
        + ". Not in the default space here: " + "; ".join(out.get("device_notes", [])) + ".", "",
        f"Shared 2-core VM: {out.get('concurrency') or 'other jobs may have run at the same time'}"
        f". Every oracle candidate ran in {passes} pass(es)"
        + (" (interleaved: the second in reverse order), its best median kept" if passes > 1
           else "")
        + ("; the stored runs (--oracle-from) keep their later passes, best median kept: "
           "pass 2 below is theirs alone" if any(runs_per_candidate(r) > passes
                                                for r in out["rows"]) else "")
        + f". {ORACLE_NOTE}."
        + (" Space `lean`: also without exact duplicates of another setting's run on this "
           "device (counted below)." if out["space"] == "lean" else "")
        + (f" Oracle micro-batches from {out['min_micro_batch']} only (plus the tuned one): "
           "not exhaustive below." if out.get("min_micro_batch", 1) > 1 else "")
        + "".join(f" **Partial oracle**: {r['workload']}: {n} candidates not run, its deadline "
                  f"(--oracle-deadline {out.get('oracle_deadline_min') or 0:g} min) had passed "
                  "(a later run with --oracle-from measures them); its pick quality and cost "
                  "ratio are upper bounds." for r in out["rows"]
                  if (n := sum(c.get("past_deadline", False)
                               for c in r["oracle"]["candidates"])))
        + (" A compiled candidate fits only if no run that compiled its graphs afresh (no "
           "inductor cache hit) failed to fit: on CPU the compile's memory is in the peak, and "
           "a run that loads a sibling's graphs peaks lower than a first launch (the search's "
           "rule; `cached only` below)." if _first_launch(out) else ""), "",
        "Search cost is the search's wall time (its estimator calibration included) against the "
        "oracle's first pass (each candidate run once: an exhaustive search over the same "
        "space), and in brackets against all passes. Child runs: the search's timed trials "
        "(re-measurements counted), memory-only probes (+ calibration runs).", "",
        "| workload | cap | tuned (search) | best (oracle) | pick quality | search s (child runs) "
        "| exhaustive pass s (runs) | cost ratio (all passes) | best without new knobs | tuned "
        "speedup over it | naive | tuned vs naive |",
        "|---|---:|---|---|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in out["rows"]:
        s, o, w = r["search"], r["oracle"], r["without_new_knobs"]
        lines.append(
            f"| {r['workload']} | {format_bytes(r['budget_bytes'])} | {s['tuned']} "
            f"({_f(r['tuned_samples_per_s'], '.0f')}/s) | {o['best']} "
            f"({_f(r['best_samples_per_s'], '.0f')}/s) | {_f(r['pick_quality'])} | "
            f"{s['wall_s']:.0f} ({s['num_runs']} + {s['num_calibration_runs']}) | "
            f"{o['first_pass_s']:.0f} ({o['num_first_pass_runs']}) | {_f(r['cost_ratio'])} "
            f"({_f(r['cost_ratio_all_passes'])}) | {w['key']} "
            f"({_f(w['samples_per_s'], '.0f')}/s) | {_f(w['tuned_speedup'], '.2f', 'x')} | "
            f"{r['naive']['key']} ({_f(r['naive']['samples_per_s'], '.0f')}/s) | "
            f"{_f(r['speedup_vs_naive'], '.2f', 'x')} |")
    lines += ["", "Targets (DESIGN.md section 9): pick quality >= 0.97 in each oracle pass, "
              "search cost <= 0.10 of one exhaustive pass.", ""]
    if any(r["search"].get("cost") for r in out["rows"]):  # results before issue 18 lack it
        lines += cost_table(out)
    lines += speed_table(out)
    judged = max([passes, *(runs_per_candidate(r) for r in out["rows"])])
    lines += ["Pick quality of the tuned config in each oracle pass alone"
              + (", and the oracle's own pick judged by its other pass (its pass-1 winner's "
                 "throughput in pass 2 over pass 2's best, and the reverse): an exhaustive "
                 "search that times each candidate once is only as good as that" if judged > 1
                 else "") + ".", "",
              "| workload | pick quality per pass | oracle's own pick judged by its other pass |",
              "|---|---:|---:|"]
    for r in out["rows"]:
        pp = per_pass(r, judged)

        def fmt(values: list) -> str:
            return ", ".join(f"{v:.2f}" if v is not None else "-" for v in values) or "-"

        lines.append(f"| {r['workload']} | {fmt(pp.get('pick_quality', []))} | "
                     f"{fmt(pp.get('self_agreement', []))} |")
    lines += side_by_side_table(out)
    lines += ["", "Largest micro-batch that fits (ran every pass under the cap, peak within the "
              "usable budget" + ("; compiled, also as a first launch compiles its graphs: "
                                 "`oracle.first_launch_fits`" if _first_launch(out) else "")
              + ") per checkpointing value, from the oracle's runs: over every setting, and "
              "for fp32 eager with the other knobs at their defaults (0: none fits; - not "
              "run).", "",
              "| workload | usable | any setting: off / blocks / alternate | fp32 eager: off / "
              "blocks / alternate |", "|---|---:|---:|---:|"]
    for r in out["rows"]:
        lf = r["largest_fit"]

        def trio(d: dict) -> str:
            return " / ".join(str(d.get(v, "-")) for v in ("off", "blocks", "alternate"))

        lines.append(f"| {r['workload']} | {format_bytes(r['usable_bytes'])} | "
                     f"{trio(lf['any'])} | {trio(lf['fp32/off'])} |")
    lines += ["", "Space per workload: settings and candidates in the oracle, and what it left "
              "out (settings) and why.", ""]
    for r in out["rows"]:
        sp = r["space"]
        reasons = "; ".join(f"{n} x {why}" for why, n in sp["excluded"].items()) or "nothing"
        lean = ""
        if sp["mode"] == "lean":
            lean = (f" Lean left out {sp['num_lean_duplicates']} duplicate settings" if
                    sp["num_lean_duplicates"] else " Lean left out nothing beyond the search's "
                    "own rule (the duplicates it knows of are skipped by the search itself)")
        lines.append(f"- {r['workload']}: {sp['num_settings']} settings x micro-batches "
                     f"{', '.join(map(str, sp['micro_batches']))}; settings left out: "
                     f"{reasons}; {r['oracle']['num_first_pass_runs']} candidates ran in pass 1 "
                     f"(a setting stops at its first failure).{lean}."
                     + (f" Of its runs, {r['oracle']['num_stored_runs']} were reused from "
                        f"{r['oracle']['stored_from']} (--oracle-from; each stored run's "
                        "median, peak and wall time as measured then), the rest measured now."
                        if r["oracle"].get("stored_from") else ""))
    lines += ["", "Tuned configs re-run in a fresh process under the cap: " + ", ".join(
        f"{r['search']['tuned']}: {r['tuned_rerun']['status']}" for r in out["rows"]) + ".", "",
        "## What the search did", ""]
    for r in out["rows"]:
        lines += [f"### {r['workload']}", ""]
        if all("timed_s" in t for t in r["search"]["trials"]):
            lines += ["| trial | verdict | samples/s | ± | runs | timed steps | timed s | "
                      "compile s | wall s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {t['label']} | {t['verdict']} | {_f(t['samples_per_s'], '.0f')} | "
                      f"{_f(t['halfwidth'], '.0%')} | {t['num_runs']} | "
                      f"{t['num_timed_steps']} | {_f(t['timed_s'], '.0f')} | "
                      f"{_f(t['compile_s'], '.0f')} | {_f(t['wall_s'], '.0f')} |"
                      for t in r["search"]["trials"]]
        else:  # results before issue 18: no timing record per trial
            lines += ["| trial | verdict | samples/s | runs | wall s |", "|---|---|---:|---:|---:|"]
            lines += [f"| {t['label']} | {t['verdict']} | {_f(t['samples_per_s'], '.0f')} | "
                      f"{t.get('num_runs', 1)} | {_f(t['wall_s'], '.0f')} |"
                      for t in r["search"]["trials"]]
        lines += ["", "Skipped: " + " ".join(f"({i + 1}) {s}" for i, s in
                                             enumerate(r["search"]["skipped"])), ""]
        if r["search"].get("reason"):
            lines += [f"Why: {r['search']['reason']}", ""]
    lines += ["## Oracle measurements", ""]
    lines += oracle_tables(out, per_pass=True)
    return "\n".join(lines) + "\n"


def render_v1(out: dict) -> str:
    """The precision x compile-mode benchmark's results (schema before the knobs; target 64)."""
    m = out["machine"]
    cap = out["rows"][0]["budget_bytes"] if out["rows"] else 2**30
    lines = [
        "# Search quality and cost (CPU testbed)", "",
        f"{m['date']}; {m.get('cpu_model') or m['processor']}, {m['cpus']} CPUs, "
        f"{m['platform']}; torch {m['torch']}, transformers {m['transformers']}, optuna "
        f"{m['optuna']}. Run {out['wall_s']:.0f} s{' (--quick)' if out['quick'] else ''}.", "",
        f"Target batch {V1_TARGET}, cap {format_bytes(cap)} per child (RLIMIT_AS over its "
        f"baseline), headroom {HEADROOM:.0%}. `api.search` with its defaults considers the "
        f"classes {', '.join('/'.join(c) for c in out.get('classes', []))} (native bf16 on this "
        f"CPU: {out.get('native_bf16')}), probes each (fp32 eager first), tries a class's "
        "smaller micro-batches while they get faster and it is within 0.9x of the leader, and "
        "re-measures a close race only.", "",
        f"Shared 2-core VM: {out.get('concurrency') or 'other jobs may have run at the same time'}"
        "; step times of a shared machine vary between periods (see the spreads in the JSON). "
        "Every oracle "
        "candidate ran in two interleaved passes (second in reverse order); its best median "
        "is kept. Throughputs in the ratios below are the oracle's measurements of the same "
        "configs, so the tuned config and the best one were measured under the same "
        f"conditions. {V1_ORACLE_NOTE}.", "",
        "Search cost is the search's wall time against the oracle's first pass (each "
        "candidate run once: an exhaustive search over the same space), and in brackets "
        "against both passes. Search runs: child processes the search started (timed trials, "
        "memory-only probes, re-measurements).", "",
        "| workload | tuned (search) | best (oracle) | pick quality | search s (runs) | oracle "
        "s: 1 pass (2 passes, runs) | cost ratio (vs 2 passes) | naive | speedup vs naive "
        "| e2e 1000 steps tuned / naive |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in out["rows"]:
        s = r["search"]
        lines.append(
            f"| {r['workload']} | {s['tuned']} ({r['tuned_samples_per_s']:.0f}/s) | "
            f"{r['oracle']['best']} ({r['best_samples_per_s']:.0f}/s) | "
            f"{r['pick_quality']:.2f} | {s['wall_s']:.0f} ({s.get('num_runs', '?')}) | "
            f"{first_pass_s(r):.0f} ({r['oracle']['wall_s']:.0f}, {r['oracle']['num_runs']}) | "
            f"{s['wall_s'] / first_pass_s(r):.2f} ({s['wall_s'] / r['oracle']['wall_s']:.2f}) | "
            f"{r['naive']['key']} ({r['naive']['samples_per_s']:.0f}/s)"
            f" | {r['speedup_vs_naive']:.2f}x | {r['tuned_e2e_s']:.0f} s / "
            f"{r['naive_e2e_s']:.0f} s |")
    lines += ["", "Targets (DESIGN.md section 9): pick quality >= 0.97, cost ratio <= 0.20.", "",
              "How far one timed run per candidate can be trusted here: pick quality of the "
              "tuned config in each oracle pass alone, and the oracle's own pick judged by its "
              "other pass (its pass-1 winner's throughput in pass 2 over pass 2's best, and the "
              "reverse). An exhaustive search that times each candidate once is only as good as "
              "that second figure.", "",
              "| workload | pick quality: pass 1, pass 2 | oracle's own pick judged by its "
              "other pass |", "|---|---:|---:|"]
    for r in out["rows"]:
        pp = per_pass(r, 2)

        def fmt(values: list) -> str:
            return ", ".join(f"{v:.2f}" if v is not None else "-" for v in values) or "-"

        lines.append(f"| {r['workload']} | {fmt(pp.get('pick_quality', []))} | "
                     f"{fmt(pp.get('self_agreement', []))} |")
    lines += ["",
              "Tuned configs re-run in a fresh process under the cap: " + ", ".join(
                  f"{r['search']['tuned']}: {r['tuned_rerun']['status']}" for r in out["rows"])
              + ".", "", "## Oracle measurements", ""]
    lines += oracle_tables(out)
    return "\n".join(lines) + "\n"


def oracle_tables(out: dict, *, per_pass: bool = False) -> list[str]:
    """Every oracle measurement, one table per workload (both renderers end with it);
    ``per_pass`` adds each pass's samples/s (how far one candidate's runs lie apart)."""
    lines: list[str] = []
    extra = (" samples/s per pass |", "---:|") if per_pass else ("", "")
    for r in out["rows"]:
        lines += [f"### {r['workload']}", "",
                  "| candidate | runs | best median s | samples/s | peak | fits usable |"
                  + extra[0], "|---|---|---:|---:|---:|---|" + extra[1]]
        for c in r["oracle"]["candidates"]:
            if not c["statuses"]:
                continue
            passes = ", ".join(f"{out['target_batch'] / m:.0f}" if m else "-"
                               for m in c["medians_s"]) if per_pass else ""
            lines.append(
                f"| {c['key']} | {', '.join(c['statuses'])} | "
                f"{c['best_median_s'] or 0:.3f} | {c['samples_per_s'] or 0:.0f} | "
                f"{format_bytes(c['peak_bytes'])} | {fits_column(c)} |"
                + (f" {passes} |" if per_pass else ""))
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help=(
        f"comma-separated subset of {', '.join(BY_SHORT)} (default: "
        f"{','.join(DEFAULT_WORKLOADS)})"))
    parser.add_argument("--target", type=int, default=TARGET,
                        help=f"target (effective) batch (default {TARGET})")
    parser.add_argument("--passes", type=int, choices=(1, 2), default=2, help=(
        "oracle passes: 2 interleaved (each candidate's best median kept, and the oracle's "
        "own agreement across passes), or 1 (half the time)"))
    parser.add_argument("--space", choices=("full", "lean"), default="full", help=(
        "full: every setting the search considers by default, less what the search's own "
        "rule skips for the workload; lean: also without exact duplicates of another "
        "setting's run on this device (said in the output)"))
    parser.add_argument("--min-micro-batch", type=int, default=1, help=(
        "oracle micro-batches from this one only, plus the tuned one (default 1: all; said "
        "in the output: the oracle is then not exhaustive below it)"))
    parser.add_argument("--oracle-from", metavar="NAME", type=oracle_names, help=(
        "reuse the oracle runs of results/NAME.json (same workload, target and cap, this "
        "machine; several names separated by commas: per candidate, the file with more runs) "
        "and run only the candidates it lacks, e.g. with a lower --min-micro-batch; stored "
        "runs of passes beyond --passes are kept; the search still runs afresh"))
    parser.add_argument("--oracle-deadline", type=float, default=None, metavar="MINUTES",
                        help=(
        "no oracle run starts after this many minutes (stored runs are still taken): an "
        "oracle measured over several sessions, each run's --oracle-from the one before; "
        "the results say what was not run, and their pick quality and cost ratio are then "
        "upper bounds (default: no deadline)"))
    parser.add_argument("--side-by-side", type=int, default=0, metavar="ROUNDS", help=(
        "after the oracle, run the tuned config and the oracle's two best that fit in "
        "ROUNDS interleaved rounds (a fresh child each, same spec): pick quality without "
        "the oracle's single-run luck (default 0: not run)"))
    parser.add_argument("--confirm-within", type=float, default=None, metavar="SHARE", help=(
        "the search re-measures leads up to this share (its --confirm-within; default: the "
        "search's own default)"))
    parser.add_argument("--rank-precision", type=float, default=None, metavar="SHARE", help=(
        "the search's first timings stop once their median is known within this share (its "
        "--rank-precision; default: the search's own default)"))
    parser.add_argument("--concurrency", default="",
                        help="note for the results, e.g. what else this run shared the CPU with")
    parser.add_argument("--name", default=NAME, help=f"results file name (default {NAME})")
    parser.add_argument("--render", metavar="NAME", help=(
        "re-render results/NAME.json (this benchmark's or the older search_quality*); a path "
        "ending in .json (e.g. an older result from git show) is rendered to stdout only"))
    args = parser.parse_args()
    if args.render and args.render.endswith(".json"):
        print(render(json.loads(Path(args.render).read_text())))
        return
    if args.render:
        out = json.loads((HERE / "results" / f"{args.render}.json").read_text())
        print(write_results(args.render, out, render(out)).read_text())
        return
    wanted = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(wanted) - set(BY_SHORT))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(BY_SHORT)}")
    if args.target < 1 or args.min_micro_batch < 1:
        parser.error("--target and --min-micro-batch must be at least 1")
    if args.oracle_deadline is not None and not 0 < args.oracle_deadline <= 24 * 60:  # nan
        parser.error(f"--oracle-deadline {args.oracle_deadline}: minutes above 0, at most a "
                     "day (leave it out to run the whole oracle)")
    if not 0 <= args.side_by_side <= 10:
        parser.error(f"--side-by-side takes 0 to 10 rounds, got {args.side_by_side}")
    if args.confirm_within is not None and not 0 <= args.confirm_within <= 1:  # nan too
        parser.error(f"--confirm-within {args.confirm_within}: a share from 0 to 1 (as the "
                     "search's own option)")
    if args.rank_precision is not None and not 0 < args.rank_precision <= 1:  # nan too
        parser.error(f"--rank-precision {args.rank_precision}: a share above 0, at most 1 "
                     "(to time every run in full, run the search itself with 0)")
    from autotune.device import describe_device

    start = time.perf_counter()
    info = describe_device("cpu")
    settings, device_notes = default_settings(info)
    values, _, _ = knob_values(info)
    classes, _ = memory_classes(info, timed_precisions(info, None)[0])
    out = {"schema": "knobs", "machine": machine(), "rows": [], "concurrency": args.concurrency,
           "command": "python benchmarks/search_quality.py " + " ".join(sys.argv[1:]),
           "wall_s": 0.0, "target_batch": args.target, "passes": args.passes,
           "space": args.space, "min_micro_batch": args.min_micro_batch,
           "classes": [c.label() for c in classes], "knob_values": values,
           "num_settings": len(settings), "device_notes": device_notes,
           "native_bf16": info.native_bf16, "confirm_within": args.confirm_within,
           "rank_precision": args.rank_precision, "oracle_deadline_min": args.oracle_deadline}
    for short in wanted:  # results written after each workload: a cut-short run keeps them
        out["rows"].append(bench_workload(
            BY_SHORT[short], info, target=args.target, passes=args.passes,
            lean=args.space == "lean", min_micro_batch=args.min_micro_batch,
            oracle_from=args.oracle_from, side_by_side=args.side_by_side,
            oracle_deadline_s=args.oracle_deadline * 60 if args.oracle_deadline else None,
            confirm_within=args.confirm_within, rank_precision=args.rank_precision))
        out["wall_s"] = time.perf_counter() - start
        write_results(args.name, out, "rendering failed: python benchmarks/search_quality.py "
                      f"--render {args.name}\n")
        write_results(args.name, out, render(out))
    print((HERE / "results" / f"{args.name}.md").read_text())


if __name__ == "__main__":
    main()
