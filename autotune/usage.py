"""``autotune.load``: the tuned config, ready to use in your own training script.

A thin layer over ``autotune.trial``: the same autocast, GradScaler, compile call and
``train_step`` that the search measured, plus adapters for Hugging Face ``TrainingArguments``
and Accelerate's ``Accelerator``.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from autotune import trial
from autotune.schema import TunedConfig
from autotune.workload import Batch, Workload


class Tuned:
    """The tuned knobs of one ``autotune.json``, with helpers that apply them.

    Example:
        >>> cfg = autotune.load("autotune.json")
        >>> model = cfg.compile(model)
        >>> for micro_batches in batches_of(cfg.micro_batch, cfg.accumulate_steps):
        ...     cfg.train_step(model, optimizer, micro_batches, workload)
    """

    def __init__(self, config: TunedConfig, *, device_type: str | None = None) -> None:
        """Args:
            config: the content of ``autotune.json``.
            device_type: ``cuda`` or ``cpu`` for autocast and the GradScaler (default: the
                device the config was tuned on).
        """
        self.config = config
        self.device_type = device_type or config.device.device.split(":")[0]
        self._scaler: torch.amp.GradScaler | None = None

    @property
    def micro_batch(self) -> int:
        """Samples per forward/backward on each device."""
        return self.config.micro_batch

    @property
    def accumulate_steps(self) -> int:
        """Micro-batches per optimizer step."""
        return self.config.accumulate_steps

    @property
    def precision(self) -> str:
        """``fp32``, ``tf32``, ``bf16`` or ``fp16``."""
        return self.config.precision

    @property
    def compile_mode(self) -> str:
        """A ``torch.compile`` mode, or ``off``."""
        return self.config.compile_mode

    def __repr__(self) -> str:
        return (f"Tuned(micro_batch={self.micro_batch}, accumulate_steps={self.accumulate_steps}, "
                f"precision={self.precision!r}, compile_mode={self.compile_mode!r})")

    def compile(self, model: nn.Module) -> nn.Module:
        """``torch.compile(model, mode=..., dynamic=False)``, or the model when ``off``.

        Save ``compiled._orig_mod.state_dict()`` (or the model you passed) for clean keys.
        """
        return trial.compile_model(model, self.compile_mode)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context for the forward pass (a no-op for fp32 and tf32)."""
        return trial.autocast(self.precision, self.device_type)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """The run's GradScaler for fp16, else None. The same one on every call: its scale
        adapts from step to step."""
        if self._scaler is None:
            self._scaler = trial.grad_scaler(self.precision, self.device_type)
        return self._scaler

    def set_matmul_precision(self) -> None:
        """Allow TensorFloat-32 matmuls for ``tf32``, disallow them otherwise (process-wide)."""
        trial.set_matmul_precision(self.precision)

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                   micro_batches: Sequence[Batch], workload: Workload) -> torch.Tensor:
        """One optimizer step over ``accumulate_steps`` micro-batches, as the search ran it.

        The loss is normalized once over the whole effective batch (by the workload's
        ``count_loss_items`` when it has one); the optimizer steps once. Step your LR
        scheduler after it.

        Returns:
            The effective batch's loss (detached).
        """
        return trial.train_step(model, optimizer, micro_batches, workload,
                                precision=self.precision, device_type=self.device_type,
                                scaler=self.grad_scaler())

    def training_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``transformers.TrainingArguments``.

        Example:
            >>> TrainingArguments(output_dir="out", **cfg.training_arguments())
        """
        compiled = self.compile_mode != "off"
        return {
            "per_device_train_batch_size": self.micro_batch,
            "gradient_accumulation_steps": self.accumulate_steps,
            "bf16": self.precision == "bf16",
            "fp16": self.precision == "fp16",
            "tf32": self.precision == "tf32",  # False turns TF32 off, as the search measured
            "torch_compile": compiled,
            "torch_compile_mode": (self.compile_mode if compiled and self.compile_mode != "default"
                                   else None),
        }

    def accelerator_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``accelerate.Accelerator``.

        The compile mode travels in a ``TorchDynamoPlugin`` when the installed accelerate has
        one (``Accelerator(dynamo_plugin=...)``); otherwise only ``dynamo_backend="inductor"``
        is given and the mode is dropped, with a warning. TF32 has no Accelerator switch: call
        ``cfg.set_matmul_precision()``.
        """
        kwargs: dict[str, Any] = {
            "gradient_accumulation_steps": self.accumulate_steps,
            "mixed_precision": {"bf16": "bf16", "fp16": "fp16"}.get(self.precision, "no"),
        }
        if self.compile_mode == "off":
            return kwargs
        mode = None if self.compile_mode == "default" else self.compile_mode
        plugin = _dynamo_plugin(mode)
        if plugin is not None:
            kwargs["dynamo_plugin"] = plugin
        else:
            kwargs["dynamo_backend"] = "inductor"
            if mode is not None:
                warnings.warn(
                    f"the installed accelerate cannot take torch.compile mode {mode!r} "
                    "(no TorchDynamoPlugin / Accelerator(dynamo_plugin=...)): compiling with "
                    "inductor's default mode; upgrade accelerate to keep the tuned mode",
                    stacklevel=2)
        return kwargs


def _dynamo_plugin(mode: str | None) -> Any:
    """A ``TorchDynamoPlugin`` for the mode, or None when accelerate cannot take one."""
    try:
        from accelerate import Accelerator
        from accelerate.utils import TorchDynamoPlugin
    except ImportError:
        return None
    if "dynamo_plugin" not in inspect.signature(Accelerator).parameters:
        return None
    return TorchDynamoPlugin(backend="inductor", mode=mode, dynamic=False)
