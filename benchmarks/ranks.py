"""Several devices on this machine: DDP against FSDP2 for 1 and 2 CPU ranks, searched for real.

For each (ranks, strategy) it runs ``autotune search --nproc-per-node R --strategy S`` as a
user would (each probe and trial a job of R gloo ranks under torch's elastic launcher), on a
workload whose AdamW state dominates its memory (``tests/workloads.py:state_heavy``: 16 MiB of
parameters, 64 MiB with gradients and AdamW's moments), under one per-rank budget. It reports
the largest micro-batch per rank of the strategy's plain setting, the winner's per-rank peak,
its global samples/s (the whole job's samples per second), the search's wall time and child
runs, and the estimator's per-rank peak for the winner's micro-batch (``autotune estimate
--strategy S --world-size R``) against the measured one. Run it on a quiet machine; more
ranks than cores are refused (a CPU rank needs a core of its own).

    python benchmarks/ranks.py --name ranks
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
WORKLOAD = f"{ROOT / 'tests' / 'workloads.py'}:state_heavy"
MIB = 1024**2


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune.cli", *args], env=env,
                          capture_output=True, text=True, timeout=3600)


def search(ranks: int, strategy: str, budget: str, target: int, work: Path,
           env: dict[str, str]) -> dict[str, object]:
    out = work / f"{strategy}-{ranks}"
    out.mkdir(parents=True)
    start = time.perf_counter()
    proc = _cli("search", "--workload", WORKLOAD, "--target-batch", str(target),
                "--nproc-per-node", str(ranks), "--strategy", strategy, "--device", "cpu",
                "--memory-budget", budget, "--precisions", "fp32", "--compile-modes", "off",
                "--checkpointing", "off", "--optimizer-impls", "default", "--no-cache",
                "--out", str(out), env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"ranks": ranks, "strategy": strategy, "error": proc.stderr.strip()[-600:]}
    config = json.loads((out / "autotune.json").read_text())
    largest = config["memory"]["max_micro_batch"]  # per probed class, by label
    fresh = [r for r in config["runs"] if r["stored_at"] is None]
    row: dict[str, object] = {
        "ranks": ranks, "strategy": strategy, "world_size": config["world_size"],
        "max_micro_batch": largest.get(f"fp32/off+dp={strategy}"),
        "winner": f"{config['knobs']['strategy']} {config['micro_batch']}x"
                  f"{config['accumulate_steps']}",
        "peak_MiB": config["memory"]["peak_bytes"] / MIB,
        "samples_per_s": config["samples_per_s"], "search_s": wall, "child_runs": len(fresh)}
    estimate = _cli("estimate", "--workload", WORKLOAD, "--micro-batch",
                    str(config["micro_batch"]), "--precision", "fp32", "--kernels", "cpu",
                    "--strategy", config["knobs"]["strategy"], "--world-size", str(ranks),
                    "--device-memory", budget, "--json", env=env)
    if estimate.returncode in (0, 1):  # 1: the estimate says it does not fit
        peak = json.loads(estimate.stdout)["estimate"]["peak_bytes"] / MIB
        row["estimate_MiB"] = peak
        row["estimate_error"] = peak / float(row["peak_MiB"]) - 1  # type: ignore[arg-type]
    else:
        row["estimate_error_text"] = estimate.stderr.strip()[-300:]
    return row


def table(rows: list[dict[str, object]], budget: str, target: int) -> str:
    lines = [
        f"Workload `state_heavy` (4 x 1024x1024 residual blocks, AdamW: training state 64 MiB "
        f"unsharded), target batch {target} over the ranks, budget {budget} per rank, "
        "fp32 eager, this machine's CPU ranks (gloo). Peaks are each rank's address-space "
        "growth (the largest rank's); samples/s are the whole job's.", "",
        "| ranks | strategy | largest micro-batch per rank | winner | per-rank peak | global "
        "samples/s | search | child runs | estimator per-rank peak (error) |",
        "|---:|---|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['ranks']} | {r['strategy']} | failed: {r['error']} | | | | | | |")
            continue
        est = (f"{r['estimate_MiB']:.1f} MiB ({r['estimate_error']:+.0%})"
               if "estimate_MiB" in r else r.get("estimate_error_text", "-"))
        lines.append(
            f"| {r['ranks']} | {r['strategy']} | {r['max_micro_batch']} | {r['winner']} | "
            f"{r['peak_MiB']:.1f} MiB | {r['samples_per_s']:.1f} | {r['search_s']:.0f} s | "
            f"{r['child_runs']} | {est} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="ranks")
    parser.add_argument("--budget", default="150MiB")
    parser.add_argument("--target", type=int, default=64)
    parser.add_argument("--ranks", default="1,2")
    ns = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="autotune-ranks-"))
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(work / "cache")}
    rows = []
    for ranks in (int(r) for r in ns.ranks.split(",")):
        for strategy in ("ddp", "fsdp"):
            rows.append(search(ranks, strategy, ns.budget, ns.target, work, env))
            print(json.dumps(rows[-1]), flush=True)
    text = table(rows, ns.budget, ns.target)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{ns.name}.md").write_text(text)
    (RESULTS / f"{ns.name}.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
