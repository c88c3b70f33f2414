"""Compiled artifacts for the user's first launch: what they are valid for, and loading them.

After a search whose winner is compiled, ``autotune.first_launch`` saves the winner's compile
cache entries (``torch.compiler.save_cache_artifacts``, "Mega-Cache", torch >= 2.7) beside
``autotune.json``. A first launch loads them (``load_artifacts``: ``Tuned.compile``; the
generated script carries a plain copy of this module's checks) before its first compile, so
inductor and AOT autograd read their results instead of compiling: only when torch, the device
and the graphs' inputs (``graphs_key``) are those they were saved for, and only a file whose
size and sha256 are the recorded ones. Anything else is a one-line reason and a normal compile,
never a failure. The file is read by torch's own loader only, which unpickles it: trust it like
code (docs/compile.md).

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.files import read_regular_file
from autotune.schema import CompileArtifacts, TunedConfig

SUFFIX = ".compile-cache.bin"
"""``autotune.json``'s artifacts: ``autotune.compile-cache.bin`` beside it."""

GRAPH_SETTINGS = ("micro_batch", "compile_dynamic", "precision", "compile_mode", "compile_scope",
                  "checkpointing", "memory_format", "strategy")
"""The tuned values the compiled graphs depend on (beside the model): the generated script has
a variable of each name, ``TunedConfig`` a field or a knob. Not ``shapes``: a fixed-shape
workload's script does not say it (its policy is ``max``); a policy changed by hand there makes
the first compile miss the artifacts, nothing worse."""


def artifacts_name(config_path: Path) -> str:
    """The artifacts' file name for an ``autotune.json`` path (``autotune.compile-cache.bin``)."""
    return Path(config_path).stem + SUFFIX


def graph_settings(config: TunedConfig) -> dict[str, Any]:
    """The config's values of ``GRAPH_SETTINGS``."""
    return {name: getattr(config, name) if hasattr(config, name) else
            getattr(config.knobs, name) for name in GRAPH_SETTINGS}


def graphs_key(model: Any, settings: Mapping[str, Any]) -> str:
    """Hash of what the compiled graphs depend on: the model's parameter names, shapes and
    dtypes, and the ``GRAPH_SETTINGS`` values (the script computes it the same way)."""
    parts = [f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in model.named_parameters()]
    parts += [f"{name}={settings.get(name)!r}" for name in GRAPH_SETTINGS]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def device_name(device: str) -> str:
    """The device's name as a first launch reads it: /proc/cpuinfo's model name (else the
    machine type) on CPU, ``torch.cuda.get_device_name`` on CUDA."""
    if device.startswith("cuda"):
        import torch

        return str(torch.cuda.get_device_name(torch.device(device)))
    name = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return name


def compile_cache_counts() -> tuple[int, int]:
    """(hits, misses) of inductor's FX graph cache and AOT autograd's cache in this process:
    graphs read from a cache, graphs compiled."""
    from torch._dynamo.utils import counters

    hits = counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"][
        "fxgraph_cache_hit"]
    misses = counters["aot_autograd"]["autograd_cache_miss"] + counters["inductor"][
        "fxgraph_cache_miss"]
    return int(hits), int(misses)


def load_artifacts(record: CompileArtifacts, folder: Path, model: Any,
                   settings: Mapping[str, Any], device: str) -> tuple[bool, str]:
    """Load the artifacts ``record`` names into torch's caches, before the first compile.

    Args:
        record: ``TunedConfig.compile_artifacts``.
        folder: the folder of ``autotune.json`` (the file lies beside it).
        model: the model about to be compiled (its parameters enter ``graphs_key``).
        settings: the ``GRAPH_SETTINGS`` values it is compiled with.
        device: where it runs (``cpu``, ``cuda:0``).

    Returns:
        Whether they were loaded, and the one line that says so or why not. Never raises for
        a file that is missing, damaged, foreign or from another torch, device or model.
    """
    import torch

    path = Path(folder) / record.file
    refused = f"compiled artifacts {path} not loaded: "
    cold = "; compiling from nothing"
    load = getattr(getattr(torch, "compiler", None), "load_cache_artifacts", None)
    if load is None:
        return False, (f"{refused}torch {torch.__version__} has no "
                       f"torch.compiler.load_cache_artifacts (2.7 or later has){cold}")
    if record.torch_version != torch.__version__:
        return False, (f"{refused}saved by torch {record.torch_version}, this is torch "
                       f"{torch.__version__}{cold}")
    here = device_name(device)
    if record.device_name != here:
        return False, f"{refused}saved on {record.device_name!r}, this is {here!r}{cold}"
    key = graphs_key(model, settings)
    if record.graphs_key != key:
        return False, (f"{refused}saved for other graphs (key {record.graphs_key}; this model "
                       f"and its settings give {key}: the model, the micro-batch or a knob "
                       f"changed){cold}")
    try:  # a regular file only: a FIFO there would wait for a writer forever
        data = read_regular_file(path)
    except OSError as exc:
        return False, f"{refused}{exc.strerror or exc}{cold}"
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != record.size_bytes or digest != record.sha256:
        return False, (f"{refused}not the file the search wrote ({len(data)} bytes, sha256 "
                       f"{digest[:12]}...; recorded {record.size_bytes} bytes, "
                       f"{record.sha256[:12]}...): truncated, damaged or replaced{cold}")
    try:
        info = load(data)
    except Exception as exc:  # torch's loader on a file it cannot take
        return False, f"{refused}torch could not load it ({type(exc).__name__}: {exc}){cold}"
    if info is None:
        return False, f"{refused}torch could not read it (its loader said why above){cold}"
    entries = sum(len(keys) for keys in info.artifacts.values())
    return True, (f"compiled artifacts loaded from {path}: {entries} cache entries (torch "
                  f"{torch.__version__}, {here}): the first compile reads them")
