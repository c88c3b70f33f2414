"""Deliver the result: load() for scripts, the generated training loop."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.api._settings import workload_spec
from autotune.codegen import SCRIPT_NAME, render_train_script
from autotune.errors import ConfigError
from autotune.schema import (
    TunedConfig,
    read_tuned,
    write_json_atomic,
)
from autotune.schema import json_schema as _json_schema
from autotune.usage import Tuned

# ----------------------------------------------------------------------------------------------
# Delivering the result: load() for your scripts, train_autotuned.py.


def load(path: str | Path = "autotune.json", *, world_size: int | None = None,
         device_type: str | None = None) -> Tuned:
    """Load ``autotune.json`` for use in a training script.

    Args:
        path: the file ``autotune search`` wrote.
        world_size: devices of the current run (default: ``WORLD_SIZE`` from torchrun, else 1).
            It must be the one the config was tuned for: the per-device micro-batch and the
            accumulation are only right for that world size.
        device_type: ``cuda`` or ``cpu`` for autocast and the GradScaler (default: the tuned
            device's).

    Returns:
        The tuned knobs (``micro_batch``, ``accumulate_steps``, ``precision``,
        ``compile_mode``) with ``compile``, ``autocast``, ``grad_scaler``, ``train_step``,
        ``training_arguments`` and ``accelerator_kwargs``.

    Raises:
        ConfigError: the file is missing, corrupt, from another schema version, or tuned for
            another world size.
    """
    config = read_tuned(path)
    if world_size is None:
        env = os.environ.get("WORLD_SIZE", "1")
        if not env.isdigit() or int(env) < 1:
            raise ConfigError(f"WORLD_SIZE={env!r} is not a positive number of processes")
        world_size, source = int(env), f"WORLD_SIZE={env}"
    else:
        source = f"world_size={world_size}"
    if world_size != config.world_size:
        raise ConfigError(
            f"{path} was tuned for {config.world_size} device(s) (micro-batch "
            f"{config.micro_batch} x {config.accumulate_steps} accumulation per device) but this "
            f"run has {world_size} ({source}): the effective batch would be "
            f"{config.micro_batch * config.accumulate_steps * world_size}, not "
            f"{config.target_batch}. Re-run `autotune search --target-batch "
            f"{config.target_batch} --world-size {world_size}`")
    return Tuned(config, device_type=device_type)


def write_train_script(config: TunedConfig, path: str | Path, *, force: bool = False) -> Path:
    """Write ``train_autotuned.py`` (atomically) for a tuned config.

    Args:
        config: the tuned config.
        path: the script's path, or a folder to write ``train_autotuned.py`` into.
        force: overwrite an existing script.

    Raises:
        ConfigError: the script exists and ``force`` is False, or the folder is not writable.
    """
    path = Path(path)
    if path.is_dir():
        path = path / SCRIPT_NAME
    write_json_atomic(path, render_train_script(config, script_dir=path.parent), force=force)
    return path


def codegen(config_path: str | Path, *, workload: str | None = None, out: str | Path = ".",
            force: bool = False) -> Path:
    """Write ``train_autotuned.py`` from an ``autotune.json`` (``autotune codegen``).

    Args:
        config_path: the ``autotune.json`` to read.
        workload: ``path/to/file.py:factory`` to use instead of the one the file names (e.g.
            when the script moved to another machine).
        out: folder for the script.
        force: overwrite an existing script.

    Raises:
        ConfigError: a missing or bad ``autotune.json``, a bad ``--workload``, a file workload
            whose file is not here, an existing script without ``force``.
    """
    config = read_tuned(config_path)
    if workload is not None:
        config = replace(config, workload=workload_spec(workload=workload))
    if config.workload.kind == "file":
        path_text = config.workload.target.rpartition(":")[0]
        if not Path(path_text).is_file():
            raise ConfigError(
                f"the workload file {path_text!r} named in {config_path} does not exist here: "
                "pass it with `autotune codegen --workload path/to/file.py:factory`")
    return write_train_script(config, Path(out) / SCRIPT_NAME, force=force)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``autotune.json`` (``autotune schema`` prints it)."""
    return _json_schema()
