"""What ``Tuned`` hands to a framework: keyword arguments for Hugging Face
``TrainingArguments``, Accelerate's ``Accelerator`` and Lightning's ``Trainer``, with one
warning for what each has no switch for (``autotune.knob_adapters`` says each knob's words).
``Tuned``'s methods of the same names call these.
"""

from __future__ import annotations

import inspect
import warnings
from typing import TYPE_CHECKING, Any

from autotune import knob_adapters
from autotune.compile_notes import watch_recompile_limit
from autotune.errors import MissingDependencyError

if TYPE_CHECKING:
    from autotune.usage import Tuned


def training_arguments(tuned: Tuned) -> dict[str, Any]:
    """What ``Tuned.training_arguments`` returns (its docstring says what it carries and
    what it warns of)."""
    kwargs, notes = knob_adapters.training_arguments(tuned.knobs, tuned.device_type)
    if tuned.compiled and tuned.config.compile_dynamic is not None:
        value = str(tuned.config.compile_dynamic).lower()
        notes.append(f"compile_dynamic={value}: Trainer compiles with torch's automatic "
                     f"dynamic shapes; set ACCELERATE_DYNAMO_USE_DYNAMIC={value} in the "
                     "environment before Trainer(...)")
    _warn(notes + knob_adapters.accumulation_note(tuned.knobs, tuned.accumulate_steps, "Trainer"),
          "TrainingArguments")
    return {"per_device_train_batch_size": tuned.micro_batch,
            "gradient_accumulation_steps": tuned.accumulate_steps, **kwargs}


def accelerator_kwargs(tuned: Tuned) -> dict[str, Any]:
    """What ``Tuned.accelerator_kwargs`` returns (its docstring says what it carries and
    what it warns of)."""
    found, notes = knob_adapters.accelerator_kwargs(tuned.knobs)
    _warn(notes + knob_adapters.accumulation_note(tuned.knobs, tuned.accumulate_steps,
                                                  "Accelerate"), "Accelerator")
    kwargs: dict[str, Any] = {"gradient_accumulation_steps": tuned.accumulate_steps, **found}
    if not tuned.compiled:
        return kwargs
    mode = None if tuned.compile_mode == "default" else tuned.compile_mode
    watch_recompile_limit()
    plugin = _dynamo_plugin(mode, knob_adapters.shapes_dynamic(tuned.knobs,
                                                               tuned.config.compile_dynamic))
    regional = tuned.knobs.compile_scope == "blocks"
    if plugin is not None and regional and hasattr(plugin, "use_regional_compilation"):
        # Accelerate's regional compilation compiles each block of a ModuleList of one
        # class, and each other leaf module on its own (the search ran those eager).
        plugin.use_regional_compilation = True
    elif regional:
        warnings.warn(knob_adapters.scope_note(tuned.knobs, "the installed Accelerate")[0],
                      stacklevel=3)
    if plugin is not None:
        kwargs["dynamo_plugin"] = plugin
    else:
        kwargs["dynamo_backend"] = "inductor"
        if mode is not None or tuned.config.compile_dynamic is not None:
            warnings.warn(
                f"the installed accelerate cannot take torch.compile mode {mode!r} and "
                f"dynamic={tuned.config.compile_dynamic} (no TorchDynamoPlugin / "
                "Accelerator(dynamo_plugin=...)): compiling with inductor's defaults; "
                "upgrade accelerate to keep the tuned ones", stacklevel=3)
    return kwargs


def lightning_trainer_kwargs(tuned: Tuned) -> dict[str, Any]:
    """What ``Tuned.lightning_trainer_kwargs`` returns (its docstring says what it carries and
    what it warns of)."""
    try:
        from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
    except ImportError:
        raise MissingDependencyError(
            "lightning_trainer_kwargs() needs lightning: pip install 'autotune[lightning]' "
            "(or pip install lightning)") from None
    knob, notes = tuned.knobs, []
    strategy: Any = {"none": "auto", "ddp": "ddp"}.get(knob.strategy)
    if knob.strategy == "ddp-bucket-view":
        strategy = DDPStrategy(gradient_as_bucket_view=True)
    elif knob.sharded:
        strategy = FSDPStrategy(sharding_strategy="FULL_SHARD" if knob.strategy == "fsdp"
                                else "SHARD_GRAD_OP")
        notes.append(f"strategy={knob.strategy}: Lightning's FSDPStrategy shards with FSDP1 "
                     "where the search measured FSDP2 (fully_shard per block); pass "
                     "auto_wrap_policy={YourBlock} to it to shard per block")
    if knob.allocator != "default":
        notes.append(f"allocator={knob.allocator}: set PYTORCH_CUDA_ALLOC_CONF="
                     "expandable_segments:True in the environment before the first CUDA "
                     "allocation (Trainer has no switch for it)")
    _warn(notes + knob_adapters.accumulation_note(knob, tuned.accumulate_steps, "Lightning"),
          "Trainer")
    ranks = tuned.config.nproc_per_node
    return {"precision": {"bf16": "bf16-mixed", "fp16": "16-mixed"}.get(tuned.precision,
                                                                       "32-true"),
            "accumulate_grad_batches": tuned.accumulate_steps,
            "accelerator": "gpu" if tuned.device_type == "cuda" else "cpu",
            "devices": ranks, "num_nodes": max(1, tuned.config.world_size // ranks),
            "strategy": strategy}


def _warn(notes: list[str], target: str) -> None:
    """One warning with every tuned knob that ``target`` cannot take as a keyword."""
    if notes:
        warnings.warn(f"{target} keywords do not carry every tuned knob: " + "; ".join(notes),
                      stacklevel=4)


def _dynamo_plugin(mode: str | None, dynamic: bool | None) -> Any:
    """A ``TorchDynamoPlugin`` for the mode and ``compile_dynamic``, or None when accelerate
    cannot take one."""
    try:
        from accelerate import Accelerator
        from accelerate.utils import TorchDynamoPlugin
    except ImportError:
        return None
    if "dynamo_plugin" not in inspect.signature(Accelerator).parameters:
        return None
    return TorchDynamoPlugin(backend="inductor", mode=mode, dynamic=dynamic)
