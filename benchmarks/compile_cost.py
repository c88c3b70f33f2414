"""What compiling costs, and what issue 49's levers save of it.

One section per lever, each a function that returns its rows (and the table that shows them):

- ``scope_rows``: regional compilation (the ``compile_scope`` knob). Per workload with repeated
  blocks, the cold compile seconds (each run a fresh child with an empty inductor cache of its
  own: ``TrialSpec.cold_compile``) and the median step time of ``compile_scope=model`` (the
  whole model compiled) against ``blocks`` (each repeated block compiled on its own, the rest
  eager). On CPU: the slow causal LM and masked LM of ``benchmarks/workloads.py`` (4 layers);
  on CUDA: the built-in workload, GPT-2 small (12 layers).
- the first launch with and without the saved compile artifacts is
  ``benchmarks/compile_first_launch.py`` (its own script: it needs a tuned config and fresh
  processes of the generated loop).

Run: ``python benchmarks/compile_cost.py --machine epyc [--device cpu] [--repeats N]`` ->
``results/compile-cost_<workload>-<machine>-<date>.{md,json}`` per workload.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from oracle import machine, write_results

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SCOPE_WORKLOADS = {
    "cpu": {"slow-gpt2": f"{HERE}/workloads.py:slow_gpt2",
            "slow-bert": f"{HERE}/workloads.py:slow_bert"},
    "cuda": {"gpt2-small": None},  # the built-in workload on CUDA
}
"""Per device, the workloads with repeated blocks the scope section times (None: built-in)."""
SCOPE_BATCH = {"cpu": 8, "cuda": 16}
"""Micro-batch of each timed run (one micro-batch a step): fits the slow workloads' caps."""


def scope_rows(device: str, workload: str, target: str | None, repeats: int,
               num_timed_steps: int) -> list[dict]:
    """``repeats`` cold runs of each scope, alternating (model, blocks), (blocks, model), so
    the shared machine's drift falls on both alike. Each row: the scope, its compile seconds
    (the first steps' time beyond their steps, ``TrialResult.compile_s``), its median step,
    the spread of its timed steps, the graphs dynamo compiled and the inductor cache misses."""
    from autotune.config import WorkloadSpec
    from autotune.knobs import Knobs
    from autotune.memory import probe_spec
    from autotune.runner import run_isolated

    spec_of = WorkloadSpec() if target is None else WorkloadSpec(kind="file", target=target)
    micro = SCOPE_BATCH[device]
    rows = []
    for repeat in range(repeats):
        order = ("model", "blocks") if repeat % 2 == 0 else ("blocks", "model")
        for scope in order:
            knobs = Knobs.checked(compile_mode="default", compile_scope=scope)
            spec = probe_spec(spec_of, device, knobs, micro, None, 1200, per_device_batch=micro,
                              num_timed_steps=num_timed_steps)
            spec = replace(spec, cold_compile=True)
            r = run_isolated(spec)
            times = sorted(r.step_times_s)
            rows.append({
                "workload": workload, "repeat": repeat + 1, "scope": scope, "status": r.status,
                "message": r.message[:300], "compile_s": r.compile_s,
                "median_step_s": r.median_step_s(), "samples_per_s": r.samples_per_s(),
                "step_min_s": times[0] if times else None,
                "step_max_s": times[-1] if times else None,
                "graphs": r.num_graphs, "graph_breaks": r.num_graph_breaks,
                "cache_misses": r.compile_cache_misses, "wall_s": r.wall_s,
                "load_1min": os.getloadavg()[0]})
            print(f"{workload} {scope} (repeat {repeat + 1}): {r.status}, compile "
                  f"{r.compile_s or 0:.1f} s, median step {r.median_step_s() or 0:.3f} s, "
                  f"graphs {r.num_graphs}, wall {r.wall_s or 0:.0f} s", flush=True)
    return rows


def scope_table(rows: list[dict]) -> list[str]:
    """Markdown: each run, then per scope the medians and blocks' ratios to model."""
    lines = ["| repeat | scope | status | cold compile, s | median step, s | step min-max, s | "
             "graphs | graph breaks | wall, s | load (1 min) |",
             "|---:|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        spread = ("-" if r["step_min_s"] is None else
                  f"{r['step_min_s']:.3f}-{r['step_max_s']:.3f}")
        lines.append(f"| {r['repeat']} | {r['scope']} | {r['status']} | "
                     f"{_num(r['compile_s'], '.1f')} | {_num(r['median_step_s'], '.3f')} | "
                     f"{spread} | {_num(r['graphs'], 'd')} | {_num(r['graph_breaks'], 'd')} | "
                     f"{_num(r['wall_s'], '.0f')} | {r['load_1min']:.1f} |")
    summary = scope_summary(rows)
    if summary:
        lines += ["", f"Medians over {summary['runs']} cold run(s) per scope: compile "
                  f"{summary['model_compile_s']:.1f} s (model) vs "
                  f"{summary['blocks_compile_s']:.1f} s (blocks), "
                  f"**{summary['compile_ratio']:.2f}x shorter cold compile with blocks**; step "
                  f"{summary['model_step_s']:.3f} s vs {summary['blocks_step_s']:.3f} s "
                  f"(blocks / model {summary['step_ratio']:.2f})."]
    return lines


def scope_summary(rows: list[dict]) -> dict | None:
    """The medians of each scope's runs that finished, and blocks' ratios to model."""
    def median(scope: str, key: str) -> float | None:
        values = [r[key] for r in rows if r["scope"] == scope and r["status"] == "ok"
                  and r[key] is not None]
        return statistics.median(values) if values else None

    got = {f"{s}_{k}": median(s, key) for s in ("model", "blocks")
           for k, key in (("compile_s", "compile_s"), ("step_s", "median_step_s"))}
    if any(v is None for v in got.values()) or not got["blocks_compile_s"]:
        return None
    return {**got, "runs": sum(1 for r in rows if r["scope"] == "model"),
            "compile_ratio": got["model_compile_s"] / got["blocks_compile_s"],
            "step_ratio": got["blocks_step_s"] / got["model_step_s"]}


def _num(value: float | int | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=HERE).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", required=True, help="short machine name for the file "
                        "names (epyc, xeon, h100, h200)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--workloads", default=None,
                        help="comma-separated subset of the device's workloads")
    parser.add_argument("--repeats", type=int, default=1,
                        help="cold runs of each scope per workload (default 1)")
    parser.add_argument("--timed-steps", type=int, default=5)
    args = parser.parse_args()
    known = SCOPE_WORKLOADS[args.device]
    chosen = args.workloads.split(",") if args.workloads else list(known)
    unknown = [w for w in chosen if w not in known]
    if unknown:
        parser.error(f"--workloads {','.join(unknown)}: not a workload of --device "
                     f"{args.device}; choose from {','.join(known)}")
    if not 1 <= args.repeats <= 10:
        parser.error(f"--repeats {args.repeats}: from 1 to 10")
    command = "python benchmarks/compile_cost.py " + " ".join(sys.argv[1:])
    day = time.strftime("%Y-%m-%d", time.gmtime())
    for name in chosen:
        rows = scope_rows(args.device, name, known[name], args.repeats, args.timed_steps)
        m = machine()
        commit = _commit()
        lines = [f"# Compile cost of {name}: regional compilation (compile_scope)", "",
                 f"{m['date']}; {m.get('cpu_model') or m['processor']}, {m['cpus']} CPUs; "
                 f"torch {m['torch']}; commit {commit}. `{command}`: fp32, compile mode "
                 f"default, micro-batch {SCOPE_BATCH[args.device]} x 1, {args.timed_steps} "
                 "timed steps; each run a fresh child with an empty inductor cache of its own "
                 "(cold compile). Cold compile: the first steps' time beyond their steps. "
                 "The machine is shared (its 1-minute load is in each row): read the step "
                 "spread as the noise.", "", *scope_table(rows)]
        path = write_results(f"compile-cost_{name}-{args.machine}-{day}",
                             {"machine": m, "command": command, "commit": commit,
                              "scope": {"rows": rows, "summary": scope_summary(rows)}},
                             "\n".join(lines) + "\n")
        print(path.read_text())


if __name__ == "__main__":
    main()
