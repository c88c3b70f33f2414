"""A trial as one rank of a job (a strategy of several ranks, started by the elastic
launcher): joining the job's process group, the values every rank agrees on while it times,
and leaving the group after a run that ended well.

Apart from ``autotune.trial`` because a trial of one process needs none of it: for such a
trial ``join_job`` returns the spec as it is, ``agreed`` the values and ``leave_job`` does
nothing.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Sequence

import torch

from autotune.config import TrialResult, TrialSpec
from autotune.knobs import KnobUnsupported


def join_job(spec: TrialSpec) -> tuple[TrialSpec, int]:
    """Join the job's process group when the spec runs a strategy of several ranks (this
    process is one rank, started by the elastic launcher): gloo on CPU, nccl on CUDA, each
    rank on its own GPU (``LOCAL_RANK``). Returns the spec for this rank and the job's size
    (1 without a strategy)."""
    if not spec.knobs.distributed:
        return spec, 1
    import datetime

    import torch.distributed as dist

    if "RANK" not in os.environ:
        raise KnobUnsupported(f"strategy {spec.knobs.strategy} runs as a job of ranks (the "
                              "runner starts one with torch's elastic launcher)")
    device = spec.device
    if device.startswith("cuda"):
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                            timeout=datetime.timedelta(seconds=max(60.0, spec.timeout_s)))
    return dataclasses.replace(spec, device=device), dist.get_world_size()


def leave_job(result: TrialResult) -> None:
    """Leave the process group after a run that ended well (a failed rank exits at once:
    its peers may be waiting for it)."""
    import torch.distributed as dist

    if result.ok and dist.is_available() and dist.is_initialized():
        # The trial's DDP/FSDP modules are garbage by now, but may sit in reference cycles:
        # freed now, before the group goes (freed at interpreter exit, gloo's threads can wait
        # for the lock the exiting main thread holds: a rank that never ends).
        gc.collect()
        dist.destroy_process_group()


def agreed(values: Sequence[float], device: torch.device) -> list[float]:
    """The largest of each value over the job's ranks (the values as they are without one):
    the slowest rank's step time and elapsed time, so every rank takes the same decision to
    stop timing (a rank that stops alone would leave its peers waiting in a collective)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64,
                          device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()
