"""Estimate the memory of one training step without a GPU and without real weights.

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
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from autotune.boundary import Point, bracket, first_candidate, next_candidate
from autotune.errors import ConfigError, UntraceableStepError, WorkloadError
from autotune.knobs import BASELINE, KNOB, Knobs, KnobUnsupported, memory_budget
from autotune.shapes import declared_lengths, worst_batch
from autotune.step import (
    apply_parallel,
    apply_to_batch,
    apply_to_model,
    apply_to_optimizer,
    set_matmul_precision,
    train_step,
)
from autotune.units import accumulate_steps, format_bytes
from autotune.workload import Workload, check_batch, check_model, count_parameters

Kernels = Literal["cuda", "cpu"]
CATEGORIES = ("parameters", "gradients", "optimizer", "inputs", "activations", "temporaries")


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


MAX_GROWTH = 4.0
"""Most a calibration may scale the estimate's per-sample growth: a measured growth beyond it is
implausible (noise between two close points, or a measured peak of another model)."""


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """A search's measured peak beside the estimate of the same config: it corrects later
    estimates of that memory class, and never turns a miss into a fit.

    The estimate counts tensors, so what it misses is mostly a constant (kernel scratch, a
    CUDA context, allocator caching): the measured peak's excess over the estimate is added as
    a constant, never subtracted. When the search measured two micro-batches far enough apart,
    the part that grows with the micro-batch is scaled by the measured growth over the
    estimated one, bounded to [1, ``MAX_GROWTH``]. So ``apply(e) >= e`` always.
    """

    micro_batch: int
    """Where the peak was measured and traced."""
    measured_peak_bytes: int
    estimate_bytes: int
    growth: float = 1.0
    """Measured per-sample growth over the estimate's, bounded to [1, ``MAX_GROWTH``]."""
    notes: tuple[str, ...] = ()
    """What was implausible in the stored figures, and how it was bounded."""

    @classmethod
    def from_record(cls, record: dict[str, int], label: str) -> Calibration | None:
        """The calibration stored in ``autotune.json`` for one memory class (``label``); None
        when it holds nothing usable (the note says so through ``describe``)."""
        m = record.get("micro_batch", 0)
        measured = record.get("measured_peak_bytes", 0)
        traced = record.get("estimate_bytes", 0)
        if min(m, measured, traced) <= 0:
            return None
        growth, notes = 1.0, []
        m0 = record.get("growth_micro_batch", 0)
        measured0 = record.get("growth_measured_peak_bytes", 0)
        traced0 = record.get("growth_estimate_bytes", 0)
        if 0 < m0 < m and traced > traced0 > 0 and measured0 > 0:
            raw = (measured - measured0) / (traced - traced0)
            growth = min(max(raw, 1.0), MAX_GROWTH)
            if not 1 / MAX_GROWTH <= raw <= MAX_GROWTH:
                notes.append(f"{label}'s stored calibration is implausible: it measured "
                             f"{raw:.2f}x the estimated growth per sample between micro-batches "
                             f"{m0} and {m}; bounded to {growth:.2f}x")
        ratio = measured / traced
        if ratio < 1 / MAX_GROWTH:  # the trace counts tensors a real step holds too
            notes.append(f"{label}'s stored calibration is implausible (measured peak "
                         f"{ratio:.3g}x the estimate at micro-batch {m}): it only ever adds to "
                         "the estimate, so the check stays on the safe side")
        return cls(micro_batch=m, measured_peak_bytes=measured, estimate_bytes=traced,
                   growth=growth, notes=tuple(notes))

    @classmethod
    def ratio(cls, ratio: float) -> Calibration:
        """A plain measured/estimate ratio (``assert_fits(calibration=...)``), applied to the
        growth and never below 1."""
        return cls(micro_batch=1, measured_peak_bytes=0, estimate_bytes=0,
                   growth=min(max(float(ratio), 1.0), MAX_GROWTH))

    def offset_bytes(self) -> int:
        """What the measured peak had beyond the (growth-scaled) estimate: never negative."""
        return max(0, self.measured_peak_bytes - int(self.estimate_bytes * self.growth))

    def apply(self, traced_bytes: int) -> int:
        """A traced peak corrected by the measurement: at least the traced peak."""
        return int(traced_bytes * self.growth) + self.offset_bytes()

    def traced_limit(self, usable_bytes: int) -> int:
        """The largest traced peak whose corrected figure stays within ``usable_bytes``."""
        return int((usable_bytes - self.offset_bytes()) / self.growth)

    def describe(self) -> str:
        """E.g. ``+12.0 MiB measured beyond the estimate at micro-batch 8, growth x1.00``."""
        return (f"+{format_bytes(self.offset_bytes())} measured beyond the estimate at "
                f"micro-batch {self.micro_batch}, per-sample growth x{self.growth:.2f}")


@dataclass(frozen=True, kw_only=True)
class EstimateReport:
    """An estimated step, and what fits a device memory with headroom."""

    workload_name: str
    estimate: StepEstimate
    """The step at the asked micro-batch."""
    device_memory_bytes: int
    headroom: float
    usable_bytes: int
    """Device memory minus headroom: an estimated peak that fits stays under this."""
    max_micro_batch: int
    """Largest micro-batch whose estimated peak fits (0: none)."""
    max_peak_bytes: int | None
    """The corrected peak at ``max_micro_batch``."""
    target_batch: int | None = None
    world_size: int = 1
    pairs: tuple[tuple[int, int], ...] = ()
    """(micro_batch, accumulate_steps) that fit the target batch, largest micro-batch last."""
    calibration: Calibration | None = None
    """The correction applied to peaks, from ``autotune.json``, or None."""
    traced: tuple[tuple[int, int], ...] = ()
    """(micro_batch, traced peak bytes) of every step traced, uncorrected."""
    notes: tuple[str, ...] = ()
    any_max_micro_batch: int | None = None
    """The largest micro-batch up to the per-device batch that fits, a divisor of it or not
    (None: not searched)."""

    def fits(self) -> bool:
        """True when the asked micro-batch's estimated peak fits."""
        return self.peak_bytes() <= self.usable_bytes

    def peak_bytes(self) -> int:
        """The asked micro-batch's peak, corrected by the calibration."""
        return self.corrected(self.estimate.peak_bytes)

    def corrected(self, traced_bytes: int) -> int:
        """A traced peak with the calibration applied (never less than traced)."""
        return self.calibration.apply(traced_bytes) if self.calibration else traced_bytes


@dataclass(frozen=True, kw_only=True)
class EstimateRequest:
    """What to estimate: everything but the workload, so it can travel to a child process."""

    micro_batch: int
    device_memory_bytes: int
    knobs: Knobs = BASELINE
    """What to trace the step with (precision, checkpointing, optimizer implementation, memory
    format; a compile mode is traced eager)."""
    headroom: float = 0.1
    candidates: tuple[int, ...] | None = None
    """Allowed micro-batches (divisors of the per-device batch), or None for any."""
    target_batch: int | None = None
    world_size: int = 1
    """Data-parallel ranks of the job: the target batch is divided over them, and with a
    ``knobs.strategy`` the step is traced as one rank of that many (fake process group)."""
    kernels: Kernels = "cuda"
    calibration: Calibration | None = None
    find_max: bool = True
    also_trace: tuple[int, ...] = ()
    """Micro-batches to trace besides the asked one (a calibration's second point)."""
    any_micro_batch: bool = False
    """With ``candidates`` and ``find_max``: also the largest micro-batch of any size."""


ESTIMATE_NOTE = (
    "counts live tensor bytes at the step's peak (fake-tensor trace of the eager step); not "
    "counted: CUDA context and library workspaces, allocator caching and fragmentation, "
    "kernels' internal scratch, CPU process overhead. The headroom is there for those")


BUDGET_NOTE = (
    "checkpointing {}: not modelled: the compiler picks what to recompute when the model "
    "compiles, which a trace of the eager step cannot follow; traced as checkpointing off (the "
    "eager step's activations, more than the compiled step keeps with the budget). A search's "
    "measured peak of the setting (its calibration, `autotune check`) is the figure to trust")


STRATEGY_NOTE = {
    "ddp": "gradients include DDP's all-reduce buckets, a second copy of them (bucket view "
           "makes the synchronized micro-batch's gradients views of the buckets, not the "
           "first no_sync micro-batch's: it saves only where the optimizer step peaks)",
    "fsdp": "parameters, gradients and optimizer state are this rank's shards; the blocks' "
            "gathered parameters count as activations (forward) and temporaries (backward); "
            "not counted: the whole model a rank builds before it shards it"}


class _Storages:
    """Live storage bytes by kind, the running total and the breakdown at its peak."""

    def __init__(self) -> None:
        self.records: dict[int, list[Any]] = {}
        self.by_kind = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.phase = "forward"
        # Peaks kept apart for forward/backward and for the optimizer step (see estimate_step).
        self.peaks: dict[str, tuple[int, dict[str, int], str]] = {}

    def track(self, tensor: torch.Tensor, kind: str, *, relabel: bool = False) -> None:
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass

        if is_traceable_wrapper_subclass(tensor):  # a DTensor: its local shard holds the bytes
            for name in tensor.__tensor_flatten__()[0]:
                inner = getattr(tensor, name)
                if isinstance(inner, torch.Tensor):
                    self.track(inner, kind, relabel=relabel)
            return
        storage = tensor.untyped_storage()
        record = self.records.get(id(storage))
        if record is not None:
            if relabel and record[1] != kind:
                self.by_kind[record[1]] -= record[0]
                self.by_kind[kind] += record[0]
                record[1] = kind
            return
        size = storage.nbytes()
        key = id(storage)
        record = [size, kind]
        self.records[key] = record
        # The storage's Python object lives as long as any tensor on it: its end is the free.
        weakref.finalize(storage, self._free, key)
        self._grow(kind, size)

    def resized(self, storage: torch.UntypedStorage) -> None:
        """A storage resized in place: FSDP frees its gathered parameters so, and regrows them."""
        record = self.records.get(id(storage))
        if record is not None:
            size, record[0] = record[0], storage.nbytes()
            self._grow(record[1], record[0] - size)

    def _grow(self, kind: str, size: int) -> None:
        self.by_kind[kind] += size
        self.current += size
        group = "step" if self.phase == "optimizer step" else "fwdbwd"
        if self.current > self.peaks.get(group, (-1,))[0]:
            self.peaks[group] = (self.current, dict(self.by_kind), self.phase)

    def _free(self, key: int) -> None:
        size, kind = self.records.pop(key)
        self.by_kind[kind] -= size
        self.current -= size


def _dispatch_mode(storages: _Storages) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map_only

    class _Tracker(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            try:
                out = func(*args, **(kwargs or {}))
            except Exception as exc:
                raise _OpFailed(func, args, exc) from exc
            in_backward = torch._C._current_graph_task_id() != -1
            if storages.phase == "optimizer step":
                kind = "optimizer"
            elif storages.phase in ("inputs", "parameters", "gradients"):
                kind = storages.phase
            else:
                storages.phase = "backward" if in_backward else "forward"
                kind = "temporaries" if in_backward else "activations"
            tree_map_only(torch.Tensor, lambda t: storages.track(t, kind), out)
            return out

    return _Tracker()


class _OpFailed(Exception):
    def __init__(self, func: Any, args: Any, exc: Exception) -> None:
        shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
                  for a in (args if isinstance(args, (tuple, list)) else [args])][:4]
        super().__init__(f"{func} (inputs {shapes}) raised {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}")


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


def _check_world(strategy: str, world_size: int) -> None:
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
def _traced_world(strategy: str, world_size: int, storages: _Storages) -> Iterator[None]:
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


def _parallel(model: nn.Module, knobs: Knobs, workload: Workload,
              storages: _Storages) -> nn.Module:
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
                _dispatch_mode(storages):
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

    _check_world(knobs.strategy, world_size)
    start = time.perf_counter()
    storages = _Storages()
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    set_matmul_precision(knobs.precision)
    try:
        with _traced_world(knobs.strategy, world_size, storages), \
                FakeTensorMode(allow_non_fake_inputs=True), _kernels(kernels), \
                _quiet_transformers():
            torch.manual_seed(seed)
            model = workload.build_model()  # on the (fake) CPU, as the contract says
            check_model(model, workload.name)
            apply_to_model(model, knobs, workload.blocks)
            for tensor in (*model.parameters(), *model.buffers()):
                storages.track(tensor, "parameters")
            model = _parallel(model, knobs, workload, storages)
            optimizer = apply_to_optimizer(workload.make_optimizer(model.parameters()), knobs,
                                           as_on_cuda=kernels == "cuda")
            hooks = _install_hooks(model, optimizer, storages)
            try:
                with _dispatch_mode(storages):
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
    except _OpFailed as exc:
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




def _combine(storages: _Storages, state_bytes: int, **fields: Any) -> StepEstimate:
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
                   storages: _Storages) -> list[Any]:
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


@dataclass(frozen=True, kw_only=True)
class FitSearch:
    """The largest micro-batch whose estimated peak stays within the usable memory."""

    max_micro_batch: int
    """0 when not even micro-batch 1 fits."""
    estimates: tuple[StepEstimate, ...]
    """Every traced step, by micro-batch (the boundary is always traced, never extrapolated)."""

    def peak_at(self, micro_batch: int) -> int | None:
        """Traced peak at a micro-batch, or None when it was not traced."""
        return next((e.peak_bytes for e in self.estimates if e.micro_batch == micro_batch),
                    None)


EVERY_MICRO_BATCH = range(1, 2**16 + 1)
"""The candidates when any micro-batch is allowed (no target batch given)."""


def largest_fitting(trace: Callable[[int], StepEstimate], usable_bytes: int,
                    candidates: Sequence[int] | None = None,
                    known: Sequence[StepEstimate] = ()) -> FitSearch:
    """The largest candidate micro-batch whose traced peak is at most ``usable_bytes``: the
    memory probe's boundary search (``autotune.boundary``) over traces instead of runs.

    The peak grows about linearly with the micro-batch, so two traces predict the boundary and
    one or two more confirm it. Without candidates, every micro-batch up to 65536 is one.

    Args:
        trace: micro-batch -> its estimate (``estimate_step`` with the other settings bound).
        usable_bytes: memory a fitting step may use (device memory minus headroom).
        candidates: allowed micro-batches (e.g. divisors of the per-device batch).
        known: estimates already traced (the first is where the search starts from).
    """
    done: dict[int, StepEstimate] = {e.micro_batch: e for e in known}
    cands: Sequence[int] = sorted(set(candidates)) if candidates else EVERY_MICRO_BATCH

    def point(e: StepEstimate) -> Point:
        return Point(micro_batch=e.micro_batch, peak_bytes=e.peak_bytes,
                     fits=e.peak_bytes <= usable_bytes)

    points = [point(e) for e in done.values()]
    # A trace costs the same at any size: start from what is known, else the smallest.
    hint = known[0].micro_batch if known else cands[0]
    micro_batch = (next_candidate(cands, points, usable_bytes, hint) if points
                   else first_candidate(cands, hint))
    while micro_batch is not None and len(done) < 32:
        done[micro_batch] = trace(micro_batch)
        points.append(point(done[micro_batch]))
        micro_batch = next_candidate(cands, points, usable_bytes, hint)
    return FitSearch(max_micro_batch=bracket(points)[0],
                     estimates=tuple(done[m] for m in sorted(done)))


def estimate_report(workload: Workload, request: EstimateRequest) -> EstimateReport:
    """Trace the asked micro-batch (and, with ``find_max``, the boundary) and say what fits.

    Raises:
        WorkloadError: the workload fails; UntraceableStepError: an op cannot be traced.
        ConfigError: a knob value the workload cannot take.
    """
    def trace(m: int) -> StepEstimate:
        return estimate_step(workload, m, knobs=request.knobs, kernels=request.kernels,
                             world_size=request.world_size)

    usable = int(request.device_memory_bytes * (1 - request.headroom))
    asked = trace(request.micro_batch)
    limit = request.calibration.traced_limit(usable) if request.calibration else usable
    known = [asked, *(trace(m) for m in request.also_trace if m != request.micro_batch)]
    if not request.find_max:
        fits = asked.peak_bytes <= limit
        search = FitSearch(max_micro_batch=request.micro_batch if fits else 0,
                           estimates=tuple(known))
    else:
        search = largest_fitting(trace, limit, request.candidates, known=known)
    best = search.max_micro_batch
    any_max = None
    if request.any_micro_batch and request.find_max and request.candidates is not None:
        # Up to the per-device batch, from the boundary among its divisors: a trace or two more.
        every = range(1, max(request.candidates) + 1)
        start = sorted((e for e in search.estimates if e.micro_batch in every),
                       key=lambda e: e.micro_batch != best)
        any_max = largest_fitting(trace, limit, every, known=start).max_micro_batch
    pairs: tuple[tuple[int, int], ...] = ()
    if request.candidates is not None:
        per_device = (request.target_batch or 1) // request.world_size
        pairs = tuple((m, accumulate_steps(per_device, m)) for m in request.candidates if m <= best)
    peak = search.peak_at(best)
    notes = [ESTIMATE_NOTE]
    if request.knobs.distributed:
        notes.append(f"one rank of {request.world_size} ({request.knobs.strategy}), traced in "
                     "one process with a fake process group (collectives do nothing): "
                     + STRATEGY_NOTE[request.knobs.strategy.split("-")[0]])
    if memory_budget(request.knobs.checkpointing) is not None:
        notes.append(BUDGET_NOTE.format(request.knobs.checkpointing))
    if request.calibration is not None:
        notes.append(f"peaks corrected by the search's measurement: "
                     f"{request.calibration.describe()}")
        notes += request.calibration.notes
    return EstimateReport(
        workload_name=workload.name, estimate=asked,
        device_memory_bytes=request.device_memory_bytes, headroom=request.headroom,
        usable_bytes=usable, max_micro_batch=best,
        max_peak_bytes=None if peak is None else (
            request.calibration.apply(peak) if request.calibration else peak),
        target_batch=request.target_batch, world_size=request.world_size, pairs=pairs,
        calibration=request.calibration,
        traced=tuple((e.micro_batch, e.peak_bytes) for e in search.estimates),
        notes=tuple(notes), any_max_micro_batch=any_max)


def _child(request: dict[str, Any]) -> dict[str, Any]:
    """The estimator's child process: the workload is built and traced here, under the
    parent's timeout, so a workload that exits, crashes or hangs decides no exit code."""
    from autotune.config import WorkloadSpec
    from autotune.serialize import from_json_dict, to_json_dict
    from autotune.workload import load_workload

    spec = from_json_dict(WorkloadSpec, request["workload"])
    asked = from_json_dict(EstimateRequest, request["request"])
    try:
        workload = load_workload(spec, "cuda" if asked.kernels == "cuda" else "cpu")
        return {"report": to_json_dict(estimate_report(workload, asked))}
    except UntraceableStepError as exc:
        return {"error": "untraceable", "message": str(exc)}
    except WorkloadError as exc:
        return {"error": "workload", "message": str(exc)}
    except ConfigError as exc:
        return {"error": "config", "message": str(exc)}


if __name__ == "__main__":
    from autotune.estimate import _child as handler
    from autotune.runner import child_main

    child_main(handler)
