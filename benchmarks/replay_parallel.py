"""The replay with N simulated workers (``--parallel N``, issue 60): the real search, its
batches dispatched by the same code (``autotune.search.slots.dispatch``) to a pool of N
simulated slots on the replay's clock.

``SimSlots`` is the pool: a run submitted at simulated time t is answered by the table-backed
device at once (``ReplayDevice``) and ends at t + its wall; ``wait`` moves the clock to the
earliest end. A run made outside a batch (the stages' one-at-a-time decisions) advances the
clock by its wall, as in the serial replay. So the clock at the end is the search's wall time
with N devices, and the sum of the runs' walls its device-seconds.

For each table and seed, N = 1 (the serial search: ``--parallel 1`` never dispatches) and each
N asked: wall cost (simulated wall / the table's serial exhaustive pass), device cost (the
runs' walls / that pass), pick quality (the pick's truth / the best's), and whether the pick is
N = 1's.

The replay device draws each run's noise in the order runs are made, so a search of N
slots, whose runs come in another order, draws other noise for every later run: ``same``
then counts the noise's doing too. ``--noise keyed`` draws each run's noise by its
candidate instead (``KeyedDevice``), so that N = 1 and N = 8 differ by their decisions.

Run: ``python benchmarks/replay_parallel.py [--seeds 10] [--workers 1,2,4,8] [--only NAME]
[--noise drawn|keyed] [--families recorded|develop|judge|fresh] [--write NAME]``.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import io
import itertools
import json
import statistics
import sys
import time

from replay import _commit, _machine, quality_of, quantile, results_name, write_results
from replay_device import KeyedDevice, ReplayDevice, plan_of, settings_of
from replay_families import tables_of
from replay_tables import Table

from autotune.config import TrialResult, TrialSpec
from autotune.search import run_search
from autotune.search._records import Candidate
from autotune.search.pick import pick_winner
from autotune.search.slots import Done, Slot, Slots

LARGE = 200
"""Candidates of a large space (DESIGN.md section 9: its own cost target)."""


class SimSlots(Slots):
    """N slots on the replay device's simulated clock (module docstring)."""

    def __init__(self, device: ReplayDevice, width: int) -> None:
        self.device, self.width, self.alone = device, width, "sim 0"
        self._free = [Slot(i, f"sim {i}") for i in range(width)]
        self._ends: list[tuple[float, int, int, Slot, object]] = []
        self._seq = 0
        self.device_s = 0.0
        self.spans: list[tuple[float, float, int, bool]] = []
        """Each run made, in the order begun: its start, end, slot and whether alone."""

    def run_alone(self, spec: TrialSpec) -> TrialResult:
        start = self.device.now_s
        result = self.device(spec)  # nothing else runs: the clock moves by its wall
        self.spans.append((start, self.device.now_s, 0, True))
        return result

    def submit(self, ticket: int, spec: TrialSpec) -> Slot:
        slot = self._free.pop(0)
        start = self.device.now_s
        result = self.device(spec)  # answers now, and moves the clock by its wall: undone
        wall = self.device.now_s - start
        self.device.now_s = start
        self.spans.append((start, start + wall, slot.index, False))
        self._seq += 1
        heapq.heappush(self._ends, (start + wall, self._seq, ticket, slot, result))
        return slot

    def wait(self) -> Done:
        end, _, ticket, slot, result = heapq.heappop(self._ends)
        self.device.now_s = max(self.device.now_s, end)
        self._free.append(slot)
        self._free.sort(key=lambda s: s.index)
        return Done(ticket, slot, result)  # type: ignore[arg-type]


def replay_one(table: Table, seed: int, width: int, plan, keyed: bool = False) -> dict:
    """One search of ``table`` at ``seed`` on ``width`` simulated slots (``keyed``: its
    noise drawn per candidate, ``KeyedDevice``)."""
    plan_, classes, values = plan
    settings = settings_of(table)
    device = (KeyedDevice if keyed else ReplayDevice)(table, seed)
    slots = SimSlots(device, width) if width > 1 else None
    stages: list[str] = []  # each run's stage, in the order begun (its progress line)

    def on_trial(count, label, candidate, rec) -> None:
        if rec is None:
            stages.append(label.split(" [")[0])

    with contextlib.redirect_stderr(io.StringIO()):
        outcome = run_search(plan_, classes, settings, values=values, run=device,
                             clock=device.clock, slots=slots, on_trial=on_trial)
    winner = pick_winner(outcome.records, settings)
    pick = Candidate(knobs=winner.knobs, micro_batch=winner.micro_batch).key() if winner \
        else None
    quality = quality_of(table, pick)[0] if pick else 0.0
    device_s = sum(r.wall_s or 0.0 for r in outcome.runs if r.stored_at is None)
    return {"pick": pick, "quality": quality, "wall": device.now_s / table.pass_s(),
            "device": device_s / table.pass_s(), "runs": device.calls,
            "on_slots": sum(1 for r in outcome.runs if r.slot not in ("", "sim 0")),
            "breakdown": breakdown(slots, stages, table.pass_s()) if slots else None}


def breakdown(slots: SimSlots, stages: list[str], pass_s: float) -> dict:
    """Where a search's wall went on ``slots`` (``--breakdown``): per stage, the wall while
    its runs ran (shares of the serial pass), how much of it one run alone held (a run
    made outside a batch, or the only one running), its device-seconds and runs; per
    slot, its busy share of the wall. Each run's stage is its progress line's."""
    assert len(stages) == len(slots.spans), (len(stages), len(slots.spans))
    cuts = sorted({t for start, end, _, _ in slots.spans for t in (start, end)})
    out: dict[str, dict] = {}
    for stage, (start, end, _, alone) in zip(stages, slots.spans, strict=True):
        row = out.setdefault(stage, {"wall": 0.0, "alone": 0.0, "device": 0.0, "runs": 0,
                                     "runs_alone": 0})
        row["device"] += (end - start) / pass_s
        row["runs"] += 1
        row["runs_alone"] += alone
    for a, b in itertools.pairwise(cuts):
        on = [i for i, (start, end, _, _) in enumerate(slots.spans) if start < b and end > a]
        if not on:
            continue
        for stage in {stages[i] for i in on}:  # (chains of two stages at once: both)
            out[stage]["wall"] += (b - a) / pass_s
            out[stage]["alone"] += (b - a) / pass_s if len(on) == 1 else 0.0
    wall = slots.device.now_s or 1.0
    busy = [sum(end - start for start, end, i, _ in slots.spans if i == n) / wall
            for n in range(slots.width)]
    return {"stages": out, "slot_busy": busy}


def score(table: Table, seeds: int, workers: list[int], keyed: bool = False) -> dict:
    """Per N: the medians over seeds, and the share of seeds picking N = 1's pick."""
    plan = plan_of(table)
    by_n = {n: [replay_one(table, s, n, plan, keyed) for s in range(seeds)] for n in workers}
    serial = by_n[1]
    # The pick's own noise: N = 1 under the other noise (drawn <-> keyed), the same decisions.
    other = [replay_one(table, s, 1, plan, not keyed) for s in range(seeds)]
    out = {"name": table.name, "candidates": len(table.entries), "pass_s": table.pass_s(),
           "same_pick_1_other_noise": sum(f["pick"] == s["pick"] for f, s in zip(
               other, serial, strict=True)) / seeds,
           "by_workers": {}}
    for n, found in by_n.items():
        q = [f["quality"] for f in found]
        out["by_workers"][str(n)] = {
            "wall_cost": {"median": statistics.median(f["wall"] for f in found),
                          "p90": quantile([f["wall"] for f in found], 0.9)},
            "device_cost": {"median": statistics.median(f["device"] for f in found)},
            "pick_quality": {"median": statistics.median(q), "p10": quantile(q, 0.1),
                             "min": min(q)},
            "within_3pct": sum(x >= 0.97 for x in q) / len(q),
            "same_pick_as_1": sum(f["pick"] == s["pick"] for f, s in zip(
                found, serial, strict=True)) / len(found),
            "runs_on_slots": {"median": statistics.median(f["on_slots"] for f in found)},
            "breakdown": merged([f["breakdown"] for f in found]) if n > 1 else None,
            "speedup": {"median": statistics.median(
                s["wall"] / f["wall"] for f, s in zip(found, serial, strict=True)
                if f["wall"])},
        }
    return out


STAGE_ORDER = ("probe", "knobs", "refine", "joint", "confirm", "first launch")


def merged(found: list[dict]) -> dict:
    """Per stage and figure, and per slot's busy share, the median over seeds (a stage a
    seed never entered: 0)."""
    names = sorted({s for f in found for s in f["stages"]}, key=lambda s: (
        STAGE_ORDER.index(s) if s in STAGE_ORDER else len(STAGE_ORDER), s))
    return {"stages": {s: {k: statistics.median(f["stages"].get(s, {}).get(k, 0.0)
                                                 for f in found)
                           for k in ("wall", "alone", "device", "runs", "runs_alone")}
                       for s in names},
            "slot_busy": [statistics.median(f["slot_busy"][i] for f in found)
                          for i in range(len(found[0]["slot_busy"]))]}


def render_breakdown(results: list[dict], n: int) -> str:
    """Per table with ``n`` workers (medians over seeds): each stage's wall as a share of
    the serial pass, of it held by one run alone in brackets, and its runs (alone); the
    slots' mean busy share."""
    lines = [f"{'table':<26} {'wall':>6}  busy  " + "  ".join(
        f"{s + ': wall(alone) runs(alone)':<34}" for s in STAGE_ORDER)]
    for r in results:
        b = r["by_workers"][str(n)]
        rows = b["breakdown"]["stages"]
        cells = []
        for s in STAGE_ORDER:
            x = rows.get(s)
            cells.append(f"{x['wall']:.3f}({x['alone']:.3f}) {x['runs']:.0f}({x['runs_alone']:.0f})"
                         if x else "-")
        busy = statistics.mean(b["breakdown"]["slot_busy"])
        lines.append(f"{r['name']:<26} {b['wall_cost']['median']:.3f}  {busy:.2f}  " + "  ".join(
            f"{c:<34}" for c in cells))
    return "\n".join(lines)


def render(results: list[dict], workers: list[int]) -> str:
    """A table per N: wall cost, device cost, pick quality, same pick as N = 1; then
    ``noise``: the share of seeds where N = 1 under the other noise picks the same."""
    lines = [f"{'table':<26} {'cands':>5}  " + "  ".join(
        f"N={n}: wall  dev  q.med  q.p10 same" for n in workers) + "  noise"]
    for r in results:
        cells = []
        for n in workers:
            b = r["by_workers"][str(n)]
            cells.append(f"     {b['wall_cost']['median']:.3f} {b['device_cost']['median']:.3f}"
                         f"  {b['pick_quality']['median']:.3f}  {b['pick_quality']['p10']:.3f}"
                         f" {b['same_pick_as_1']:.2f}")
        lines.append(f"{r['name']:<26} {r['candidates']:>5}  " + "  ".join(cells)
                     + f"   {r['same_pick_1_other_noise']:.2f}")
    return "\n".join(lines)


def summary(results: list[dict], workers: list[int]) -> dict:
    """Per N, over tables: the median and worst wall cost (all; the large spaces' median and
    best), the speedup over N = 1 (median, best, tables over 1.01x), the worst pick quality
    median and the same-pick share (and N = 1's under the other noise: the pick's own
    noise, the same for every N)."""
    out = {}
    for n in workers:
        rows = [r["by_workers"][str(n)] for r in results]
        large = [r["by_workers"][str(n)] for r in results if r["candidates"] >= LARGE]
        out[str(n)] = {
            "wall_cost_median": statistics.median(b["wall_cost"]["median"] for b in rows),
            "wall_cost_worst": max(b["wall_cost"]["median"] for b in rows),
            "wall_cost_large_median": statistics.median(
                b["wall_cost"]["median"] for b in large) if large else None,
            "device_cost_median": statistics.median(b["device_cost"]["median"] for b in rows),
            "wall_cost_large_best": min(
                b["wall_cost"]["median"] for b in large) if large else None,
            "speedup_median": statistics.median(b["speedup"]["median"] for b in rows),
            "speedup_best": max(b["speedup"]["median"] for b in rows),
            "tables_faster_by_1pct": sum(b["speedup"]["median"] > 1.01 for b in rows),
            "quality_median_worst": min(b["pick_quality"]["median"] for b in rows),
            "same_pick_as_1_median": statistics.median(b["same_pick_as_1"] for b in rows),
            "same_pick_as_1_worst": min(b["same_pick_as_1"] for b in rows),
            "same_pick_1_other_noise_median": statistics.median(
                r["same_pick_1_other_noise"] for r in results),
            "same_pick_1_other_noise_worst": min(
                r["same_pick_1_other_noise"] for r in results),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--only", default="")
    parser.add_argument("--families", choices=("recorded", "develop", "judge", "fresh"),
                        default="recorded",
                        help="the tables: the recorded ones, or a generated set's "
                             "(replay_families.tables_of)")
    parser.add_argument("--write", metavar="NAME", default=None, type=results_name)
    parser.add_argument("--noise", choices=("drawn", "keyed"), default="drawn",
                        help="drawn: the replay device's draws in the order of the runs; "
                             "keyed: per candidate (KeyedDevice)")
    args = parser.parse_args(argv)
    workers = sorted({1, *(int(n) for n in args.workers.split(","))})
    started, commit = time.perf_counter(), _commit()
    tables = [t for t in tables_of(args.families)
              if not args.only or t.name in args.only.split(",")]
    results = [score(t, args.seeds, workers, args.noise == "keyed") for t in tables]
    summ = summary(results, workers)
    text = render(results, workers)
    if workers[-1] > 1:
        text += (f"\n\nWhere the wall went with N={workers[-1]} (medians over seeds; shares "
                 "of the serial pass):\n\n" + render_breakdown(results, workers[-1]))
    print(text)
    print(json.dumps(summ, indent=1))
    if args.write:
        head = {"commit": commit, "machine": _machine(),
                "command": "python benchmarks/replay_parallel.py " + " ".join(
                    argv if argv is not None else sys.argv[1:]),
                "replay_s": time.perf_counter() - started}
        body = {**head, "seeds": args.seeds, "workers": workers, "summary": summ,
                "tables": results}
        md = (f"# Replay with N simulated workers at {commit} ({head['machine']['date']})\n\n"
              f"`{head['command']}` in {head['replay_s']:.0f} s. How: the docstring of "
              "`benchmarks/replay_parallel.py`. Costs are shares of one serial exhaustive "
              "pass; wall: the simulated clock with N slots; dev: device-seconds; q: pick "
              "quality; same: share of seeds picking N=1's pick; noise: share of seeds "
              "where N=1 under the other noise (drawn/keyed) picks the same.\n\n```\n"
              + text + "\n```\n\n"
              "Summary over tables:\n\n```\n" + json.dumps(summ, indent=1) + "\n```\n")
        write_results(args.write, body, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
