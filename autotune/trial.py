"""One trial of the measured training step (``step.train_step``), inside a child process.

A trial that is one rank of a job joins and leaves its process group through
``autotune.trial_ranks``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import math
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from autotune.builtin_workloads import load_workload
from autotune.config import TrialResult, TrialSpec, TrialStatus
from autotune.device import backend_for
from autotune.device.backend import TrialMemory
from autotune.errors import WorkloadError
from autotune.knob_adapters import shapes_dynamic
from autotune.knobs import KNOB, KnobUnsupported
from autotune.oom_text import oom_clause
from autotune.shapes import (
    declared_lengths,
    drawn_steps,
    shape_batch,
    watch_compiles,
    worst_batch,
)
from autotune.step import (  # train_step and loss_weights re-exported for callers of trial
    apply_memory_budget,
    apply_parallel,
    apply_to_batch,
    apply_to_model,
    apply_to_optimizer,
    compile_model,
    grad_scaler,
    loss_weights,
    set_matmul_precision,
    train_step,
    workload_traits,
)
from autotune.timing import stop_reason
from autotune.trial_ranks import agreed, join_job, leave_job
from autotune.trial_status import (  # re-exported: callers of trial classify through it
    classify_exception,
    is_out_of_memory,  # noqa: F401
)
from autotune.units import format_bytes
from autotune.user_code import check_model, user_traceback
from autotune.workload import Batch, Workload, batch_bytes, check_batch, to_device

# ----------------------------------------------------------------------------------------------
# One trial, inside the child process.


def _reference_loss(spec: TrialSpec, workload: Workload, micro_batches: Sequence[Batch],
                    device: torch.device, signature: list[float]) -> float | None:
    """The first step's loss in fp32 eager (no autocast, no TF32, no compile, no update, no
    knob) on its own micro-batches: the numerics guard's reference.

    It runs after the trial's peak was read, with the cap lifted, on the model built again
    from the trial's seed: run before the steps, its memory was the step's (on CPU the
    allocator then held 32 MiB more through every step: ``slow_gpt2`` bf16/default 16x4
    peaked at 430.9 MiB with it, 399.4 without, as a probe did). None when the model built
    again is not the one the trial started from (``_signature``: a build that ignores the
    seed); the guard then compares with the baseline's first loss."""
    torch.manual_seed(spec.seed)
    model = workload.build_model().to(device)
    if _signature(model) != signature:
        return None
    model.train()
    torch.manual_seed(spec.seed + 2)  # the first step's dropout draws
    set_matmul_precision("fp32")
    try:
        with torch.no_grad():
            return float(sum(
                workload.compute_loss(model, batch).float() * weight
                for weight, batch in zip(loss_weights(micro_batches, workload.count_loss_items),
                                         micro_batches, strict=True)))
    finally:
        set_matmul_precision(spec.precision)


def _signature(model: nn.Module) -> list[float]:
    """The first and last value of each parameter: whether a model built again from the same
    seed is the one a trial started from, read without copying a parameter."""
    values = [v for p in model.parameters() if p.numel() for v in (
        p.detach()[(0,) * p.dim()], p.detach()[tuple(n - 1 for n in p.shape)])]
    return torch.stack([v.float() for v in values]).tolist() if values else []


def _flop_counter() -> Any:
    """A FLOP counter over a real step (a warm-up step: its dispatch overhead is not timed)."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False)


def _dynamo_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"].get("unique_graphs", 0))
    breaks = int(sum(counters["graph_break"].values()))
    return graphs, breaks


def _cache_counts() -> tuple[int, int]:
    """``artifacts.compile_cache_counts``, imported where a compiled run asks (the module reads
    the tuned file's schema: an eager child, and every child's start, need none of it)."""
    from autotune.artifacts import compile_cache_counts

    return compile_cache_counts()


def run_trial(spec: TrialSpec) -> TrialResult:
    """Run one trial in this (child) process and describe what happened.

    Never raises for the outcomes a trial can have (OOM, compile error, non-finite loss, a
    workload that misbehaves): they come back as the result's status.
    """
    info: dict[str, Any] = {"samples_per_step": spec.micro_batch * spec.accumulate_steps}
    memory: TrialMemory | None = None
    try:
        spec, world = join_job(spec)
        info["samples_per_step"] *= world  # the job's: every rank's micro-batches
        workload = load_workload(spec.workload, spec.device)
        info["tokens_per_sample"] = workload.tokens_per_sample
        info["workload_name"] = workload.name
        set_matmul_precision(spec.precision)
        torch.manual_seed(spec.seed)
        model = workload.build_model()
        check_model(model, workload.name)
        signature = _signature(model) if spec.num_timed_steps > 0 else []
        memory = backend_for(spec.device).open_memory(spec, model)
        info["baseline_bytes"] = memory.baseline
        if memory.budget is not None and memory.model_bytes > memory.budget:
            return TrialResult(status="oom", peak_bytes=memory.model_bytes, message=(
                f"the model's parameters and buffers alone take "
                f"{format_bytes(memory.model_bytes)}, over the budget of "
                f"{format_bytes(memory.budget)}"), **info)
        result, first_batches = _train(spec, workload, model.to(memory.device), memory, info)
        if result.ok and first_batches:  # the trained model goes: the reference builds anew
            del model
            gc.collect()
            memory.release()
            result = dataclasses.replace(result, reference_loss=_reference_loss(
                spec, workload, first_batches, memory.device, signature))
        leave_job(result)
        return result
    except BaseException as exc:  # every outcome is a value; KeyboardInterrupt ends the child
        if isinstance(exc, KeyboardInterrupt):
            raise
        status = classify_exception(exc)
        if memory is not None and "peak_bytes" not in info:  # not after the reference's rebuild
            info.update(memory.peak())
        at_cap = ""
        if status in ("compile_error", "error") and memory is not None and memory.at_cap(
                info.get("peak_bytes")):
            status, at_cap = "oom", (
                f"out of memory: the run had reached its cap ({format_bytes(info['peak_bytes'])}"
                f" of {format_bytes(memory.budget or 0)}) when it failed with ")
        if spec.compiled and "torch._dynamo" in sys.modules:
            with contextlib.suppress(Exception):  # whether it was compiling afresh
                info["compile_cache_hits"], info["compile_cache_misses"] = _cache_counts()
        return _failed(status, exc, info, at_cap)


def _failed(status: TrialStatus, exc: BaseException, info: dict[str, Any],
            at_cap: str = "") -> TrialResult:
    """The result of a trial that raised: the cause named, then the workload's own frames.

    ``at_cap``: why a failure that raised no out-of-memory error is one (its run had reached
    its cap), said first. An OOM after memory grew at every step leads with the leak that
    caused it."""
    if isinstance(exc, SystemExit):
        message = str(WorkloadError.from_exit(exc))
    elif isinstance(exc, (WorkloadError, KnobUnsupported)):
        message = str(exc)  # says what the workload did, with its traceback when it raised
    else:
        said = oom_clause(exc) if status == "oom" else None
        message = f"{at_cap}{said or f'{type(exc).__name__}: {exc}'}"
    if status in ("error", "compile_error") or isinstance(exc, SystemExit):
        frames = user_traceback(exc)
        message += f"\n{frames}" if frames else ""
    result = TrialResult(status=status, message=message[:6000], **info)
    note = result.leak_note() if status == "oom" else None
    if note is not None:
        result = dataclasses.replace(result, message=f"{note}\n{result.message}")
    return result


def _train(spec: TrialSpec, workload: Workload, model: nn.Module, memory: TrialMemory,
           info: dict[str, Any]) -> tuple[TrialResult, list[Batch]]:
    """The trial's training, and the first step's micro-batches when it timed steps (the
    numerics guard's reference runs on them, ``_reference_loss``)."""
    device = memory.device
    knobs = spec.knobs
    model.train()  # from_pretrained builds in eval mode: no dropout, and HF never checkpoints
    built = workload.make_optimizer(model.parameters())
    lengths = declared_lengths(workload)
    torch.manual_seed(spec.seed + 1)
    batches = []
    for _ in range(max(spec.warmup_micro_batches(), spec.accumulate_steps)):
        batch = worst_batch(workload, spec.micro_batch, lengths)
        check_batch(batch, spec.micro_batch, workload.name)
        batches.append(to_device(batch, device))
    # What the knobs need of the workload, read before they change it: a knob value that
    # cannot apply is an ``unsupported`` outcome, never a failure of the workload.
    info["traits"] = dataclasses.replace(workload_traits(
        model, built, batches[0], workload.blocks), has_lengths=lengths is not None,
        padding_ceiling=(lengths.worst * len(lengths.values) / sum(lengths.values)
                         if lengths is not None else 1.0))
    why = KNOB["shapes"].needs(knobs.shapes, info["traits"])
    if why:  # without lengths every policy runs max's batches: never timed as a copy of it
        raise KnobUnsupported(f"shapes {knobs.shapes}: {why}")
    apply_to_model(model, knobs, workload.blocks)
    batches = [apply_to_batch(b, knobs) for b in batches]
    if lengths is not None:  # memory at the worst case, under the policy's compile
        batches = [shape_batch(b, knobs.shapes, lengths.worst) for b in batches]
    # A probe warms up with 2 micro-batches (its memory worst case); the timed steps run the
    # config's own accumulation.
    warmup_batches = batches[:spec.warmup_micro_batches()]
    timed_batches = batches[:spec.accumulate_steps]
    info["workload_fingerprint"] = fingerprint(model, warmup_batches[0], (
        f"lengths:{lengths.values}" if lengths is not None else ""))
    if knobs.sharded:
        # fully_shard swaps the parameters for shards: the optimizer is built over those,
        # and the full ones (freed) no longer count in this rank's memory.
        del built
        model = apply_parallel(model, knobs, workload.blocks, device)
        memory.rebase(model, sum(batch_bytes(b) for b in batches))
        built = workload.make_optimizer(model.parameters())
    elif knobs.distributed:
        model = apply_parallel(model, knobs, workload.blocks, device)
    optimizer = apply_to_optimizer(built, knobs)
    scaler = grad_scaler(spec.precision, device.type)
    stepped = apply_memory_budget(compile_model(model, spec.compile_mode, shapes_dynamic(knobs),
                                                scope=knobs.compile_scope,
                                                blocks=workload.blocks), knobs)
    drawn = None
    if lengths is not None and spec.num_timed_steps:  # speed on the real lengths
        drawn = drawn_steps(workload, lengths, knobs.shapes, micro_batch=spec.micro_batch,
                            accumulate_steps=spec.accumulate_steps, seed=spec.seed + 3,
                            device=device)
        drawn.steps = [[apply_to_batch(b, knobs) for b in step] for step in drawn.steps]
        info["tokens_per_sample"] = round(drawn.real_tokens / drawn.samples)

    losses: list[torch.Tensor] = []
    num_skipped = 0
    updates: list[float] = []

    def one_step(micro_batches: list[Batch]) -> float:
        nonlocal num_skipped
        scale_before = scaler.get_scale() if scaler is not None else None
        counting = spec.count_flops and not spec.compiled and not losses
        counter = _flop_counter() if counting else contextlib.nullcontext()
        marks = [memory.mark()]
        start = time.perf_counter()
        with counter:
            losses.append(train_step(stepped, optimizer, micro_batches, workload,
                                     precision=spec.precision, device_type=device.type,
                                     scaler=scaler, cuda_graphs=spec.knobs.cuda_graphs,
                                     on_backward=lambda: marks.append(memory.mark())))
        marks.append(memory.mark())
        memory.sync()
        # The update's share of the step: from the last backward to the end, on the device's
        # clock, scaled to the step's wall time (what grows with the micro-batches is the rest).
        device_s = memory.seconds(marks[0], marks[-1])
        share = memory.seconds(marks[-2], marks[-1]) / device_s if device_s > 0 else 0.0
        updates.append(share)
        info["step_memory_bytes"] = (*info.get("step_memory_bytes", ()), memory.current())
        if counting:  # per timed step: model FLOPs grow with the micro-batches of a step
            flops = counter.get_total_flops()  # type: ignore[union-attr]
            info["flops_per_step"] = flops * spec.accumulate_steps // len(micro_batches)
        elapsed = time.perf_counter() - start
        if scaler is not None and scaler.get_scale() < scale_before:
            num_skipped += 1
        info["num_optimizer_steps"] = len(losses)
        return elapsed

    def one_pass() -> float:
        """A timed unit of drawn lengths: one step of each (their mean time, their mean
        update share)."""
        assert drawn is not None
        times = [one_step(step) for step in drawn.steps]
        shares = updates[-len(times):]
        del updates[-len(times):]
        updates.append(statistics.fmean(shares))
        return statistics.fmean(times)

    torch.manual_seed(spec.seed + 2)  # the reference sees the first step's dropout draws
    with watch_compiles() as compiles:
        warmup = [one_step(warmup_batches) for _ in range(max(1, spec.num_warmup_steps))]
        if drawn is not None:  # every length the draw pads to, compiled before timing
            warmup += [one_step(step) for step in drawn.steps]
    info["warmup_s"] = sum(warmup)
    timed: list[float] = []
    timing_start = time.perf_counter()
    with watch_compiles() as recompiles:
        while spec.num_timed_steps > 0:
            step_s, elapsed_s = agreed([one_pass() if drawn is not None else one_step(
                timed_batches), time.perf_counter() - timing_start], device)
            timed.append(step_s)
            why = stop_reason(timed, max_steps=spec.num_timed_steps, elapsed_s=elapsed_s,
                              min_elapsed_s=spec.min_timed_s, max_elapsed_s=spec.max_timed_s,
                              precision=spec.timing_precision,
                              stop_above_s=spec.stop_above_step_s)
            if why is not None:
                info["timing_stop"] = why
                break
    info["step_times_s"] = tuple(timed)
    shares = updates[len(warmup):]
    info["update_times_s"] = tuple(t * share for t, share in zip(timed, shares, strict=True))
    info["compile_s"] = max(0.0, info["warmup_s"] - len(warmup) * _warm_step_s(
        timed, info["update_times_s"], spec, min(warmup)))
    info.update(memory.peak())
    values = torch.stack(losses).tolist()
    info.update(first_loss=values[0], last_loss=values[-1], num_skipped_steps=num_skipped)
    if spec.compiled:
        info["num_graphs"], info["num_graph_breaks"] = _dynamo_counts()
        info["compile_cache_hits"], info["compile_cache_misses"] = _cache_counts()
        if info["num_graphs"] == 0:
            return TrialResult(status="compile_error", message=(
                "torch.compile produced no graph: the step silently ran eager (recompile limit "
                "or graph breaks everywhere); not counted as a compiled trial"), **info), []
        if hit := compiles.hit_limit or recompiles.hit_limit:
            return TrialResult(status="compile_error", message=(
                f"torch.compile hit its recompile limit ({hit}): part of the step ran eager, "
                f"not counted as a compiled trial (shapes={knobs.shapes})"), **info), []
        if recompiles.graphs and drawn is not None:  # every drawn shape compiled in warm-up
            return TrialResult(status="compile_error", message=(
                f"torch.compile compiled {recompiles.graphs} graph(s) while the steps were "
                f"timed (shapes={knobs.shapes}): the timings hold compiles, not counted as a "
                "compiled trial"), **info), []
    if not all(math.isfinite(v) for v in values):
        bad = next(i for i, v in enumerate(values) if not math.isfinite(v))
        return TrialResult(status="non_finite", message=(
            f"loss became {values[bad]} at optimizer step {bad + 1} of {len(values)}"),
            **info), []
    return TrialResult(status="ok", **info), warmup_batches if spec.num_timed_steps else []


def _warm_step_s(timed: Sequence[float], update_s: Sequence[float], spec: TrialSpec,
                 fallback: float) -> float:
    """What one warm-up step takes once compiled: its micro-batches at the timed steps' time
    per micro-batch, plus one update (``fallback``, the fastest warm-up step, without timed
    steps)."""
    if not timed:
        return fallback
    update = statistics.median(update_s)
    per_micro_batch = (statistics.median(timed) - update) / spec.accumulate_steps
    return spec.warmup_micro_batches() * per_micro_batch + update


def fingerprint(model: nn.Module, batch: Batch, extra: str = "") -> str:
    """Hash of the model's parameter names, shapes and dtypes and the batch's tensor shapes
    (and ``extra``: the declared lengths, whose draw the timings ran on)."""
    parts = [f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in model.named_parameters()]
    parts += [extra] if extra else []
    tensors = batch.values() if isinstance(batch, dict) else (
        batch if isinstance(batch, (tuple, list)) else [batch])
    parts += [f"batch:{tuple(t.shape[1:])}:{t.dtype}" for t in tensors]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
