"""How much a compiled child's peak on a CPU depends on its compile, from committed results.

On a CPU the cap is the child's address space, and a compiled child's peak counts its compile:
the run that compiles a graph peaks higher than one that loads it from inductor's cache. This
prints, from a ``search_quality`` results file with two oracle passes:

- how much the peak of each candidate moved between its two runs, compiled and eager apart,
  and how many candidates ran out of memory in one pass and not the other;
- the pick quality against the configs that fit a first launch (a cold compile): a compiled
  candidate counts only if no candidate sharing its compiled graph (the same knobs but the
  optimizer implementation, which is not compiled, at the same micro-batch) ran out of memory
  in any run; an eager one as the oracle judged it;
- with ``--show KEY``, each run of that oracle candidate (status, peak, wall seconds: a run
  that compiles its graph takes longer than one that loads it);
- with ``--search-json``, the search's own ``autotune.json``: every candidate its run log ran
  more than once, each run's kind, peak and compile seconds.

Run: ``python benchmarks/compile_memory.py search_quality_slow-cnn-pairs
[--search-json benchmarks/results/autotune_slow-cnn-pairs.json] [--show KEY ...]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIB = 2**20


def graph(candidate: dict) -> tuple:
    """What the compiled model depends on: every knob but the optimizer, and the micro-batch."""
    knobs = {k: v for k, v in candidate["knobs"].items() if k != "optimizer_impl"}
    return tuple(sorted(knobs.items())), candidate["micro_batch"]


def peak_moves(candidates: list[dict]) -> dict[str, list[float]]:
    """MiB each candidate's peak moved between its first two completed runs, by kind."""
    moves: dict[str, list[float]] = {"compiled": [], "eager": []}
    for c in candidates:
        peaks, statuses = c.get("run_peak_bytes") or [], c.get("statuses") or []
        if len(peaks) >= 2 and statuses[:2] == ["ok", "ok"] and all(peaks[:2]):
            kind = "eager" if c["compile_mode"] == "off" else "compiled"
            moves[kind].append(abs(peaks[1] - peaks[0]) / MIB)
    return moves


def cold_fits(candidates: list[dict]) -> list[dict]:
    """The candidates that fit a first launch: the oracle's own verdict where the results
    carry it (``fits_first_launch``, by the search's rule), else the module docstring's."""
    out_of_memory = {graph(c) for c in candidates if "oom" in (c.get("statuses") or [])}
    return [c for c in candidates if c.get("fits_usable") and c.get("samples_per_s")
            and c.get("fits_first_launch", c["compile_mode"] == "off"
                      or graph(c) not in out_of_memory)]


def report(row: dict, show: list[str]) -> list[str]:
    candidates = row["oracle"]["candidates"]
    lines = [f"== {row['workload']}"]
    for c in candidates:
        if c["key"] in show:
            runs = "; ".join(f"{status} {(peak or 0) / MIB:.1f} MiB in {wall:.0f} s" for status,
                             peak, wall in zip(c["statuses"], c["run_peak_bytes"], c["wall_s"],
                                               strict=False))
            lines.append(f"{c['key']} per oracle pass: {runs}")
    for kind, moved in peak_moves(candidates).items():
        if moved:
            lines.append(f"{kind}: {len(moved)} candidates ran twice; peak moved by a median of "
                         f"{statistics.median(moved):.2f} MiB (largest {max(moved):.1f} MiB)")
    flips = [c["key"] for c in candidates if len(set(c.get("statuses") or [])) > 1]
    lines.append(f"{len(flips)} candidates ran out of memory in one pass and not the other")
    best_as_measured = max((c for c in candidates if c.get("fits_usable")
                            and c.get("samples_per_s")), key=lambda c: c["samples_per_s"])
    fits = cold_fits(candidates)
    best = max(fits, key=lambda c: c["samples_per_s"])
    tuned = row["tuned_samples_per_s"]
    lines.append(f"oracle best as measured: {best_as_measured['key']} "
                 f"({best_as_measured['samples_per_s']:.1f} samples/s)")
    lines.append(f"oracle best that fits a cold compile: {best['key']} "
                 f"({best['samples_per_s']:.1f} samples/s)")
    lines.append(f"tuned: {tuned:.1f} samples/s; pick quality against what fits a cold compile: "
                 f"{tuned / best['samples_per_s']:.2f}")
    return lines


def search_runs(path: Path) -> list[str]:
    """The search's candidates run more than once, each run with its kind, peak and compile."""
    runs = json.loads(path.read_text())["runs"]
    by_candidate: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        by_candidate[(tuple(sorted(r["knobs"].items())), r["micro_batch"])].append(r)
    lines = [f"== {path.name}: candidates run more than once"]
    for (knobs, micro_batch), rs in by_candidate.items():
        if len(rs) > 1:
            named = dict(knobs)
            label = f"{named['precision']}/{named['compile_mode']}"
            extra = "+".join(v for k, v in knobs if k not in ("precision", "compile_mode")
                             and v not in ("off", "default", "contiguous", "none"))
            runs_text = "; ".join(
                f"#{r['number']} {r['kind']} {r['status']} "
                f"{(r['peak_bytes'] or 0) / MIB:.1f} MiB, compile {r['compile_s'] or 0:.0f} s"
                for r in rs)
            lines.append(f"{label}{'+' + extra if extra else ''} at {micro_batch}: {runs_text}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="a results file's name in benchmarks/results (no .json)")
    parser.add_argument("--search-json", type=Path, help="the search's autotune.json")
    parser.add_argument("--show", action="append", default=[], metavar="KEY",
                        help="an oracle candidate (e.g. bf16/default/8) whose runs to print")
    args = parser.parse_args(argv)
    path = HERE / "results" / f"{args.name}.json"
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return 2
    for row in rows:
        print("\n".join(report(row, args.show)))
    if args.search_json is not None:
        try:
            print("\n".join(search_runs(args.search_json)))
        except (OSError, ValueError, KeyError) as exc:
            print(f"cannot read {args.search_json}: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
