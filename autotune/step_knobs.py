"""The knobs that rebuild part of a model or its optimizer: checkpointing of the repeated
blocks, and the optimizer's implementation (for-loop, foreach, fused).

``autotune.step`` applies them with the other knobs (``apply_to_model``,
``apply_to_optimizer``) and re-exports them; the child's trial, the estimator and ``Tuned``
reach them through it, so every path rebuilds alike.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from autotune.knobs import KNOB, KnobUnsupported, memory_budget
from autotune.traits import WorkloadTraits


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the longest run of consecutive same-type children (each
    with parameters) of any ``ModuleList`` or ``Sequential``; ties go to more parameters."""

    best: list[nn.Module] = []

    def weight(run: list[nn.Module]) -> tuple[int, int]:
        return len(run), sum(p.numel() for m in run for p in m.parameters())

    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        run: list[nn.Module] = []
        for child in [*module.children(), None]:
            same = (child is not None and run and type(child) is type(run[0]))
            if not same:
                if len(run) >= 2 and weight(run) > weight(best):
                    best = run
                run = []
            if child is not None and any(True for _ in child.parameters()):
                run.append(child)
    return best


def _blocks_of(model: nn.Module, blocks: Callable[[nn.Module], Sequence[nn.Module]] | None
               ) -> list[nn.Module]:
    return list(blocks(model)) if blocks is not None else find_blocks(model)


def apply_checkpointing(model: nn.Module, setting: str,
                        blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None) -> int:
    """Checkpoint the repeated blocks' activations (non-reentrant): every block (``blocks``)
    or every second one (``alternate``). A Hugging Face model uses its own switch
    (``activation_checkpointing_enable``, or ``gradient_checkpointing_enable`` and each
    layer's ``gradient_checkpointing`` flag before transformers 5); other modules get their
    blocks' ``forward`` wrapped in ``torch.utils.checkpoint.checkpoint``, so parameter names
    stay as they were. A compiler budget (``budget-0.5``) changes no block: the compiled
    model's calls carry it (``apply_memory_budget``).

    Returns:
        How many blocks are checkpointed.

    Raises:
        KnobUnsupported: no repeated blocks.
    """
    if setting == "off" or memory_budget(setting) is not None:
        return 0
    found = _blocks_of(model, blocks)
    chosen = [b for i, b in enumerate(found) if setting == "blocks" or i % 2 == 0]
    if blocks is None and getattr(model, "supports_gradient_checkpointing", False):
        every = 1 if setting == "blocks" else 2
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable({"use_reentrant": False}, every_n_layers=every)
            return len(chosen) or 1
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layers = [b for b in found if hasattr(b, "gradient_checkpointing")]
        for i, layer in enumerate(layers):  # every second layer: the others keep activations
            layer.gradient_checkpointing = i % every == 0
        return len(chosen) or 1
    if len(found) < 2:
        raise KnobUnsupported(KNOB["checkpointing"].needs(setting, WorkloadTraits()) or "no blocks")
    for block in chosen:
        _checkpoint_forward(block)
    return len(chosen)


def _checkpoint_forward(block: nn.Module) -> None:
    from torch.utils.checkpoint import checkpoint

    forward = block.forward

    @functools.wraps(forward)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    block.forward = checkpointed  # type: ignore[method-assign]


_IMPL_FLAGS = {"for-loop": {"foreach": False, "fused": False},
               "foreach": {"foreach": True, "fused": False},
               "fused": {"foreach": False, "fused": True}}


def optimizer_impls(optimizer: torch.optim.Optimizer) -> tuple[str, ...]:
    """Implementations the optimizer's class has a switch for."""
    out = []
    if "foreach" in optimizer.defaults:
        out += ["for-loop", "foreach"]
    if "fused" in optimizer.defaults:
        out.append("fused")
    return tuple(out)


def default_impl(optimizer: torch.optim.Optimizer) -> str:
    """The implementation an optimizer as built runs: what its flags say, else torch's own
    choice (foreach when every parameter is on CUDA, for-loop otherwise), else ``""``."""
    if not optimizer_impls(optimizer):
        return ""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return "fused"
    if group.get("foreach") is not None:
        return "foreach" if group["foreach"] else "for-loop"
    on_cuda = all(p.is_cuda for g in optimizer.param_groups for p in g["params"])
    return "foreach" if on_cuda else "for-loop"


def rebuild_optimizer(optimizer: torch.optim.Optimizer, impl: str) -> torch.optim.Optimizer:
    """The same optimizer (class, parameter groups, hyper-parameters, step hooks) as ``impl``;
    ``default`` keeps it as built.

    Raises:
        KnobUnsupported: its class has no such switch, or refuses it here (e.g. fused on a
            device or dtype it does not support).
    """
    if impl == "default":
        return optimizer
    cls = type(optimizer)
    if impl not in optimizer_impls(optimizer):
        raise KnobUnsupported(KNOB["optimizer_impl"].needs(impl, WorkloadTraits(
            optimizer=cls.__name__, optimizer_impls=optimizer_impls(optimizer))) or impl)
    flags = {k: v for k, v in _IMPL_FLAGS[impl].items() if k in optimizer.defaults}
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {k: v for k, v in {**optimizer.defaults, **flags}.items() if k in accepted}
    groups = [{**group, **flags} for group in optimizer.param_groups]
    try:
        rebuilt = cls(groups, **defaults)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise KnobUnsupported(f"{cls.__name__} refused {impl}: {exc}") from exc
    for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
        if hasattr(optimizer, name) and hasattr(rebuilt, name):
            getattr(rebuilt, name).update(getattr(optimizer, name))
    return rebuilt
