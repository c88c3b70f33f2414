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


class OutputExistsError(ConfigError):
    """An output file (``autotune.json``, ``train_autotuned.py``) exists and ``force`` was not
    given: it is left as it is, also when another run wrote it after this one started.

    Attributes:
        path: the file that was not overwritten.
    """

    def __init__(self, path: object, message: str | None = None) -> None:
        self.path = path
        super().__init__(message or f"{path} already exists and was not overwritten: pass "
                         "--force to replace it, or choose another --out folder")


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


class OutOfMemoryFallbackError(AutotuneError):
    """The mid-run out-of-memory fallback gave up: a step ran out of memory again after its
    fallbacks in a row, at the smallest micro-batch, or in the optimizer's update. Exit code 1
    (a memory verdict)."""

    exit_code = 1


class MissingDependencyError(AutotuneError):
    """An optional package needed for the requested feature is not installed."""


class Interrupted(KeyboardInterrupt):
    """A signal that ends autotune early (SIGINT from Ctrl-C, or SIGTERM from ``timeout``, a CI
    cancel, ``docker stop``): handled like Ctrl-C, the best so far kept.

    Attributes:
        signal_name: ``SIGINT`` or ``SIGTERM``.
        exit_code: 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signal_name: str = "SIGINT", signal_number: int = 2) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.exit_code = 128 + signal_number


MEMORY_STATUS = "oom"
"""The one child-run status that is a memory verdict."""

BROKEN = ("non_finite", "timeout", "compile_error", "error", "workload_error")
"""Statuses that no memory budget changes: at the smallest micro-batch they name a broken
workload (exit 2), never "does not fit" (exit 1), and no setting that frees memory is tried
(a ``crash`` under the cap can be the cap's doing: it is tried again without it)."""


def error_for_status(status: str, message: str) -> AutotuneError:
    """The one mapping from the status of a child run that decides a command to its error,
    and so its exit code: ``oom`` is a memory verdict (exit 1); every other failure
    (``non_finite``, ``timeout``, ``crash``, ``compile_error``, ``error``, ``workload_error``)
    is the workload's (exit 2), never "does not fit"."""
    if status == MEMORY_STATUS:
        return NoFeasibleConfigError(message)
    return WorkloadError(message)
