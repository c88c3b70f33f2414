"""Racing variants of the search, judged on the replay (the experiment behind issue 47's note).

``base``: the search as it is; ``band``: no interleaved rounds where the leader and its
challenger are within 3% (the practical-equality band: either would do); ``norounds``: no
interleaved rounds at all; ``nodrift``: no re-measure of candidates within the drift. Each
replaces one policy decision of ``autotune.search.stages.race`` in this process only, and prints the
replay's summary (tuning and held-out apart) and a line per table.

Run: ``python benchmarks/replay_variants.py base|band|norounds|nodrift [SEEDS]``.
"""

from __future__ import annotations

import json
import sys

import replay

from autotune.search import policy
from autotune.search.stages import race

BAND = 0.03


def _band(ev):
    pair = policy.round_pair(ev)
    if pair is None:
        return None
    leader, challenger = pair[0], pair[1]
    gap = 1 - (ev.score(challenger, full=True) or 0) / (ev.score(leader, full=True) or 1)
    return None if gap < BAND else pair


VARIANTS = {"base": {}, "band": {"round_pair": _band},
            "norounds": {"round_pair": lambda ev: None},
            "nodrift": {"within_drift": lambda ev: []}}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VARIANTS:
        print(f"usage: replay_variants.py {'|'.join(VARIANTS)} [SEEDS]", file=sys.stderr)
        return 2
    for name, fn in VARIANTS[argv[0]].items():
        setattr(race, name, fn)
    seeds = int(argv[1]) if len(argv) > 1 else 30
    results = [replay.score(t, seeds) for t in replay.all_tables()]
    print(argv[0], json.dumps(replay.summary(results)))
    for r in results:
        print(f"  {r['name']:24s} pick {r['pick_quality']['median']:.3f} p10 "
              f"{r['pick_quality']['p10']:.3f} within 3% {r['within_3pct']:.2f} cost "
              f"{r['cost']['median']:.3f} runs {r['runs']['median']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
