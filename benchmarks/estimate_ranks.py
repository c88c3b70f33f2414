"""Per-rank estimator accuracy: one process's fake-world trace vs real DDP/FSDP jobs (CPU).

Estimate: ``estimate_step(..., knobs=Knobs(strategy=S), world_size=N, kernels="cpu")``, rank 0
of a fake process group of N ranks traced in this process (live tensor bytes at the step's
peak). Measured: ``run_isolated`` of the same config as one job of N real ranks under torch's
elastic launcher (gloo), its peak the largest rank's: each rank's address-space growth over its
baseline plus its model's bytes (DESIGN.md section 4). An FSDP rank is rebased after sharding,
but the kernel's VmPeak still remembers the full model it built first: where training needs
less than that model, the measured figure over-counts. What the estimate misses is mostly a
per-process constant (kernel scratch, allocator caching), so the table also compares what the
strategy changes against the same workload's single process (``none``, 1 rank): that difference
is free of the constant.

Run: ``python benchmarks/estimate_ranks.py [--repeats 2] [--render]`` (about 10 minutes on 2
cores); writes ``benchmarks/results/estimate_ranks.{json,md}``. Worlds above this machine's
cores (``max_ranks``) are estimated only and marked unmeasured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from oracle import machine, write_results

from autotune.builtin_workloads import load_workload
from autotune.config import TrialSpec, WorkloadSpec
from autotune.device import backend_for
from autotune.estimate.trace import estimate_step
from autotune.knobs import Knobs
from autotune.runner import run_isolated
from autotune.units import format_bytes

HERE = Path(__file__).resolve().parent
NAME = "estimate_ranks"
MICRO_BATCH = 8
WORKLOADS = {
    "state-heavy (4 x 1024 MLP)": WorkloadSpec(
        kind="file", target=f"{HERE.parent}/tests/workloads.py:state_heavy"),
    "default (tiny GPT)": WorkloadSpec(),
}
CASES = (("none", 1), ("ddp", 1), ("ddp", 2), ("ddp-bucket-view", 2), ("fsdp", 1),
         ("fsdp", 2), ("fsdp-no-reshard", 2), ("ddp", 4), ("fsdp", 4), ("ddp", 64),
         ("fsdp", 64))
BREAKDOWN = ("parameters", "gradients", "optimizer", "inputs", "activations", "temporaries")


def measure(spec: WorkloadSpec, strategy: str, ranks: int) -> list[int]:
    """The ranks' peaks of one real job (two micro-batches accumulated, two timed steps)."""
    knobs = Knobs(strategy=strategy)  # type: ignore[arg-type]
    result = run_isolated(TrialSpec(
        workload=spec, device="cpu", micro_batch=MICRO_BATCH, accumulate_steps=2, knobs=knobs,
        num_timed_steps=2, ranks=ranks, timeout_s=300))
    if not result.ok or result.peak_bytes is None:
        raise RuntimeError(f"{spec.label()} {strategy} x{ranks}: {result.status} "
                           f"{result.message}")
    return list(result.rank_peak_bytes or (result.peak_bytes,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="real jobs per measured case")
    parser.add_argument("--render", action="store_true", help=f"re-render results/{NAME}.json")
    args = parser.parse_args()
    if args.render:
        out = json.loads((HERE / "results" / f"{NAME}.json").read_text())
        print(write_results(NAME, out, render(out)).read_text())
        return
    start = time.perf_counter()
    most = backend_for("cpu").max_ranks()
    rows = []
    for name, spec in WORKLOADS.items():
        workload = load_workload(spec, "cpu")
        for strategy, ranks in CASES:
            knobs = Knobs(strategy=strategy)  # type: ignore[arg-type]
            est = estimate_step(workload, MICRO_BATCH, knobs=knobs, kernels="cpu",
                                world_size=ranks)
            row = {"workload": name, "strategy": strategy, "ranks": ranks,
                   "micro_batch": MICRO_BATCH, "estimate_bytes": est.peak_bytes,
                   "peak_phase": est.peak_phase, "trace_s": round(est.trace_s, 2),
                   "breakdown": {k: getattr(est, f"{k}_bytes") for k in BREAKDOWN},
                   "measured": ranks <= most, "rank_peak_bytes": [], "measured_bytes": None,
                   "error": None}
            if row["measured"]:
                runs = [measure(spec, strategy, ranks) for _ in range(args.repeats)]
                row["rank_peak_bytes"] = runs
                row["measured_bytes"] = int(sorted(max(r) for r in runs)[len(runs) // 2])
                row["error"] = round(est.peak_bytes / row["measured_bytes"] - 1, 4)
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    out = {"machine": machine(), "max_ranks": most, "repeats": args.repeats, "rows": rows,
           "wall_s": round(time.perf_counter() - start, 1)}
    print(write_results(NAME, out, render(out)).read_text())


def _delta(value: int | None, base: int | None) -> str:
    if value is None or base is None:
        return "-"
    sign = "+" if value >= base else "-"
    return f"{sign}{format_bytes(abs(value - base))}"


def render(out: dict) -> str:
    """The markdown table of the JSON results."""
    rows, m = out["rows"], out["machine"]
    cpu = m.get("cpu_model") or m["processor"] or "CPU model not recorded"
    lines = [
        "# Per-rank estimator accuracy (CPU, fp32, eager, DDP and FSDP2)", "",
        f"{m['date']}; {cpu}, torch {m['torch']}, {m['platform']}, {m['cpus']} CPUs; run "
        f"{out['wall_s']} s; micro-batch {rows[0]['micro_batch']} x 2 accumulated; median of "
        f"{out['repeats']} real jobs per measured row.", "",
        "Estimate: rank 0 of a fake process group of N ranks, traced in one process "
        "(kernels=cpu): live tensor bytes at the step's peak. Measured: one real job of N ranks "
        "(torch's elastic launcher, gloo), the largest rank's peak address-space growth plus "
        "its model bytes. Negative error: the estimate is below the measurement. Delta: the "
        "row minus the same workload's `none` x 1 (the estimate's vs the measurement's), free "
        "of the per-process constant the estimate does not count. Rows of more ranks than "
        f"this machine's {out['max_ranks']} cores are estimated only: unmeasured.", "",
        "| workload | strategy | ranks | estimate / rank | measured (largest rank) | error | "
        "estimate delta | measured delta | ranks measured (all runs) | peak during |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    base = {r["workload"]: r for r in rows if r["strategy"] == "none" and r["ranks"] == 1}
    for r in rows:
        b = base.get(r["workload"], {})
        measured = r["measured_bytes"]
        spread = "; ".join(", ".join(format_bytes(x) for x in run)
                           for run in r["rank_peak_bytes"]) or "unmeasured"
        lines.append(
            f"| {r['workload']} | {r['strategy']} | {r['ranks']} | "
            f"{format_bytes(r['estimate_bytes'])} | "
            f"{format_bytes(measured) if measured is not None else 'unmeasured'} | "
            f"{'-' if r['error'] is None else format(r['error'], '+.1%')} | "
            f"{_delta(r['estimate_bytes'], b.get('estimate_bytes'))} | "
            f"{_delta(measured, b.get('measured_bytes'))} | {spread} | {r['peak_phase']} |")
    lines += ["", "Estimated breakdown at the peak (parameters, gradients and optimizer state "
              "are one rank's shards under FSDP; DDP's gradients include its buckets):", "",
              "| workload | strategy | ranks | " + " | ".join(BREAKDOWN) + " |",
              "|---|---|---:|" + "---:|" * len(BREAKDOWN)]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['strategy']} | {r['ranks']} | "
                     + " | ".join(format_bytes(r["breakdown"][k]) for k in BREAKDOWN) + " |")
    measured = [r for r in rows if r["error"] is not None]
    within = [r for r in measured if abs(r["error"]) <= 0.10]
    lines += ["", f"Within 10% of the measured peak: {len(within)} of {len(measured)} measured "
              "rows."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
