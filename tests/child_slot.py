"""A child for the slot-pinning test: says the cores, threads and device variables it saw."""

from __future__ import annotations

import os
from typing import Any

from autotune.runner import child_main


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """What pins this child: its affinity, torch's threads, the variables of its slot."""
    import torch

    return {"cores": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
            **{name: os.environ.get(name) for name in (
                "OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS", "CUDA_VISIBLE_DEVICES",
                "CUDA_DEVICE_ORDER")}}


if __name__ == "__main__":
    child_main(handle)
