"""The pipeline, one function per user action: probe, search, load, estimate, check, codegen.

The CLI and library users call these; everything below them is internal. Each name is imported
on first use, so ``autotune.load`` in a training script does not import optuna or the search.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.api._deliver import codegen, json_schema, load, write_train_script
    from autotune.api._fit import CheckResult, CheckTarget, check, estimate
    from autotune.api._pipeline import env, probe, search, tuned_config
    from autotune.api._settings import Budget, TuneRequest, resolve_budget, workload_spec

_EXPORTS = {
    "codegen": "_deliver", "json_schema": "_deliver", "load": "_deliver",
    "write_train_script": "_deliver",
    "CheckResult": "_fit", "CheckTarget": "_fit", "check": "_fit", "estimate": "_fit",
    "env": "_pipeline", "probe": "_pipeline", "search": "_pipeline", "tuned_config": "_pipeline",
    "Budget": "_settings", "TuneRequest": "_settings", "resolve_budget": "_settings",
    "workload_spec": "_settings",
}
__all__ = [
    "Budget",
    "CheckResult",
    "CheckTarget",
    "TuneRequest",
    "check",
    "codegen",
    "env",
    "estimate",
    "json_schema",
    "load",
    "probe",
    "resolve_budget",
    "search",
    "tuned_config",
    "workload_spec",
    "write_train_script",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"autotune.api.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'autotune.api' has no attribute {name!r}")
