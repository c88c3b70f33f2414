"""The mid-run out-of-memory fallback: a smaller micro-batch, the same effective batch.

Real data can be longer than the declared worst case, fragmentation grows over hours, a
neighbour takes memory. A step that runs out of memory (``autotune.trial_status.is_out_of_memory``,
the one classifier the search uses) is redone from its first micro-batch with the next smaller
divisor of the per-device batch: the same samples, regrouped, with more accumulation steps, so
the effective batch and the gradient stay what they were. Nothing of the failed attempt is
kept (its gradients are set to None before the retry). After ``max_in_a_row`` fallbacks
without a completed step it stops with ``OutOfMemoryFallbackError``.

Ranks (DDP, FSDP) agree: every rank checks in after each micro-batch's forward and after the
last backward (``step.train_step``'s ``check``), with one all-reduce of a flag; a rank that ran
out of memory checks in once with the flag raised, so every rank leaves the attempt at the same
check, and the new micro-batch is the smallest any rank chose (an all-reduce too).

``Tuned.train_step(..., oom_fallback=True)`` runs it; ``train_autotuned.py`` carries the same
logic as plain code (tests keep the two equal).
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from autotune.errors import ConfigError, OutOfMemoryFallbackError, WorkloadError
from autotune.oom_text import oom_cause
from autotune.trial_status import is_out_of_memory
from autotune.units import accumulate_steps
from autotune.workload import Batch

T = TypeVar("T")
LOG = logging.getLogger("autotune.fallback")


def batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor.

    Raises:
        WorkloadError: the batch holds no tensor (nothing to regroup by samples).
    """
    found = _first_tensor(batch)
    if found is None:
        raise WorkloadError(
            f"the out-of-memory fallback regroups a batch's samples along the first dimension "
            f"of its tensors, and a batch of type {type(batch).__name__} holds none: pass "
            "tensors, or dicts, tuples or lists of them")
    return found.shape[0]


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, dict) else (
        batch if isinstance(batch, (tuple, list)) else ())
    return next((t for t in map(_first_tensor, values) if t is not None), None)


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {key: _slice(value, start, stop) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_slice(value, start, stop) for value in batch)
    return batch  # not per sample (a flag, a length): every part keeps it


def _cat(parts: Sequence[Any]) -> Any:
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(parts)) if len(parts) > 1 else first
    if isinstance(first, dict):
        return {key: _cat([part[key] for part in parts]) for key in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_cat(column) for column in zip(*parts, strict=True))
    return first


def _shapes(batch: Any) -> list[tuple[int, ...]]:
    """Each tensor's shape after the first dimension (what must match to join samples)."""
    if isinstance(batch, torch.Tensor):
        return [tuple(batch.shape[1:])]
    values = batch.values() if isinstance(batch, dict) else (
        batch if isinstance(batch, (tuple, list)) else [])
    return [shape for value in values for shape in _shapes(value)]


def ragged(micro_batches: Sequence[Batch]) -> bool:
    """The micro-batches' tensors differ beyond the first dimension (e.g. their lengths): a
    new micro-batch must not join samples of two of them."""
    return any(_shapes(b) != _shapes(micro_batches[0]) for b in micro_batches[1:])


def smaller_micro_batch(per_device: int, current: int, must_divide: Sequence[int] = ()) -> int:
    """The next smaller divisor of the per-device batch below ``current``.

    Args:
        per_device: samples per device per optimizer step.
        current: the micro-batch that ran out of memory.
        must_divide: sizes it must divide too (the given micro-batches', when they are ragged:
            a new micro-batch never joins two of them).

    Returns:
        That divisor, or 0 when there is none.
    """
    return next((d for d in range(min(current, per_device + 1) - 1, 0, -1)
                 if per_device % d == 0 and all(s % d == 0 for s in must_divide)), 0)


def split_micro_batches(micro_batches: Sequence[Batch], size: int) -> list[Batch]:
    """The samples of ``micro_batches``, in their order, as micro-batches of ``size`` samples
    (the batches themselves when they already are). Ragged micro-batches are split each on its
    own (``size`` must divide each).

    Raises:
        ConfigError: the samples do not split so (``smaller_micro_batch`` only picks sizes that
            do).
    """
    sizes = [batch_size(b) for b in micro_batches]
    if all(s == size for s in sizes):
        return list(micro_batches)
    if ragged(micro_batches):
        if any(s % size for s in sizes):
            raise ConfigError(f"micro-batches of {sizes} samples and different shapes cannot be "
                              f"regrouped into micro-batches of {size}: pick a size that "
                              "divides each")
        return [_slice(b, i, i + size) for b, s in zip(micro_batches, sizes, strict=True)
                for i in range(0, s, size)]
    if sum(sizes) % size:
        raise ConfigError(f"{sum(sizes)} samples do not split into micro-batches of {size}: "
                          "pick a divisor of the samples per step")
    pieces = [(b, s) for b, s in zip(micro_batches, sizes, strict=True)]
    out: list[Batch] = []
    group: list[Any] = []
    room = size
    for batch, samples in pieces:
        start = 0
        while start < samples:
            take = min(room, samples - start)
            group.append(_slice(batch, start, start + take))
            start += take
            room -= take
            if room == 0:
                out.append(_cat(group))
                group, room = [], size
    return out


class PeerOutOfMemory(RuntimeError):
    """Another rank of the job ran out of memory in this attempt of the step."""


def any_rank(flag: bool, device: torch.device) -> bool:
    """``flag`` of any rank of the job (the flag itself without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    tensor = torch.tensor([int(flag)], device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def smallest_of_ranks(value: int, device: torch.device) -> int:
    """The smallest ``value`` over the job's ranks."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


class OomFallback:
    """The fallback's state over a run: the micro-batch now used, the fallbacks in a row.

    Args:
        max_in_a_row: fallbacks without a completed step before it stops (at least 1).
        log: where the one line per fallback goes (default: the ``autotune.fallback`` logger,
            as a warning).
    """

    def __init__(self, max_in_a_row: int = 3, log: Callable[[str], object] | None = None
                 ) -> None:
        if isinstance(max_in_a_row, bool) or not isinstance(max_in_a_row, int) or (
                max_in_a_row < 1):
            raise ConfigError(f"max_oom_fallbacks must be a whole number of at least 1, got "
                              f"{max_in_a_row!r}: pass oom_fallback=False to turn the fallback "
                              "off")
        self.max_in_a_row = max_in_a_row
        self.micro_batch: int | None = None  # None: the micro-batches as given
        self.in_a_row = 0
        self.fallbacks = 0
        self.log = log or LOG.warning

    def run(self, step: Callable[[list[Batch], Callable[[], None]], T],
            micro_batches: Sequence[Batch], *, optimizer: torch.optim.Optimizer,
            device: torch.device, model: torch.nn.Module | None = None) -> T:
        """``step(micro_batches, check)``, redone with smaller micro-batches after an
        out-of-memory error on any rank.

        Raises:
            OutOfMemoryFallbackError: ``max_in_a_row`` fallbacks without a completed step, no
                smaller micro-batch, or an out-of-memory error in the optimizer's update
                (which a smaller micro-batch does not shrink).
        """
        sizes = [batch_size(b) for b in micro_batches]
        per_device = sum(sizes)
        saved = running_stats(model) if model is not None else {}
        while True:
            size = self.micro_batch or sizes[0]
            batches = split_micro_batches(micro_batches, size)
            checks = _Checks(device)
            failure = ""
            try:
                result = step(batches, checks)
            except PeerOutOfMemory as exc:
                failure = str(exc)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                if checks.count == len(batches) and _ddp_job(model):
                    raise OutOfMemoryFallbackError(
                        f"out of memory in the last micro-batch's backward "
                        f"({oom_cause(exc)}), where DDP all-reduces the gradients: the other "
                        "ranks wait inside that all-reduce, so the ranks cannot agree on a "
                        "fallback; lower the micro-batch in autotune.json (codegen again) or "
                        "free memory") from exc
                if checks.count > len(batches):  # every rank passed the last check: the update
                    raise OutOfMemoryFallbackError(
                        f"out of memory in the optimizer's update, which a smaller "
                        f"micro-batch does not shrink ({oom_cause(exc)}): free memory "
                        "elsewhere, or shard the optimizer state (strategy fsdp)") from exc
                failure = oom_cause(exc)
                any_rank(True, device)  # the others leave the attempt at this check
            else:
                self.in_a_row = 0
                return result
            # The failed attempt's frames (activations, losses) are gone with its exception.
            optimizer.zero_grad(set_to_none=True)
            if model is not None:
                restore_running_stats(model, saved)
                reset_ddp(model)
            del batches
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            must_divide = sizes if ragged(micro_batches) else ()
            smaller = smallest_of_ranks(smaller_micro_batch(per_device, size, must_divide),
                                        device)
            self.in_a_row += 1
            if smaller == 0:
                raise OutOfMemoryFallbackError(
                    f"out of memory at micro-batch {size} ({failure}) after no smaller "
                    f"micro-batch: the step of {per_device} samples per device does not fit; "
                    "lower the target batch, free memory (checkpointing, a smaller precision) "
                    "or re-run autotune search under the memory you have")
            if self.in_a_row > self.max_in_a_row:  # the limit, not the memory, ends it
                left = [d for d in range(size - 1, 0, -1)
                        if per_device % d == 0 and all(s % d == 0 for s in must_divide)]
                raise OutOfMemoryFallbackError(
                    f"out of memory at micro-batch {size} ({failure}): "
                    f"{used_up(self.max_in_a_row, left, 'max_oom_fallbacks', '=')}, or lower the "
                    "micro-batch you split the batch into")
            self.micro_batch = smaller
            self.fallbacks += 1
            accumulate = accumulate_steps(per_device, smaller)
            self.log(f"out of memory at micro-batch {size} ({failure}): redoing the step "
                     f"with micro-batch {smaller} x {accumulate} accumulation "
                     f"(effective batch unchanged; fallback {self.in_a_row} of "
                     f"{self.max_in_a_row} in a row)")


def used_up(limit: int, left: Sequence[int], name: str, sep: str) -> str:
    """Why the fallback stopped while smaller micro-batches were ``left`` (largest first):
    its ``limit`` of fallbacks in a row, not the memory; raising ``name`` (written
    ``name{sep}value``) would have gone on. The generated script says the same of
    ``--oom-fallbacks``."""
    shown = ", ".join(map(str, left[:4])) + (", ..." if len(left) > 4 else "")
    return (f"{limit} fallback{'s' if limit > 1 else ''} in a row used up ({name}{sep}{limit}) "
            f"with smaller micro-batches left to try ({shown}): raise {name} "
            f"({name}{sep}{limit + len(left)} tries them all)")


def is_sharded(model: torch.nn.Module) -> bool:
    """The model has FSDP2-sharded modules (each forward and backward runs collectives).

    No module is sharded before ``torch.distributed.fsdp`` was imported (``fully_shard`` lives
    there): a step does not import it to find out (3 s on a 2-core CPU, each process)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return False
    return any(isinstance(m, fsdp.FSDPModule)
               for m in getattr(model, "_orig_mod", model).modules())


def running_stats(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of what a training forward changes besides activations: the running statistics
    of normalization layers (BatchNorm, SyncBatchNorm, InstanceNorm tracking them), put back
    after a failed attempt so the redo updates them once, as a run at the smaller micro-batch
    does."""
    return {f"{name}.{key}": buffer.detach().clone()
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.modules.batchnorm._NormBase)
            and module.track_running_stats
            for key, buffer in module.named_buffers(recurse=False) if buffer is not None}


def restore_running_stats(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """The buffers ``running_stats`` copied, back in place."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in saved:
                buffer.copy_(saved[name])


def _ddp_job(model: torch.nn.Module | None) -> bool:
    """A DistributedDataParallel model in a job of several ranks."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    return (isinstance(getattr(model, "_orig_mod", model), DistributedDataParallel)
            and dist.is_initialized() and dist.get_world_size() > 1)


def reset_ddp(model: torch.nn.Module) -> None:
    """A DistributedDataParallel model ready for a new forward after an attempt left without
    its backward: a rank whose last micro-batch's forward ran (outside ``no_sync``) has its
    reducer waiting for that backward, and its next backward would all-reduce while the other
    ranks do not (gloo: "Received data size doesn't match expected size"). Every rank resets
    (buckets rebuilt at the next step, alike on every rank), as DDP's own
    ``_update_process_group`` does."""
    from torch.nn.parallel import DistributedDataParallel

    inner = getattr(model, "_orig_mod", model)
    if isinstance(inner, DistributedDataParallel):
        inner._has_rebuilt_buckets = False
        inner.reducer._reset_state()


class _Checks:
    """``step.train_step``'s ``check``: every rank checks in, an all-reduce of "none ran out
    of memory" (counted: past the last one, the update runs)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.count = 0

    def __call__(self) -> None:
        self.count += 1
        if any_rank(False, self.device):
            raise PeerOutOfMemory("another rank ran out of memory")
