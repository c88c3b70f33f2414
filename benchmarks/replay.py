"""Replay benchmark: today's search judged against every recorded exhaustive pass, over seeds.

Each table (``replay_tables``: one per workload and machine, from the committed oracles) stands
in for the device: ``ReplayDevice`` is a runner (``TrialSpec -> TrialResult``) that answers a
spec from the candidate's recorded runs, and ``run_search`` reads its simulated clock
(``clock=``), so a search of hours replays in a fraction of a second, once per seed.

- **A run**: the candidate (``Candidate.of(spec).key()``: every knob and the micro-batch) is
  looked up. Recorded: one of its runs is drawn (seeded); with one ok run recorded, its median
  is scaled by exp(N(0, sigma)), sigma the table's noise model (``replay_tables``); with two
  or more the drawn run is their spread. Its steps scatter about that median as its recorded
  spread (p90 - p10 over the median) says, and the run times steps until
  ``autotune.timing.stop_reason`` stops it, as the child does. A status other than ok is
  answered as recorded; a peak over the spec's cap answers ``oom`` (a table's peaks were
  recorded under its own cap, which the search is given). A compiled candidate the table
  says fits only when its graphs load from inductor's cache (``fits_first_launch`` false: no
  first-launch peak is recorded, only the verdict) answers a run that compiles afresh
  (``cold_compile``) with a peak just over the usable budget. A run past the spec's timeout
  (the time budget's end) is killed there (``timeout``), as the runner kills a child. Wall
  seconds: the drawn run's own
  less its timed steps, plus the replayed steps.
- **Not recorded**: a run of a micro-batch the table lacks at or above one its setting ran out
  of memory at answers ``oom`` (memory grows with the micro-batch: the oracle did not run
  it); a memory probe (no timed steps) the table lacks, where its setting has recorded peaks,
  answers the line through the nearest two (``oom`` over the cap); both are counted as
  ``interpolated``. Any other run the table lacks
  answers status ``unsupported``, message ``not recorded`` (the search skips the setting, as
  it skips a knob value the workload cannot take, and goes on; counted as ``missing``, costing
  the median wall of the table's runs). A pick the table lacks scores 0: never a win. A pick
  the table holds but says does not fit (a run over the usable budget, or a compiled one over
  it at its first launch) is scored by its truth, as ``search_quality.py`` scores a live
  search, and counted (``over_budget_picks``).
- **Scores** per table over the seeds: pick quality (the table's truth of the pick, the mean of
  its runs' samples/s, over the best fitting candidate's), median, 10th percentile and
  minimum; the share of seeds within 3% of the best; cost (simulated search seconds over one
  exhaustive pass: each candidate's first recorded run's wall seconds), median and 90th
  percentile, and over a set of tables pooled (their median searches' seconds over one pass
  of them all: what a user tuning every one would pay); the runs; the search's own overhead
  (measured, apart); and, per rule that skipped a setting (the search's skip note with its
  numbers taken out), how often the table says that setting could have won (a candidate of
  it at a micro-batch the note skipped, not timed, within 3% of the best).
- **The space**: the search is given the knob values its table's exhaustive pass recorded (as a
  user restricts them, ``--optimizers`` and the like), so the two walk one space and the cost
  is a share of that pass's (before 2026-11-28 the default values were offered and the tiny
  tables' missing knob runs were charged: cost 0.20 there, now 0.14).
- **Tuning and held-out tables** (``HELD_OUT``): the AMD EPYC tables and the GPU capped
  table are held out (a machine and a memory regime the search's rules were not all drawn
  from: most rules came from Xeon oracles and the uncapped GPU); the Xeon tables and the GPU
  uncapped one are the tuning set. Nothing in the search may be tuned on the held-out set.

Run: ``python benchmarks/replay.py [--seeds 30] [--only NAME,...] [--json]``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import math
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from replay_tables import Entry, Table, all_tables

from autotune.config import ProbeReport, TrialResult, TrialSpec
from autotune.errors import AutotuneError
from autotune.knobs import BASELINE
from autotune.search import SearchSettings, run_search
from autotune.search._records import Candidate
from autotune.search.pick import pick_winner
from autotune.space import knob_values, memory_classes, timed_precisions
from autotune.timing import stop_reason

HELD_OUT_MACHINES = ("epyc",)
HELD_OUT = ("gpt2-h200-capped",)
"""Held out beside every EPYC table (``is_held_out``)."""
WITHIN = 0.03
P10_SD = 2.5631  # a normal's p90 - p10 in standard deviations


def is_held_out(table: Table) -> bool:
    return table.name in HELD_OUT or table.machine.startswith(HELD_OUT_MACHINES)


@dataclass
class ReplayDevice:
    """A runner answering each spec from a table (module docstring), on a simulated clock."""

    table: Table
    seed: int
    now_s: float = 0.0
    missing: collections.Counter = field(default_factory=collections.Counter)
    interpolated: collections.Counter = field(default_factory=collections.Counter)
    timed: set = field(default_factory=set)
    calls: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        walls = [r.wall_s for e in self.table.entries.values() for r in e.runs if r.wall_s]
        self.missing_wall_s = statistics.median(walls) if walls else 0.0

    def clock(self) -> float:
        return self.now_s

    def __call__(self, spec: TrialSpec) -> TrialResult:
        """The spec's answer; one that runs past its timeout is killed there, as the runner
        kills a child (``timeout``, its wall the timeout)."""
        self.calls += 1
        result = self._answer(spec)
        wall = result.wall_s or 0.0
        if wall > spec.timeout_s:
            wall = spec.timeout_s
            result = TrialResult(status="timeout", message="timed out (replayed)",
                                 wall_s=wall, samples_per_step=result.samples_per_step,
                                 workload_name=self.table.name,
                                 workload_fingerprint="replay")
        self.now_s += wall
        return result

    def _answer(self, spec: TrialSpec) -> TrialResult:
        key = Candidate.of(spec).key()
        entry = self.table.entries.get(key)
        info = {"samples_per_step": spec.micro_batch * spec.accumulate_steps,
                "workload_name": self.table.name, "workload_fingerprint": "replay"}
        if entry is None or not entry.runs:
            peak = self._line_peak(spec)
            if peak is not None and peak >= 0 and spec.num_timed_steps:
                peak = None  # a timed run's step times are not to be made up
            if peak is None:
                self.missing[key] += 1
                return TrialResult(status="unsupported", message="not recorded",
                                   wall_s=self.missing_wall_s, **info)
            self.interpolated[key] += 1
            wall = self.missing_wall_s
            return self._result(spec, "ok", peak, (), wall, None, info) if peak >= 0 else \
                TrialResult(status="oom", message="out of memory (replayed)", wall_s=wall,
                            **info)
        run = self.rng.choice(entry.runs)
        wall = run.overhead_s()
        if run.status != "ok" or (spec.memory_budget_bytes and run.peak_bytes
                                  and run.peak_bytes > spec.memory_budget_bytes):
            status = "oom" if run.status == "ok" else run.status
            return TrialResult(status=status, message=f"{status} (replayed)",
                               peak_bytes=run.peak_bytes, wall_s=run.wall_s or wall, **info)
        median = run.median_s * spec.accumulate_steps / entry.accumulate_steps
        if len(entry.ok_medians()) == 1:
            median *= math.exp(self.rng.gauss(0.0, self.table.sigma))
        if self.table.stall:  # a generated table's stalls: a share of runs, only slower
            share, least, most = self.table.stall
            if self.rng.random() < share:
                median *= self.rng.uniform(least, most)
        median *= 1 + self.table.drift_per_hour * self.now_s / 3600
        sd = (run.spread or 0.0) / P10_SD
        times: list[float] = []
        why = None
        while spec.num_timed_steps and why is None:  # the child's own rule (trial._train)
            times.append(median * math.exp(self.rng.gauss(0.0, sd)))
            why = stop_reason(times, max_steps=spec.num_timed_steps, elapsed_s=sum(times),
                              min_elapsed_s=spec.min_timed_s, max_elapsed_s=spec.max_timed_s,
                              precision=spec.timing_precision,
                              stop_above_s=spec.stop_above_step_s)
        peak = run.peak_bytes
        if spec.cold_compile and not entry.fits_first_launch and peak is not None:
            peak = max(peak, self.table.usable_bytes() + 1)  # the table's verdict, no peak
        if times:
            self.timed.add(key)
        wall += sum(times)
        return self._result(spec, why or "", peak, tuple(times), wall,
                            entry, info)

    def _result(self, spec: TrialSpec, why: str, peak: int | None, times: tuple,
                wall: float, entry: Entry | None, info: dict) -> TrialResult:
        compiled = spec.compile_mode != "off"
        return TrialResult(
            status="ok", peak_bytes=peak, step_times_s=times, timing_stop=why if times else "",
            first_loss=2.0, reference_loss=2.0, num_optimizer_steps=2 + len(times),
            num_graphs=1 if compiled else None, num_graph_breaks=0 if compiled else None,
            compile_s=entry.compile_s if entry and compiled else None, wall_s=wall,
            traits=self.table.traits(), **info)

    def _line_peak(self, spec: TrialSpec) -> int | None:
        """A peak from its setting's recorded ones (-1: at or above a micro-batch recorded
        out of memory, or the line over the cap), None where fewer than two micro-batches of
        it were recorded ok."""
        label, m = spec.knobs.label(), spec.micro_batch
        ok: dict[int, int] = {}
        oom = []
        for key, e in self.table.entries.items():
            c = Candidate.from_key(key)
            if c.knobs.label() != label:
                continue
            for r in e.runs:
                if r.status == "ok" and r.peak_bytes:
                    ok[c.micro_batch] = max(ok.get(c.micro_batch, 0), r.peak_bytes)
                elif r.status == "oom":
                    oom.append(c.micro_batch)
        if oom and m >= min(oom):
            return -1
        if len(ok) < 2:
            return None
        near = sorted(ok, key=lambda x: (abs(x - m), x))[:2]
        a, b = sorted(near)
        peak = ok[a] + (ok[b] - ok[a]) / (b - a) * (m - a)
        if spec.memory_budget_bytes and peak > spec.memory_budget_bytes:
            return -1
        return max(int(peak), 1)


def plan_of(table: Table):
    """The report, classes and knob values api.search gives ``run_search`` (as
    ``TuneRequest.validate`` makes them, without its check of this machine's ranks: a GPU
    table replays on a CPU)."""
    precisions, _ = timed_precisions(table.device, table.search.get("precisions"))
    values, base, _ = knob_values(table.device, {"strategy": ["none"]})
    # The table's own space: the knob values its exhaustive pass recorded (as a user would
    # restrict them, e.g. --optimizers), so the search and the pass it is judged by walk one
    # space, and its cost is a share of that pass's.
    recorded = [Candidate.from_key(k).knobs for k in table.entries]
    values = {name: tuple(v for v in vs if any(getattr(k, name) == v for k in recorded))
              for name, vs in values.items()}
    classes, _ = memory_classes(table.device, precisions, table.search.get("compile_modes"),
                                base=base)
    if BASELINE not in classes:
        classes = (BASELINE, *classes)
    plan = ProbeReport(workload=table.spec, device=table.device, target_batch=table.target,
                       world_size=1, headroom=table.headroom, budget_bytes=table.budget_bytes,
                       probes=())
    return plan, classes, values


def settings_of(table: Table) -> SearchSettings:
    fields = {k: v for k, v in table.search.items() if k in SearchSettings.__dataclass_fields__}
    return SearchSettings(cache=False, **fields)


@dataclass
class Seed:
    pick: str | None
    quality: float
    cost: float
    runs: int
    missing: int
    interpolated: int
    overhead_s: float
    why: str = ""
    missing_keys: tuple = ()
    ruled_out: dict = field(default_factory=dict)
    """Per rule id (``autotune.search.rules.RULES``): whether a setting it skipped could have
    won by the table."""


def rule_of(note: str) -> tuple[str, str, Callable[[int], bool]] | None:
    """(the setting a skip note names, the note with its numbers and labels taken out, which
    of the setting's micro-batches it skipped: those it names, above or at and below one it
    names, else all). The rule itself is the skip's id (``Skip.rule``)."""
    m = re.match(r"([a-z0-9]+/[a-z-]+(?:\+[a-z_=-]+)*)[: ]", note)
    if not m:
        return None
    text = note[len(m.group(1)):]
    skipped: Callable[[int], bool] = lambda mb: True  # noqa: E731
    if above := re.match(r": micro-batches above (\d+)", text):
        skipped = lambda mb, n=int(above.group(1)): mb > n  # noqa: E731
    elif named := re.match(r": micro-batch(?:es)? ((?:\d+, )*\d+)( and below)? not", text):
        sizes = [int(x) for x in named.group(1).split(", ")]
        skipped = (lambda mb, n=max(sizes): mb <= n) if named.group(2) else \
            (lambda mb, these=frozenset(sizes): mb in these)
    text = re.sub(r"[a-z0-9]+/[a-z-]+(?:\+[a-z_=.-]+)*(?:/\d+)?", "X", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return m.group(1), text.strip(" :")[:70], skipped


def quality_of(table: Table, pick: str) -> tuple[float, str]:
    """The pick's truth over the best fitting candidate's, and what was wrong with the pick:
    0 for a pick the table lacks (never a win), its truth for one over the table's budget."""
    truth = table.truth(pick)
    if truth is None:
        return 0.0, "not recorded"
    return truth / table.best()[1], "" if table.fits(pick) else "over the table's budget"


def replay_one(table: Table, seed: int, plan=None) -> Seed:
    plan, classes, values = plan or plan_of(table)
    settings = settings_of(table)
    device = ReplayDevice(table, seed)
    started = time.perf_counter()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            outcome = run_search(plan, classes, settings, values=values, run=device,
                                 clock=device.clock)
        winner = pick_winner(outcome.records, settings)
    except AutotuneError as exc:
        outcome, winner, why = None, None, f"{type(exc).__name__}: {exc}"[:200]
    else:
        why = "" if winner else "no winner"
    overhead = time.perf_counter() - started
    pick = Candidate(knobs=winner.knobs, micro_batch=winner.micro_batch).key() if winner \
        else None
    best = table.best()[1]
    quality, why = quality_of(table, pick) if pick else (0.0, why)
    ruled: dict[str, bool] = {}
    for note in (outcome.skips if outcome else ()):
        found = rule_of(note.text)
        if not found:
            continue
        label, _, skipped = found
        rule = note.rule  # its stable id (autotune.search.rules.RULES)
        could = any(c.knobs.label() == label and skipped(c.micro_batch)
                    and k not in device.timed and table.fits(k)
                    and (table.truth(k) or 0) >= (1 - WITHIN) * best
                    for k in table.entries if (c := Candidate.from_key(k)))
        ruled[rule] = ruled.get(rule, False) or could
    return Seed(pick=pick, quality=quality, cost=device.now_s / table.pass_s(),
                runs=device.calls, why=why,
                missing=sum(device.missing.values()),
                interpolated=sum(device.interpolated.values()), overhead_s=overhead,
                missing_keys=tuple(device.missing),
                ruled_out=ruled)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def score(table: Table, seeds: int) -> dict:
    plan = plan_of(table)
    found = [replay_one(table, s, plan) for s in range(seeds)]
    q = [s.quality for s in found]
    cost = [s.cost for s in found]
    rules: dict[str, list[int]] = {}
    for s in found:
        for rule, could in s.ruled_out.items():
            fired, won = rules.setdefault(rule, [0, 0])
            rules[rule] = [fired + 1, won + could]
    best_key, best = table.best()
    picks = collections.Counter(s.pick or f"none ({s.why})" for s in found)
    return {
        "name": table.name, "machine": table.machine, "workload": table.workload,
        "set": "held-out" if is_held_out(table) else "tuning",
        "target_batch": table.target, "budget_bytes": table.budget_bytes,
        "candidates": len(table.entries),
        "candidates_run": sum(1 for e in table.entries.values() if e.runs),
        "recorded_runs": table.num_runs(), "sources": table.sources,
        "pass_s": table.pass_s(), "best": best_key, "best_samples_per_s": best,
        "noise": {"sigma": table.sigma, "fitted": table.sigma_note},
        "seeds": seeds,
        "pick_quality": {"median": statistics.median(q), "p10": quantile(q, 0.1),
                         "min": min(q)},
        "within_3pct": sum(x >= 1 - WITHIN for x in q) / seeds,
        "cost": {"median": statistics.median(cost), "p90": quantile(cost, 0.9)},
        "runs": {"median": statistics.median(s.runs for s in found)},
        "not_recorded": {"median": statistics.median(s.missing for s in found),
                         "seeds_with_any": sum(s.missing > 0 for s in found),
                         "candidates": dict(collections.Counter(
                             k for s in found for k in s.missing_keys).most_common())},
        "interpolated_probes": {"median": statistics.median(s.interpolated for s in found)},
        "over_budget_picks": sum(s.why == "over the table's budget" for s in found),
        "failed_searches": sum(s.pick is None for s in found),
        "picks": dict(picks.most_common()),
        "overhead_s": {"median": statistics.median(s.overhead_s for s in found)},
        "rules": {rule: {"fired": f, "could_have_won": w} for rule, (f, w) in
                  sorted(rules.items(), key=lambda kv: -kv[1][0])},
    }


def summary(results: list[dict]) -> dict:
    out = {}
    for name in ("tuning", "held-out"):
        part = [r for r in results if r["set"] == name]
        if part:
            out[name] = {
                "tables": len(part),
                "pick_quality_median": statistics.median(r["pick_quality"]["median"]
                                                         for r in part),
                "worst_p10": min(r["pick_quality"]["p10"] for r in part),
                "within_3pct": statistics.fmean(r["within_3pct"] for r in part),
                "cost_median": statistics.median(r["cost"]["median"] for r in part),
                # seconds the searches spent over seconds one exhaustive pass of every table
                # takes (each table's median search): what a user tuning them all would pay
                "cost_pooled": sum(r["cost"]["median"] * r["pass_s"] for r in part)
                / sum(r["pass_s"] for r in part)}
    return out


NOISE_NOTE = (
    "Noise model: a candidate with one ok run recorded answers its median x exp(N(0, sigma)); "
    "one with more answers one of its runs, drawn. sigma: 1.4826 x the median absolute "
    "log(run median / its candidate's geometric mean), each scaled by sqrt(k / (k - 1)), over "
    "the table's candidates with 2+ ok runs of 5+ timed steps (runs from different sittings: "
    "drift between hours); under 5 such candidates, its machine's pool. Steps scatter about "
    "the median as the drawn run's spread says; its wall seconds less its timed steps are "
    "the run's overhead.")
HOLD_OUT_NOTE = (
    "Held out (nothing in the search may be tuned on them): the AMD EPYC tables and the GPU "
    "capped one, a machine and a memory regime most of the search's rules were not drawn from "
    "(they came from Xeon oracles and the uncapped GPU); the tuning set is the rest.")

NOTES = {"noise": NOISE_NOTE, "held_out": HOLD_OUT_NOTE}


def render(results: list[dict], summ: dict) -> str:
    lines = [NOISE_NOTE, HOLD_OUT_NOTE, ""]
    for r in results:
        q, c = r["pick_quality"], r["cost"]
        lines += [
            f"== {r['name']} ({r['set']}): {r['workload']} on {r['machine']}, target "
            f"{r['target_batch']}, cap {r['budget_bytes'] / 2**20:.0f} MiB",
            f"   table: {r['candidates']} candidates ({r['candidates_run']} ran), "
            f"{r['recorded_runs']} runs, one pass {r['pass_s']:.0f} s, best {r['best']} "
            f"({r['best_samples_per_s']:.1f}/s); noise sigma {r['noise']['sigma']:.3f} "
            f"({r['noise']['fitted']})",
            f"   {r['seeds']} seeds: pick quality median {q['median']:.3f}, p10 {q['p10']:.3f}, "
            f"min {q['min']:.3f}; within 3% {r['within_3pct']:.0%}; cost median "
            f"{c['median']:.3f} (p90 {c['p90']:.3f}); runs {r['runs']['median']:g}; not "
            f"recorded {r['not_recorded']['median']:g} a seed (in "
            f"{r['not_recorded']['seeds_with_any']} seeds), interpolated probes "
            f"{r['interpolated_probes']['median']:g}; picks over the table's budget "
            f"{r['over_budget_picks']}; search overhead "
            f"{r['overhead_s']['median']:.2f} s",
            *(["   not recorded (seeds asking): " + ", ".join(
                f"{k} x{n}" for k, n in list(r["not_recorded"]["candidates"].items())[:5])]
              if r["not_recorded"]["candidates"] else []),
            "   picks: " + ", ".join(f"{k} x{n}" for k, n in list(r["picks"].items())[:4])]
        lines += [f"   rule '{rule}': fired in {v['fired']} seeds, a skipped setting could "
                  f"have won in {v['could_have_won']}" for rule, v in r["rules"].items()
                  if v["could_have_won"]]
    lines.append("summary: " + "; ".join(
        f"{name} ({s['tables']} tables): pick quality median {s['pick_quality_median']:.3f}, "
        f"worst p10 {s['worst_p10']:.3f}, within 3% {s['within_3pct']:.0%}, cost median "
        f"{s['cost_median']:.3f}, pooled {s['cost_pooled']:.3f} (their searches' seconds "
        "over one exhaustive pass of them all)" for name, s in summ.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--only", default="", help="table names, comma-separated")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", metavar="NAME", default="",
                        help="also write results/NAME.json and NAME.md (with the commit)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    tables = all_tables()
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {t.name for t in tables})
        if unknown:
            parser.error(f"--only {','.join(unknown)}: no such table; tables are "
                         f"{', '.join(t.name for t in tables)}")
        tables = [t for t in tables if t.name in wanted]
    results = [score(replace(t, held_out=is_held_out(t)), args.seeds) for t in tables]
    summ = summary(results)
    text = render(results, summ)
    if args.json:
        print(json.dumps({"tables": results, "summary": summ, "notes": NOTES}, indent=1))
    else:
        print(text)
    if args.write:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "../autotune"],
                               cwd=here, capture_output=True, text=True).stdout.strip()
        head = {"commit": commit + ("+dirty" if dirty else ""), "seeds": args.seeds,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "replay_s": time.perf_counter() - started}
        (here / "results" / f"{args.write}.json").write_text(json.dumps(
            {**head, "tables": results, "summary": summ, "notes": NOTES}, indent=1) + "\n")
        (here / "results" / f"{args.write}.md").write_text(
            f"# Replay of the search at {head['commit']} ({head['date']})\n\n"
            f"`python benchmarks/replay.py --seeds {args.seeds}`: every table x "
            f"{args.seeds} seeds in {head['replay_s']:.0f} s on this machine. How tables, "
            "runs, noise and scores are made: the docstrings of `benchmarks/replay.py` and "
            "`benchmarks/replay_tables.py`.\n\n```\n" + text + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
