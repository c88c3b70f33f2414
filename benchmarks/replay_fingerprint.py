"""A refactor's check: every replay search's decisions, to compare before and after a change.

For every replay table (``replay_tables``) and seeds 0..N-1, the search's pick, simulated cost,
number of runs, every skip sentence, every record (candidate, verdict, runs) and the drift it saw,
written as JSON. A change that must not alter the search (a split, a rename) leaves the file
identical; ``--compare OLD`` says how many searches differ and shows the first.

Run: ``python benchmarks/replay_fingerprint.py OUT.json [--seeds 8] [--compare OLD.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

from replay import ReplayDevice, all_tables, plan_of, settings_of

from autotune.search import pick_winner, run_search
from autotune.search._records import Candidate


def fingerprint(seeds: int) -> dict[str, dict]:
    out = {}
    for table in all_tables():
        plan, classes, values = plan_of(table)
        settings = settings_of(table)
        for seed in range(seeds):
            device = ReplayDevice(table, seed)
            with contextlib.redirect_stderr(io.StringIO()):
                o = run_search(plan, classes, settings, values=values, run=device,
                               clock=device.clock)
            w = pick_winner(o.records, settings)
            out[f"{table.name}/{seed}"] = {
                "pick": w and Candidate(knobs=w.knobs, micro_batch=w.micro_batch).key(),
                "cost": round(device.now_s, 6), "runs": device.calls,
                "skipped": list(o.skipped),
                "records": [(Candidate(knobs=r.knobs, micro_batch=r.micro_batch).key(),
                             r.verdict, r.num_runs) for r in o.records],
                "drift": sorted((k.key(), round(v, 9)) for k, v in o.drift.items())}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--compare", metavar="OLD", default="")
    args = parser.parse_args(argv)
    found = json.loads(json.dumps(fingerprint(args.seeds)))  # as the file holds it
    with open(args.out, "w") as f:
        json.dump(found, f, indent=0)
    print(f"{len(found)} searches written to {args.out}")
    if args.compare:
        with open(args.compare) as f:
            old = json.load(f)
        differ = [k for k in found if old.get(k) != found[k]]
        print(f"{len(differ)} of {len(found)} searches differ from {args.compare}")
        if differ:
            k = differ[0]
            before = old.get(k, {})
            for field in sorted({*before, *found[k]}):
                if before.get(field) != found[k].get(field):
                    print(f"first: {k} {field}:\n  old {before.get(field)}\n"
                          f"  new {found[k].get(field)}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
