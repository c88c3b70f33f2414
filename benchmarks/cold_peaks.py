"""How far a compiled run's peak drops once its graphs are in inductor's cache, in the recorded
CPU tables: per table, the groups of compiled candidates sharing graphs (``Candidate.graph``,
an optimizer implementation leaves the compiled model alone) that hold their knob-default run
(run first in an exhaustive pass, so compiled afresh), how many of them that run peaks highest
in, and by how much the group's highest peak is over each other member's (median, most). The
figures behind ``replay_tables.Table.cold_peak``.

Run: ``python benchmarks/cold_peaks.py``.
"""

from __future__ import annotations

import collections
import statistics
import sys

from replay_tables import all_tables

from autotune.search._records import Candidate

MIB = 2**20


def main() -> int:
    total = highest = 0
    print(f"{'table':22s} {'groups':>6s} {'default highest':>15s} {'over, median':>12s} "
          f"{'most':>8s}")
    for t in all_tables():
        if not t.compile_in_peak():
            continue
        groups: dict[str, dict[str, int]] = collections.defaultdict(dict)
        for key, e in t.entries.items():
            c = Candidate.from_key(key)
            peaks = [r.peak_bytes for r in e.runs if r.status == "ok" and r.peak_bytes]
            if c.knobs.compiled and peaks:
                groups[c.graph().key()][key] = max(peaks)
        gaps, n, top = [], 0, 0
        for graph, members in groups.items():
            if len(members) < 2:
                continue
            most = max(members.values())
            gaps += [(most - p) / MIB for k, p in members.items() if k != graph or p != most]
            if graph in members:
                n += 1
                top += members[graph] == most
        if n:
            total, highest = total + n, highest + top
            print(f"{t.name:22s} {n:6d} {top:15d} {statistics.median(gaps):9.1f} MiB "
                  f"{max(gaps):5.1f} MiB")
    print(f"all CPU tables: the knob-default run peaks highest in {highest} of {total} groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
