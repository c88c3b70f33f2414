"""The GPU part of the benchmarks, in one go (about 10 minutes on one H100).

Steps, each time-boxed and written to its own JSON as soon as it ends, so a step that fails or
runs out of time leaves the others' results:

1. ``search-gpt2``: ``api.search`` on the built-in default workload (GPT-2-small-sized causal LM
   on CUDA, seq 1024), target batch 64;
2. ``search-bert``: ``api.search`` on ``--model bert-base-uncased`` (config shipped in
   ``autotune/hf_configs.py``, random weights), target batch 64;
3. ``oracle-bert``: the exhaustive oracle (``oracle.run_oracle``, two interleaved passes) on the
   BERT workload, plus pick quality and cost ratio against step 2 and the naive baseline (fp32
   eager, micro-batch = target if it fits, else the largest power of two that fits);
4. ``estimate``: the estimator (kernels=cuda) vs the measured peak of a real eager step, for
   both models at two micro-batches, fp32 and bf16.

To stay inside 10 minutes the searches and the oracle are restricted (``--full`` lifts it):
precisions bf16 and fp32, compile modes off and default, at most 2 micro-batches per class;
the oracle covers those classes at micro-batches >= 8 and stops starting runs at its deadline.
The results say so.

Run: ``benchmarks/gpu.sh`` (or ``python benchmarks/gpu_suite.py``); ``--dry-run`` lists what
would run without touching a GPU. Results go to ``$OUT/gpu`` when ``OUT`` is set, else
``benchmarks/results/gpu/``.

``--rehearse`` runs every step's code on this CPU instead, with tiny stand-ins for the two
models (``benchmarks/workloads.py``: ``pick_gpt2``, ``pick_bert``), fp32 eager only and short
timing windows, into ``gpu-rehearsal/``: about two minutes, no GPU figures, but a suite that
rehearsed is one whose first (scarce) GPU call does not die of a Python error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from oracle import HERE, machine, naive_micro_batch, run_oracle, write_results

from autotune.api.request import TuneRequest
from autotune.config import WorkloadSpec
from autotune.errors import Interrupted
from autotune.search import Candidate

TARGET = 64
HEADROOM: float = {f.name: f.default for f in fields(TuneRequest)}["headroom"]
"""The search's default share of the budget kept free: the oracle judges fits as it does."""


@dataclass(frozen=True, kw_only=True)
class Setup:
    """Where the suite runs and on what: the GPU, or a CPU rehearsal of the same code."""

    device: str
    gpt2: WorkloadSpec
    bert: WorkloadSpec
    names: tuple[str, str] = ("gpt2-small (default)", "bert-base-uncased")
    """How the results name the two models."""
    rehearsal: bool = False

    def search_settings(self) -> dict:
        """Timing overrides: a rehearsal times short windows (its figures mean nothing)."""
        return {"num_timed_steps": 3, "min_timed_s": 0.2} if self.rehearsal else {}

    def search_limits(self) -> dict:
        """A rehearsal's searches stop after 5 child runs (its probe, the baseline twice and
        two knobs): every line of the suite's own code runs, and the search's stages are
        the everyday tests' (a whole rehearsal search took 160 s on the 2-core Xeon)."""
        return {"max_trials": 5} if self.rehearsal else {}


GPU = Setup(device="cuda:0",
            gpt2=WorkloadSpec(),  # the built-in default: GPT-2 small sized on CUDA, seq 1024
            bert=WorkloadSpec(kind="hf", target="bert-base-uncased"))
REHEARSAL = Setup(device="cpu", rehearsal=True, names=("pick_gpt2 (tiny)", "pick_bert (tiny)"),
                  gpt2=WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:pick_gpt2"),
                  bert=WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:pick_bert"))


@dataclass(frozen=True, kw_only=True)
class Step:
    """One time-boxed step of the suite."""

    name: str
    what: str
    budget_s: float
    """Seconds the step is planned to take (searches get it as their time budget)."""
    settings: dict = field(default_factory=dict)
    opt_in: bool = False
    """Runs only when ``--only`` names it (outside the 10-minute suite)."""


def plan(full: bool, setup: Setup = GPU) -> list[Step]:
    """The steps, with the restrictions that keep the suite within 10 minutes (a rehearsal:
    fp32 eager only, the oracle at two micro-batches, one estimate point per model)."""
    restrict = {} if full else {"precisions": ["bf16", "fp32"],
                                "compile_modes": ["off", "default"],
                                "micro_batches_per_class": 2}
    # fp32 eager (the baseline) runs first; then the likely winners, so that a deadline
    # leaves out the slow classes.
    oracle_classes = [["fp32", "off"], ["bf16", "default"], ["bf16", "off"],
                      ["fp32", "default"]]
    capped_classes = [["fp32", "off"], ["bf16", "default"], ["bf16", "default+ckpt=blocks"],
                      ["bf16", "off"], ["bf16", "off+ckpt=blocks"],
                      ["bf16", "default+ckpt=alternate"], ["fp32", "default"]]
    cap = "24GiB"  # fp32 eager fits 8 of GPT-2 small at seq 1024 (13.5 GiB on the H200)
    # what a call's deadline left out of oracle-gpt2-capped, for a later call (H200, 2026-11-26)
    capped_rest = [["bf16", "off"], ["bf16", "off+ckpt=blocks"],
                   ["bf16", "default+ckpt=alternate"], ["fp32", "default"]]
    estimate = {"micro_batches": [4, 8], "precisions": ["fp32", "bf16"]}
    min_micro_batch = 1 if full else 8
    if setup.rehearsal:
        restrict = {"precisions": ["fp32"], "compile_modes": ["off"],
                    "micro_batches_per_class": 2}
        oracle_classes, min_micro_batch = [["fp32", "off"]], 32
        capped_classes, cap = [["fp32", "off"], ["fp32", "off+ckpt=blocks"]], "120MiB"
        capped_rest = [["fp32", "off+ckpt=alternate"]]
        estimate = {"micro_batches": [4], "precisions": ["fp32"]}
    return [
        Step(name="search-gpt2", budget_s=200, what="api.search default workload (GPT-2 small, "
             f"seq 1024) --target-batch {TARGET}", settings={"workload": setup.gpt2.label(),
                                                              **restrict}),
        Step(name="search-bert", budget_s=140, what="api.search --model bert-base-uncased "
             f"--target-batch {TARGET}", settings={"workload": setup.bert.label(),
                                                   **restrict}),
        Step(name="oracle-bert", budget_s=160, what="exhaustive oracle on bert-base-uncased "
             "(2 interleaved passes, best median) vs search-bert; naive baseline",
             settings={"classes": oracle_classes, "min_micro_batch": min_micro_batch,
                       "repeats": 2}),
        Step(name="estimate", budget_s=60, what="estimator (kernels=cuda) vs measured eager "
             "peak: GPT-2 small and BERT-base, micro-batches 4 and 8, fp32 and bf16",
             settings=estimate),
        Step(name="ranks", budget_s=40, what="one job of 1 rank per strategy (none, ddp, fsdp: "
             "nccl on the GPU) on the default workload: peak, samples/s and the per-rank "
             "estimate", settings={"strategies": ["none", "ddp", "fsdp"], "micro_batch": 4,
                                   "precision": "fp32" if setup.rehearsal else "bf16"}),
        # Issue 60: on a node of several GPUs, the same search on every device at once
        # (compare its wall_s with search-gpt2's; on one GPU, auto is 1).
        Step(name="search-gpt2-parallel", budget_s=200, opt_in=True, what="api.search default "
             f"workload --target-batch {TARGET} --parallel auto",
             settings={"workload": setup.gpt2.label(), "parallel": "auto", **restrict}),
        Step(name="oracle-gpt2", budget_s=380, opt_in=True, what="exhaustive oracle (one "
             "pass) on the default workload vs search-gpt2 (this run's, or --search-from's)",
             settings={"classes": oracle_classes, "min_micro_batch": min_micro_batch,
                       "repeats": 1}),
        # Issue 18's case on a GPU: under a consumer card's memory the classes' micro-batches
        # bind and checkpointing can win (on the H200 uncapped, every class fit 64).
        Step(name="search-gpt2-capped", budget_s=300, opt_in=True, what="api.search default "
             f"workload --target-batch {TARGET} --memory-budget {cap}",
             settings={"workload": setup.gpt2.label(), "memory_budget": cap, **restrict}),
        Step(name="oracle-gpt2-capped", budget_s=420, opt_in=True, what="exhaustive oracle "
             f"(one pass) under {cap}, checkpointing included, vs search-gpt2-capped",
             settings={"classes": capped_classes, "min_micro_batch": min_micro_batch,
                       "repeats": 1, "memory_budget": cap}),
        Step(name="oracle-gpt2-capped-rest", budget_s=170, opt_in=True, what="the classes "
             f"oracle-gpt2-capped's deadline left out, under {cap}, and the tuned setting again "
             "(it ties this machine's figures to the earlier call's)",
             settings={"classes": capped_rest, "min_micro_batch": min_micro_batch,
                       "repeats": 1, "memory_budget": cap}),
    ]


def out_dir(setup: Setup = GPU) -> Path:
    name = "gpu-rehearsal" if setup.rehearsal else "gpu"
    return Path(os.environ["OUT"]) / name if os.environ.get("OUT") else HERE / "results" / name


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _probe_line(knobs, step) -> None:
    """Each memory probe point as it ends (a call cut off by its time limit keeps them)."""
    peak = f"{step.peak_bytes / 2**30:.2f} GiB" if step.peak_bytes else "-"
    log(f"  probe {knobs.label()} {step.micro_batch}: {step.status}, peak {peak}, "
        f"{step.wall_s or 0:.0f} s")


def _trial_line(runs, stage: str, candidate, record) -> None:
    """Each timed trial as it ends."""
    if record is not None:
        peak = f"{record.peak_bytes / 2**30:.2f} GiB" if record.peak_bytes else "-"
        log(f"  [{runs.done}] {stage} {candidate.key()}: {record.verdict}, "
            f"{record.samples_per_s or 0:,.1f} samples/s, peak {peak}, "
            f"compile {record.compile_s or 0:.0f} s, {record.wall_s or 0:.0f} s")


def run_search(step: Step, spec: WorkloadSpec, setup: Setup) -> dict:
    from autotune import api
    from autotune.search import SearchSettings

    settings = SearchSettings(
        micro_batches_per_class=step.settings.get("micro_batches_per_class", 3),
        # Its share less the start (imports) and the end (calibration, writing the files).
        time_budget_s=max(step.budget_s * 0.6, step.budget_s - 40), **setup.search_settings(),
        **setup.search_limits())
    start = time.perf_counter()
    result = api.search(spec, target_batch=TARGET, device=setup.device,
                        precisions=step.settings.get("precisions"),
                        compile_modes=step.settings.get("compile_modes"),
                        memory_budget=step.settings.get("memory_budget"),
                        parallel=step.settings.get("parallel", 1),
                        out=tempfile.mkdtemp(prefix=f"{step.name}-"), force=True,
                        settings=settings, on_step=_probe_line, on_trial=_trial_line)
    cfg = result.config
    tuned = Candidate(knobs=cfg.knobs, micro_batch=cfg.micro_batch).key()  # every knob
    return {"wall_s": time.perf_counter() - start, "tuned": tuned,
            "accumulate_steps": cfg.accumulate_steps, "samples_per_s": cfg.samples_per_s,
            "tokens_per_s": cfg.tokens_per_s, "speedup": cfg.speedup,
            "baseline_samples_per_s": cfg.baseline_samples_per_s,
            "max_micro_batch": cfg.memory.max_micro_batch, "peak_bytes": cfg.memory.peak_bytes,
            "num_probes": sum(p.num_probes for p in result.probe.probes),
            "stop_reason": str(result.stop_reason),
            "parallel": cfg.cost.parallel if cfg.cost is not None else 1,
            "device_s": cfg.cost.device_s if cfg.cost is not None else None,
            "stop_exit": result.stop_reason.exit_code if result.stop_reason.by_signal else None,
            "skipped": cfg.skipped,
            "trials": [{"label": t.label(), "verdict": t.verdict, "samples_per_s": t.samples_per_s,
                        "wall_s": t.wall_s} for t in cfg.trials]}


def run_oracle_step(step: Step, search: dict | None, setup: Setup,
                    spec: WorkloadSpec) -> dict:
    from oracle import as_knobs

    from autotune.knobs import BASELINE, Knobs
    from autotune.space import divisors
    from autotune.units import parse_bytes

    cap = step.settings.get("memory_budget")
    budget = parse_bytes(cap) if cap else None
    usable = int(budget * (1 - HEADROOM)) if budget else 2**62  # as the search judges a fit
    mbs = [m for m in divisors(TARGET) if m >= step.settings["min_micro_batch"]]
    classes = [as_knobs(tuple(c)) for c in step.settings["classes"]]  # type: ignore[arg-type]
    space: dict[Knobs, list[int]] = {classes[0]: list(mbs)}
    if search:  # the tuned config (every knob) is always in the oracle's space, run second
        tuned = Candidate.from_key(search["tuned"])
        space[tuned.knobs] = sorted({*space.get(tuned.knobs, ()), tuned.micro_batch})
    for knobs in classes[1:]:
        space[knobs] = sorted({*space.get(knobs, ()), *mbs})
    timing = setup.search_settings()
    candidates, wall = run_oracle(spec, setup.device, TARGET, space, budget_bytes=budget,
                                  repeats=step.settings["repeats"],
                                  # no new run past this: the last one (a compile, ~40 s on a GPU)
                                  # still ends inside the step's share of the call
                                  deadline_s=max(step.budget_s * 0.7, step.budget_s - 40),
                                  log=log, **timing)
    by_key = {c.key(): c for c in candidates}
    measured = [c for c in candidates if c.ran_ok_every_time() and c.samples_per_s(TARGET)
                and c.fits_usable(usable)]
    best = max(measured, key=lambda c: c.samples_per_s(TARGET) or 0.0, default=None)
    eager = {c.micro_batch: c for c in candidates if c.knobs == BASELINE}
    naive_mb = naive_micro_batch(TARGET, lambda m: m in eager and eager[m] in measured)
    naive = eager.get(naive_mb)
    tuned = by_key.get(search["tuned"]) if search else None
    sps = {name: (c.samples_per_s(TARGET) if c else None)
           for name, c in (("tuned", tuned), ("best", best), ("naive", naive))}
    return {"wall_s": wall, "candidates": [c.summary(TARGET, usable) for c in candidates],
            "best": best.key() if best else None, "naive": naive.key() if naive else None,
            "samples_per_s": sps,
            "pick_quality": sps["tuned"] / sps["best"] if sps["tuned"] and sps["best"] else None,
            "cost_ratio": search["wall_s"] / wall if search else None,
            "search": ({"tuned": search["tuned"], "wall_s": search["wall_s"],
                        "from": search["from"]} if search else None),
            "speedup_vs_naive": (sps["tuned"] / sps["naive"]
                                 if sps["tuned"] and sps["naive"] else None),
            "note": (f"memory cap {cap} ({usable / 2**30:.2f} GiB usable, headroom "
                     f"{HEADROOM:.0%}: a peak over it does not fit)" if cap else
                     "no memory cap: the GPU's own memory is the limit (OOM -> infeasible)")}


def run_estimate(step: Step, setup: Setup) -> dict:
    from autotune import api
    from autotune.device import describe_device
    from autotune.knobs import Knobs
    from autotune.memory import probe_spec
    from autotune.runner import run_isolated

    total = describe_device(setup.device).total_memory_bytes
    kernels = "cpu" if setup.device == "cpu" else "cuda"
    rows = []
    for name, spec in zip(setup.names, (setup.gpt2, setup.bert), strict=True):
        for precision in step.settings["precisions"]:
            for m in step.settings["micro_batches"]:
                est = api.estimate(spec, micro_batch=m, device_memory=total,
                                   precision=precision, kernels=kernels, find_max=False)
                real = run_isolated(probe_spec(
                    spec, setup.device, Knobs.checked(precision=precision),
                    m, None, 300))
                measured = real.peak_bytes if real.ok else None
                rows.append({"workload": name, "precision": precision, "micro_batch": m,
                             "estimate_bytes": est.estimate.peak_bytes,
                             "measured_bytes": measured, "status": real.status,
                             "error": (est.estimate.peak_bytes / measured - 1
                                       if measured else None)})
                log(f"  estimate {rows[-1]}")
    return {"rows": rows, "note": "measured = max_memory_reserved + CUDA context and "
            "non-PyTorch use (autotune's CUDA peak); the estimate counts live tensors only"}


def run_ranks(step: Step, setup: Setup) -> dict:
    """Each strategy as one real job of one rank (the launcher, the process group: nccl on
    CUDA, gloo on CPU; FSDP2's bf16 policy), against the estimator's per-rank figure."""
    from autotune import api
    from autotune.config import TrialSpec
    from autotune.device import describe_device
    from autotune.knobs import Knobs
    from autotune.runner import run_isolated

    total = describe_device(setup.device).total_memory_bytes
    kernels = "cpu" if setup.device == "cpu" else "cuda"
    m, rows = step.settings["micro_batch"], []
    for strategy in step.settings["strategies"]:
        knobs = Knobs.checked(precision=step.settings["precision"], strategy=strategy)
        real = run_isolated(TrialSpec(workload=setup.gpt2, device=setup.device, micro_batch=m,
                                      accumulate_steps=2, knobs=knobs, num_timed_steps=3,
                                      ranks=1, timeout_s=300))
        est = api.estimate(setup.gpt2, micro_batch=m, device_memory=total, knobs=knobs,
                           kernels=kernels, find_max=False, world_size=1)
        measured = real.peak_bytes if real.ok else None
        rows.append({"strategy": strategy, "status": real.status, "message": real.message[:300],
                     "measured_bytes": measured, "samples_per_s": real.samples_per_s(),
                     "estimate_bytes": est.estimate.peak_bytes,
                     "error": est.estimate.peak_bytes / measured - 1 if measured else None})
        log(f"  ranks {rows[-1]}")
    return {"rows": rows, "micro_batch": m}


def _cell(value: float | None, spec: str, scale: float = 1.0) -> str:
    """A table cell: ``value / scale`` formatted, or '-' where there is none."""
    return "-" if value is None else format(value / scale, spec)


def render(results: dict) -> str:
    m = results["machine"]
    if results.get("rehearsal"):
        title = "# GPU benchmarks: CPU rehearsal (no GPU figures)"
        where = (f"{m.get('cpu_model') or m['processor']}, {m['cpus']} CPUs, tiny stand-in "
                 "models, fp32 eager, 3-step windows: this checks the suite's code, the "
                 "figures mean nothing")
    else:
        title = "# GPU benchmarks"
        where = f"{m.get('gpu')}, CUDA {m.get('cuda')}"
    lines = [title, "",
             f"{m['date']}; {where}; torch {m['torch']}, transformers {m['transformers']}, "
             f"optuna {m['optuna']}. Suite {results['wall_s']:.0f} s"
             f"{' (--full)' if results['full'] else ' (restricted to fit 10 minutes)'}.", ""]
    for name, res in results["steps"].items():
        lines.append(f"## {name}")
        lines.append("")
        if "error" in res:
            lines += [f"failed: {res['error']}", ""]
            continue
        if name.startswith("search"):
            lines.append(f"tuned {res['tuned']} x{res['accumulate_steps']}: "
                         f"{res['samples_per_s']:.1f} samples/s, {res['speedup'] or 0:.2f}x the "
                         f"baseline; {res['num_probes']} probes; {res['wall_s']:.0f} s; "
                         f"max micro-batch {res['max_micro_batch']}"
                         + (f"; under {cap}" if (cap := res["settings"].get("memory_budget"))
                            else ""))
        elif name.startswith("oracle"):
            q, c, s = res["pick_quality"], res["cost_ratio"], res["speedup_vs_naive"]
            lines.append(f"best {res['best']}, naive {res['naive']}; pick quality "
                         f"{'-' if q is None else f'{q:.2f}'}, cost ratio "
                         f"{'-' if c is None else f'{c:.2f}'}, tuned vs naive "
                         f"{'-' if s is None else f'{s:.2f}x'}; oracle {res['wall_s']:.0f} s")
            lines.append(res["note"])
            if res.get("search"):
                lines.append(f"search: {res['search']['tuned']} in "
                             f"{res['search']['wall_s']:.0f} s ({res['search']['from']})")
            lines += ["", "| candidate | statuses | timed steps | samples/s | peak GiB | "
                      "wall s |", "|---|---|---|---:|---:|---:|"]
            for c in res["candidates"]:
                lines.append(f"| {c['key']} | {','.join(c['statuses']) or 'not run'} | "
                             f"{','.join(map(str, c['num_timed_steps']))} | "
                             f"{_cell(c['samples_per_s'], '.1f')} | "
                             f"{_cell(c['peak_bytes'], '.2f', 2**30)} | "
                             f"{sum(w or 0 for w in c['wall_s']):.0f} |")
        elif name == "ranks":
            lines += [f"micro-batch {res['micro_batch']} x 2, one rank per job", "",
                      "| strategy | status | measured GiB | samples/s | estimate GiB | error |",
                      "|---|---|---:|---:|---:|---:|"]
            for r in res["rows"]:
                lines.append(f"| {r['strategy']} | {r['status']} | "
                             f"{_cell(r['measured_bytes'], '.2f', 2**30)} | "
                             f"{_cell(r['samples_per_s'], '.1f')} | "
                             f"{r['estimate_bytes'] / 2**30:.2f} | {_cell(r['error'], '+.1%')} |")
        else:
            lines += ["| workload | precision | micro-batch | estimate GiB | measured GiB "
                      "| error |", "|---|---|---:|---:|---:|---:|"]
            for r in res["rows"]:
                lines.append(f"| {r['workload']} | {r['precision']} | {r['micro_batch']} | "
                             f"{r['estimate_bytes'] / 2**30:.2f} | "
                             f"{_cell(r['measured_bytes'], '.2f', 2**30)} | "
                             f"{_cell(r['error'], '+.1%')} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="list the steps; run nothing")
    parser.add_argument("--full", action="store_true",
                        help="no restrictions (all precisions and compile modes): far over 10 min")
    parser.add_argument("--only", action="append", help="run only these steps (repeatable)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="the steps run share this many seconds (default: the suite's 600 "
                             "s, a step's share as planned): a device call's time left")
    parser.add_argument("--search-from", type=Path, default=None,
                        help="a suite JSON whose searches the oracle steps compare against when "
                             "this run has none (an oracle in a later device call)")
    parser.add_argument("--rehearse", action="store_true",
                        help="run every step's code on this CPU with tiny models (no GPU figures)")
    args = parser.parse_args(argv)
    setup = REHEARSAL if args.rehearse else GPU
    every = plan(args.full, setup)
    names = [s.name for s in every]
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"--only {', '.join(unknown)}: not a step; the steps are {', '.join(names)}")
    steps = [s for s in every if (s.name in args.only if args.only else not s.opt_in)]
    # The steps chosen share the whole suite's 10 minutes (a call of the device tool each).
    total_s = (args.seconds if args.seconds is not None
               else sum(s.budget_s for s in every if not s.opt_in))
    if not 60 <= total_s < float("inf"):  # nan too
        parser.error(f"--seconds {args.seconds:g}: must be a number of seconds from 60 up "
                     "(a device call's seconds left)")
    scale = total_s / sum(s.budget_s for s in steps)
    earlier: dict = {}
    if args.search_from:
        try:
            earlier = json.loads(args.search_from.read_text())["steps"]
            if not isinstance(earlier, dict):
                raise TypeError(f"its steps are a {type(earlier).__name__}, not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"--search-from {args.search_from}: not a suite result ({exc})")
    if args.seconds is None:
        scale = max(1.0, scale)
    steps = [replace(s, budget_s=s.budget_s * scale) for s in steps]
    folder = out_dir(setup)
    result_name = "gpu_suite" + "".join(f"-{s.name}" for s in steps if args.only)
    if args.dry_run:
        print(f"would write to {folder}")
        for s in steps:
            print(f"{s.name}  (~{s.budget_s:.0f} s)  {s.what}  {json.dumps(s.settings)}")
        print(f"planned total ~{sum(s.budget_s for s in steps):.0f} s")
        return 0
    import torch

    def terminate(signum: int, _frame: object) -> None:  # as the autotune CLI does
        raise Interrupted(signal.Signals(signum).name, signum)

    signal.signal(signal.SIGTERM, terminate)
    if not setup.rehearsal and not torch.cuda.is_available():
        print("no CUDA device here: the GPU suite needs one (try --dry-run, or --rehearse "
              "to run its code on this CPU)", file=sys.stderr)
        return 2
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="gpu-inductor-"))
    # Each suite run measures afresh: no study store from an earlier run answers its searches.
    os.environ.setdefault("AUTOTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="gpu-store-"))
    start = time.perf_counter()
    results: dict = {"machine": machine(), "full": args.full, "rehearsal": setup.rehearsal,
                     "steps": {}}
    def search_of(name: str) -> dict | None:
        """This run's search, else --search-from's (one that failed: none)."""
        found = results["steps"].get(name) or earlier.get(name)
        if found and "error" not in found:
            where = "this run" if name in results["steps"] else str(args.search_from)
            return {**found, "from": where}
        return None

    actions: dict[str, Callable[[Step], dict]] = {
        "search-gpt2": lambda s: run_search(s, setup.gpt2, setup),
        "search-bert": lambda s: run_search(s, setup.bert, setup),
        "oracle-bert": lambda s: run_oracle_step(s, search_of("search-bert"), setup,
                                                 setup.bert),
        "oracle-gpt2": lambda s: run_oracle_step(s, search_of("search-gpt2"), setup,
                                                 setup.gpt2),
        "search-gpt2-capped": lambda s: run_search(s, setup.gpt2, setup),
        "search-gpt2-parallel": lambda s: run_search(s, setup.gpt2, setup),
        "oracle-gpt2-capped": lambda s: run_oracle_step(s, search_of("search-gpt2-capped"),
                                                        setup, setup.gpt2),
        "oracle-gpt2-capped-rest": lambda s: run_oracle_step(
            s, search_of("search-gpt2-capped"), setup, setup.gpt2),
        "estimate": lambda s: run_estimate(s, setup),
        "ranks": lambda s: run_ranks(s, setup),
    }
    for step in steps:
        log(f"== {step.name}: {step.what}")
        t0 = time.perf_counter()
        try:
            res = actions[step.name](step)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as autotune's Interrupted
            log(f"interrupted in step {step.name}: the finished steps' results "
                f"({', '.join(results['steps']) or 'none'}) are in {folder}")
            return getattr(exc, "exit_code", 130)
        except Exception as exc:  # one failed step must not lose the others' results
            res = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        res["step_s"] = time.perf_counter() - t0
        res["settings"] = step.settings
        results["steps"][step.name] = res
        results["wall_s"] = time.perf_counter() - start
        try:
            markdown = render(results)
        except Exception:  # the JSON still holds every figure
            markdown = f"rendering failed; see {result_name}.json\n\n{traceback.format_exc()}"
        write_results(result_name, results, markdown, folder)
        if res.get("stop_exit"):  # a signal: the search kept its best so far, then ended
            log(f"{res['stop_reason']}: stopped after step {step.name}; results in {folder}")
            return res["stop_exit"]
    print((folder / f"{result_name}.md").read_text())
    failed = [name for name, res in results["steps"].items() if "error" in res]
    if failed:
        print(f"steps that failed: {', '.join(failed)} (see {result_name}.json)",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
