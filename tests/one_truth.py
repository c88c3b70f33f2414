"""The one-truth check: gradients of one effective batch, however it is split or distributed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch


class GradRecorder:
    """An optimizer stand-in that keeps the gradients it is asked to step with."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.grads: dict[str, torch.Tensor] = {}

    def step(self) -> None:
        self.grads = {n: p.grad.clone() for n, p in self.model.named_parameters()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)


class TinyLM(torch.nn.Module):
    """A float64-clean causal LM (TinyGPT's loss upcasts logits to float32, which would blur
    a float64 comparison): the same interface, ``model(input_ids, labels) -> mean loss``."""

    def __init__(self, vocab_size: int = 64, dim: int = 16) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab_size, dim)
        self.mix = torch.nn.Linear(2 * dim, dim)
        self.head = torch.nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids)
        previous = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
        logits = self.head(torch.tanh(self.mix(torch.cat([x, previous], dim=-1))))
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
            ignore_index=-100)


PADDED = [[12, 3], [7, 7], [2, 10], [5, 1]]
"""Token lengths per sample of each micro-batch (of 12 tokens): label counts differ."""


def token_batches(padded: bool, num_micro_batches: int = 3, micro_batch: int = 2,
                  seq_len: int = 12) -> list[dict[str, torch.Tensor]]:
    """Micro-batches of token ids with labels, padding (id 0) labelled -100 when ``padded``."""
    torch.manual_seed(1)
    lengths = (PADDED if padded else [[seq_len] * micro_batch] * 4)[:num_micro_batches]
    batches = []
    for row_lengths in lengths:
        ids = torch.randint(1, 64, (micro_batch, seq_len))
        labels = ids.clone()
        for row, length in enumerate(row_lengths):
            ids[row, length:] = 0
            labels[row, length:] = -100
        batches.append({"input_ids": ids, "labels": labels})
    return batches


def full_batch_grads(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]],
                      loss) -> dict[str, torch.Tensor]:
    keys = batches[0].keys() if isinstance(batches[0], dict) else None
    if keys is not None:
        full = {k: torch.cat([b[k] for b in batches]) for k in keys}
    else:
        full = tuple(torch.cat(parts) for parts in zip(*batches, strict=True))
    model.zero_grad(set_to_none=True)
    loss(model, full).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                 float32_weights: bool = False) -> None:
    """Equal gradients. Against one big batch, allow float32 rounding: the micro-batch weights
    are float32 ratios of item counts (as in training); everything else is float64."""
    assert a.keys() == b.keys()
    rtol, atol = (1e-6, 1e-9) if float32_weights else (1e-12, 1e-15)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol,
                                   msg=lambda m, key=key: f"{key}: {m}")


def saved_bytes(forward) -> int:
    """Bytes autograd keeps for backward while ``forward()`` runs (what checkpointing frees:
    checkpointed blocks keep only their inputs)."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return total


class _Residual(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class BlockLM(torch.nn.Module):
    """A float64-clean causal LM with repeated residual blocks (to checkpoint, to shard)."""

    def __init__(self, vocab_size: int = 64, dim: int = 16, num_blocks: int = 3) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab_size, dim)
        self.blocks = torch.nn.ModuleList(_Residual(dim) for _ in range(num_blocks))
        self.head = torch.nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
            ignore_index=-100)


def load_script(path: Path) -> ModuleType:
    """The generated ``train_autotuned.py`` imported as a module (its ``main`` not run)."""
    spec = importlib.util.spec_from_file_location("generated", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _GraphOutputGrad(torch.autograd.Function):
    """``x @ weight`` whose backward hands back its weight gradient in one buffer that every
    backward reuses, as a CUDA graph's replay writes its outputs into the same memory."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, out)
        return x @ weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, out = ctx.saved_tensors
        out.copy_(x.transpose(0, 1) @ grad)
        return out.detach(), None, None  # a fresh tensor on that memory: autograd adopts it


class StaticGradModel(torch.nn.Module):
    """A regression whose weight gradient lives in one reused buffer (``_GraphOutputGrad``):
    on a CPU, the hazard of gradient accumulation under CUDA graphs (pytorch/pytorch#169545).
    Its workload loss is ``StaticGradModel.loss`` on ``(x, y)`` batches."""

    def __init__(self, dim: int = 3) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim, 2, dtype=torch.float64))
        self.register_buffer("replayed", torch.zeros(dim, 2, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GraphOutputGrad.apply(self.weight, x, self.replayed)

    @staticmethod
    def loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)


def static_grad_batches(num_micro_batches: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(2)
    return [(torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64))
            for _ in range(num_micro_batches)]
