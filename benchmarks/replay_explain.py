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
- ``overhead``: per recorded table, the median share of a timed run's wall seconds outside its
  timed steps (start-up, warm-up, compile: what runs of finalists could overlap).
- ``wall-split FILE N``: from a ``replay_parallel.py`` results file, per stage the wall with N
  workers (of it, one run alone) and its runs, the mean over the large spaces (200+
  candidates), shares of a serial pass.
- ``runs SET TABLE [FILTER]``: a table's candidates (that fit it) whose key holds
  ``FILTER``, best first: each one's truth as a share of the best, and its recorded runs
  (optimizer steps a second, the sitting's file).
- ``families BEFORE AFTER``: two ``replay.py --families`` results files of one set, per family
  the mean change over its tables of within 3%, pick quality p10 and cost.

Run: ``python benchmarks/replay_explain.py stages develop 3`` (and so on).
"""

from __future__ import annotations

import collections
import json
import math
import statistics
import sys
from pathlib import Path

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


def overhead_shares() -> dict[str, float]:
    """Per recorded table, the median share of a timed run's wall outside its timed steps."""
    out = {}
    for t in tables_of("recorded"):
        shares = [r.overhead_s() / r.wall_s for e in t.entries.values() for r in e.runs
                  if r.status == "ok" and r.median_s and r.wall_s and r.num_steps > 0]
        if shares:
            out[t.name] = statistics.median(shares)
    return out


def wall_split(results: dict, workers: int, large: int = 200) -> dict[str, dict[str, float]]:
    """Per stage, the mean over the large spaces of ``results`` (a ``replay_parallel.py``
    file) of its wall with ``workers``, the part one run held alone, and its runs (a table
    without the stage counts 0)."""
    rows = [t["by_workers"][str(workers)]["breakdown"]["stages"] for t in results["tables"]
            if t["candidates"] >= large]
    out: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(
        float))
    for stages in rows:
        for stage, x in stages.items():
            for k in ("wall", "alone", "runs"):
                out[stage][k] += x[k] / len(rows)
    return {stage: dict(v) for stage, v in out.items()}


def family_changes(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Per family (a table name up to its "="), the mean change over its tables from
    ``before`` to ``after`` (``replay.py --families`` results) of within 3%, p10 and cost."""
    old = {t["name"]: t for t in before["tables"]}
    per: dict[str, list[tuple[float, float, float]]] = collections.defaultdict(list)
    for t in after["tables"]:
        a = old.get(t["name"])
        if a is not None:
            per[t["name"].split("=")[0]].append((
                t["within_3pct"] - a["within_3pct"],
                t["pick_quality"]["p10"] - a["pick_quality"]["p10"],
                t["cost"]["median"] - a["cost"]["median"]))
    return {f: {k: statistics.fmean(v[i] for v in rows)
                for i, k in enumerate(("within_3pct", "p10", "cost"))} | {"tables": len(rows)}
            for f, rows in per.items()}


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
    elif what == "overhead":
        for name, share in overhead_shares().items():
            print(f"{name:22s} start-up share of a timed run {share:.2f}")
    elif what == "wall-split":
        split = wall_split(json.loads(Path(args[0]).read_text()), int(args[1]))
        print(f"N={args[1]}, mean over the large spaces: wall (one run alone), runs")
        for stage, x in split.items():
            print(f"  {stage:13s} {x['wall']:.4f} ({x['alone']:.4f}) {x['runs']:.1f}")
    elif what == "runs":
        t = _table(args[0], args[1])
        best = t.best()[1]
        for key in sorted((k for k in t.entries if t.fits(k) and (len(args) < 3 or args[2] in k)),
                          key=lambda k: -(t.truth(k) or 0.0)):
            runs = ", ".join(f"{1 / r.median_s:.3f}/s ({Path(r.source).name})" if r.median_s
                             else r.status for r in t.entries[key].runs)
            print(f"{key:50s} truth {(t.truth(key) or 0.0) / best:.3f}  runs: {runs}")
    elif what == "families":
        a, b = (json.loads(Path(p).read_text()) for p in args[:2])
        for fam, x in family_changes(a, b).items():
            print(f"  {fam:22s} {x['tables']:3.0f} tables: within 3% {x['within_3pct']:+.4f}"
                  f", p10 {x['p10']:+.4f}, cost {x['cost']:+.4f}")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
