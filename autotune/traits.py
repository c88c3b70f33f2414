"""What a child saw of the workload that decides which knob values it can take, and what
each knob's values need of it.

A child fills ``WorkloadTraits`` (``autotune.trial``: the repeated blocks, the optimizer's
implementations, the inputs, the declared lengths); each row of ``autotune.knobs.KNOBS`` names
its ``needs`` here: why a workload without the trait cannot take a value (None: it can).
``knob_rules.skip_reason`` asks every row. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

BLOCK_CHECKPOINTING: tuple[str, ...] = ("blocks", "alternate")
"""The checkpointing values that wrap repeated blocks (``budget-*`` is the compiler's)."""


@dataclass(frozen=True, kw_only=True)
class WorkloadTraits:
    """What a child saw of the workload that decides which knob values can apply to it."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid", "strict": True}

    num_blocks: int = 0
    """Repeated blocks found for checkpointing (``Workload.blocks`` or the longest run of
    same-type children of a ModuleList/Sequential)."""
    blocks: str = ""
    """Where they are, e.g. ``blocks (2 x _Block)``."""
    hf_checkpointing: bool = False
    """A Hugging Face model that supports ``gradient_checkpointing_enable``."""
    has_conv2d: bool = False
    image_input: bool = False
    """The batch has a 4-D floating-point tensor (N, C, H, W)."""
    optimizer: str = ""
    """The workload's optimizer class."""
    optimizer_impls: tuple[str, ...] = ()
    """Implementations its class can be rebuilt as (``for-loop``, ``foreach``, ``fused``)."""
    optimizer_default: str = ""
    """The implementation the optimizer as built runs (torch picks foreach for CUDA
    parameters and for-loop otherwise, unless the workload chose)."""
    has_lengths: bool = False
    """The workload declares real sequence lengths (``Workload.lengths``, ``--lengths``)."""
    padding_ceiling: float = 1.0
    """The worst-case length over the declared lengths' mean: the most any shape policy can
    gain over padding every batch to the worst case (it cannot do less work than the real
    tokens); 1.0 where no lengths are declared."""


def checkpointing_needs(value: str, traits: WorkloadTraits) -> str | None:
    """``checkpointing``: a value that wraps blocks needs repeated blocks (or a Hugging Face
    model's own switch)."""
    if value in BLOCK_CHECKPOINTING and traits.num_blocks < 2 \
            and not traits.hf_checkpointing:
        return ("no repeated blocks to checkpoint (no ModuleList/Sequential of 2 or more "
                "same-type modules; name them with Workload(blocks=...))")
    return None


def optimizer_needs(value: str, traits: WorkloadTraits) -> str | None:
    """``optimizer_impl``: an implementation the optimizer's class can be rebuilt as, other
    than the one it runs as built."""
    if value != "default" and value == traits.optimizer_default:
        return (f"{traits.optimizer} as built already runs {value} (the same run as "
                "optimizer_impl=default)")
    if value != "default" and value not in traits.optimizer_impls:
        return (f"{traits.optimizer or 'the optimizer'} cannot be rebuilt as {value} (it has "
                f"{', '.join(traits.optimizer_impls) or 'no implementation switch'})")
    return None


def format_needs(value: str, traits: WorkloadTraits) -> str | None:
    """``memory_format``: ``channels_last`` needs 2-D convolutions and 4-D image inputs."""
    if value == "channels_last" and not (traits.has_conv2d and traits.image_input):
        return "needs 2-D convolutions and 4-D image inputs"
    return None


def scope_needs(value: str, traits: WorkloadTraits) -> str | None:
    """``compile_scope``: ``blocks`` needs repeated blocks."""
    if value == "blocks" and traits.num_blocks < 2:
        return ("no repeated blocks to compile one by one (no ModuleList/Sequential of 2 or "
                "more same-type modules; name them with Workload(blocks=...))")
    return None


def shapes_needs(value: str, traits: WorkloadTraits) -> str | None:
    """``shapes``: a policy other than ``max`` needs declared lengths."""
    if value != "max" and not traits.has_lengths:
        return ("the workload declares no lengths (every batch has its worst-case shape); "
                "declare Workload(lengths=...) or --lengths FILE")
    return None
