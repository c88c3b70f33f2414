"""Workload factories for the tests, loaded the user's way: ``tests/workloads.py:NAME``.

Each factory is imported inside the runner's child process, so misbehaviour (NaN, a crash, a
hang, a bad batch) happens where it would in real use.
"""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn

from autotune import Workload

SEQ = 128
"""Rows per sample: every sample is SEQ vectors of width IN_DIM."""
IN_DIM = 8
HIDDEN = 4096
"""Wide hidden layer: one hidden activation is SEQ * HIDDEN * 4 bytes = 2 MiB per sample, while
the parameters stay under 0.3 MiB, so memory grows steeply and linearly with the micro-batch."""


class WideMLP(nn.Module):
    """Per-row MLP with a wide hidden layer; returns the mean squared error against ``y``."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(IN_DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, IN_DIM)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.down(nn.functional.gelu(self.up(x)))
        return nn.functional.mse_loss(out, y)


def _batch(micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(micro_batch, SEQ, IN_DIM), torch.randn(micro_batch, SEQ, IN_DIM)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return model(*batch)


def tiny() -> Workload:
    """A small model whose activations dominate memory (several MiB per sample)."""
    return Workload(name="tiny-wide-mlp", build_model=WideMLP, make_batch=_batch, loss=_loss)


def nan_loss() -> Workload:
    """The loss is NaN from the first step: the trial must say ``non_finite``."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return model(*batch) * float("nan")

    return Workload(name="nan-loss", build_model=WideMLP, make_batch=_batch, loss=loss)


def crash() -> Workload:
    """The child kills itself in the loss, as the kernel's OOM killer would."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGKILL)
        return model(*batch)  # pragma: no cover

    return Workload(name="crash", build_model=WideMLP, make_batch=_batch, loss=loss)


def hang() -> Workload:
    """make_batch never returns: only the runner's timeout ends the child."""

    def make_batch(micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(600)
        return _batch(micro_batch)  # pragma: no cover

    return Workload(name="hang", build_model=WideMLP, make_batch=make_batch, loss=_loss)


def bad_batch() -> Workload:
    """make_batch returns a list of ints, not tensors."""
    return Workload(name="bad-batch", build_model=WideMLP,
                    make_batch=lambda micro_batch: [1, 2, 3], loss=_loss)


def wrong_rows() -> Workload:
    """make_batch returns tensors whose first dimension is not the micro-batch."""
    return Workload(name="wrong-rows", build_model=WideMLP,
                    make_batch=lambda micro_batch: _batch(micro_batch + 1), loss=_loss)


def raises() -> Workload:
    """The factory itself fails."""
    raise ValueError("workload factory failed on purpose")


def not_a_workload() -> dict[str, str]:
    """The factory returns something that is not an autotune.Workload."""
    return {"name": "not a workload"}


def reads_values() -> Workload:
    """A loss that branches on a tensor's value: fake tensors cannot trace it, a real step can."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        value = model(*batch)
        return value if value.item() > 0 else -value

    return Workload(name="reads-values", build_model=WideMLP, make_batch=_batch, loss=loss)


class BrokenMLP(WideMLP):
    """WideMLP with a graph break in its forward: torch.compile makes two graphs of it."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = nn.functional.gelu(self.up(x))
        torch._dynamo.graph_break()
        return nn.functional.mse_loss(self.down(hidden), y)


def graph_break() -> Workload:
    """A model whose compiled forward has a graph break (eager code between two graphs)."""
    return Workload(name="graph-break", build_model=BrokenMLP, make_batch=_batch, loss=_loss)


def wrong_in_bf16() -> Workload:
    """A loss that is 50% off whenever the model runs in bf16: the numerics guard must catch it."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        out = model.down(nn.functional.gelu(model.up(x)))
        value = nn.functional.mse_loss(out.float(), y)
        return value * 1.5 if out.dtype == torch.bfloat16 else value

    return Workload(name="wrong-in-bf16", build_model=WideMLP, make_batch=_batch, loss=loss)
