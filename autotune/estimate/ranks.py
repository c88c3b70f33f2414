"""Trace one rank of a job of several in this process, under a fake process group.

A job of several ranks (``knobs.strategy`` ddp or fsdp, ``world_size`` ranks) is traced as its
rank 0, in this one process, under a fake process group of ``world_size`` ranks (as torchtitan's
memory estimation does): ``step.apply_parallel`` wraps the model as the job's ranks do, FSDP2
shards over the fake world, DDP allocates its buckets, and the collectives do nothing. The figure
is one rank's: FSDP's rank 0 holds the largest (padded) shards. What the fake world changes:
DDP's check that the ranks' parameter shapes agree runs outside the fake mode (it writes the
shapes into a real tensor), and DDP gets a communication hook that hands each bucket back as the
in-place all-reduce does (the fake group's all-reduce returns no tensor). FSDP's device mesh is
built outside the fake mode (it reads its ranks from a tensor); the parameters stay fake, so the
shards made from them are too. Not counted: the full model a real FSDP rank builds before it
shards it (a real CPU job's peak address space keeps it), communication buffers inside the
process group (NCCL's, gloo's), and DDP's rebuilt buckets after the first step (the same size).
FSDP pads every parameter's first dimension to a multiple of the world size: near that size (a
1024-row layer over 1000 ranks) the gathered buffers grow to twice the layer, as in a real job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from autotune.errors import ConfigError
from autotune.estimate.tracker import Storages, dispatch_mode
from autotune.knobs import KNOB, Knobs
from autotune.step import apply_parallel
from autotune.workload import Workload


def check_world(strategy: str, world_size: int) -> None:
    """Raises ConfigError: a strategy or world size the fake world cannot take."""
    values = KNOB["strategy"].values
    if strategy not in values:
        raise ConfigError(f"strategy {strategy!r} is not one of {', '.join(values)}")
    if world_size < 1:
        raise ConfigError(f"world size must be at least 1, got {world_size}")
    if strategy == "none":
        return
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError(f"strategy {strategy} needs torch.distributed, which this torch "
                          "build lacks: estimate with strategy none, or install a torch with it")
    if dist.is_initialized():
        raise ConfigError(f"estimating strategy {strategy} simulates its ranks in a fake "
                          "process group, and this process already has a process group: "
                          "estimate outside the job (autotune estimate runs in a child)")


@contextlib.contextmanager
def traced_world(strategy: str, world_size: int, storages: Storages) -> Iterator[None]:
    """A fake process group of ``world_size`` ranks, this process its rank 0 (none without a
    strategy), destroyed afterwards; storages resized in place are tracked meanwhile."""
    resize = torch.UntypedStorage.resize_

    def tracked_resize(storage: torch.UntypedStorage, size: int) -> Any:
        out = resize(storage, size)  # a storage method: no op the dispatch mode sees
        storages.resized(storage)
        return out

    torch.UntypedStorage.resize_ = tracked_resize  # type: ignore[method-assign]
    try:
        if strategy == "none":
            yield
            return
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        try:
            yield
        finally:
            dist.destroy_process_group()
    finally:
        torch.UntypedStorage.resize_ = resize  # type: ignore[method-assign]


def wrap_as_rank(model: nn.Module, knobs: Knobs, workload: Workload,
              storages: Storages) -> nn.Module:
    """The model as a rank of the job wraps it (``apply_parallel``) in the fake world: what the
    strategy allocates counts as parameters (FSDP's shards) or gradients (DDP's buckets)."""
    if not knobs.distributed:
        return model
    import torch.nn.parallel.distributed as ddp_module
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    fsdp = knobs.sharded
    verify = ddp_module._verify_param_shape_across_processes

    def verify_outside_fake(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():  # it writes the shapes into a tensor and reads them
            return verify(*args, **kwargs)

    ddp_module._verify_param_shape_across_processes = verify_outside_fake
    storages.phase = "parameters" if fsdp else "gradients"
    try:
        # FSDP's device mesh reads its ranks from a tensor: built outside the fake mode.
        with (unset_fake_temporarily() if fsdp else contextlib.nullcontext()), \
                dispatch_mode(storages):
            # On the CPU, whatever the machine's accelerator: the parameters are fake CPU
            # tensors (a CUDA mesh refuses them: "Expects the parameter to already be moved").
            model = apply_parallel(model, knobs, workload.blocks, torch.device("cpu"))
    finally:
        ddp_module._verify_param_shape_across_processes = verify
        storages.phase = "forward"
    storages.peaks.clear()  # wrapping (the model before sharding, DDP's broadcast) is no step
    if not fsdp:
        model.register_comm_hook(None, _bucket_back)
    return model


def _bucket_back(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations
    """The all-reduce of a DDP bucket as the real one leaves it (in place), since the fake
    group's returns no tensor for DDP's reducer."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
