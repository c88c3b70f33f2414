"""Estimator accuracy: fake-tensor estimate vs the peak of a real step in a child process (CPU).

The real peak (``runner.run_isolated``) is the child's address-space growth: it includes what
the estimate does not count (malloc arenas, thread stacks, freed memory glibc keeps). So three
figures are shown per point:

- raw: the measured peak with the default allocator;
- sharp: measured with ``MALLOC_MMAP_THRESHOLD_=131072`` (large blocks go back on free);
- explained: sharp minus the peak of a null workload (one parameter) under the same settings,
  i.e. the step's own memory. The estimate (kernels=cpu) is compared with it.

Run: ``python benchmarks/estimate_accuracy.py`` (a few minutes on 2 cores); writes
``benchmarks/results/estimate_accuracy.{json,md}``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from autotune.config import TrialSpec, WorkloadSpec, format_bytes
from autotune.estimate import estimate_step
from autotune.runner import run_isolated
from autotune.workload import load_workload

HERE = Path(__file__).resolve().parent
WORKLOADS = {
    "default (tiny GPT)": (WorkloadSpec(), (8, 32)),
    "tiny HF GPT-2": (WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:tiny_hf_gpt2"),
                      (8, 32)),
    "tiny BERT": (WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:tiny_bert"), (8, 32)),
    "small CNN": (WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:small_cnn"), (16, 64)),
}
NULL = WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:null")
SHARP = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def measure(spec: WorkloadSpec, micro_batch: int, env: dict[str, str]) -> int:
    saved = {k: os.environ.get(k) for k in SHARP}
    os.environ.update(env)
    try:
        result = run_isolated(TrialSpec(workload=spec, device="cpu", micro_batch=micro_batch,
                                        precision="fp32", num_warmup_steps=2, timeout_s=300))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if not result.ok or result.peak_bytes is None:
        raise RuntimeError(f"{spec.label()} mb {micro_batch}: {result.status} {result.message}")
    return result.peak_bytes


def main() -> None:
    start = time.perf_counter()
    null_raw, null_sharp = measure(NULL, 1, {}), measure(NULL, 1, SHARP)
    rows = []
    for name, (spec, micro_batches) in WORKLOADS.items():
        workload = load_workload(spec, "cpu")
        for micro_batch in micro_batches:
            est = estimate_step(workload, micro_batch, precision="fp32", kernels="cpu")
            raw, sharp = measure(spec, micro_batch, {}), measure(spec, micro_batch, SHARP)
            explained = sharp - null_sharp
            rows.append({
                "workload": name, "micro_batch": micro_batch, "precision": "fp32",
                "estimate_bytes": est.peak_bytes, "trace_s": round(est.trace_s, 2),
                "measured_raw_bytes": raw, "measured_sharp_bytes": sharp,
                "explained_bytes": explained,
                "error_vs_explained": round(est.peak_bytes / explained - 1, 4),
                "error_vs_raw": round(est.peak_bytes / raw - 1, 4),
            })
            print(rows[-1], file=sys.stderr)
    out = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "null_overhead_raw_bytes": null_raw, "null_overhead_sharp_bytes": null_sharp,
        "rows": rows, "wall_s": round(time.perf_counter() - start, 1),
    }
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / "estimate_accuracy.json").write_text(json.dumps(out, indent=2) + "\n")
    render(out)


def render(out: dict) -> None:
    """Write the markdown table from the JSON results."""
    rows, null_raw, null_sharp = (out["rows"], out["null_overhead_raw_bytes"],
                                  out["null_overhead_sharp_bytes"])
    lines = [
        "# Estimator accuracy (CPU, fp32, eager)", "",
        f"torch {torch.__version__}, {platform.platform()}, {os.cpu_count()} CPUs, "
        f"run {out['wall_s']} s; {out['machine']['processor'] or out['machine']['platform']}.",
        "",
        "Estimate: fake-tensor trace (kernels=cpu), live tensor bytes at the peak. Measured: "
        "address-space growth of a real child step (runner.run_isolated). raw = default "
        "glibc malloc; sharp = MALLOC_MMAP_THRESHOLD_=131072; explained = sharp minus the "
        f"null workload's peak ({format_bytes(null_sharp)} sharp, {format_bytes(null_raw)} "
        "raw: arenas, thread stacks, runtime).", "",
        "| workload | micro-batch | estimate | measured raw | measured sharp | explained "
        "| error vs explained | error vs raw |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['micro_batch']} | {format_bytes(r['estimate_bytes'])} | "
            f"{format_bytes(r['measured_raw_bytes'])} | {format_bytes(r['measured_sharp_bytes'])}"
            f" | {format_bytes(r['explained_bytes'])} | {r['error_vs_explained']:+.1%} | "
            f"{r['error_vs_raw']:+.1%} |")
    lines += ["", "Per-sample growth (slope between the two micro-batches): what the micro-batch "
              "costs, free of constant process overhead.", "",
              "| workload | estimate per sample | explained per sample | error |",
              "|---|---:|---:|---:|"]
    for name in dict.fromkeys(r["workload"] for r in rows):
        a, b = [r for r in rows if r["workload"] == name][:2]
        span = b["micro_batch"] - a["micro_batch"]
        est = (b["estimate_bytes"] - a["estimate_bytes"]) / span
        real = (b["explained_bytes"] - a["explained_bytes"]) / span
        lines.append(f"| {name} | {format_bytes(est)} | {format_bytes(real)} | "
                     f"{est / real - 1:+.1%} |")
    (HERE / "results" / "estimate_accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:] == ["--render"]:
        render(json.loads((HERE / "results" / "estimate_accuracy.json").read_text()))
    else:
        main()
