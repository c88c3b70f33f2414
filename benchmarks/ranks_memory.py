"""Per-rank memory of jobs of more ranks than this machine has cores, against the estimator.

A search refuses more ranks than cores (their timings would be each other's), but a rank's
memory does not depend on its core: this runs ``state_heavy`` (micro-batch 8 x 2 accumulated,
2 optimizer steps, no timing) as one job of ``--ranks`` gloo ranks per strategy, ``--repeats``
times, and prints each job's largest rank's peak beside the estimator's per-rank figure.

    python benchmarks/ranks_memory.py --ranks 4
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from autotune.builtin_workloads import load_workload
from autotune.config import TrialSpec, WorkloadSpec
from autotune.estimate.trace import estimate_step
from autotune.knobs import Knobs
from autotune.runner import run_isolated

WORKLOAD = WorkloadSpec(
    kind="file", target=f"{Path(__file__).resolve().parent.parent / 'tests' / 'workloads.py'}"
                        ":state_heavy")
MIB = 1024**2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    ns = parser.parse_args()
    print("| strategy | ranks | estimate / rank | measured (largest rank), each job | error |")
    print("|---|---:|---:|---:|---:|")
    for strategy in ("ddp", "fsdp"):
        knobs = Knobs(strategy=strategy)
        estimate = estimate_step(load_workload(WORKLOAD), 8, knobs=knobs, kernels="cpu",
                                 world_size=ns.ranks).peak_bytes
        peaks = []
        for _ in range(ns.repeats):
            result = run_isolated(TrialSpec(workload=WORKLOAD, device="cpu", micro_batch=8,
                                            accumulate_steps=2, knobs=knobs, ranks=ns.ranks,
                                            timeout_s=300))
            if not result.ok or result.peak_bytes is None:
                raise SystemExit(f"{strategy} x {ns.ranks}: {result.status}: {result.message}")
            peaks.append(result.peak_bytes)
        print(f"| {strategy} | {ns.ranks} | {estimate / MIB:.2f} MiB | "
              f"{', '.join(f'{p / MIB:.2f} MiB' for p in peaks)} | "
              f"{estimate / statistics.median(peaks) - 1:+.1%} |", flush=True)


if __name__ == "__main__":
    main()
