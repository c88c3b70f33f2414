"""autotune: the fastest way to train your model at the effective batch size you want.

Public API (imported lazily, so ``import autotune`` and ``autotune --help`` stay light)::

    autotune.Workload(...)            # what to train (model, worst-case batch, loss, optimizer)
    autotune.search(...)              # the search from Python: returns the tuned config (Tuned)
    autotune.probe(...)               # largest micro-batch that fits, per memory class
    autotune.estimate(...)            # a step's memory without running it (fake tensors)
    autotune.check("autotune.json")   # does a tuned config still fit its device?
    autotune.verify("autotune.json")  # its step run as your loop runs it, beside the report
    autotune.load("autotune.json")    # the tuned config, with helpers for your own loop
    autotune.lightning.TunedCallback(cfg)  # Lightning (beside cfg.lightning_trainer_kwargs())
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Workload": "autotune.workload",
    "Knobs": "autotune.knobs",
    "TuneRequest": "autotune.api",
    "WorkloadSpec": "autotune.config",
    "search": "autotune.api.python",
    "Progress": "autotune.api.python",
    "probe": "autotune.api",
    "estimate": "autotune.api",
    "check": "autotune.api",
    "verify": "autotune.api",
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
    if name == "lightning":  # the Lightning callback: imports lightning, so only when asked
        return importlib.import_module("autotune.lightning")
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


class _CallablePackage(types.ModuleType):
    """A subpackage that is also a public function of the same name (``autotune.search``,
    ``autotune.estimate``): calling it runs the function, while ``autotune.search.X`` and
    ``from autotune.search import X`` still reach the module's own names."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _function(self.__name__)(*args, **kwargs)

    @property
    def __signature__(self) -> Any:  # inspect.signature / help() show the function's
        import inspect

        return inspect.signature(_function(self.__name__))


def _function(module: str) -> Any:
    name = module.rpartition(".")[2]
    return getattr(importlib.import_module(_EXPORTS[name]), name)


class _Both:
    """The package attribute ``name``: the submodule of that name, made callable. A data
    descriptor, so it wins over the attribute the import system sets on the package when it
    imports the submodule (that module is the one returned anyway); any other value set on
    it is returned until the module is set back."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, package: Any, owner: type | None = None) -> Any:
        if package is not None and f"_set_{self.name}" in package.__dict__:
            return package.__dict__[f"_set_{self.name}"]  # set by hand (a test's monkeypatch)
        module = importlib.import_module(f"{__name__}.{self.name}")
        if not isinstance(module, _CallablePackage):
            module.__class__ = _CallablePackage
        return module

    def __set__(self, package: Any, value: Any) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{self.name}":
            package.__dict__.pop(f"_set_{self.name}", None)  # the import system's, or undone
        else:
            package.__dict__[f"_set_{self.name}"] = value


class _Autotune(types.ModuleType):
    """This package: ``search`` and ``estimate`` are both a function and a module."""

    search = _Both()
    estimate = _Both()


sys.modules[__name__].__class__ = _Autotune
