"""Deliver the result: load() for scripts, the generated training loop, the written files."""

from __future__ import annotations

import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.api.request import workload_file_here, workload_spec
from autotune.artifacts import artifacts_name
from autotune.codegen import SCRIPT_NAME, render_train_script
from autotune.config import WorkloadSpec
from autotune.errors import AutotuneError, ConfigError, OutputExistsError
from autotune.files import write_json_atomic
from autotune.first_launch import Saved, save_compile_artifacts
from autotune.report_html import render_html
from autotune.schema import SkipRecord, TunedConfig
from autotune.signals import SignalGuard, guarded, interrupted_by
from autotune.tuned_file import json_schema as _json_schema
from autotune.tuned_file import read_tuned, save_tuned
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
        The tuned values (``micro_batch``, ``accumulate_steps``, ``knobs`` with ``precision``
        and ``compile_mode`` at hand) with ``apply`` (checkpointing, memory format),
        ``build_optimizer``, ``batch``, ``compile``, ``autocast``, ``grad_scaler``,
        ``train_step``, ``training_arguments`` and ``accelerator_kwargs``. A schema 1 file
        loads with its other knobs at their defaults.

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
    return Tuned(config, device_type=device_type, folder=Path(path).absolute().parent)


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


def codegen(config_path: str | Path, *, workload: str | WorkloadSpec | None = None,
            out: str | Path = ".", force: bool = False) -> Path:
    """Write ``train_autotuned.py`` from an ``autotune.json`` (``autotune codegen``).

    Args:
        config_path: the ``autotune.json`` to read.
        workload: ``path/to/file.py:factory`` (or its ``WorkloadSpec``) to use instead of the
            one the file names (e.g. when the script moved to another machine).
        out: folder for the script.
        force: overwrite an existing script.

    Raises:
        ConfigError: a missing or bad ``autotune.json``, a bad ``--workload``, a file workload
            whose file is not here, an existing script without ``force``.
    """
    config = read_tuned(config_path)
    if workload is not None:
        config = replace(config, workload=workload if isinstance(workload, WorkloadSpec) else
                         workload_spec(workload=workload))
    workload_file_here(config.workload, config_path)
    return write_train_script(config, Path(out) / SCRIPT_NAME, force=force)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``autotune.json`` (``autotune schema`` prints it)."""
    return _json_schema()


def with_compile_artifacts(config: TunedConfig, path: Path, timeout_s: float | None,
                           guard: SignalGuard) -> tuple[TunedConfig, Saved | None]:
    """The config naming its winner's compiled artifacts, and their bytes, saved by one more
    child run of the winner (``autotune.first_launch``); or, for a compiled winner without
    them, the config with a skip that says why (eager: as it was).

    Args:
        config: the tuned config.
        path: where ``autotune.json`` goes (the artifacts go beside it).
        timeout_s: the run's limit (what the search's limits leave); None: none left.
        guard: the search's signal guard: a signal ends the run, the result stays.
    """
    if not config.compiled:
        return config, None
    if timeout_s is None:
        saved, why = None, "no compiled artifacts: the search's limits are spent"
    else:
        try:
            with guard.armed():
                saved, why = save_compile_artifacts(config, artifacts_name(path), timeout_s)
        except KeyboardInterrupt as exc:  # the search is done: keep its result
            name = getattr(exc, "signal_name", None)
            stopped = f"interrupted ({'Ctrl-C' if name in (None, 'SIGINT') else name})"
            config = replace(config, interrupted=True,
                             stopped_by=f"{stopped} while saving compiled artifacts")
            saved, why = None, f"no compiled artifacts: {stopped} while saving them"
    if saved is None:
        return replace(config, skips=(*config.skips, SkipRecord(
            rule="compile-artifacts", text=why))), None
    return replace(config, compile_artifacts=saved.record), saved


def write_outputs(config: TunedConfig, path: Path, script: Path, *, force: bool,
                  artifacts: Saved | None = None) -> None:
    """Write autotune.json, train_autotuned.py and, beside the first, autotune.html and the
    compiled ``artifacts`` (when given), with
    Ctrl-C and SIGTERM held until all are written (then acted on: ``Interrupted`` says what was
    written). Without ``force`` none replaces a file another process wrote meanwhile: this
    search's result goes beside it, and the error says where. Artifacts that cannot be
    written leave the config naming none (a warning says why).

    The page is a view of the config, rendered before anything is written: when it cannot be
    rendered (plotly missing, a bug in the page) or written (the disk filled), the config and
    the script are still written, and a warning says so and how to write the page later
    (``autotune report``). A script that cannot be written after the config was names both.

    Raises:
        OutputExistsError: a file appeared while the search ran.
        ConfigError: the config or the script cannot be written (saying what was).
        Interrupted: a signal came while writing; the files were written.
    """
    written: list[Path] = []
    with guarded() as guard:
        if artifacts is not None:  # first: the config names them only once they are there
            config = _write_artifacts(config, path, artifacts, force, written)
        writers = [(path, "config", lambda at, f: save_tuned(config, at, force=f)),
                   (script, "script", lambda at, f: write_train_script(config, at, force=f))]
        page = _render_page(config, path)
        if page is not None:
            writers.append((path.with_suffix(".html"), "report",
                            lambda at, f: write_json_atomic(at, page, force=f)))
        for target, what, write in writers:
            try:
                write(target, force)
            except OutputExistsError:
                spare = _free_name(target)
                write(spare, False)
                raise OutputExistsError(target, (
                    f"{target} was written by another process while this search ran: not "
                    f"overwritten. This search's {what} is in {spare}"
                    + (f" (its config in {path})" if target != path else "")
                    + "; pass --force to overwrite, or --out another folder")) from None
            except ConfigError as exc:  # the disk filled, the folder went read-only, ...
                if what == "report":  # a view of the result, which is written
                    warnings.warn(
                        f"{exc}. Written: {' and '.join(map(str, written))}; `autotune report "
                        f"{path}` writes the page once it can be", stacklevel=2)
                    continue
                raise ConfigError(f"{exc}. " + (
                    f"Written, complete: {path}; `autotune codegen {path} --out "
                    f"{script.parent}` writes the script once it can be" if written else
                    "Nothing written")) from exc
            written.append(target)
    if guard.held:
        stopped = interrupted_by(guard.held[0])
        stopped.written = path  # type: ignore[attr-defined]
        raise stopped


def _write_artifacts(config: TunedConfig, path: Path, artifacts: Saved, force: bool,
                     written: list[Path]) -> TunedConfig:
    """Write the compiled artifacts beside ``path``; the config without them (and a warning)
    when they cannot be: an extra for the first launch never costs the result."""
    target = path.with_name(artifacts.record.file)
    try:
        write_json_atomic(target, artifacts.data, force=force)
    except AutotuneError as exc:  # another process wrote it meanwhile, the disk filled, ...
        why = f"{target} not written: {exc}"
        warnings.warn(f"{why}; the first launch compiles from nothing", stacklevel=3)
        return replace(config, compile_artifacts=None, skips=(*config.skips, SkipRecord(
            rule="compile-artifacts", text=f"no compiled artifacts: {why}")))
    written.append(target)
    return config


def _render_page(config: TunedConfig, path: Path) -> str | None:
    """autotune.html's text, or None (with a warning) when it cannot be rendered: a view of the
    result never costs the result."""
    try:
        return render_html(config)
    except Exception as exc:
        bug = "" if isinstance(exc, AutotuneError) else " (a bug in autotune: please report it)"
        warnings.warn(
            f"{path.with_suffix('.html')} not written: {type(exc).__name__}: {exc}{bug}. "
            f"{path.name} and the script are written; `autotune report {path}` writes the "
            "page once that is fixed", stacklevel=3)
        return None


def _free_name(path: Path) -> Path:
    """``autotune-2.json``, ``autotune-3.json``, ...: the first name not taken."""
    n = 2
    while (candidate := path.with_name(f"{path.stem}-{n}{path.suffix}")).exists():
        n += 1
    return candidate
