"""The interface of a device kind: its backend (``DeviceBackend``) and a trial's memory on it
(``TrialMemory``). torch is imported where it is used, not at import (see ``autotune.device``).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from autotune.config import PRECISIONS, DeviceInfo, TrialSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

Kernels = Literal["cpu", "cuda"]


class DeviceBackend(abc.ABC):
    """What one device kind does differently: a stateless object, one per kind."""

    kind: ClassVar[str]
    """The device kind, as in ``torch.device(...).type``."""
    kernels: ClassVar[Kernels]
    """Whose kernel choices the estimator models for this kind (``estimate.trace.StepEstimate``)."""
    precision_names: ClassVar[tuple[str, ...]]
    """Precisions this kind can run at all; ``precisions`` narrows them to one device."""
    peak_counted: ClassVar[str] = ""
    """How a run's peak is counted on this kind, said where a user can count it alike
    (``autotune verify``, docs/using-the-result.md)."""
    compile_in_peak: ClassVar[bool] = False
    """Whether ``torch.compile``'s own memory counts in a child's peak on this kind: then a
    compile loaded from inductor's cache peaks lower than the first launch that compiles it,
    and a compiled setting fits only if a run that compiled its graphs fit."""
    peaks_flatten: ClassVar[bool] = False
    """Whether a run's peak on this kind grows less per sample at larger micro-batches
    (``boundary.flattens``) before any probe shows it: a line through two peaks is then not
    trusted further beyond them than they are apart (``boundary.line_reach``)."""

    def child_environment(self, base_env: Mapping[str, str]) -> dict[str, str]:
        """Variables a child on this kind sets over ``base_env`` before it starts torch."""
        return {}

    @abc.abstractmethod
    def allocator_notes(self, env: Mapping[str, str]) -> str:
        """The allocator settings a child with ``env`` runs with, for the report."""

    @abc.abstractmethod
    def open_memory(self, spec: TrialSpec, model: nn.Module) -> TrialMemory:
        """Cap this (child) process's memory for ``spec`` and start measuring it.

        Called once per child, after the model is built and before it moves to the device."""

    @abc.abstractmethod
    def compile_modes(self) -> tuple[str, ...]:
        """Compile modes this kind can run."""

    @abc.abstractmethod
    def max_ranks(self) -> int:
        """The most ranks of a job this machine runs on its own devices of this kind."""

    def default_compile_modes(self) -> tuple[str, ...]:
        """Compile modes a search tries when the user names none."""
        return self.compile_modes()

    def precisions(self, info: DeviceInfo) -> tuple[str, ...]:
        """Precisions the device ``info`` describes can run."""
        ok = {"fp32": True, "tf32": info.supports_tf32, "bf16": info.supports_bf16,
              "fp16": info.supports_fp16}
        return tuple(p for p in PRECISIONS if p in self.precision_names and ok[p])

    def peak_tflops(self, device_name: str, precision: str) -> float | None:
        """Dense peak TFLOP/s of the device in ``precision`` (for MFU), or None if unknown."""
        return None

    def budget_limit(self) -> tuple[int, str] | None:
        """The largest memory budget a child's cap can hold here besides the device's memory,
        and a clause that says what sets it; None when only the device's memory does."""
        return None

    @abc.abstractmethod
    def normalize(self, device: str) -> str:
        """Canonical string of a device of this kind, checked to be there.

        Raises:
            ConfigError: the device is not there.
        """

    @abc.abstractmethod
    def describe(self, device: str) -> DeviceInfo:
        """Facts about ``device``, a canonical string of this kind."""


class TrialMemory(abc.ABC):
    """Caps and measures a trial child's memory on one device (``DeviceBackend.open_memory``)."""

    device: torch.device
    budget: int | None
    """The spec's memory budget (None: uncapped)."""
    baseline: int = 0
    """Memory the process held before training (CPU: its address space high-water mark)."""
    context: int = 0
    """Device memory held outside PyTorch's allocator (CUDA context, library workspaces)."""
    model_bytes: int = 0
    """The model's parameters and buffers, counted in the budget (CPU)."""

    @abc.abstractmethod
    def peak(self) -> dict[str, int | None]:
        """The result's memory fields (``TrialResult``), read after the steps."""

    @abc.abstractmethod
    def current(self) -> int:
        """Memory now, after a step (``TrialResult.step_memory_bytes``)."""

    def rebase(self, model: nn.Module, batch_bytes: int) -> None:
        """The model was sharded (FSDP): count its local shards from now on, not the full
        model it was built as (nothing to do where the device's allocator counts)."""
        return None

    @abc.abstractmethod
    def release(self) -> None:
        """Lift the cap: what runs after the peak was read is not the trial's training."""

    def at_cap(self, peak_bytes: int | None) -> bool:
        """Whether a run that failed had reached its cap: its failure then is an out of memory,
        whatever it raised (on CPU a C extension that cannot allocate under the address-space
        cap may raise a bare ``SystemError``). False where the device's allocator raises its
        own out-of-memory error (CUDA)."""
        return False

    @abc.abstractmethod
    def sync(self) -> None:
        """Wait for the device's queued work (before reading a clock)."""

    def mark(self) -> Any:
        """A point in the device's queue of work, without waiting for it (read by
        ``seconds`` after ``sync``). The host's clock, for a device whose ops return when done."""
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds of device work between two ``mark``s (after ``sync``)."""
        return float(end - start)
