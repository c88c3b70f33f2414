"""A child's pinning to its slot of a parallel search (``search.slots``): applied by the child
itself, first thing (``runner.child_main``), before torch starts its thread pools.
"""

from __future__ import annotations

import os
import sys

RANKS = "AUTOTUNE_RANKS"
"""Set for each rank of a job (``runner``): its ranks share the slot's cores."""


SLOT_CORES = "AUTOTUNE_SLOT_CORES"
"""The cores a child of a parallel search on CPU runs on (``0,1``): set by its slot
(``search.slots``), applied by the child itself (``pin_to_slot``). An autotune variable, read
only once a child starts: every slot's children fork from one warm server (``child``)."""


def pin_to_slot() -> None:
    """A child of a slot on CPU: its affinity to the slot's cores, and torch's threads (and
    inductor's compile threads) to their count (a rank of a job: its share), before it runs
    anything; nothing outside a slot. Called first thing in a child (``child_main``), before
    torch starts its thread pools."""
    cores = [int(c) for c in os.environ.get(SLOT_CORES, "").split(",") if c.strip()]
    if not cores or not hasattr(os, "sched_setaffinity"):
        return
    os.sched_setaffinity(0, cores)
    ranks = int(os.environ.get(RANKS) or 1) if os.environ.get("RANK") else 1
    threads = max(1, len(cores) // ranks)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(len(cores))
    import torch

    torch.set_num_threads(threads)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:  # imported by the fork server already: its value was read then
        inductor.compile_threads = len(cores)  # type: ignore[attr-defined]
