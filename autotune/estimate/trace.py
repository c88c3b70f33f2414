"""Trace one training step under fake tensors: its peak live tensor bytes, by kind.

The real step (``trial.train_step``: two accumulated micro-batches, the precision's autocast,
the optimizer step; the state it creates is counted as alive in the next step) runs under
``FakeTensorMode`` on fake CPU tensors, with the model built inside the fake mode and the knobs
applied as a trial applies them (checkpointed blocks, the optimizer rebuilt, channels-last
batches): no tensor holds data, so a model far larger than RAM can be estimated in seconds. A
dispatch mode counts the bytes of every live tensor storage (freed through weakref finalizers)
and keeps the breakdown at the peak; a checkpointed block's recompute in backward counts as
backward temporaries.

What the figure counts: live tensor storage bytes at the step's peak (parameters and buffers,
gradients, optimizer state, inputs, activations saved for backward, backward temporaries).
What it does not count: a CUDA context and library workspaces (cuBLAS, cuDNN), the caching
allocator's rounding and fragmentation, kernels' internal scratch buffers, and on CPU the process
overhead (malloc arenas, thread stacks, freed memory the allocator keeps). The headroom covers
those; ``autotune.json`` calibration (measured / estimate) corrects for them per knob setting.
Compiled modes cannot be traced this way: the figure is always the eager step's. The allocator
knob changes no tensor: it moves only what the calibration and the headroom cover.

A job of several ranks is traced as its rank 0 under a fake process group (``ranks``); the
live bytes are counted by ``tracker``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from autotune.errors import ConfigError, UntraceableStepError, WorkloadError
from autotune.estimate.ranks import check_world, traced_world, wrap_as_rank
from autotune.estimate.tracker import CATEGORIES, OpFailed, Storages, dispatch_mode
from autotune.knobs import BASELINE, Knobs, KnobUnsupported
from autotune.shapes import declared_lengths, worst_batch
from autotune.step import (
    apply_to_batch,
    apply_to_model,
    apply_to_optimizer,
    set_matmul_precision,
    train_step,
)
from autotune.user_code import check_model
from autotune.workload import Workload, check_batch, count_parameters

Kernels = Literal["cuda", "cpu"]


@dataclass(frozen=True, kw_only=True)
class StepEstimate:
    """Live tensor bytes at the peak of one traced training step, by kind."""

    micro_batch: int
    knobs: Knobs
    """The knobs the step was traced with (compiled modes traced eager)."""
    kernels: Kernels
    """Whose kernel choices were modelled: ``cuda`` runs attention as CUDA's memory-efficient
    fused kernel (no seq x seq scores) and an optimizer left to choose as foreach; ``cpu``
    keeps what the CPU runs (SDPA's math fallback when there is dropout or a mask, the
    for-loop optimizer)."""
    peak_bytes: int
    parameters_bytes: int
    """Parameters and buffers."""
    gradients_bytes: int
    """Gradients, and DDP's all-reduce buckets: one more copy of them. With bucket view the
    synchronized micro-batch's gradients are views of the buckets, the first (``no_sync``)
    micro-batch's are not (``zero_grad`` set them to None): it saves at the optimizer step."""
    optimizer_bytes: int
    """Optimizer state (and, while the optimizer steps, its temporaries)."""
    inputs_bytes: int
    """The accumulated micro-batches' input tensors."""
    activations_bytes: int
    """Tensors made in forward (saved for backward, autocast copies) alive at the peak."""
    temporaries_bytes: int
    """Tensors made in backward that are not gradients, alive at the peak."""
    peak_phase: str
    """``forward``, ``backward`` or ``optimizer step``: where the peak happened."""
    num_parameters: int
    """Of the whole model (not one rank's shard)."""
    trace_s: float
    world_size: int = 1
    """The job's ranks. With a ``knobs.strategy`` the step was traced as its rank 0 in a fake
    process group of that many, and the figures are one rank's: FSDP's parameters, gradients
    and optimizer state are its shards, the blocks' gathered parameters count as activations
    in forward and temporaries in backward. Without one, each rank runs the step alone."""

    @property
    def precision(self) -> str:
        """The traced precision (``knobs.precision``)."""
        return self.knobs.precision


def _fused_attention(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """SDPA as CUDA's memory-efficient kernel (its meta kernel runs on fake CPU tensors)."""

    def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
             **kwargs: Any) -> torch.Tensor:
        if kwargs or enable_gqa or query.dim() != 4 or key.shape[1] != query.shape[1]:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, **kwargs)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:  # as CUDA's SDPA does: an additive -inf bias
                attn_mask = torch.zeros((), dtype=query.dtype).masked_fill(
                    attn_mask.logical_not(), float("-inf"))
            attn_mask = attn_mask.to(query.dtype).expand(
                query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, query.requires_grad, dropout_p, is_causal, scale=scale)
        return out[0]

    return sdpa


@contextlib.contextmanager
def _kernels(kernels: Kernels) -> Iterator[None]:
    if kernels != "cuda":
        yield
        return
    original = nn.functional.scaled_dot_product_attention
    nn.functional.scaled_dot_product_attention = _fused_attention(original)
    try:
        yield
    finally:
        nn.functional.scaled_dot_product_attention = original


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Transformers' notes on the traced model (its loss type, its defaults) are silenced, as
    in the trial children (``TRANSFORMERS_VERBOSITY=error``): they are not the user's code."""
    module = sys.modules.get("transformers")
    if module is None:
        yield
        return
    logging = module.utils.logging
    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)


def estimate_step(workload: Workload, micro_batch: int, *, knobs: Knobs = BASELINE,
                  kernels: Kernels = "cuda", world_size: int = 1,
                  seed: int = 0) -> StepEstimate:
    """Trace the real training step under fake tensors and return its peak breakdown.

    One ``train_step`` runs (two accumulated micro-batches, one optimizer step); the optimizer
    state it creates is added to its forward/backward peak, which is what the second and later
    steps see (their gradients were freed by ``zero_grad``, the state was not).

    Args:
        workload: what to train (its factories run inside the fake mode).
        micro_batch: samples per forward/backward.
        knobs: applied as a trial applies them: the precision's autocast (fp16's GradScaler is
            left out: its inf check reads data, and its unscale is in place), checkpointed
            blocks (their recompute in backward is traced), the optimizer rebuilt, channels-last
            model and batches. A compile mode is traced eager; the allocator changes no tensor.
        kernels: whose kernel choices to model (see ``StepEstimate.kernels``).
        world_size: ranks of the job: with ``knobs.strategy`` ddp or fsdp, the step is traced
            as its rank 0 in a fake process group of that many ranks (see the module's notes).
        seed: as ``torch.manual_seed`` in a trial.

    Raises:
        WorkloadError: the workload or one of its ops cannot run under fake tensors; the
            message names the op (``UntraceableStepError``).
        ConfigError: a knob value the workload cannot take (e.g. checkpointing without
            repeated blocks), an unknown strategy or a world size below 1.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    check_world(knobs.strategy, world_size)
    start = time.perf_counter()
    storages = Storages()
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    set_matmul_precision(knobs.precision)
    try:
        with traced_world(knobs.strategy, world_size, storages), \
                FakeTensorMode(allow_non_fake_inputs=True), _kernels(kernels), \
                _quiet_transformers():
            torch.manual_seed(seed)
            model = workload.build_model()  # on the (fake) CPU, as the contract says
            check_model(model, workload.name)
            apply_to_model(model, knobs, workload.blocks)
            for tensor in (*model.parameters(), *model.buffers()):
                storages.track(tensor, "parameters")
            model = wrap_as_rank(model, knobs, workload, storages)
            optimizer = apply_to_optimizer(workload.make_optimizer(model.parameters()), knobs,
                                           as_on_cuda=kernels == "cuda")
            hooks = _install_hooks(model, optimizer, storages)
            try:
                with dispatch_mode(storages):
                    torch.manual_seed(seed + 1)
                    storages.phase = "inputs"
                    batches = _make_batches(workload, micro_batch, knobs)
                    storages.phase = "forward"
                    train_step(model, optimizer, batches, workload, precision=knobs.precision,
                               device_type="cpu", cuda_graphs=knobs.cuda_graphs)
            finally:
                for hook in hooks:
                    hook.remove()
            num_parameters = count_parameters(model)
            local = [getattr(v, "_local_tensor", v).untyped_storage()  # a DTensor's shard
                     for st in optimizer.state.values() for v in st.values()
                     if isinstance(v, torch.Tensor)]
            state = {id(storage): storage.nbytes() for storage in local}
            state_bytes = sum(state.values())
    except WorkloadError:
        raise
    except KnobUnsupported as exc:
        raise ConfigError(f"workload {workload.name!r} cannot take {knobs.label()}: {exc}"
                          ) from exc
    except OpFailed as exc:
        raise UntraceableStepError(
            f"workload {workload.name!r}: the training step cannot be traced under fake "
            f"tensors: {exc}. Ops that read tensor values (.item(), .tolist(), data-dependent "
            "shapes or branches) cannot be estimated; measure a real step on a device instead "
            "(autotune check --measure, autotune probe)") from exc
    except Exception as exc:
        raise UntraceableStepError(
            f"workload {workload.name!r}: the training step failed under fake tensors "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
            "Measure a real step on a device instead (autotune check --measure)") from exc
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return _combine(storages, state_bytes, micro_batch=micro_batch, knobs=knobs,
                    kernels=kernels, num_parameters=num_parameters, world_size=world_size,
                    trace_s=time.perf_counter() - start)


def _make_batches(workload: Workload, micro_batch: int, knobs: Knobs) -> list[Any]:
    """Two micro-batches as the knobs want them (what ``apply_to_batch`` replaced is freed)."""
    lengths = declared_lengths(workload)  # memory at the worst case, whatever the policy
    batches = [worst_batch(workload, micro_batch, lengths) for _ in range(2)]
    for batch in batches:
        check_batch(batch, micro_batch, workload.name)
    return [apply_to_batch(batch, knobs) for batch in batches]



def _combine(storages: Storages, state_bytes: int, **fields: Any) -> StepEstimate:
    # One optimizer step is traced. The second differs only in that the optimizer state made by
    # the first is alive through its forward and backward: add it there. The optimizer step's
    # own peak (state created, plus its temporaries) is the same in both.
    total, by_kind, phase = storages.peaks.get("fwdbwd", (0, dict.fromkeys(CATEGORIES, 0), ""))
    by_kind = {**by_kind, "optimizer": by_kind["optimizer"] + state_bytes}
    total += state_bytes
    if storages.peaks.get("step", (-1,))[0] > total:
        total, by_kind, phase = storages.peaks["step"]
    return StepEstimate(
        peak_bytes=total, parameters_bytes=by_kind["parameters"],
        gradients_bytes=by_kind["gradients"], optimizer_bytes=by_kind["optimizer"],
        inputs_bytes=by_kind["inputs"], activations_bytes=by_kind["activations"],
        temporaries_bytes=by_kind["temporaries"], peak_phase=phase, **fields)


def _install_hooks(model: nn.Module, optimizer: torch.optim.Optimizer,
                   storages: Storages) -> list[Any]:
    def grad_done(param: torch.Tensor) -> None:
        if param.grad is not None:
            storages.track(param.grad, "gradients", relabel=True)

    def step_pre(*_: Any) -> None:
        storages.phase = "optimizer step"

    def step_post(opt: torch.optim.Optimizer, *_: Any) -> None:
        storages.phase = "forward"
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    storages.track(value, "optimizer", relabel=True)

    hooks = [p.register_post_accumulate_grad_hook(grad_done)
             for p in model.parameters() if p.requires_grad]
    hooks.append(optimizer.register_step_pre_hook(step_pre))
    hooks.append(optimizer.register_step_post_hook(step_post))
    return hooks
