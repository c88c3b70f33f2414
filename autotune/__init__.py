"""autotune: the fastest way to train your model at the effective batch size you want.

Public API (imported lazily, so ``import autotune`` and ``autotune --help`` stay light)::

    autotune.Workload(...)            # what to train (model, worst-case batch, loss, optimizer)
    autotune.probe(...)               # largest micro-batch that fits, per memory class
    autotune.load("autotune.json")    # the tuned config, with helpers for your own loop
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Workload": "autotune.workload",
    "Knobs": "autotune.knobs",
    "TuneRequest": "autotune.api",
    "WorkloadSpec": "autotune.config",
    "probe": "autotune.api",
    "load": "autotune.api",
    "Tuned": "autotune.usage",
    "AutotuneError": "autotune.errors",
    "ConfigError": "autotune.errors",
    "WorkloadError": "autotune.errors",
    "NoFeasibleConfigError": "autotune.errors",
    "MissingDependencyError": "autotune.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
