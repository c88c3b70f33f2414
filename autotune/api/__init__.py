"""The pipeline, one function per user action: probe, search, load, estimate, check, codegen.

The CLI and library users call these; everything below them is internal.
"""

from autotune.api._deliver import codegen, load, write_train_script
from autotune.api._fit import CheckResult, CheckTarget, check, estimate
from autotune.api._pipeline import env, probe, search, tuned_config
from autotune.api._settings import Budget, resolve_budget, workload_spec

__all__ = [
    "Budget", "CheckResult", "CheckTarget", "check", "codegen", "env", "estimate", "load",
    "probe", "resolve_budget", "search", "tuned_config", "workload_spec", "write_train_script",
]
