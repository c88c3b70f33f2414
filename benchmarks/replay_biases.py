"""Which of the replay's bias fixes (issue 59) moved which figure, on the recorded tables.

Replays every recorded table with the device as it is (``after``), and with each fix undone
alone: ``symmetric`` (steps scatter both ways about the median, as before) and
``warm-compile`` (every run pays a drawn run's overhead, as before) and ``linear-spread``
(the slow side's width ``spread / HALF_P10_P90``, as before 2026-12-02). Prints, per table, pick
quality (median, p10) and cost median of each, without the baseline. The rule blame's change
(every skip counted by its rule id from its own fields) is compared against the replay of the
commit before it (``python benchmarks/replay.py --json`` there).

Run: ``python benchmarks/replay_biases.py [--seeds 30] [--json]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import replay
from replay_device import ReplayDevice
from replay_tables import all_tables

VARIANTS = {"after": {}, "symmetric": {"one_sided": False},
            "warm-compile": {"charge_cold_compile": False},
            "linear-spread": {"exact_spread": False}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    tables = all_tables()
    out: dict[str, dict] = {}
    for name, options in VARIANTS.items():
        replay.ReplayDevice = functools.partial(ReplayDevice, **options)
        for t in tables:
            r = replay.score(t, args.seeds, baseline=False)
            out.setdefault(t.name, {})[name] = {
                "median": r["pick_quality"]["median"], "p10": r["pick_quality"]["p10"],
                "within_3pct": r["within_3pct"], "cost": r["cost"]["median"],
                "rules": r["rules"]}
    replay.ReplayDevice = ReplayDevice
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for table, got in out.items():
        print(f"{table:22s} " + "  ".join(
            f"{name} {v['median']:.3f}/{v['p10']:.3f} w3 {v['within_3pct']:.0%} cost "
            f"{v['cost']:.3f}" for name, v in got.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
