"""One error family. Library code raises these; only the CLI turns them into exit codes."""

from __future__ import annotations


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose.

    Attributes:
        exit_code: what the CLI exits with when this error reaches it.
    """

    exit_code: int = 2


class ConfigError(AutotuneError):
    """A setting, option or file is wrong. The message names the value seen and what to do."""


class WorkloadError(AutotuneError):
    """The user's workload could not be loaded or misbehaved (factory raised, bad batch, ...)."""

    @classmethod
    def from_exit(cls, exc: SystemExit) -> WorkloadError:
        """The workload called ``sys.exit``: a mistake to name, never a clean exit of a child
        (exit code 0 without a result) or of the process that decides an exit code."""
        code = "" if exc.code is None else repr(exc.code)
        return cls(f"the workload called sys.exit({code})")


class UntraceableStepError(WorkloadError):
    """The workload's training step cannot be followed under fake tensors (an op reads tensor
    values, or fails on fake ones): only a real step on a device can measure it."""


class NoFeasibleConfigError(AutotuneError):
    """Nothing fits: not even micro-batch 1, or no candidate survived. Exit code 1."""

    exit_code = 1


class MissingDependencyError(AutotuneError):
    """An optional package needed for the requested feature is not installed."""
