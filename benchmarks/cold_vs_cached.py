"""Does a compiled config run as fast after compiling its graphs afresh (a user's first launch)
as after loading them from inductor's cache (most of the search's runs)?

The search times most compiled candidates with graphs another run compiled (they load from the
shared cache) and re-runs a compiled winner once with an empty cache of its own (its first-launch
check; each candidate keeps its better run). Two README-command searches on 2026-11-26 timed
that re-run at 95.5 and 95.9 samples/s against 138.0 and 150.2 in the winner's first run. This
runs the default workload's fp32/default 64x1 (CPU) in alternating pairs, each run in a fresh
child: one compiling afresh (``cold_compile``), one loading the cache the first pair filled, the
order swapped every other pair, so the machine's drift falls on both alike.

Run: ``python benchmarks/cold_vs_cached.py [--pairs N]`` -> ``results/cold_vs_cached.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import replace

from oracle import machine, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="alternating pairs (default 4)")
    args = parser.parse_args()
    if not 1 <= args.pairs <= 20:
        parser.error(f"--pairs {args.pairs}: from 1 to 20")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="cold-vs-cached-")
    from autotune.config import WorkloadSpec
    from autotune.knobs import Knobs
    from autotune.memory import probe_spec
    from autotune.runner import run_isolated

    spec = probe_spec(WorkloadSpec(), "cpu", Knobs.checked(compile_mode="default"), 64, None,
                      600, per_device_batch=64, num_timed_steps=10)
    run_isolated(spec)  # fills the shared cache: the cached runs load what this compiled
    rows = []
    for pair in range(args.pairs):
        for cold in ((True, False) if pair % 2 == 0 else (False, True)):
            r = run_isolated(replace(spec, cold_compile=cold))
            rows.append({"pair": pair + 1, "cold": cold, "status": r.status,
                         "samples_per_s": r.samples_per_s(), "compile_s": r.compile_s,
                         "cache_hits": r.compile_cache_hits,
                         "cache_misses": r.compile_cache_misses})
            print(f"pair {pair + 1} {'afresh' if cold else 'cached'}: {r.status} "
                  f"{r.samples_per_s() or 0:.1f} samples/s, compile {r.compile_s or 0:.1f} s, "
                  f"cache hits {r.compile_cache_hits}", flush=True)
    pairs = [(next(r for r in rows if r["pair"] == p and r["cold"]),
              next(r for r in rows if r["pair"] == p and not r["cold"]))
             for p in range(1, args.pairs + 1)]
    ratios = [a["samples_per_s"] / b["samples_per_s"] for a, b in pairs
              if a["samples_per_s"] and b["samples_per_s"]]
    m = machine()
    lines = ["# A compiled config after compiling afresh vs after loading inductor's cache", "",
             f"{m['date']}; {m.get('cpu_model') or m['processor']}, {m['cpus']} CPUs; torch "
             f"{m['torch']}. `python benchmarks/cold_vs_cached.py --pairs {args.pairs}`: the "
             "default workload, fp32/default 64x1, 10 timed steps, each run a fresh child.", "",
             "| pair | compiled afresh: samples/s | loaded from the cache: samples/s | "
             "afresh / cached |", "|---:|---:|---:|---:|"]
    for p, (a, b) in enumerate(pairs, start=1):
        ratio = (a["samples_per_s"] / b["samples_per_s"]
                 if a["samples_per_s"] and b["samples_per_s"] else None)
        lines.append(f"| {p} | {a['samples_per_s'] or 0:.1f} | {b['samples_per_s'] or 0:.1f} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} |")
    if ratios:
        afresh = [a["samples_per_s"] for a, _ in pairs if a["samples_per_s"]]
        cached = [b["samples_per_s"] for _, b in pairs if b["samples_per_s"]]
        lines += ["", f"Median afresh / cached within a pair: {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}); medians "
                  f"{statistics.median(afresh):.1f} afresh and "
                  f"{statistics.median(cached):.1f} cached, samples/s."]
    path = write_results("cold_vs_cached", {"machine": m, "rows": rows, "ratios": ratios},
                         "\n".join(lines) + "\n")
    print(path.read_text())


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # results are written only at the end: nothing half-written
        print("interrupted: no results written", file=sys.stderr)
        sys.exit(130)
