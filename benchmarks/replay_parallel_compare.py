"""Two replays with N simulated workers (``replay_parallel.py --write``) of the same tables,
side by side: per N, the wall, device-seconds and pick quality over the tables (the mean of
the per-table medians, the large spaces apart), how many tables' wall moved by more than 1%
either way, and the table whose wall rose most; then the picks: the share of seeds within 3%
of the best (mean over tables; N = 1's after it), the share on N = 1's pick, and how far the
worst table's share on N = 1's pick lies below N = 1's own under the other noise (the
``noise`` column: the pick's own noise), with the tables more than ``BEYOND`` below it.

Run: ``python benchmarks/replay_parallel_compare.py BEFORE.json AFTER.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from replay_parallel import LARGE

MOVED = 0.01
"""A table's wall moved where the after/before ratio of its medians is off 1 by more."""
BEYOND = 0.2
"""A table's pick depends on N where its share of seeds on N = 1's pick lies more than this
below N = 1's own under the other noise (two seeds of ten)."""


def picks(tables: dict, names: list[str], n: str) -> tuple[float, float, float, str, int]:
    """Over ``tables`` with ``n`` workers: the mean share within 3% of the best, the mean
    share on N = 1's pick, the worst table's share on it less its noise column (and its
    name), and the tables more than ``BEYOND`` below theirs."""
    rows = [tables[name]["by_workers"][n] for name in names]
    gaps = {name: tables[name]["by_workers"][n]["same_pick_as_1"]
            - tables[name]["same_pick_1_other_noise"] for name in names}
    worst = min(names, key=gaps.__getitem__)
    return (statistics.mean(r["within_3pct"] for r in rows),
            statistics.mean(r["same_pick_as_1"] for r in rows), gaps[worst], worst,
            sum(g < -BEYOND - 1e-9 for g in gaps.values()))


def compare(before: dict, after: dict) -> str:
    """The comparison's lines (module docstring)."""
    old = {t["name"]: t for t in before["tables"]}
    new = {t["name"]: t for t in after["tables"]}
    names = [n for n in old if n in new]
    if len(names) != len(old) or len(names) != len(new):
        raise SystemExit(f"the two replays hold other tables ({len(old)} and {len(new)}, "
                         f"{len(names)} in both): compare replays of one set")
    lines = [f"{len(names)} tables; before {before['commit']}, after {after['commit']}"]
    for n in sorted({*old[names[0]]["by_workers"]} - {"1"}, key=int):
        def med(tables: dict, name: str, figure: str, n: str = n) -> float:
            return tables[name]["by_workers"][n][figure]["median"]

        def mean(tables: dict, figure: str, large: bool = False) -> str:
            values = [med(tables, name, figure) for name in names
                      if not large or tables[name]["candidates"] >= LARGE]
            return f"{statistics.mean(values):.4f}" if values else "-"

        ratio = {name: med(new, name, "wall_cost") / med(old, name, "wall_cost")
                 for name in names}
        worst = max(names, key=ratio.__getitem__)
        lines.append(
            f"N={n}: wall {mean(old, 'wall_cost')} -> {mean(new, 'wall_cost')} "
            f"(large spaces {mean(old, 'wall_cost', True)} -> "
            f"{mean(new, 'wall_cost', True)}), device-seconds "
            f"{mean(old, 'device_cost')} -> {mean(new, 'device_cost')}, pick quality "
            f"{mean(old, 'pick_quality')} -> {mean(new, 'pick_quality')} "
            "(means of per-table medians, shares of a serial pass); wall lower on "
            f"{sum(r < 1 - MOVED for r in ratio.values())}, higher on "
            f"{sum(r > 1 + MOVED for r in ratio.values())}; most risen: {worst} "
            f"{med(old, worst, 'wall_cost'):.3f} -> {med(new, worst, 'wall_cost'):.3f}; "
            + (said_picks(picks(old, names, n), picks(new, names, n),
                          picks(new, names, "1")[0]) if all(
                "same_pick_1_other_noise" in t[name] for t in (old, new) for name in names)
               else "picks not compared: a file without the noise column (written before "
                    "2026-11-29b)"))
    return "\n".join(lines)


def said_picks(old: tuple, new: tuple, serial: float) -> str:
    """The picks' figures of ``picks``, before -> after."""
    return (f"within 3% {old[0]:.4f} -> {new[0]:.4f} (N=1 {serial:.4f}), on N=1's pick "
            f"{old[1]:.3f} -> {new[1]:.3f}, worst table's less its noise {old[2]:+.1f} "
            f"({old[3]}) -> {new[2]:+.1f} ({new[3]}), more than {BEYOND} below {old[4]} -> "
            f"{new[4]}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    replays = []
    for path in argv:
        try:
            replay = json.loads(Path(path).read_text())
            if not isinstance(replay, dict) or not isinstance(replay.get("tables"), list):
                raise ValueError("no 'tables' list")
        except (OSError, ValueError) as exc:
            print(f"cannot read {path!r} as a replay_parallel.py --write JSON file: {exc}",
                  file=sys.stderr)
            return 2
        replays.append(replay)
    print(compare(*replays))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
