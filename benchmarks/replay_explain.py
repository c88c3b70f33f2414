"""One replayed search taken apart, for the figures a note quotes about a table.

- ``stages SET SEEDS [FILTER]``: each stage's share of an exhaustive pass, memory probes and
  timed runs apart, averaged over the set's tables (``develop``, ``judge`` or ``recorded``)
  whose name holds ``FILTER``, seeds 0..SEEDS-1.
- ``trace SET TABLE SEED``: every run of that search in order (stage, kind, candidate,
  status, its share of a pass, steps and their stop, the samples/s it measured against the
  table's truth), then the pick.
- ``hits SET TABLE FIRST LAST``: over seeds FIRST..LAST-1, how many picks came within 3% of
  the best, and the median pick quality.
- ``sittings``: per recorded table of several sittings, how far a candidate's runs differ
  within one sitting and between sittings (sd of the log of the step time), and the sittings'
  mean offset.

Run: ``python benchmarks/replay_explain.py stages develop 3`` (and so on).
"""

from __future__ import annotations

import collections
import math
import statistics
import sys

import replay
from replay_device import ReplayDevice, plan_of
from replay_families import tables_of
from replay_tables import Table

import autotune.search.driver as driver
from autotune.search._records import Candidate


def traced(table: Table, seed: int, plan=None) -> tuple[replay.Seed, list[dict]]:
    """The search at ``seed`` and each of its runs, with the stage that asked for it."""
    runs: list[dict] = []
    executors: list = []
    stages, call = driver.stages, ReplayDevice.__call__

    def watched(ex) -> None:
        executors.append(ex)
        return stages(ex)

    def logged(device: ReplayDevice, spec):
        before = device.now_s
        result = call(device, spec)
        times = sorted(result.step_times_s or ())
        runs.append({"stage": executors[-1].stage if executors else "?",
                     "kind": "timed" if spec.num_timed_steps else "probe",
                     "key": Candidate.of(spec).key(), "status": result.status,
                     "cost": (device.now_s - before) / table.pass_s(), "steps": len(times),
                     "stop": result.timing_stop or "",
                     "sps": result.samples_per_step / times[len(times) // 2] if times else 0.0,
                     "truth": table.truth(Candidate.of(spec).key()) or 0.0})
        return result

    driver.stages, ReplayDevice.__call__ = watched, logged
    try:
        found = replay.replay_one(table, seed, plan)
    finally:
        driver.stages, ReplayDevice.__call__ = stages, call
    return found, runs


def stage_costs(tables: list[Table], seeds: int) -> dict[tuple[str, str], float]:
    """(stage, probe or timed) -> its share of a pass, the mean over tables and seeds."""
    total: collections.Counter = collections.Counter()
    for t in tables:
        plan = plan_of(t)
        for seed in range(seeds):
            for run in traced(t, seed, plan)[1]:
                total[(run["stage"], run["kind"])] += run["cost"] / seeds / len(tables)
    return dict(total)


def sitting_spread(table: Table) -> dict[str, float] | None:
    """Within one sitting, the sd of the log step time between a candidate's runs; between
    sittings, the sd and the mean of the difference of a candidate's mean log step time
    (each other sitting against the first). None: one sitting."""
    per: dict[str, dict[str, list[float]]] = collections.defaultdict(dict)
    for k, e in table.entries.items():
        for r in e.runs:
            if r.status == "ok" and r.median_s:
                per[r.source].setdefault(k, []).append(math.log(r.median_s))
    if len(per) < 2:
        return None
    first, *others = per.values()
    diffs = [statistics.fmean(got[k]) - statistics.fmean(first[k])
             for got in others for k in got if k in first]
    within = [statistics.pstdev(v) for got in per.values() for v in got.values() if len(v) > 1]
    return {"within": statistics.fmean(within) if within else float("nan"),
            "between": statistics.pstdev(diffs) if len(diffs) > 1 else float("nan"),
            "offset": statistics.fmean(diffs) if diffs else float("nan")}


def _table(which: str, name: str) -> Table:
    return next(t for t in tables_of(which) if t.name == name)


def main(argv: list[str]) -> int:
    what, *args = argv
    if what == "stages":
        tables = [t for t in tables_of(args[0]) if len(args) < 3 or args[2] in t.name]
        costs = stage_costs(tables, int(args[1]))
        print(f"{len(tables)} tables, {args[1]} seeds: mean share of an exhaustive pass")
        for (stage, kind), v in sorted(costs.items(), key=lambda kv: -kv[1]):
            print(f"  {stage:13s} {kind:6s} {v:.4f}")
        print(f"  total {sum(costs.values()):.4f}")
    elif what == "trace":
        t = _table(args[0], args[1])
        found, runs = traced(t, int(args[2]))
        for r in runs:
            print(f"{r['stage']:13s} {r['kind']:6s} {r['key']:45s} {r['status']:11s} "
                  f"cost {r['cost']:.3f} steps {r['steps']:2d} {r['stop']:9s} "
                  f"{r['sps']:8.1f}/s (truth {r['truth']:.1f})")
        print(f"best {t.best()[0]} {t.best()[1]:.1f}/s; pick {found.pick} quality "
              f"{found.quality:.3f}, cost {found.cost:.3f}, {found.runs} runs")
    elif what == "hits":
        t = _table(args[0], args[1])
        plan = plan_of(t)
        q = [replay.replay_one(t, s, plan).quality for s in range(int(args[2]), int(args[3]))]
        print(f"{len(q)} seeds: within 3% of the best {sum(x >= 0.97 for x in q)}, "
              f"median {statistics.median(q):.3f}")
    elif what == "sittings":
        for t in tables_of("recorded"):
            got = sitting_spread(t)
            if got:
                print(f"{t.name:22s} within a sitting {got['within']:.3f}, between "
                      f"{got['between']:.3f} (offset {got['offset']:+.3f})")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
