"""A custom workload: ``autotune search --workload examples/my_workload.py:workload``.

A factory returns ``autotune.Workload``: how to build the model (on the CPU), the worst-case
batch for a micro-batch size, and the loss. autotune calls it in a fresh process per trial, and
``train_autotuned.py`` / ``examples/train_plain.py`` call it to train.
"""

from __future__ import annotations

import torch
from torch import nn

import autotune

NUM_FEATURES = 64
NUM_CLASSES = 10


class MLPClassifier(nn.Module):
    """Two hidden layers; replace with your model."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(NUM_FEATURES, width), nn.GELU(),
            nn.Linear(width, width), nn.GELU(),
            nn.Linear(width, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_batch(micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A worst-case batch: every sample at its largest shape (fixed here)."""
    return torch.randn(micro_batch, NUM_FEATURES), torch.randint(0, NUM_CLASSES, (micro_batch,))


def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    return nn.functional.cross_entropy(model(features), labels)


def workload() -> autotune.Workload:
    """The factory named after the colon in ``--workload examples/my_workload.py:workload``."""
    return autotune.Workload(
        name="mlp-classifier",
        build_model=MLPClassifier,
        make_batch=make_batch,
        loss=loss,
        build_optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )
