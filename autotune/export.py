"""``autotune export``: the tuned config as another tool's own config file.

DeepSpeed's JSON (``deepspeed.initialize(config=...)``), torchtitan's job TOML
(``--job.config_file``) and Accelerate's config YAML (``accelerate launch --config_file``).
Each carries what the tool has a field for; every tuned value it has none for is said, with
what to do instead: in a comment at the top of the TOML and YAML files, and as notes the CLI
prints (JSON has no comments). Written atomically, never over a file without ``force``.
Values come from a validated ``autotune.json`` only, and enter the files as literals; every
text, in the comments too, is escaped as the format's strings are (``_escaped``), so no text
can become a line of configuration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.files import write_json_atomic
from autotune.knob_adapters import budget_by_hand
from autotune.names import FLAGS, Names
from autotune.schema import TunedConfig
from autotune.traits import BLOCK_CHECKPOINTING
from autotune.tuned_file import read_tuned

TARGETS = {"deepspeed": "ds_config.json", "torchtitan": "torchtitan.toml",
           "accelerate": "accelerate_config.yaml"}
"""Each tool and the file name written by default."""


@dataclass(frozen=True)
class Export:
    """One tool's config file for a tuned config."""

    target: str
    text: str
    notes: tuple[str, ...]
    """The tuned values the file cannot carry, each with what to do instead."""


def export_config(config_path: str | Path, to: str, output: str | Path | None = None, *,
                  force: bool = False, name: Names = FLAGS) -> tuple[Path, Export]:
    """Write ``to``'s config file for the ``autotune.json`` at ``config_path``.

    Args:
        config_path: the ``autotune.json`` to read (validated as ``autotune.load`` does).
        to: ``deepspeed``, ``torchtitan`` or ``accelerate``.
        output: the file to write, or a folder for the tool's default name (default: that
            name in the current folder).
        force: overwrite an existing file.
        name: how errors name ``output`` and ``force`` (``-o/--output``, ``--force``).

    Returns:
        The path written and the export (its notes: what the file does not carry).

    Raises:
        ConfigError: an unknown ``to``, a bad ``autotune.json``, an existing file without
            ``force``, a folder that cannot be written.
    """
    target = _target(to)
    config = read_tuned(config_path)
    path = Path(output) if output is not None else Path(TARGETS[target])
    if path.is_dir():
        path = path / TARGETS[target]
    result = render(config, target)
    write_json_atomic(path, result.text, force=force, name=name, setting="output")
    return path, result


def render(config: TunedConfig, to: str) -> Export:
    """The text of ``to``'s config file for ``config``, and what it does not carry."""
    target = _target(to)
    data, notes = {"deepspeed": deepspeed, "torchtitan": torchtitan,
                   "accelerate": accelerate}[target](config)
    header = [f"autotune export --to {target}: {config.workload_name}, effective batch "
              f"{config.target_batch} = {config.micro_batch} x {config.accumulate_steps} x "
              f"{config.world_size}, {config.knobs.label()} (autotune {config.autotune_version}, "
              f"{config.created_at})"]
    if target == "torchtitan":
        header.append("torchtitan 0.3+ reads no TOML: pass the same values as options: "
                      + " ".join(f"--{section}.{key} {_cli(value)}"
                                 for section, values in data.items()
                                 for key, value in values.items()))
    if notes:
        header.append("not carried by this file:")
        header += [f"- {note}" for note in notes]
    if target == "deepspeed":
        text = json.dumps(data, indent=2) + "\n"
    elif target == "torchtitan":
        text = _comment(header) + _toml(data)
    else:
        text = _comment(header) + _yaml(data)
    return Export(target=target, text=text, notes=tuple(notes))


def _target(to: str) -> str:
    if to not in TARGETS:
        raise ConfigError(f"--to {to!r} is not a tool autotune exports to: use "
                          f"{', '.join(TARGETS)}")
    return to


def _common_notes(config: TunedConfig, what: str) -> list[str]:
    """What no exported file carries: TF32, the memory format, the allocator."""
    knobs, notes = config.knobs, []
    if knobs.precision == "tf32":
        notes.append("precision=tf32: set torch.backends.cuda.matmul.allow_tf32 = True (or "
                     f"cfg.set_matmul_precision()) in your script; {what} has no field for it")
    if knobs.memory_format != "contiguous":
        notes.append(f"memory_format={knobs.memory_format}: call cfg.apply(model) and "
                     "cfg.batch(batch) in your script (channels_last model and images)")
    if knobs.allocator != "default":
        notes.append(f"allocator={knobs.allocator}: set PYTORCH_CUDA_ALLOC_CONF="
                     "expandable_segments:True in the job's environment")
    return notes + budget_by_hand(knobs, what)


def deepspeed(config: TunedConfig) -> tuple[dict[str, Any], list[str]]:
    """DeepSpeed's config: batch sizes, the bf16/fp16 block, ZeRO, activation checkpointing."""
    knobs = config.knobs
    notes = _common_notes(config, "DeepSpeed's config")
    data: dict[str, Any] = {
        "train_batch_size": config.target_batch,
        "train_micro_batch_size_per_gpu": config.micro_batch,
        "gradient_accumulation_steps": config.accumulate_steps,
    }
    if knobs.precision in ("bf16", "fp16"):
        data["bf16" if knobs.precision == "bf16" else "fp16"] = (
            {"enabled": True} if knobs.precision == "bf16" else
            {"enabled": True, "loss_scale": 0})  # 0: dynamic, as the GradScaler
        dtype = {"bf16": "bfloat16", "fp16": "float16"}[knobs.precision]
        notes.append(f"precision={knobs.precision}: the search ran torch.autocast over fp32 "
                     f"weights; DeepSpeed's {knobs.precision} block keeps {knobs.precision} "
                     "weights with fp32 master copies (less memory); for autocast as measured "
                     f'use "torch_autocast": {{"enabled": true, "dtype": "{dtype}"}} instead')
    data["zero_optimization"] = {"stage": 3 if knobs.sharded else 0}
    if knobs.strategy == "fsdp-no-reshard":
        notes.append("strategy=fsdp-no-reshard: ZeRO-3 gathers each parameter again in "
                     "backward, where the search kept it from forward to backward; stage 2 "
                     "keeps whole parameters (faster, more memory)")
    if knobs.strategy == "ddp-bucket-view":
        notes.append("strategy=ddp-bucket-view: DeepSpeed's data parallelism has no "
                     "gradient_as_bucket_view; its ZeRO stage 0 buckets gradients its own way")
    if knobs.checkpointing in BLOCK_CHECKPOINTING:
        data["activation_checkpointing"] = {
            "partition_activations": False, "cpu_checkpointing": False,
            "contiguous_memory_optimization": False, "synchronize_checkpoint_boundary": False,
            "profile": False}
        every = "every repeated block" if knobs.checkpointing == "blocks" else "every second"
        notes.append(f"checkpointing={knobs.checkpointing}: DeepSpeed checkpoints only what "
                     "the model wraps in deepspeed.checkpointing.checkpoint (the block "
                     f"written configures it); or call cfg.apply(model) ({every} block) "
                     "before deepspeed.initialize")
    if knobs.compiled:
        mode = "" if knobs.compile_mode == "default" else f"'mode': '{knobs.compile_mode}', "
        notes.append(f"compile_mode={knobs.compile_mode}: DeepSpeed's config has no compile "
                     f"switch: call engine.compile(compile_kwargs={{{mode}'dynamic': "
                     f"{config.compile_dynamic}}}) after deepspeed.initialize")
        if knobs.compile_scope == "blocks":
            notes.append("compile_scope=blocks: engine.compile compiles the whole model; for "
                         "the tuned regional compile call cfg.compile(model) before "
                         "deepspeed.initialize instead (each repeated block compiled)")
    if knobs.optimizer_impl != "default":
        notes.append(f"optimizer_impl={knobs.optimizer_impl}: pass your optimizer rebuilt "
                     "with cfg.build_optimizer(...) as deepspeed.initialize(optimizer=...) "
                     "(an \"optimizer\" block would build DeepSpeed's own)")
    return data, notes


def torchtitan(config: TunedConfig) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """torchtitan's job config (its 0.2 ``JobConfig`` TOML): batches, mixed precision, data
    parallel degrees, activation checkpointing, compile, optimizer implementation."""
    knobs = config.knobs
    notes = _common_notes(config, "torchtitan's job config")
    param = "bfloat16" if knobs.precision == "bf16" else "float32"
    if knobs.precision == "fp16":
        notes.append("precision=fp16: torchtitan has no float16 mixed precision "
                     "(mixed_precision_param is bfloat16 or float32): written float32; "
                     "bfloat16 would be another config than the one measured")
    sharded = knobs.sharded
    replicated = knobs.replicated
    data: dict[str, dict[str, Any]] = {
        "training": {"local_batch_size": config.micro_batch,
                     "global_batch_size": config.target_batch,
                     "mixed_precision_param": param, "mixed_precision_reduce": "float32"},
        "parallelism": {
            "data_parallel_replicate_degree": config.world_size if replicated else 1,
            "data_parallel_shard_degree": config.world_size if sharded else 1,
            "fsdp_reshard_after_forward": {"fsdp": "always", "fsdp-no-reshard": "never"}.get(
                knobs.strategy, "default")},
        "activation_checkpoint": {"mode": {"off": "none", "blocks": "full",
                                           "alternate": "selective"}.get(
                                               knobs.checkpointing, "none")},
        "compile": {"enable": knobs.compiled, "components": ["model"]},
    }
    if knobs.checkpointing == "alternate":
        data["activation_checkpoint"]["selective_ac_option"] = "2"
    if knobs.strategy == "ddp-bucket-view":
        notes.append("strategy=ddp-bucket-view: torchtitan's DDP has no gradient_as_bucket_view "
                     "switch (written as plain DDP)")
    if knobs.compile_mode not in ("off", "default"):
        notes.append(f"compile_mode={knobs.compile_mode}: torchtitan compiles with the default "
                     "mode (its config has no mode)")
    if knobs.compiled and config.compile_dynamic is not None:
        notes.append(f"compile_dynamic={str(config.compile_dynamic).lower()}: torchtitan's "
                     "config has no dynamic switch")
    if knobs.optimizer_impl != "default":
        data["optimizer"] = {"implementation": knobs.optimizer_impl}
    else:
        notes.append("optimizer_impl=default: your optimizer as built was measured; "
                     "torchtitan's default implementation is fused (set "
                     "optimizer.implementation to what yours runs)")
    return data, notes


def accelerate(config: TunedConfig) -> tuple[dict[str, Any], list[str]]:
    """Accelerate's config YAML: processes, machines, mixed precision, dynamo, FSDP2."""
    knobs = config.knobs
    notes = _common_notes(config, "Accelerate's config")
    on_cpu = config.device.device.split(":")[0] == "cpu"
    ranks = config.nproc_per_node
    sharded = knobs.sharded
    kind = ("FSDP" if sharded else "NO" if config.world_size == 1 else
            "MULTI_CPU" if on_cpu else "MULTI_GPU")
    data: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": kind,
        "mixed_precision": {"bf16": "bf16", "fp16": "fp16"}.get(knobs.precision, "no"),
        "use_cpu": on_cpu, "num_machines": max(1, config.world_size // ranks),
        "num_processes": config.world_size, "machine_rank": 0, "downcast_bf16": "no",
        "main_training_function": "main", "rdzv_backend": "static", "same_network": True,
        "debug": False}
    notes.append(f"micro_batch={config.micro_batch}, accumulate_steps="
                 f"{config.accumulate_steps}: Accelerate's config has no batch fields: build "
                 "your DataLoader with batch_size=cfg.micro_batch and pass "
                 "Accelerator(**cfg.accelerator_kwargs()) (or set "
                 f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={config.accumulate_steps})")
    if knobs.compiled:
        dynamo: dict[str, Any] = {"dynamo_backend": "INDUCTOR",
                                  "dynamo_mode": knobs.compile_mode,
                                  "dynamo_use_fullgraph": False}
        if config.compile_dynamic is not None:
            dynamo["dynamo_use_dynamic"] = config.compile_dynamic
        data["dynamo_config"] = dynamo
    if sharded:
        data["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_reshard_after_forward": knobs.strategy == "fsdp",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_activation_checkpointing": knobs.checkpointing in BLOCK_CHECKPOINTING}
        if knobs.checkpointing == "alternate":
            notes.append("checkpointing=alternate: Accelerate's FSDP checkpoints every wrapped "
                         "block; for every second one call cfg.apply(model) instead")
    elif knobs.checkpointing in BLOCK_CHECKPOINTING:
        notes.append(f"checkpointing={knobs.checkpointing}: call cfg.apply(model) before "
                     "accelerator.prepare (Accelerate's config switches it only under FSDP)")
    if knobs.strategy == "ddp-bucket-view":
        notes.append("strategy=ddp-bucket-view: pass Accelerator(**cfg.accelerator_kwargs()) "
                     "(its DistributedDataParallelKwargs; the config file has no field)")
    if knobs.optimizer_impl != "default":
        notes.append(f"optimizer_impl={knobs.optimizer_impl}: build the optimizer with "
                     "cfg.build_optimizer(...) before accelerator.prepare")
    return data, notes


def _comment(lines: list[str]) -> str:
    """Comment lines of the TOML or YAML file, each escaped as the body's strings are: no
    text (a workload name is free text) can end a comment and start configuration."""
    return "".join(f"# {_escaped(line)}\n" for line in lines) + "\n"


def _escaped(text: str) -> str:
    """``text`` as the inside of a TOML basic string and of a YAML double-quoted scalar: the
    only way text enters a TOML or YAML file. Printable ASCII stays as it is but for ``"``
    and ``\\``; every other character is a ``\\uXXXX`` or ``\\UXXXXXXXX`` escape, which both
    formats read as that character (JSON's surrogate pairs are not TOML). So a line break,
    another control character or YAML's NEL and U+2028 never reaches the file as such. A
    lone surrogate (no character: TOML cannot hold it) is written as U+FFFD."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif 0xD800 <= code < 0xE000:
            out.append("\\uFFFD")
        else:
            out.append(f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}")
    return "".join(out)


def _scalar(value: Any) -> str:
    """A TOML/YAML literal: booleans lower-case, numbers as JSON writes them, strings
    quoted and escaped (``_escaped``), lists of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{_escaped(value)}"'
    return json.dumps(value)


def _cli(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return _scalar(value) if isinstance(value, bool) else str(value)


def _toml(data: dict[str, dict[str, Any]]) -> str:
    return "\n".join(f"[{section}]\n" + "".join(f"{key} = {_scalar(value)}\n"
                                               for key, value in values.items())
                     for section, values in data.items())


def _yaml(data: dict[str, Any]) -> str:
    lines = []
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k}: {_scalar(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key}: {_scalar(value)}")
    return "\n".join(lines) + "\n"
