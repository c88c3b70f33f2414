"""How much a knob value that frees no memory by design moves a run's peak: the figure behind
``autotune.search.fits.VALUE_PEAK_DROP`` (rule ``near-miss``).

For every recorded table of the replay (``replay_tables.py``: the exhaustive passes of the
CPUs and the H200), each candidate with an optimizer implementation or a memory format other
than the default is set beside the same candidate without that value (same class,
checkpointing, other knobs and micro-batch): the lowest peak of its runs over the highest of
the other's. Printed per table (how many pairs, the least ratio, the 5th and 25th
percentiles, the median) and the pairs with the lowest ratios, with the peak they came down
from (micro-batch 1 of a small model is where the allocator's blocks and a kernel's workspace
weigh most).

Run: ``python benchmarks/value_peaks.py [--lowest N]``.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from replay_tables import all_tables

VALUES = ("opt=", "format=")
"""The knobs whose values free no memory by design, as a candidate's label spells them."""


def pairs() -> list[tuple[float, str, str, float]]:
    """(lowest peak with the value over the highest without it, table, candidate, the peak
    without it in MiB), lowest first."""
    found = []
    for table in all_tables():
        for key, entry in table.entries.items():
            label, micro_batch = key.rsplit("/", 1)
            parts = label.split("+")
            for knob in VALUES:
                if not any(p.startswith(knob) for p in parts):
                    continue
                other = table.entries.get(
                    "+".join(p for p in parts if not p.startswith(knob)) + "/" + micro_batch)
                with_value = [r.peak_bytes for r in entry.runs if r.peak_bytes]
                without = [r.peak_bytes for r in (other.runs if other else ()) if r.peak_bytes]
                if with_value and without:
                    found.append((min(with_value) / max(without), table.name, key,
                                  max(without) / 2**20))
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lowest", type=int, default=10, help="pairs listed (default 10)")
    args = parser.parse_args()
    if args.lowest < 0:
        parser.error(f"--lowest {args.lowest}: a count of pairs, 0 or more")
    found = pairs()
    by_table = collections.defaultdict(list)
    for ratio, table, _, _ in found:
        by_table[table].append(ratio)
    print("| table | pairs | least | p05 | p25 | median |\n|---|---:|---:|---:|---:|---:|")
    for table, ratios in sorted(by_table.items()):
        def at(q: float, r: list[float] = ratios) -> float:
            return r[int(q * (len(r) - 1))]
        print(f"| {table} | {len(ratios)} | {ratios[0]:.3f} | {at(0.05):.3f} | {at(0.25):.3f}"
              f" | {at(0.5):.3f} |")
    print(f"\nThe {args.lowest} lowest (peak with the value over the peak without it):\n")
    for ratio, table, key, peak in found[:args.lowest]:
        print(f"  {ratio:.3f}  {table:26s} {key:58s} from {peak:.1f} MiB")


if __name__ == "__main__":
    main()
