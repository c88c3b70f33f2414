"""One node of a joined study (``--join``), run as its own process by test_join.py: a scripted
search (tests.scripted, no training) on the PostgreSQL study named on the command line.

    python -m tests.join_node URL STUDY OUT.json [HANG] [WIDTH]

WIDTH > 1: the knobs' search (a ``KnobDevice``, the knob values: the joint screen's batches)
on WIDTH slots of threads (``--parallel``), as tests/test_parallel.py runs it.

Each child run takes ``RUN_S``; a run of the candidate ``HANG`` (``label/micro_batch``) first
writes ``OUT.json.hang`` and then sleeps until killed (a node that dies mid-run). Heartbeats
every second, a claim stale after 3 s. Writes what it ran, what it picked, who writes the outputs
(``Ledger.outputs_by``: '' when this node does) and the runs its outcome lists (its own and
those the other nodes finished meanwhile, each with its node) to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

from autotune.search import claims, run_search, tuned_config
from autotune.search.slots import Slot, ThreadSlots
from tests.scripted import CLASSES, SETTINGS, VALUES, KnobDevice, ScriptedDevice, by_class, plan
from tests.test_store import SPEEDS

RUN_S = 0.3
KNOB_SPEEDS = by_class(100, 150, 160, 200, 300, 330)
claims.HEARTBEAT_S, claims.GRACE_S = 1, 3


def main(url: str, study: str, out: str, hang: str = "", width: str = "1") -> None:
    slots = int(width)
    device = KnobDevice(KNOB_SPEEDS) if slots > 1 else ScriptedDevice(SPEEDS)

    def run(spec):
        if f"{spec.knobs.label()}/{spec.micro_batch}" == hang:
            Path(out + ".hang").write_text("running")
            time.sleep(600)
        time.sleep(RUN_S)
        return device(spec)

    settings = replace(SETTINGS, storage=url, study_name=study, join=True)
    with warnings.catch_warnings(record=True):
        outcome = run_search(plan(), CLASSES, settings, run=run,
                             **({"values": VALUES, "slots": ThreadSlots(
                                 [Slot(i, f"cpu {i}") for i in range(slots)],
                                 lambda spec, slot, on_start: run(spec))} if slots > 1 else {}))
    config = tuned_config(plan(), outcome, settings)
    writer = outcome.ledger.outputs_by() if outcome.ledger is not None else "?"
    Path(out).write_text(json.dumps({
        "winner": f"{config.knobs.label()}/{config.micro_batch}",
        "ran": [[r.kind, f"{r.knobs.label()}/{r.micro_batch}"] for r in outcome.runs
                if r.stored_at is None and r.node == claims.who()],
        "note": outcome.study.note if outcome.study is not None else "",
        "outputs_by": writer, "me": claims.who(),
        "nodes": sorted({r.node for r in outcome.runs}),
        "listed": [[r.node, r.kind, f"{r.knobs.label()}/{r.micro_batch}"]
                   for r in outcome.runs]}))


if __name__ == "__main__":
    main(*sys.argv[1:])
