"""The knobs' part of ``train_autotuned.py``: the plain copy of how ``autotune.step`` applies
them, put into ``codegen_templates.SCRIPT`` by ``autotune.codegen`` (``$knob_functions``). No
torch import here.

``find_blocks``, ``checkpoint_blocks``, ``compiler_recompute``, ``rebuild_optimizer``,
``parallelize``, ``compile_model`` and ``to_device`` (some read the tuned values the script
assigns above them: ``compile_scope``, ``compile_dynamic``, ``memory_format``); tests keep them
equal to the library's (the same blocks, the same gradients, also over DDP and FSDP
ranks, the same optimizer groups). Values enter as literals; each function, and the
branches for some values, are marked ``#[if PART]`` for ``codegen_parts.select`` to keep only
where the config runs them. No ``$`` placeholders here.
"""

KNOB_FUNCTIONS = '''
#[if find_blocks]
def find_blocks(model):
    """The repeated blocks: the longest run of consecutive same-type children (each with
    parameters) of any ModuleList or Sequential; ties go to more parameters."""
    best = []

    def weight(run):
        return len(run), sum(p.numel() for block in run for p in block.parameters())

    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        run = []
        for child in [*module.children(), None]:
            if child is None or not run or type(child) is not type(run[0]):
                if len(run) >= 2 and weight(run) > weight(best):
                    best = run
                run = []
            if child is not None and any(True for _ in child.parameters()):
                run.append(child)
    return best


#[end]
#[if checkpoint]
def checkpoint_blocks(model, setting, blocks=None):
    """Activation checkpointing of every repeated block ("blocks") or every second one
    ("alternate"): their activations are recomputed in backward instead of kept."""
    if setting not in ("blocks", "alternate"):  # off, or the compiler's budget (below)
        return
    found = list(blocks(model)) if blocks is not None else find_blocks(model)
    if blocks is None and getattr(model, "supports_gradient_checkpointing", False):
        # A Hugging Face model checkpoints its own layers (every one, or every second).
        every = 1 if setting == "blocks" else 2
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable({"use_reentrant": False}, every_n_layers=every)
            return
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layers = [block for block in found if hasattr(block, "gradient_checkpointing")]
        for i, layer in enumerate(layers):  # each layer's flag says which
            layer.gradient_checkpointing = i % every == 0
        return
    if len(found) < 2:
        raise SystemExit("checkpointing: the model has no repeated blocks (no ModuleList or "
                         "Sequential of 2 or more same-type modules)")
    for i, block in enumerate(found):
        if setting == "blocks" or i % 2 == 0:
            # Wrapping forward (not the module) keeps the parameter names as they were.
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


#[end]
#[if recompute]
def compiler_recompute(model, setting):
    """checkpointing "budget-F": torch.compile's partitioner keeps about F of the activations
    and recomputes the cheapest rest in backward. It reads the budget when the model compiles
    (at its first call, and any recompile), so it is set around each call of the compiled
    model, and only there."""
    if not setting.startswith("budget-"):
        return model
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "activation_memory_budget"):
        raise SystemExit(f"checkpointing {setting}: torch {torch.__version__} has no "
                         "activation_memory_budget; set checkpointing = 'off' above")
    budget, forward = float(setting[len("budget-"):]), model.forward

    @functools.wraps(forward)
    def budgeted(*args, **kwargs):
        with functorch_config.patch(activation_memory_budget=budget):
            return forward(*args, **kwargs)

    model.forward = budgeted
    return model


#[end]
#[if rebuild_optimizer]
def rebuild_optimizer(optimizer, impl):
    """The same optimizer (class, parameter groups, hyper-parameters, step hooks) rebuilt
    for-loop, foreach (fewer kernel launches) or fused (one kernel per step)."""
    if impl == "default":
        return optimizer
    if ("fused" if impl == "fused" else "foreach") not in optimizer.defaults:
        raise SystemExit(f"{type(optimizer).__name__} cannot be rebuilt {impl}")
    flags = {"foreach": impl == "foreach", "fused": impl == "fused"}
    flags = {key: value for key, value in flags.items() if key in optimizer.defaults}
    accepted = inspect.signature(type(optimizer).__init__).parameters
    defaults = {key: value for key, value in {**optimizer.defaults, **flags}.items()
                if key in accepted}
    groups = [{**group, **flags} for group in optimizer.param_groups]
    rebuilt = type(optimizer)(groups, **defaults)
    for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
        getattr(rebuilt, hooks).update(getattr(optimizer, hooks))
    return rebuilt


#[end]
def parallelize(model, parallel, precision, device):
#[if fsdp]
    """The model as the tuned strategy runs it over the ranks: DistributedDataParallel ("ddp";
    "ddp-bucket-view": its gradients are views into the all-reduce buckets, one copy less) or
    FSDP2 ("fsdp": fully_shard on each repeated block, then the root, parameters freed after
    each block's forward; "fsdp-no-reshard": kept gathered from forward to backward). Build the
    optimizer over the parameters of the model it returns: fully_shard swaps them for shards."""
#[else]
    """The model as the strategy runs it over the ranks: DistributedDataParallel ("ddp";
    "ddp-bucket-view": its gradients are views into the all-reduce buckets, one copy less).
    torchrun runs this script as DDP whatever was tuned; one process runs it as it is."""
#[end]
    if parallel == "none":
        return model
#[if fsdp]
    if parallel.startswith("ddp"):
        ids = [torch.device(device)] if str(device).startswith("cuda") else None
        return DDP(model, device_ids=ids, gradient_as_bucket_view=parallel == "ddp-bucket-view")
#[else]
    ids = [torch.device(device)] if str(device).startswith("cuda") else None
    return DDP(model, device_ids=ids, gradient_as_bucket_view=parallel == "ddp-bucket-view")
#[end]
#[if fsdp]
    # bf16/fp16: parameters gathered in the autocast dtype for compute, gradients reduced in fp32.
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    policy = MixedPrecisionPolicy(param_dtype=dtype,
                                  reduce_dtype=torch.float32 if dtype is not None else None)
    blocks = list(model_blocks(model)) if model_blocks is not None else find_blocks(model)
    for block in blocks:
        fully_shard(block, reshard_after_forward=parallel == "fsdp", mp_policy=policy)
    fully_shard(model, reshard_after_forward=parallel == "fsdp", mp_policy=policy)
    return model
#[end]


#[if compiled]
def compile_model(model, mode):
    """torch.compile of the whole model (compile_scope "model"), or of each repeated block's
    forward in place, the rest eager (compile_scope "blocks", regional compilation: the
    blocks share one compiled graph, a much shorter cold compile)."""
#[if blocks_scope]
    if compile_scope != "blocks":
        return torch.compile(model, mode=mode, dynamic=compile_dynamic)
#[else]
    return torch.compile(model, mode=mode, dynamic=compile_dynamic)
#[end]
#[if blocks_scope]
    inner = model.module if isinstance(model, DDP) else model
    blocks = list(model_blocks(inner)) if model_blocks is not None else find_blocks(inner)
    if len(blocks) < 2:
        raise SystemExit("compile_scope blocks: the model has no repeated blocks (no "
                         "ModuleList or Sequential of 2 or more same-type modules)")
    for block in blocks:
        block.forward = torch.compile(block.forward, mode=mode, dynamic=compile_dynamic)
    return model
#[end]


#[end]
def to_device(batch, device):
#[if channels_last]
    """The batch on the device; with channels_last, its 4-D float tensors (images) too."""

    def move(tensor):
        tensor = tensor.to(device)
        if memory_format == "channels_last" and tensor.dim() == 4 and tensor.is_floating_point():
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor
#[else]
    """The batch on the device."""

    def move(tensor):
        return tensor.to(device)
#[end]

    if isinstance(batch, dict):
        return {key: move(value) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(move(value) for value in batch)
    return move(batch)'''
