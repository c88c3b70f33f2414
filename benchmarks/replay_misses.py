"""Where the search misses (issue 59): for each table of a committed families replay whose
median pick is under 0.97, every seed's search replayed again and said as one of

- ``hit``: the pick is within 3% of the best;
- ``timed-good-lost``: a candidate within 3% of the best was timed, and the pick is not one
  (a near-tie the noise decided, or a best stopped early behind a lucky leader);
- ``never-timed-good``: no candidate within 3% of the best was timed.

    cd benchmarks
    python replay_misses.py results/replay-families_develop_all-tables_replay-2026-11-30h.json

It replays the search of the tree it runs in (``PYTHONPATH`` chooses it), on the tables and
seeds the file names; its figures for a file written by another search say where this one
misses on the tables that one missed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import sys
from pathlib import Path

from replay_device import ReplayDevice, plan_of, settings_of
from replay_families import REPLAY_SEEDS, Variant, build
from replay_tables import all_tables

from autotune.search import pick_winner, run_search
from autotune.search._records import Candidate

WITHIN = 0.03
UNDER = 0.97


def table_of(name: str, tables: dict):
    """The recorded or generated table a replay's row names."""
    if "#" not in name:
        return tables[name]
    head, rest = name.split("#")
    family, param = head.split("=")
    seed, base = rest.split("@")
    return build(Variant(family, float(param), int(seed), base), tables)


def kinds(table, seeds: range) -> collections.Counter:
    """Each seed's search said as hit, timed-good-lost or never-timed-good."""
    plan, classes, values = plan_of(table)
    settings = settings_of(table)
    best = table.best()[1]
    good = {k for k in table.entries if table.fits(k)
            and (table.truth(k) or 0) >= (1 - WITHIN) * best}
    found: collections.Counter = collections.Counter()
    for seed in seeds:
        device = ReplayDevice(table, seed)
        with contextlib.redirect_stderr(io.StringIO()):
            outcome = run_search(plan, classes, settings, values=values, run=device,
                                 clock=device.clock)
        winner = pick_winner(outcome.records, settings)
        pick = winner and Candidate(knobs=winner.knobs, micro_batch=winner.micro_batch).key()
        found["hit" if pick in good else "timed-good-lost" if good & set(device.timed)
              else "never-timed-good"] += 1
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("replay", help="a replay.py --families ... --json file")
    args = parser.parse_args(argv)
    try:
        data = json.loads(Path(args.replay).read_text())
        rows = [r for r in data["tables"] if r["pick_quality"]["median"] < UNDER]
        count = int(data["seeds"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"replay_misses: {args.replay}: not a families replay ({exc})", file=sys.stderr)
        return 2
    tables = {t.name: t for t in all_tables()}
    total: collections.Counter = collections.Counter()
    for row in rows:
        first = REPLAY_SEEDS.get(row.get("set", ""), 0)  # the seeds the replay drew
        found = kinds(table_of(row["name"], tables), range(first, first + count))
        total.update(found)
        print(f"{row['name']:50s} " + "  ".join(f"{k} {found[k]}" for k in
                                                 ("hit", "timed-good-lost", "never-timed-good")),
              flush=True)
    print(f"{len(rows)} tables under {UNDER}: " + ", ".join(
        f"{k} {total[k]}" for k in ("hit", "timed-good-lost", "never-timed-good")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
