"""Workloads: what to train. Model, worst-case batch, loss and optimizer factories.

A workload holds code, so it never crosses a process boundary: a ``WorkloadSpec`` does, and
``builtin_workloads.load_workload`` rebuilds the workload inside the child process that runs
it (a user's file through ``user_code``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autotune.errors import ConfigError, WorkloadError
from autotune.serialize import control_character

Batch = Any  # a tensor, a tuple/list of tensors, or a dict of tensors


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What to train: the factories autotune calls inside each child process.

    Example:
        >>> autotune.Workload(
        ...     name="my-model",
        ...     build_model=lambda: MyModel(),
        ...     make_batch=lambda micro_batch: {"x": torch.randn(micro_batch, 512)},
        ...     loss=lambda model, batch: model(**batch).loss,
        ... )
    """

    name: str
    """Shown in reports and stored in ``autotune.json``."""
    build_model: Callable[[], nn.Module]
    """Returns the model on the CPU; called inside the child process (never in the parent)."""
    make_batch: Callable[..., Batch]
    """Returns the WORST-CASE batch of ``micro_batch`` samples (max sequence length, largest
    image): probes must see the largest memory the real data can ask for. A workload that
    declares ``lengths`` takes the length too, ``make_batch(micro_batch, length)``: a batch
    whose sequence dimension (dim 1) is ``length``."""
    loss: Callable[[nn.Module, Batch], torch.Tensor] | None = None
    """Scalar mean loss of one micro-batch. Default: ``model(**batch).loss`` for dict batches
    (Hugging Face outputs), ``model(*batch).loss`` for tuples, ``model(batch).loss`` else."""
    build_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None
    """Default: AdamW(lr=1e-4): two fp32 state tensors per parameter."""
    count_loss_items: Callable[[Batch], torch.Tensor | int] | None = None
    """How many items (e.g. label tokens) a micro-batch's mean loss averages over. When given,
    micro-batch losses are weighted by their share of the whole effective batch, so a token
    loss is normalized once over all tokens of the optimizer step."""
    tokens_per_sample: int | None = None
    """For tokens/s in reports (sequence length for language models). With ``lengths``, the
    worst-case length (default: the longest length)."""
    lengths: Sequence[int] | Callable[[], Sequence[int]] | None = None
    """Real sequence lengths (a sample of the dataset's token counts, or a function returning
    one, e.g. read from the dataset): batches vary in length, and the ``shapes`` knob tunes how
    they are padded and compiled (``docs/shapes.md``). Memory is probed at the worst case;
    speed on batches drawn from these lengths. None: every batch has the worst-case shape."""
    blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None
    """The model's repeated blocks, for activation checkpointing (and FSDP's per-block
    wrapping). Default: the longest run of same-type modules in a ``ModuleList`` or
    ``Sequential`` (``knobs.find_blocks``)."""

    def __post_init__(self) -> None:
        """Refuse a name with a control character: it is stored in ``autotune.json`` and
        written into the files made from it (comments of ``autotune export``'s TOML and YAML,
        the script's header), where a line break would start configuration or code.

        Raises:
            ConfigError: the name holds a control character (a line break, a tab, ...).
        """
        bad = control_character(self.name) if isinstance(self.name, str) else None
        if bad is not None:
            raise ConfigError(f"Workload(name={self.name!r}) holds the control character "
                              f"{bad}: a workload's name is one line of text; pass a name "
                              "without line breaks, tabs or escapes")

    def compute_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The workload's loss on one micro-batch."""
        if self.loss is not None:
            return self.loss(model, batch)
        if isinstance(batch, dict):
            args, kwargs, call = (), batch, "model(**batch)"
        elif isinstance(batch, (tuple, list)):
            args, kwargs, call = tuple(batch), {}, "model(*batch)"
        else:
            args, kwargs, call = (batch,), {}, "model(batch)"
        try:
            out = model(*args, **kwargs)
        except TypeError as exc:
            inner = _unwrapped(model)
            if not _refuses(inner, args, kwargs):
                raise  # a TypeError inside the model's own code: the model's to fix
            raise WorkloadError(
                f"workload {self.name!r}: the default loss calls {call}, and "
                f"{type(inner).__name__}.forward does not take that batch ({exc}); pass "
                "loss=lambda model, batch: ... (e.g. loss=lambda model, batch: "
                "torch.nn.functional.mse_loss(model(batch[0]), batch[1])) to autotune.Workload"
            ) from exc
        loss = getattr(out, "loss", None)
        if loss is None:
            raise WorkloadError(
                f"workload {self.name!r}: the default loss is {call}.loss, and the model "
                f"returned {type(out).__name__}, which has no .loss; pass loss=lambda model, "
                "batch: ... to autotune.Workload"
            )
        return loss

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The workload's optimizer, AdamW by default."""
        if self.build_optimizer is not None:
            return self.build_optimizer(params)
        return torch.optim.AdamW(params, lr=1e-4)


def _unwrapped(model: nn.Module) -> nn.Module:
    """The user's model under a compile or DDP wrapper (whose forward takes anything)."""
    model = getattr(model, "_orig_mod", model)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return getattr(model, "_orig_mod", model)


def _refuses(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the model's forward cannot take these arguments (its signature refuses them)."""
    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError:
        return True
    except ValueError:  # no signature to read (a builtin)
        return False
    return False


def check_batch(batch: Batch, micro_batch: int, name: str) -> None:
    """Check that ``make_batch(micro_batch)`` returned tensors with ``micro_batch`` rows.

    Raises:
        WorkloadError: wrong type, no tensors, or a leading dimension that is not the micro-batch.
    """
    tensors = _tensors(batch)
    if tensors is None or not tensors:
        raise WorkloadError(
            f"workload {name!r}: make_batch({micro_batch}) returned {type(batch).__name__}; "
            "it must return a tensor, a tuple of tensors or a dict of tensors"
        )
    for key, tensor in tensors:
        if tensor.dim() == 0 or tensor.shape[0] != micro_batch:
            raise WorkloadError(
                f"workload {name!r}: make_batch({micro_batch}) returned {key} with shape "
                f"{tuple(tensor.shape)}; its first dimension must be the micro-batch "
                f"({micro_batch})"
            )


def _tensors(batch: Batch) -> list[tuple[str, torch.Tensor]] | None:
    if isinstance(batch, torch.Tensor):
        return [("the tensor", batch)]
    if isinstance(batch, dict):
        items = list(batch.items())
    elif isinstance(batch, (tuple, list)):
        items = [(f"item {i}", v) for i, v in enumerate(batch)]
    else:
        return None
    if not all(isinstance(v, torch.Tensor) for _, v in items):
        return None
    return [(str(k), v) for k, v in items]


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    """Move a batch (tensor, tuple/list or dict of tensors) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return type(batch)(to_device(v, device) for v in batch)


def batch_bytes(batch: Batch) -> int:
    """Bytes of a batch's tensors."""
    if isinstance(batch, torch.Tensor):
        return batch.nelement() * batch.element_size()
    values = batch.values() if isinstance(batch, dict) else batch
    return sum(batch_bytes(v) for v in values if isinstance(v, (torch.Tensor, dict, tuple, list)))


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
