"""The check behind rule ``compile-floor`` (``reach_bounds.compile_floor``), on every generated
and recorded table: where a compiled class fit no micro-batch the table recorded (down to 1),
would the rule skip a compiled class of another precision, same compile mode, that fits one?

The rule compares the two eager classes' peaks at every micro-batch both ran; the table's own
runs stand in for the probes' (every micro-batch it recorded ok). Prints how many classes the
rule skips and how many of those fit somewhere, and the same for the comparison at the largest
common micro-batch alone (what ``oom_class_peak`` reads for checkpointing).

Run: ``python benchmarks/compile_floor_check.py``.
"""

from __future__ import annotations

import collections
import sys

from replay_families import tables_of
from replay_tables import Table

from autotune.search._records import Candidate


def classes(t: Table) -> tuple[dict[str, bool], dict[str, set[int]], dict[str, dict[int, int]]]:
    """Per plain class label (no knob changed): whether it fits anywhere, the micro-batches
    recorded, and (eager classes) the largest ok peak per micro-batch."""
    fits: dict[str, bool] = collections.defaultdict(bool)
    ran: dict[str, set[int]] = collections.defaultdict(set)
    peaks: dict[str, dict[int, int]] = collections.defaultdict(dict)
    for key, e in t.entries.items():
        c = Candidate.from_key(key)
        label = c.knobs.label()
        if "+" in label or not e.runs:
            continue
        ran[label].add(c.micro_batch)
        fits[label] |= t.fits(key)
        if not c.knobs.compiled:
            ok = [r.peak_bytes for r in e.runs if r.status == "ok" and r.peak_bytes]
            if ok:
                peaks[label][c.micro_batch] = max(ok)
    return fits, ran, peaks


def check(tables: list[Table]) -> dict[str, list]:
    """(table, failed class, skipped class) the rule skips, and those the largest common
    micro-batch alone skips, each with whether the skipped class fits."""
    out: dict[str, list] = {"every": [], "largest": []}
    for t in tables:
        fits, ran, peaks = classes(t)
        compiled = [c for c in ran if "/off" not in c]
        for failed in compiled:
            if fits[failed] or 1 not in ran[failed]:
                continue
            for other in compiled:
                if other == failed or other.split("/")[1] != failed.split("/")[1]:
                    continue
                mine = peaks[other.split("/")[0] + "/off"]
                theirs = peaks[failed.split("/")[0] + "/off"]
                common = sorted(set(mine) & set(theirs))
                if not common:
                    continue
                row = (t.name, failed, other, fits[other])
                if all(mine[m] >= theirs[m] for m in common):
                    out["every"].append(row)
                if mine[common[-1]] >= theirs[common[-1]]:
                    out["largest"].append(row)
    return out


def main() -> int:
    for which in ("develop", "judge", "recorded"):
        got = check(tables_of(which))
        for how, rows in got.items():
            wrong = [r for r in rows if r[3]]
            print(f"{which:9s} {how:8s} skips {len(rows):3d} classes, {len(wrong)} of them fit "
                  "somewhere" + "".join(f"\n    {r[0]}: {r[2]} after {r[1]}" for r in wrong))
    return 0


if __name__ == "__main__":
    sys.exit(main())
