"""``autotune.load``: the tuned config, ready to use in your own training script.

A thin layer over ``autotune.step`` and ``autotune.usage_frameworks``: the same checkpointing,
optimizer rebuild, memory format, autocast, GradScaler, compile call and ``train_step`` that the
search measured, plus adapters for Hugging Face ``TrainingArguments`` and Accelerate's
``Accelerator`` (with a warning for what they have no switch for).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune import knob_adapters, step, usage_frameworks
from autotune.artifacts import graph_settings, load_artifacts
from autotune.builtin_workloads import load_workload
from autotune.compile_notes import (  # re-exported: users and tests import them from here
    ARTIFACTS_LOG,
    CompileArtifactsWarning,
    RecompileLimitWarning,  # noqa: F401
    watch_recompile_limit,
)
from autotune.errors import ConfigError
from autotune.fallback import OomFallback, is_sharded
from autotune.knobs import Knobs
from autotune.schema import TunedConfig
from autotune.shapes import Lengths, declared_lengths, mark_dynamic
from autotune.workload import Batch, Workload


class Tuned:
    """The tuned knobs of one ``autotune.json``, with helpers that apply them.

    Example:
        >>> cfg = autotune.load("autotune.json")
        >>> model = cfg.apply(build_model())  # checkpointing, memory format
        >>> optimizer = cfg.build_optimizer(make_optimizer(model.parameters()))
        >>> model = cfg.compile(model)
        >>> for micro_batches in batches_of(cfg.micro_batch, cfg.accumulate_steps):
        ...     cfg.train_step(model, optimizer, [cfg.batch(b) for b in micro_batches], workload)
    """

    def __init__(self, config: TunedConfig, *, device_type: str | None = None,
                 folder: Path | None = None) -> None:
        """Args:
            config: the content of ``autotune.json``.
            device_type: ``cuda`` or ``cpu`` for autocast and the GradScaler (default: the
                device the config was tuned on).
            folder: the folder of ``autotune.json``, where its compiled artifacts lie (None:
                ``compile`` loads none).
        """
        self.config = config
        self.folder = folder
        self.artifacts_note = ""
        """What ``compile`` did with the compiled artifacts (loaded, or why not)."""
        self.device_type = device_type or config.device.device.split(":")[0]
        self._scaler: torch.amp.GradScaler | None = None
        self._lengths: Lengths | None = None
        self.fallback: OomFallback | None = None
        """The out-of-memory fallback's state (``train_step(..., oom_fallback=True)``): its
        ``micro_batch`` now (None: as given) and ``fallbacks`` so far."""

    @property
    def micro_batch(self) -> int:
        """Samples per forward/backward on each device."""
        return self.config.micro_batch

    @property
    def accumulate_steps(self) -> int:
        """Micro-batches per optimizer step."""
        return self.config.accumulate_steps

    @property
    def knobs(self) -> Knobs:
        """Every tuned knob: precision, compile mode, checkpointing, optimizer implementation,
        memory format, allocator."""
        return self.config.knobs

    @property
    def precision(self) -> str:
        """``fp32``, ``tf32``, ``bf16`` or ``fp16``."""
        return self.knobs.precision

    @property
    def compile_mode(self) -> str:
        """A ``torch.compile`` mode, or ``off``."""
        return self.knobs.compile_mode

    @property
    def compiled(self) -> bool:
        """Whether the config runs ``torch.compile`` (a mode other than ``off``)."""
        return self.knobs.compiled

    def __repr__(self) -> str:
        return (f"Tuned(micro_batch={self.micro_batch}, accumulate_steps={self.accumulate_steps}, "
                f"knobs={self.knobs.label()!r})")

    def apply(self, model: nn.Module,
              blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None) -> nn.Module:
        """Apply the knobs that change the model, in place: activation checkpointing of its
        repeated blocks and the memory format. Call it before ``build_optimizer`` and
        ``compile``, as the search did.

        Args:
            model: the model, built as the workload builds it.
            blocks: the model's repeated blocks, as the workload's ``Workload(blocks=...)``
                names them (default: the longest run of same-type modules in a ``ModuleList``
                or ``Sequential``, as the search found them).

        Returns:
            The same model.

        Raises:
            KnobUnsupported: the model cannot take a tuned knob (no repeated blocks to
                checkpoint, no 2-D convolution for the memory format): not the tuned model.
        """
        return step.apply_to_model(model, self.knobs, blocks)

    def parallelize(self, model: nn.Module,
                    blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None,
                    device: torch.device | None = None) -> nn.Module:
        """The model as the tuned strategy runs it, in a job under ``torchrun`` (its process
        group initialized): DistributedDataParallel (``ddp``, ``ddp-bucket-view``) or FSDP2
        (``fully_shard`` on each repeated block, then the root; ``fsdp``,
        ``fsdp-no-reshard``), as the search measured it; the model itself for ``none``. Call
        it after ``apply`` and before building the optimizer (FSDP swaps the parameters for
        their shards: build it over the returned model's ``parameters()``) and ``compile``.
        At the job's end free the model and optimizer (``del``, then ``gc.collect()``) before
        ``dist.destroy_process_group()``: FSDP's modules hold the group, and left to the
        interpreter's exit gloo's threads can abort the process.

        Args:
            model: the model, after ``apply``.
            blocks: its repeated blocks (as for ``apply``).
            device: the rank's CUDA device, for DDP's ``device_ids`` (None on CPU).

        Raises:
            KnobUnsupported: a strategy without a process group to run in.
        """
        return step.apply_parallel(model, self.knobs, blocks, device)

    def build_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer rebuilt as the tuned implementation (``knobs.optimizer_impl``) with
        the same class, parameter groups and hyper-parameters; as built when that is the default.
        Build your LR scheduler on the optimizer it returns.

        Raises:
            KnobUnsupported: its class has no such implementation (or refuses it here).
        """
        return step.apply_to_optimizer(optimizer, self.knobs)

    def batch(self, batch: Any) -> Any:
        """A (device) batch as the knobs want it: 4-D float tensors channels-last when the
        tuned memory format is; its sequence dimension (dim 1) marked dynamic for
        ``torch.compile`` when the tuned shape policy is ``dynamic``; otherwise the batch
        itself."""
        batch = step.apply_to_batch(batch, self.knobs)
        return mark_dynamic(batch) if self.knobs.shapes == "dynamic" else batch

    def lengths(self) -> Lengths:
        """The workload's declared lengths and worst case (read once from the workload
        ``autotune.json`` names: ``--lengths``, or the factory's ``Workload.lengths``).

        Raises:
            ConfigError: the workload declares no lengths (every batch is the worst case).
        """
        if self._lengths is None:
            found = declared_lengths(load_workload(self.config.workload))
            if found is None:
                raise ConfigError(
                    f"workload {self.config.workload_name!r} declares no lengths: its batches "
                    "have one shape, nothing to pad; declare Workload(lengths=...) or --lengths "
                    "FILE and search again")
            self._lengths = found
        return self._lengths

    def bucket_lengths(self) -> tuple[int, ...]:
        """The lengths the ``buckets`` policy pads to at the tuned micro-batch (a pure function
        of the declared lengths and the micro-batch: ``autotune.lengths.bucket_lengths``),
        whatever the tuned policy."""
        return self.lengths().buckets(self.micro_batch)

    def pad_to(self, length: int) -> int:
        """The length to pad a batch to whose longest sample has ``length`` tokens, under the
        tuned shape policy: the worst case (``max``), the next bucket length (``buckets``), or
        ``length`` itself (``dynamic``, ``longest``). Use it in your collate function, e.g.
        ``tokenizer.pad(samples, padding="max_length", max_length=cfg.pad_to(longest))``.

        Raises:
            ConfigError: the workload declares no lengths, or ``length`` is over its worst case.
        """
        lengths = self.lengths()
        if not 0 < length <= lengths.worst:
            raise ConfigError(f"pad_to({length}): a batch's longest sample must have 1 to "
                              f"{lengths.worst} tokens (the worst case tuned for); truncate it")
        return lengths.pad(length, self.knobs.shapes, self.micro_batch)

    def compile(self, model: nn.Module,
                blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None) -> nn.Module:
        """``torch.compile(model, mode=..., dynamic=config.compile_dynamic)``, or the model when
        ``off``; with ``compile_scope`` ``blocks``, each repeated block's forward compiled in
        place (``blocks``: as for ``apply``; default the longest run of same-type modules) and
        the model returned as given (regional compilation, ``step.compile_model``). With
        checkpointing ``budget-0.5`` the compiler's recompute is set around the compiled
        model's calls, as the search ran it (``step.apply_memory_budget``: other models and
        eager code keep torch's default). ``compile_dynamic`` None (the default) is torch's
        automatic dynamic shapes: batches of varying length cost one more compile, not one per
        length. Should torch
        still hit its recompile limit (that code then runs eager), a warning says so in one
        line, with what to do.

        When the search saved its compiled artifacts beside ``autotune.json`` and they were
        saved by this torch, on this device, for this model and these settings, they are loaded
        first, so the first compile reads them (one line on the ``autotune.artifacts`` logger);
        otherwise a warning says why not, in one line, and it compiles from nothing. Call
        ``set_matmul_precision()`` before: the graphs' cache keys hold the TF32 flags.

        Save ``compiled._orig_mod.state_dict()`` (or the model you passed) for clean keys.
        """
        if self.compiled:
            watch_recompile_limit()
            self._load_artifacts(model)
        dynamic = knob_adapters.shapes_dynamic(self.knobs, self.config.compile_dynamic)
        return step.apply_memory_budget(
            step.compile_model(model, self.compile_mode, dynamic,
                               scope=self.knobs.compile_scope, blocks=blocks), self.knobs)

    def _load_artifacts(self, model: nn.Module) -> None:
        record = self.config.compile_artifacts
        if record is None or self.folder is None:
            return
        first = next(model.parameters(), None)
        device = str(first.device) if first is not None else "cpu"
        loaded, self.artifacts_note = load_artifacts(
            record, self.folder, model, graph_settings(self.config), device)
        if not loaded:
            warnings.warn(self.artifacts_note, CompileArtifactsWarning, stacklevel=3)
            return
        ARTIFACTS_LOG.info(self.artifacts_note)
        tf32 = self.precision == "tf32"  # inductor's cache keys hold both flags
        flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        if flags != (tf32, tf32):
            warnings.warn(
                f"compiled artifacts loaded, but this process's TF32 flags (matmul {flags[0]}, "
                f"cudnn {flags[1]}) are not the search's ({self.precision}: both {tf32}) and "
                "inductor's cache keys hold them: call cfg.set_matmul_precision() before "
                "cfg.compile(model), or the first compile misses the artifacts",
                CompileArtifactsWarning, stacklevel=3)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context for the forward pass (a no-op for fp32 and tf32)."""
        return step.autocast(self.precision, self.device_type)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """The run's GradScaler for fp16, else None. The same one on every call: its scale
        adapts from step to step."""
        if self._scaler is None:
            self._scaler = step.grad_scaler(self.precision, self.device_type)
        return self._scaler

    def set_matmul_precision(self) -> None:
        """Allow TensorFloat-32 matmuls for ``tf32``, disallow them otherwise (process-wide)."""
        step.set_matmul_precision(self.precision)

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                   micro_batches: Sequence[Batch], workload: Workload, *,
                   oom_fallback: bool = False, max_oom_fallbacks: int = 3) -> torch.Tensor:
        """One optimizer step over ``accumulate_steps`` micro-batches, as the search ran it.

        The loss is normalized once over the whole effective batch (by the workload's
        ``count_loss_items`` when it has one); the optimizer steps once. Step your LR
        scheduler after it.

        With ``oom_fallback``, a step that runs out of memory (on any rank) is redone from its
        first micro-batch with the next smaller divisor of the per-device batch: the same
        samples regrouped, more accumulation, the same effective batch and gradient; one
        warning line on the ``autotune.fallback`` logger; later steps keep the smaller
        micro-batch (pass the micro-batches as before: they are regrouped). See
        docs/oom-fallback.md.

        Args:
            oom_fallback: fall back to smaller micro-batches on an out-of-memory error.
            max_oom_fallbacks: fallbacks without a completed step before it stops.

        Returns:
            The effective batch's loss (detached).

        Raises:
            OutOfMemoryFallbackError: ``max_oom_fallbacks`` fallbacks in a row, no smaller
                micro-batch, or an out-of-memory error in the optimizer's update.
            ConfigError: ``oom_fallback`` with an FSDP model (not supported: see
                docs/oom-fallback.md).
        """
        def run(batches: Sequence[Batch], check: Callable[[], object] | None = None
                ) -> torch.Tensor:
            return step.train_step(model, optimizer, batches, workload,
                                    precision=self.precision, device_type=self.device_type,
                                    scaler=self.grad_scaler(),
                                    cuda_graphs=self.knobs.cuda_graphs, check=check)

        if not oom_fallback:
            return run(micro_batches)
        if self.knobs.sharded or is_sharded(model):
            raise ConfigError(
                "oom_fallback=True does not run under FSDP: an out-of-memory error inside a "
                "sharded block leaves the other ranks in another collective (a hang or an abort, "
                "not a fallback); train without it, or with strategy ddp (docs/oom-fallback.md)")
        if self.fallback is None or self.fallback.max_in_a_row != max_oom_fallbacks:
            self.fallback = OomFallback(max_oom_fallbacks)
        first = next(iter(model.parameters()))
        device = getattr(first, "_local_tensor", first).device
        return self.fallback.run(run, micro_batches, optimizer=optimizer, device=device,
                                 model=model)

    def training_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``transformers.TrainingArguments``: micro-batch,
        accumulation, precision, compile mode, gradient checkpointing, the optimizer
        (``optim``: ``adamw_torch_fused`` for ``fused``, else ``adamw_torch``, whose loop torch
        picks as for an optimizer built without flags) and FSDP2 (``fsdp``/``fsdp_config``)
        for an fsdp strategy. What Trainer has no switch for (sparser checkpointing, a
        foreach/for-loop optimizer torch would not pick on this device, the memory format,
        the allocator, DDP's bucket view, FSDP's fp32 reduction under autocast, a pinned
        ``compile_dynamic``) is said in one warning, with what to do instead.

        Example:
            >>> TrainingArguments(output_dir="out", **cfg.training_arguments())
        """
        return usage_frameworks.training_arguments(self)

    def accelerator_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``accelerate.Accelerator``.

        The compile mode travels in a ``TorchDynamoPlugin`` when the installed accelerate has
        one (``Accelerator(dynamo_plugin=...)``); otherwise only ``dynamo_backend="inductor"``
        is given and the mode is dropped, with a warning. TF32 has no Accelerator switch: call
        ``cfg.set_matmul_precision()``; nor have checkpointing, the optimizer implementation
        and the memory format: ``cfg.apply(model)`` and ``cfg.build_optimizer(...)`` (one
        warning says which are tuned). The strategy travels as Accelerate's FSDP2 plugin
        (``fsdp_plugin``) or DDP's kwargs handler (bucket view).
        """
        return usage_frameworks.accelerator_kwargs(self)

    def lightning_trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``lightning.pytorch.Trainer``: ``precision`` (``32-true``,
        ``bf16-mixed``, ``16-mixed``), ``accumulate_grad_batches``, ``accelerator``,
        ``devices`` (ranks per node), ``num_nodes`` and ``strategy`` (``auto``, ``ddp``, a
        ``DDPStrategy`` with the bucket view, an ``FSDPStrategy``). The rest (TF32,
        checkpointing, compile, the optimizer implementation, channels_last, the batch size)
        is applied by the callback ``autotune.lightning.TunedCallback(cfg)``; what neither
        carries is said in one warning.

        Example:
            >>> Trainer(**cfg.lightning_trainer_kwargs(), callbacks=[TunedCallback(cfg)])

        Raises:
            MissingDependencyError: lightning is not installed.
        """
        return usage_frameworks.lightning_trainer_kwargs(self)
