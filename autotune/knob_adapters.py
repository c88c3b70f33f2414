"""The knobs' settings handed to what runs them outside autotune's own step.

A child's environment before CUDA starts (the allocator: ``child_environment``), the ``dynamic``
argument of ``torch.compile`` under the shape policy (``shapes_dynamic``), and Hugging Face
``TrainingArguments`` and Accelerate's ``Accelerator`` (``training_arguments``,
``accelerator_kwargs``), with a note for each tuned value those have no switch for
(``Tuned.training_arguments``, ``Tuned.accelerator_kwargs`` and ``Tuned.lightning_kwargs`` warn
them; ``autotune export`` says them). What the knobs are, their values and words, is
``autotune.knobs``. No torch here; transformers and accelerate are imported only where a
mapping needs them.
"""

from __future__ import annotations

from typing import Any

from autotune.knobs import Knobs, memory_budget
from autotune.traits import BLOCK_CHECKPOINTING


def child_environment(knobs: Knobs, base: dict[str, str]) -> dict[str, str]:
    """Environment variables a child sets before CUDA starts (the allocator), over ``base``."""
    if knobs.allocator != "expandable_segments":
        return {}
    current = base.get("PYTORCH_CUDA_ALLOC_CONF", "")
    parts = [p for p in current.split(",") if p and not p.startswith("expandable_segments")]
    return {"PYTORCH_CUDA_ALLOC_CONF": ",".join([*parts, "expandable_segments:True"])}


def shapes_dynamic(knobs: Knobs, configured: bool | None = None) -> bool | None:
    """``torch.compile``'s ``dynamic`` under the shape policy: ``buckets`` compiles one static
    graph per bucket (False: automatic dynamic shapes would turn the second bucket into a
    dynamic graph); the others keep ``configured`` (``TunedConfig.compile_dynamic``; ``dynamic``
    marks the sequence dimension itself)."""
    return False if knobs.shapes == "buckets" else configured


def budget_by_hand(knobs: Knobs, target: str) -> list[str]:
    """How to set the compiler's recompute where ``target`` has no switch for it."""
    budget = memory_budget(knobs.checkpointing)
    if budget is None:
        return []
    return [f"checkpointing={knobs.checkpointing}: {target} has no switch for the compiler's "
            "recompute: set torch._functorch.config.activation_memory_budget = "
            f"{budget} before the first step (read when the model compiles), or compile "
            "with cfg.compile(model), which sets it around the compiled model's calls"]


def training_arguments(knobs: Knobs, device_type: str = "cuda"
                       ) -> tuple[dict[str, Any], list[str]]:
    """``TrainingArguments`` keywords for the knobs, and what has no mapping there.

    ``optim`` is always set (Trainer's own default is ``adamw_torch_fused`` since torch 2.8):
    ``fused`` is ``adamw_torch_fused``; every other implementation is ``adamw_torch``, whose
    AdamW is built without implementation flags, so torch picks its loop as for an optimizer
    built without them (``default``): foreach with every parameter on CUDA, for-loop
    otherwise. ``foreach`` on ``device_type`` cpu and ``for-loop`` on cuda have no
    ``TrainingArguments`` switch (``optim_args`` do not reach AdamW's ``foreach``): a note.
    ``ddp`` needs no keyword (Trainer runs DistributedDataParallel under torchrun); ``fsdp``
    and ``fsdp-no-reshard`` are ``fsdp=True`` with ``fsdp_config`` version 2 and
    ``reshard_after_forward`` (Trainer shards each layer of the model's ``_no_split_modules``,
    a transformers model's blocks, then the root); ``ddp-bucket-view`` has no switch.
    """
    compiled = knobs.compiled
    kwargs: dict[str, Any] = {
        "bf16": knobs.precision == "bf16", "fp16": knobs.precision == "fp16",
        "tf32": knobs.precision == "tf32",  # False turns TF32 off, as the search measured
        "torch_compile": compiled,
        "torch_compile_mode": (knobs.compile_mode if compiled and knobs.compile_mode != "default"
                               else None),
    }
    checkpointed = knobs.checkpointing in BLOCK_CHECKPOINTING
    notes = budget_by_hand(knobs, "Trainer")
    if _trainer_has_activation_checkpointing():  # transformers 5: every_n_layers, new names
        kwargs["activation_checkpointing"] = checkpointed
        if checkpointed:
            kwargs["activation_checkpointing_kwargs"] = {
                "use_reentrant": False, "every_n_layers": 1 if knobs.checkpointing == "blocks"
                else 2}
    else:
        kwargs["gradient_checkpointing"] = checkpointed
        if checkpointed:
            kwargs["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
        if knobs.checkpointing == "alternate":
            notes.append("checkpointing=alternate: this transformers' Trainer checkpoints every "
                         "block (gradient_checkpointing=True); every second one needs "
                         "cfg.apply(model)")
    impl = knobs.optimizer_impl
    kwargs["optim"] = "adamw_torch_fused" if impl == "fused" else "adamw_torch"
    torch_picks = "foreach" if device_type == "cuda" else "for-loop"
    if impl in ("foreach", "for-loop") and impl != torch_picks:
        notes.append(
            f"optimizer_impl={impl}: Trainer's optim=adamw_torch runs torch's own loop "
            f"({torch_picks} on {device_type}) and no TrainingArguments switch makes it {impl};"
            " pass Trainer(optimizer_cls_and_kwargs=(torch.optim.AdamW, {'lr': "
            f"args.learning_rate, 'foreach': {impl == 'foreach'}}})) for the tuned one")
    if knobs.memory_format != "contiguous":
        notes.append("memory_format=channels_last has no TrainingArguments switch: call "
                     "cfg.apply(model) before Trainer(model=...)")
    if knobs.allocator != "default":
        notes.append(f"allocator={knobs.allocator}: set PYTORCH_CUDA_ALLOC_CONF="
                     "expandable_segments:True in the environment before CUDA starts")
    if knobs.sharded:
        kwargs["fsdp"] = True
        kwargs["fsdp_config"] = {"version": 2,
                                 "reshard_after_forward": knobs.strategy == "fsdp"}
    elif knobs.strategy == "ddp-bucket-view":
        notes.append("strategy=ddp-bucket-view: TrainingArguments has no gradient_as_bucket_view "
                     "switch (Trainer builds its own DistributedDataParallelKwargs), so Trainer "
                     "runs plain DDP under torchrun, with one copy of the gradients more than "
                     "measured")
    notes += _fsdp_reduce_note(knobs, "Trainer")
    notes += scope_note(knobs, "Trainer")
    if knobs.shapes == "buckets":
        kwargs["group_by_length"] = True  # batches of alike lengths: less padding per bucket
    notes += shapes_notes(knobs, "Trainer")
    return kwargs, notes


def scope_note(knobs: Knobs, target: str) -> list[str]:
    """What ``target`` cannot take of ``compile_scope=blocks`` (Trainer: no switch; an
    Accelerate without ``TorchDynamoPlugin.use_regional_compilation``)."""
    if knobs.compile_scope != "blocks" or not knobs.compiled:
        return []
    return [f"compile_scope=blocks: {target} has no switch for regional compilation and "
            "compiles the whole model (a longer cold compile than measured); for the tuned "
            "one turn its compile off and call cfg.compile(model) before handing it the model "
            "(each repeated block compiled in place)"]


def _fsdp_reduce_note(knobs: Knobs, target: str) -> list[str]:
    """What differs under FSDP with autocast: Accelerate's FSDP2 policy (Trainer's too) takes
    every dtype from ``mixed_precision``; the search reduced gradients in fp32."""
    if not knobs.sharded or knobs.precision not in ("bf16", "fp16"):
        return []
    dtype = {"bf16": "bfloat16", "fp16": "float16"}[knobs.precision]
    fix = ("Trainer has no switch for it" if target == "Trainer" else
           "before Accelerator(...), set kwargs['fsdp_plugin'].mixed_precision_policy = "
           f"MixedPrecisionPolicy(param_dtype=torch.{dtype}, reduce_dtype=torch.float32)")
    return [f"strategy={knobs.strategy} with {knobs.precision}: {target}'s FSDP2 reduces "
            f"gradients in {knobs.precision} (its policy comes from mixed_precision) where the "
            f"search reduced them in fp32; {fix}"]


def _trainer_has_activation_checkpointing() -> bool:
    """Whether the installed transformers' ``TrainingArguments`` takes
    ``activation_checkpointing`` (it renamed ``gradient_checkpointing``, an alias until v6)."""
    try:
        import transformers
    except ImportError:
        return False
    fields = getattr(transformers.TrainingArguments, "__dataclass_fields__", {})
    return "activation_checkpointing" in fields


def accumulation_note(knobs: Knobs, accumulate_steps: int, target: str) -> list[str]:
    """What ``target`` (Trainer, Accelerate) gets wrong with the knobs at this accumulation:
    under CUDA graphs, a step of several micro-batches (``step.train_step``'s ``cuda_graphs``)."""
    if not knobs.cuda_graphs or accumulate_steps <= 1:
        return []
    return [f"compile_mode={knobs.compile_mode} with {accumulate_steps} micro-batches a step: "
            f"{target}'s gradient accumulation under CUDA graphs keeps the first micro-batch's "
            "gradients in the graph's output buffer, which the next replay overwrites "
            "(torch raises, or an older one adds wrong gradients: pytorch/pytorch#169545); "
            "step with cfg.train_step(...) or the generated loop (they copy those gradients "
            "out), or pick the best config without CUDA graphs (max-autotune-no-cudagraphs)"]


def accelerator_kwargs(knobs: Knobs) -> tuple[dict[str, Any], list[str]]:
    """``Accelerator`` keywords (beyond the compile plugin) and what needs doing by hand.

    ``ddp`` needs no keyword (Accelerate runs DistributedDataParallel under torchrun or
    ``accelerate launch``); ``ddp-bucket-view`` is a ``DistributedDataParallelKwargs``
    handler; ``fsdp`` and ``fsdp-no-reshard`` an FSDP2 ``FullyShardedDataParallelPlugin``
    (built here: accelerate is imported only for them).
    """
    kwargs: dict[str, Any] = {
        "mixed_precision": {"bf16": "bf16", "fp16": "fp16"}.get(knobs.precision, "no")}
    notes = [f"{name}={getattr(knobs, name)}: apply it with cfg.apply(model) / "
             "cfg.build_optimizer(...) (Accelerate has no switch for it)"
             for name in knobs.changed() if name not in ("strategy", "compile_scope", "shapes")
             and memory_budget(getattr(knobs, name)) is None]
    notes += budget_by_hand(knobs, "Accelerate")
    notes += shapes_notes(knobs, "Accelerate")
    if knobs.strategy not in ("none", "ddp"):
        found, why = _accelerate_strategy(knobs)
        kwargs.update(found)
        notes += why
    return kwargs, notes


def _accelerate_strategy(knobs: Knobs) -> tuple[dict[str, Any], list[str]]:
    """The DDP kwargs handler (``ddp-bucket-view``) or the FSDP2 plugin (``fsdp*``), and what
    the plugin does not carry."""
    try:
        from accelerate.utils import DistributedDataParallelKwargs, FullyShardedDataParallelPlugin
    except ImportError:
        return {}, [f"strategy={knobs.strategy}: accelerate is not installed here (pip install "
                    "accelerate); no plugin built"]
    if knobs.strategy == "ddp-bucket-view":
        return {"kwargs_handlers": [DistributedDataParallelKwargs(gradient_as_bucket_view=True)]
                }, []
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, reshard_after_forward=knobs.strategy == "fsdp",
        auto_wrap_policy="transformer_based_wrap")
    notes = [f"strategy={knobs.strategy}: the plugin shards each layer the model's "
             "_no_split_modules names (a transformers model's blocks), then the root; for "
             "another model set kwargs['fsdp_plugin'].transformer_cls_names_to_wrap = [its "
             "block class name] (else Accelerate shards the root alone: one all-gather of "
             "every parameter)"]
    return {"fsdp_plugin": plugin}, notes + _fsdp_reduce_note(knobs, "Accelerate")


def shapes_notes(knobs: Knobs, target: str) -> list[str]:
    """What ``target`` (Trainer, Accelerate) needs by hand for the shape policy: its collate
    (``Tuned.pad_to``; ``buckets``: ``DataCollatorWithPadding(pad_to_multiple_of=...)`` is the
    nearest switch, one multiple for all lengths) and the dynamic marking."""
    if knobs.shapes == "buckets":
        return [f"shapes=buckets: pad each batch to cfg.pad_to(its longest length) in your "
                f"collate (the tuned bucket lengths; {target}'s DataCollatorWithPadding has "
                "only pad_to_multiple_of), and compile with dynamic=False"]
    if knobs.shapes == "dynamic":
        return [f"shapes=dynamic: pad each batch to its own longest sample only, and mark its "
                f"sequence dimension with cfg.batch(batch) (torch._dynamo.mark_dynamic(t, 1)); "
                f"{target} has no switch for it"]
    return []
