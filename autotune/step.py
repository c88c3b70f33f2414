"""The one training step, and the knobs applied to torch objects.

``train_step`` is the step trials time, probes measure, the estimator traces and
``autotune.load`` runs; the generated script carries the same arithmetic (tests compare their
gradients). The functions here apply a ``knobs.Knobs`` to a model, an optimizer and batches:
the child's trial, the estimator and ``Tuned`` all call them, so every path applies a knob the
same way.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from autotune.knobs import KNOB, Knobs, KnobUnsupported, memory_budget
from autotune.step_knobs import (  # re-exported: callers reach every knob through step
    _blocks_of,
    apply_checkpointing,
    default_impl,
    find_blocks,  # noqa: F401
    optimizer_impls,
    rebuild_optimizer,
)
from autotune.traits import WorkloadTraits
from autotune.user_code import check_loss
from autotune.workload import Batch, Workload


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype for a precision, or None when it runs without autocast."""

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def autocast(precision: str, device_type: str) -> Any:
    """The autocast context for a precision (a no-op for fp32 and tf32)."""


    dtype = autocast_dtype(precision)
    return (contextlib.nullcontext() if dtype is None
            else torch.autocast(device_type=device_type, dtype=dtype))


def grad_scaler(precision: str, device_type: str) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 (its small range underflows gradients without one), else None."""

    return torch.amp.GradScaler(device_type) if precision == "fp16" else None


def set_matmul_precision(precision: str) -> None:
    """tf32 lets fp32 matmuls and convolutions use TensorFloat-32 (Ampere+); others stay exact."""

    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def compile_model(model: nn.Module, compile_mode: str, dynamic: bool | None = None, *,
                  scope: str = "model",
                  blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None
                  ) -> nn.Module:
    """``torch.compile`` with the mode, or the model (``off``).

    ``scope`` (``Knobs.compile_scope``): ``model`` wraps the whole model (after DDP/FSDP);
    ``blocks`` compiles each repeated block's ``forward`` (``blocks``, else ``find_blocks``,
    of the model under DDP's wrapper) in place and leaves the rest eager: the blocks share one
    compiled graph (regional compilation), and the model returned is the one given, its
    parameter names unchanged. A block checkpointed by ``apply_to_model`` (before) is compiled
    with its checkpoint inside, as whole-model compile traces it; the module's hooks (FSDP2's
    gathers and frees) stay eager around the compiled forward, as torchtitan's per-block
    compile keeps them outside.

    ``dynamic`` (``TunedConfig.compile_dynamic``): None is torch's automatic dynamic shapes,
    in trials and delivered paths alike. Its first compile is static (dynamo assumes every
    dim static until one changes), so a trial's fixed shape gets the graphs ``dynamic=False``
    gives; a dim that changes later compiles once more, dynamic, where ``dynamic=False``
    would compile once per shape and, past ``recompile_limit`` shapes, run eager.
    """
    if compile_mode == "off":
        return model
    if scope == "blocks":
        found = _blocks_of(unwrapped(model), blocks)
        if len(found) < 2:
            raise KnobUnsupported(KNOB["compile_scope"].needs("blocks", WorkloadTraits())
                                  or "no blocks")
        for block in found:
            block.forward = torch.compile(  # type: ignore[method-assign]
                block.forward, mode=None if compile_mode == "default" else compile_mode,
                dynamic=dynamic)
        return model

    return torch.compile(model, mode=None if compile_mode == "default" else compile_mode,
                         dynamic=dynamic)


def budget_patch(knobs: Knobs) -> contextlib.AbstractContextManager[Any]:
    """A context in which ``torch._functorch.config.activation_memory_budget`` is the knobs'
    ``budget-F`` (a no-op for other checkpointing values); torch's value again after it.

    Raises:
        KnobUnsupported: compile_mode off (nothing compiles to read it), or a torch without
            the setting.
    """
    budget = memory_budget(knobs.checkpointing)
    if budget is None:
        return contextlib.nullcontext()
    if not knobs.compiled:
        raise KnobUnsupported(f"checkpointing {knobs.checkpointing} needs a compiled mode (the "
                              "compiler applies it), and compile_mode is off")
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "activation_memory_budget"):
        raise KnobUnsupported(f"checkpointing {knobs.checkpointing}: torch {torch.__version__} "
                              "has no torch._functorch.config.activation_memory_budget")
    return functorch_config.patch(activation_memory_budget=budget)


def apply_memory_budget(model: nn.Module, knobs: Knobs) -> nn.Module:
    """The compiled model with the compiler's recompute of a ``budget-F`` checkpointing value:
    ``activation_memory_budget`` F is set around each of its calls (``budget_patch``; the
    partitioner reads it when a call compiles: the first, and any recompile), and only there:
    eager code and other compiled models keep torch's default. Other values: the model.

    Raises:
        KnobUnsupported: as ``budget_patch``.
    """
    budget_patch(knobs)  # refused here, not at the first call
    if memory_budget(knobs.checkpointing) is None:
        return model
    forward = model.forward

    @functools.wraps(forward)
    def budgeted(*args: Any, **kwargs: Any) -> Any:
        with budget_patch(knobs):
            return forward(*args, **kwargs)

    model.forward = budgeted  # type: ignore[method-assign]
    return model


def apply_to_model(model: nn.Module, knobs: Knobs,
                   blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None) -> nn.Module:
    """The knobs that change the model (checkpointing, memory format), in place, before it
    is compiled and its optimizer built.

    Raises:
        KnobUnsupported: a knob value the model cannot take.
    """

    apply_checkpointing(model, knobs.checkpointing, blocks)
    if knobs.memory_format == "channels_last":
        if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
            raise KnobUnsupported(
                KNOB["memory_format"].needs("channels_last", WorkloadTraits()) or "")
        # In place, as Module.to(memory_format=...) converts 4-D tensors (``.data =``): that
        # also works on fake tensors, whose mode refuses swapping a parameter for a new one.
        with torch.no_grad():
            for tensor in (*model.parameters(), *model.buffers()):
                if tensor.dim() == 4:
                    tensor.data = tensor.data.contiguous(memory_format=torch.channels_last)
    return model


def apply_parallel(model: nn.Module, knobs: Knobs,
                   blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None,
                   device: torch.device | None = None) -> nn.Module:
    """The model as its job's strategy runs it, after ``apply_to_model`` and before its
    optimizer is built and it is compiled: DistributedDataParallel (``ddp``;
    ``gradient_as_bucket_view`` for ``ddp-bucket-view``) or FSDP2 (``fully_shard`` on each
    repeated block, then the root; resharded after forward unless ``fsdp-no-reshard``; with
    bf16/fp16, parameters in that dtype for compute and gradients reduced in fp32). Without
    repeated blocks FSDP shards the root alone (one all-gather of every parameter). FSDP's
    device mesh is on ``device``'s type when given (else torch's default accelerator): a job
    on the CPU of a machine with a GPU, and the estimator's trace on fake CPU tensors, shard
    on the CPU.

    ``fully_shard`` replaces the parameters with sharded ones: build the optimizer over the
    returned model's parameters.

    Raises:
        KnobUnsupported: no process group to run the strategy in.
    """
    if not knobs.distributed:
        return model
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise KnobUnsupported(
            f"strategy {knobs.strategy} needs a process group: run under torchrun (autotune "
            "starts one per probe with --nproc-per-node)")
    if knobs.replicated:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device] if device is not None and device.type == "cuda" else None
        return DistributedDataParallel(
            model, device_ids=ids, gradient_as_bucket_view=knobs.strategy == "ddp-bucket-view")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = autocast_dtype(knobs.precision)
    policy = MixedPrecisionPolicy(param_dtype=dtype,
                                  reduce_dtype=torch.float32 if dtype is not None else None)
    reshard = knobs.strategy == "fsdp"
    mesh = None
    if device is not None:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in _blocks_of(model, blocks):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return model


def unwrapped(model: nn.Module) -> nn.Module:
    """The module under torch.compile's and DistributedDataParallel's wrappers."""
    model = getattr(model, "_orig_mod", model)
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def _sync_context(model: nn.Module, last: bool) -> Any:
    """DistributedDataParallel's ``no_sync`` on all but the last micro-batch of a step: the
    gradients are all-reduced once per optimizer step, as accumulation intends."""
    inner = getattr(model, "_orig_mod", model)
    if last or not hasattr(inner, "no_sync"):
        return contextlib.nullcontext()
    from torch.nn.parallel import DistributedDataParallel

    return inner.no_sync() if isinstance(inner, DistributedDataParallel) else (
        contextlib.nullcontext())


def apply_to_optimizer(optimizer: torch.optim.Optimizer, knobs: Knobs, *,
                       as_on_cuda: bool = False) -> torch.optim.Optimizer:
    """The optimizer the knobs run: as built, or rebuilt as their implementation.

    Args:
        optimizer: the workload's optimizer as built.
        knobs: the setting.
        as_on_cuda: run it as CUDA would though its tensors are elsewhere (the estimator's
            fake CPU tensors): an optimizer left to torch's choice runs foreach there (the
            for-loop on CPU), and foreach holds temporaries as large as the parameters.

    Raises:
        KnobUnsupported: its class cannot be rebuilt so.
    """
    impl = knobs.optimizer_impl
    left_to_torch = (optimizer.defaults.get("foreach", False) is None
                     and not optimizer.defaults.get("fused")
                     and not optimizer.defaults.get("differentiable")
                     and all(g.get("foreach") is None for g in optimizer.param_groups))
    if impl == "default" and as_on_cuda and left_to_torch:
        try:
            return rebuild_optimizer(optimizer, "foreach")
        except KnobUnsupported:
            return optimizer
    return rebuild_optimizer(optimizer, impl)


def apply_to_batch(batch: Any, knobs: Knobs) -> Any:
    """The batch as the knobs want it: 4-D floating-point tensors channels-last."""
    if knobs.memory_format != "channels_last":
        return batch

    def convert(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point():
            return t.contiguous(memory_format=torch.channels_last)
        return t

    if isinstance(batch, dict):
        return {k: convert(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(convert(v) for v in batch)
    return convert(batch)


def workload_traits(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any,
                    blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None
                    ) -> WorkloadTraits:
    """What decides which knob values apply to this workload (read once per child run)."""

    found = _blocks_of(model, blocks)
    tensors = (batch.values() if isinstance(batch, dict) else
               batch if isinstance(batch, (tuple, list)) else [batch])
    return WorkloadTraits(
        num_blocks=len(found),
        blocks=(f"{len(found)} x {type(found[0]).__name__}" if found else ""),
        hf_checkpointing=bool(getattr(model, "supports_gradient_checkpointing", False)),
        has_conv2d=any(isinstance(m, nn.Conv2d) for m in model.modules()),
        image_input=any(isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point()
                        for t in tensors),
        optimizer=type(optimizer).__name__, optimizer_impls=optimizer_impls(optimizer),
        optimizer_default=default_impl(optimizer))


def loss_weights(micro_batches: Sequence[Batch],
                 count_loss_items: Callable[[Batch], Any] | None) -> list[Any]:
    """Weight of each micro-batch's mean loss in the effective batch's loss.

    Without item counts every micro-batch weighs 1/k. With counts (e.g. label tokens), a
    micro-batch weighs its share of all items in the optimizer step, so the effective batch's
    loss is the mean over all its items: the same gradient as one big batch.
    """
    if count_loss_items is None:
        return [1.0 / len(micro_batches)] * len(micro_batches)
    counts = [count_loss_items(b) for b in micro_batches]
    total = sum(counts)
    return [c / total for c in counts]


def _own_grads(model: nn.Module) -> None:
    """Each parameter's gradient replaced by a copy (``train_step``'s ``cuda_graphs``)."""
    with torch.no_grad():
        for param in model.parameters():
            if param.grad is not None:
                param.grad = param.grad.clone()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               micro_batches: Sequence[Batch], workload: Workload, *, precision: str,
               device_type: str, scaler: torch.amp.GradScaler | None = None,
               on_backward: Callable[[], object] | None = None,
               cuda_graphs: bool = False,
               check: Callable[[], object] | None = None) -> torch.Tensor:
    """One optimizer step over the micro-batches of one effective batch.

    Forward and backward run per micro-batch under autocast; gradients accumulate in
    ``.grad`` (a DistributedDataParallel model all-reduces them at the last micro-batch's
    backward only: ``no_sync`` before); the optimizer steps once; gradients are freed
    (``set_to_none``).
    ``on_backward`` is called after each micro-batch's backward (a trial's clock marks the
    micro-batches' and the update's shares of the step there; it must not wait for the device).
    ``cuda_graphs`` (``Knobs.cuda_graphs``): the model replays CUDA graphs. The first
    micro-batch's backward then leaves in each ``.grad`` the backward graph's own output
    buffer (autograd adopts a fresh gradient instead of copying it), which the next
    micro-batch's replay overwrites: torch raises ("accessing tensor output of CUDAGraphs that
    has been overwritten"), or an older one adds the wrong gradients silently
    (pytorch/pytorch#169545). With more micro-batches to come, those gradients are copied out
    of the graph's memory first.
    ``check`` is called after each micro-batch's forward and after the last backward, before
    the update (the out-of-memory fallback's agreement of the ranks, ``autotune.fallback``).

    Returns:
        The effective batch's loss (detached), computed before the update.

    Raises:
        WorkloadError: the workload's loss is not a scalar floating-point tensor that requires
            grad (checked from metadata only: no device sync).
    """
    first = next(iter(model.parameters()))
    total = torch.zeros((), device=getattr(first, "_local_tensor", first).device)
    weights = loss_weights(micro_batches, workload.count_loss_items)
    for i, (weight, batch) in enumerate(zip(weights, micro_batches, strict=True)):
        with _sync_context(model, i == len(weights) - 1):
            with autocast(precision, device_type):
                loss = workload.compute_loss(model, batch)
                check_loss(loss, workload.name)
                loss = loss * weight
            if check is not None:
                check()
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.detach().float()
        if cuda_graphs and i == 0 and len(weights) > 1:
            _own_grads(model)
        if on_backward is not None:
            on_backward()
    if check is not None:
        check()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
