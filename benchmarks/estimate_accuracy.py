"""Estimator accuracy: fake-tensor estimate vs the peak of a real step in a child process (CPU).

Measured: the peak the probe itself uses (``runner.run_isolated``): the child's address-space
growth over its baseline (taken after importing torch and building the model) plus the exact
bytes of the model's parameters and buffers. The null workload (one parameter) shows what a
training step costs the process beyond its tensors. The estimate (kernels=cpu) counts live
tensor bytes at the peak of the same step (two micro-batches accumulated, optimizer step).

Run: ``python benchmarks/estimate_accuracy.py [--name NAME] [--render]`` (a few minutes on 2 cores);
writes ``benchmarks/results/NAME.{json,md}`` (default ``estimate_accuracy``). The constant the
estimate misses is kernel-library scratch memory: it depends on the CPU (oneDNN and MKL pick
other kernels, with other workspaces, on another instruction set), so record the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from oracle import machine, write_results

from autotune.builtin_workloads import load_workload
from autotune.config import TrialSpec, WorkloadSpec
from autotune.estimate.trace import estimate_step
from autotune.runner import run_isolated
from autotune.units import format_bytes

HERE = Path(__file__).resolve().parent
MICRO_BATCHES = (4, 8, 16, 32, 64)
WORKLOADS = {
    "default (tiny GPT)": WorkloadSpec(),
    "tiny HF GPT-2": WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:tiny_hf_gpt2"),
    "tiny BERT": WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:tiny_bert"),
    "small CNN": WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:small_cnn"),
}
NULL = WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:null")


def measure(spec: WorkloadSpec, micro_batch: int) -> int:
    result = run_isolated(TrialSpec(workload=spec, device="cpu", micro_batch=micro_batch,
                                    precision="fp32", num_warmup_steps=2, timeout_s=300))
    if not result.ok or result.peak_bytes is None:
        raise RuntimeError(f"{spec.label()} mb {micro_batch}: {result.status} {result.message}")
    return result.peak_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="estimate_accuracy", help="results file name")
    parser.add_argument("--render", action="store_true", help="re-render results/NAME.json")
    args = parser.parse_args()
    if args.render:
        out = json.loads((HERE / "results" / f"{args.name}.json").read_text())
        print(write_results(args.name, out, render(out)).read_text())
        return
    start = time.perf_counter()
    null = measure(NULL, 1)
    rows = []
    for name, spec in WORKLOADS.items():
        workload = load_workload(spec, "cpu")
        for micro_batch in MICRO_BATCHES:
            est = estimate_step(workload, micro_batch, kernels="cpu")  # fp32 eager
            measured = measure(spec, micro_batch)
            rows.append({
                "workload": name, "micro_batch": micro_batch, "precision": "fp32",
                "estimate_bytes": est.peak_bytes, "trace_s": round(est.trace_s, 2),
                "measured_bytes": measured,
                "error": round(est.peak_bytes / measured - 1, 4),
            })
            print(rows[-1], file=sys.stderr)
    out = {
        "machine": machine(),
        "kernel_env": {k: v for k, v in sorted(os.environ.items())  # they move the scratch
                       if k.startswith(("MKL_", "ONEDNN_", "DNNL_", "OMP_"))},
        "null_step_bytes": null, "rows": rows, "wall_s": round(time.perf_counter() - start, 1),
    }
    print(write_results(args.name, out, render(out)).read_text())


def render(out: dict) -> str:
    """The markdown table of the JSON results."""
    rows, m = out["rows"], out["machine"]
    cpu = m.get("cpu_model") or m["processor"] or "CPU model not recorded"
    lines = [
        "# Estimator accuracy (CPU, fp32, eager)", "",
        f"{m['date']}; {cpu}, torch {m['torch']}, "
        f"{m['platform']}, {m['cpus']} CPUs; run "
        f"{out['wall_s']} s. Kernel-library settings: "
        + ("not recorded" if "kernel_env" not in out else
           ", ".join(f"{k}={v}" for k, v in out["kernel_env"].items()) or "defaults")
        + ".", "",
        "Estimate: fake-tensor trace of one training step (kernels=cpu): live tensor bytes at "
        "the peak. Measured: the probe's own figure from a real step in a child process "
        "(address-space growth over the baseline taken after building the model, plus the "
        "model's parameter and buffer bytes). A null workload (one parameter) measures "
        f"{format_bytes(out['null_step_bytes'])}: what a step costs the process beyond its "
        "tensors. Negative error: the estimate is below the measurement.", "",
        "| workload | micro-batch | estimate | measured | error | trace s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['micro_batch']} | {format_bytes(r['estimate_bytes'])} | "
            f"{format_bytes(r['measured_bytes'])} | {r['error']:+.1%} | {r['trace_s']:.1f} |")
    lines += ["", "Per-sample growth (slope between the smallest and largest micro-batch): what "
              "the micro-batch costs, free of constant overhead; and the constant the estimate "
              "misses (measured minus estimate, mean over the micro-batches).", "",
              "| workload | estimate per sample | measured per sample | error | constant missed |",
              "|---|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == name]
        a, b = mine[0], mine[-1]
        span = b["micro_batch"] - a["micro_batch"]
        est = (b["estimate_bytes"] - a["estimate_bytes"]) / span
        real = (b["measured_bytes"] - a["measured_bytes"]) / span
        missed = sum(r["measured_bytes"] - r["estimate_bytes"] for r in mine) / len(mine)
        lines.append(f"| {name} | {format_bytes(est)} | {format_bytes(real)} | "
                     f"{est / real - 1:+.1%} | {format_bytes(missed)} |")
    within = [r for r in rows if abs(r["error"]) <= 0.10]
    lines += ["", f"Within 10%: {len(within)} of {len(rows)} points; at micro-batch >= 16: "
              f"{sum(1 for r in within if r['micro_batch'] >= 16)} of "
              f"{sum(1 for r in rows if r['micro_batch'] >= 16)}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
