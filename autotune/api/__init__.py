"""The pipeline, one function per user action: probe, search, load, estimate, check, codegen.

The CLI and library users call these; everything below them is internal. Public modules:
``request`` (what to tune: ``TuneRequest``), ``settings`` (the one check of every setting's
type, before anything starts), ``tune`` (probe, search), ``fit`` (estimate, check),
``deliver`` (load, the generated script, the written files), ``verify`` (the config run as
a user's loop runs it, beside what was reported). Importing this package
imports torch but not optuna: the search imports it when a search starts.
"""

from __future__ import annotations

from autotune.api.deliver import codegen, json_schema, load, write_train_script
from autotune.api.fit import CheckResult, check, estimate
from autotune.api.fit_target import CheckTarget
from autotune.api.request import Budget, TuneRequest, resolve_budget, workload_spec
from autotune.api.tune import env, probe, search, tuned_config
from autotune.api.verify import VerifyResult, verify

__all__ = [
    "Budget", "CheckResult", "CheckTarget", "TuneRequest", "VerifyResult", "check", "codegen",
    "env", "estimate", "json_schema", "load", "probe", "resolve_budget", "search",
    "tuned_config", "verify", "workload_spec", "write_train_script",
]
