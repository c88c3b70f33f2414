"""Does the numerics guard's reference count in a timed run's peak? (CPU, ``slow_gpt2``.)

Runs ``slow_gpt2`` at bf16/default, micro-batch 16 (accumulation 4) under its 480 MiB cap in
the search's own children (``runner.run_isolated``): a memory probe (2 warm-up steps, nothing
timed, no reference) and timed runs (2 warm-up + 3 timed steps, with the guard's fp32 eager
reference), alternately, each with a warm inductor cache. Before ``trial._reference_loss`` ran
after the measured steps, a timed run peaked ~32 MiB above the probe (the reference's forward
left the allocator holding more through every step). Prints one JSON line per run and writes
them with the machine's facts to ``benchmarks/results/NAME.json``.

    python benchmarks/guard_peak.py [--repeats 2] [--name guard_peak]

``guard_peak-before.json`` ran the code before the change (``git worktree add /tmp/wt cec4279``,
then ``cd /tmp/wt && PYTHONPATH=/tmp/wt python /work/main/benchmarks/guard_peak.py --name
guard_peak-before``: the children run ``python -m`` from the working directory, so it must be
the worktree).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from oracle import machine
from workloads import SLOW_GPT2_CAP_BYTES

from autotune.config import TrialSpec, WorkloadSpec
from autotune.knobs import Knobs
from autotune.runner import run_isolated
from autotune.units import MIB

HERE = Path(__file__).resolve().parent


def spec(timed: bool) -> TrialSpec:
    return TrialSpec(
        workload=WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:slow_gpt2"),
        device="cpu", micro_batch=16, accumulate_steps=4,
        warmup_accumulate_steps=None if timed else 2, knobs=Knobs(precision="bf16",
                                                                  compile_mode="default"),
        num_warmup_steps=2, num_timed_steps=3 if timed else 0,
        memory_budget_bytes=SLOW_GPT2_CAP_BYTES, timeout_s=600.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--name", default="guard_peak", help="results file name (no suffix)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be 1 or more (got {args.repeats})")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.name) or ".." in args.name:
        parser.error(f"--name must be a file name of letters, digits, '_', '-' and '.' (got "
                     f"{args.name!r})")
    run_isolated(spec(timed=False))  # warms inductor's cache: every run below loads from it
    rows = []
    for _ in range(args.repeats):
        for timed in (False, True):
            result = run_isolated(spec(timed))
            row = {"run": "timed" if timed else "probe", "status": result.status,
                   "peak_mib": round((result.peak_bytes or 0) / MIB, 1),
                   "after_each_step_mib": [round(b / MIB, 1) for b in result.step_memory_bytes],
                   "first_loss": result.first_loss, "reference_loss": result.reference_loss}
            print(json.dumps(row), flush=True)
            rows.append(row)
    import autotune

    out = {"machine": machine(), "autotune_from": str(Path(autotune.__file__).parent),
           "workload": "slow_gpt2 bf16/default 16x4, cap 480 MiB",
           "runs": rows}
    path = HERE / "results" / f"{args.name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
