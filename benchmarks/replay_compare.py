"""Two replays of the generated families side by side: whether a change of the search moved
the figures beyond the replay's own noise.

Run: ``python benchmarks/replay_compare.py BEFORE.json AFTER.json`` (each written by
``python benchmarks/replay.py --families develop|judge|all --seeds N --json`` or ``--write``).

A change of a rule changes which runs each search makes, so every seed of every table draws
other runs after it: a table's median moves by a few hundredths either way on tables the rule
never touched, and a count of tables under a threshold moves with it. So the two are compared
per table, paired by name: per figure, the mean over the tables of the change, with its 95%
interval from the spread of the per-table changes (a paired t interval; the seeds' own noise
is inside that spread). A figure moved only where that interval leaves out 0; else it is
"within the replay's noise", however the counts moved. Tables made from one recorded table
are not independent of each other, so the interval is if anything too narrow: a figure it
calls within the noise did not move. The counts and the worst table are
shown beside it, as ``docs/benchmarks.md`` reports them.

Both files must be replays of the same set, the same seeds, the same noise (``--noise``) and
the same tables; anything else is an error that says what differs (exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

T95 = 1.97
"""The t quantile for a two-sided 95% interval at 100+ paired tables (1.96 at infinity; a
set has 178 tables)."""

FIGURES: dict[str, tuple[str, Callable[[dict], float], bool]] = {
    "within_3pct": ("share of seeds within 3% of the best", lambda t: t["within_3pct"], True),
    "median": ("pick quality, median", lambda t: t["pick_quality"]["median"], True),
    "p10": ("pick quality, p10", lambda t: t["pick_quality"]["p10"], True),
    "cost": ("cost, median (share of an exhaustive pass)", lambda t: t["cost"]["median"],
             False),
}
"""Per figure: its words, how a table's result gives it, and whether larger is better."""


class CompareError(ValueError):
    """The two files cannot be compared (what differs, and what to do)."""


def load(path: Path) -> dict:
    """A replay of the generated families, read and checked."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise CompareError(f"{path}: cannot read it ({e.strerror}); give a file written by "
                           "benchmarks/replay.py --families ... --json") from None
    except json.JSONDecodeError as e:
        raise CompareError(f"{path}: not JSON ({e.msg} at line {e.lineno}); give a file "
                           "written by benchmarks/replay.py --families ... --json") from None
    if not isinstance(data, dict) or not isinstance(data.get("tables"), list) \
            or "sets" not in data or "seeds" not in data:
        raise CompareError(f"{path}: not a replay of the generated families (no tables, sets "
                           "and seeds); give one written by replay.py --families ... --json")
    if not data["tables"]:
        raise CompareError(f"{path}: holds no tables (a replay of nothing: --only matched "
                           "none?); replay at least one table")
    for t in data["tables"]:
        if not isinstance(t, dict) or "name" not in t or not all(
                _figure(t, f) is not None for f in FIGURES):
            name = t.get("name", "?") if isinstance(t, dict) else repr(t)[:40]
            raise CompareError(f"{path}: table {name} lacks a figure (within_3pct, "
                               "pick_quality, cost); was it written by replay.py --families?")
    return data


def _figure(table: dict, key: str) -> float | None:
    """A table's figure, or None where the file lacks it."""
    try:
        value = FIGURES[key][1](table)
    except (KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def pair(before: dict, after: dict) -> list[tuple[dict, dict]]:
    """The two files' tables paired by name; an error where the sets, seeds or tables
    differ."""
    for key in ("sets", "seeds", "noise"):
        if before.get(key, "drawn") != after.get(key, "drawn"):
            raise CompareError(f"the two replays differ in {key}: {before.get(key, 'drawn')} "
                               f"before, {after.get(key, 'drawn')} after; replay both with the "
                               "same --families, --seeds and --noise")
    old = {t["name"]: t for t in before["tables"]}
    new = {t["name"]: t for t in after["tables"]}
    if old.keys() != new.keys():
        only = sorted(old.keys() ^ new.keys())
        raise CompareError(f"the two replays hold other tables ({len(only)} in one only, e.g. "
                           f"{only[0]}); replay both from the same benchmarks/replay_families.py")
    return [(old[name], new[name]) for name in old]


def change(pairs: list[tuple[dict, dict]], key: str) -> dict:
    """One figure's means before and after, the mean change per table and its 95% interval,
    and the verdict: ``better``, ``worse`` or ``within the replay's noise``."""
    diffs = [_figure(b, key) - _figure(a, key) for a, b in pairs]  # type: ignore[operator]
    mean = statistics.fmean(diffs)
    half = T95 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.inf
    larger_better = FIGURES[key][2]
    if abs(mean) <= half or not mean:
        verdict = "within the replay's noise"
    else:
        verdict = "better" if (mean > 0) == larger_better else "worse"
    return {"before": statistics.fmean(_figure(a, key) for a, _ in pairs),  # type: ignore[misc]
            "after": statistics.fmean(_figure(b, key) for _, b in pairs),  # type: ignore[misc]
            "change": mean, "low": mean - half, "high": mean + half, "verdict": verdict}


def counts(tables: list[dict]) -> dict:
    """The counts ``docs/benchmarks.md`` reports, and the worst table (as the replay's report
    names it, ``replay_report.family_summary``: the lowest median, then p10)."""
    worst = min(tables, key=lambda t: (t["pick_quality"]["median"], t["pick_quality"]["p10"]))
    return {"under_0.97": sum(t["pick_quality"]["median"] < 0.97 for t in tables),
            "p10_under_0.93": sum(t["pick_quality"]["p10"] < 0.93 for t in tables),
            "within_3pct_under_0.8": sum(t["within_3pct"] < 0.8 for t in tables),
            "worst": worst["name"], "worst_median": worst["pick_quality"]["median"]}


def compare(before: dict, after: dict) -> dict:
    """Per set in the files, each figure's change (``change``) and the counts before and
    after (``counts``)."""
    pairs = pair(before, after)
    out = {}
    for which in before["sets"]:
        mine = [(a, b) for a, b in pairs if a.get("set", which) == which]
        if not mine:
            continue
        out[which] = {"tables": len(mine),
                      "figures": {k: change(mine, k) for k in FIGURES},
                      "counts": {"before": counts([a for a, _ in mine]),
                                 "after": counts([b for _, b in mine])}}
    return out


def render(result: dict, seeds: int) -> str:
    """The comparison as a table per set."""
    lines = []
    for which, got in result.items():
        lines.append(f"{which}: {got['tables']} tables, {seeds} replay seeds each; the change "
                     "is the mean over tables, with its 95% interval")
        lines.append(f"  {'figure':44s} {'before':>7s} {'after':>7s} {'change':>8s} "
                     f"{'95% interval':>19s}  verdict")
        for key, fig in got["figures"].items():
            lines.append(f"  {FIGURES[key][0]:44s} {fig['before']:7.4f} {fig['after']:7.4f} "
                         f"{fig['change']:+8.4f} [{fig['low']:+8.4f}, {fig['high']:+8.4f}]  "
                         f"{fig['verdict']}")
        b, a = got["counts"]["before"], got["counts"]["after"]
        lines.append(f"  tables under 0.97 (median): {b['under_0.97']} -> {a['under_0.97']}; "
                     f"p10 under 0.93: {b['p10_under_0.93']} -> {a['p10_under_0.93']}; "
                     f"within 3% in under 80% of seeds: {b['within_3pct_under_0.8']} -> "
                     f"{a['within_3pct_under_0.8']}")
        lines.append(f"  worst table: {b['worst']} {b['worst_median']:.3f} -> "
                     f"{a['worst']} {a['worst_median']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = parser.parse_args(argv)
    try:
        before, after = load(args.before), load(args.after)
        result = compare(before, after)
    except CompareError as e:
        print(f"replay_compare: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else render(result, before["seeds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
