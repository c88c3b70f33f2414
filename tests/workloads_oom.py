"""A workload whose sequences grow mid-run, run under a real memory cap (tests/test_fallback.py).

Samples come from one stream per rank, numbered across the run (a batch of m takes the next
m), each drawn from its own seed: a run at any micro-batch trains on the same samples in the
same optimizer steps. Samples from number ``OOM_GROW_FROM`` on (default: those of optimizer
step ``GROW_AT``, 0-based) are ``OOM_LONG`` tokens long on the ranks in ``OOM_GROW_RANKS`` (all
by default), ``SHORT`` otherwise. Float64 throughout; a deep stack of layers keeps the
forward's saved activations above what the backward adds, so a cap between the two fails in
the forward.

``OOM_IN_BACKWARD`` (environment): long micro-batches fail in their backward instead (the
CPU allocator's error, whatever the cap).
``OOM_IN_UPDATE`` (environment): the optimizer's step asks for more state than any machine
holds (the CPU allocator's error, in the update: a smaller micro-batch does not help).
``OOM_CAP_MIB`` (environment): address space allowed above the baseline, set by
``build_model`` as RLIMIT_AS once torch's thread pool and lazy imports are in the baseline.
"""

from __future__ import annotations

import importlib
import os
import resource

import torch
from torch import nn

from autotune import Workload

PER_DEVICE = 8
GROW_AT = 2
SHORT = 8
VOCAB = 32
DIM = 64
LAYERS = 8


class DeepLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        if os.environ.get("OOM_IN_BACKWARD") and input_ids.shape[1] > SHORT:
            x = _BackwardNeedsMore.apply(x)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                           input_ids[:, 1:].reshape(-1))


class _BackwardNeedsMore(torch.autograd.Function):
    """Identity whose backward needs more memory than any machine (``OOM_IN_BACKWARD``)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        torch.empty(1 << 62, dtype=torch.uint8)
        return grad


class _StateTooLarge(torch.optim.SGD):
    """SGD whose update allocates state no machine holds (``OOM_IN_UPDATE``)."""

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        torch.empty(1 << 62, dtype=torch.uint8)


def _vm_size() -> int:
    with open("/proc/self/status") as status:
        line = next(ln for ln in status if ln.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


def build_model() -> nn.Module:
    torch.manual_seed(0)
    model = DeepLM().double()
    cap = os.environ.get("OOM_CAP_MIB")
    if cap:
        torch.ones(64, 64) @ torch.ones(64, 64)  # the thread pool's stacks in the baseline
        importlib.import_module("torch._dynamo")  # optimizers import it lazily
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + int(float(cap) * 2**20), hard))
    return model


_drawn = [0]


def make_batch(micro_batch: int) -> torch.Tensor:
    rank = int(os.environ.get("RANK", "0"))
    grows = str(rank) in os.environ.get("OOM_GROW_RANKS", str(rank)).split(",")
    rows = []
    for index in range(_drawn[0], _drawn[0] + micro_batch):
        length = int(os.environ.get("OOM_LONG", "64")) if (grows and index >= int(
            os.environ.get("OOM_GROW_FROM", GROW_AT * PER_DEVICE))) else SHORT
        generator = torch.Generator().manual_seed(10_000 * rank + index)
        rows.append(torch.randint(0, VOCAB, (length,), generator=generator))
    _drawn[0] += micro_batch
    return torch.stack(rows)


def workload() -> Workload:
    return Workload(name="growing", build_model=build_model, make_batch=make_batch,
                    loss=lambda model, ids: model(ids),
                    build_optimizer=lambda params: (
                        _StateTooLarge if os.environ.get("OOM_IN_UPDATE") else torch.optim.SGD
                    )(params, lr=0.1))
