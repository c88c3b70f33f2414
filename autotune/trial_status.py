"""What a trial's exception says about it: out of memory (by type first, then the messages
allocators raise), a knob value the workload cannot take, the workload's own error, a compile
error, or another error. The child's trial, the OOM fallback and the user's loop all read it
from here, so a failure is named alike everywhere.
"""

from __future__ import annotations

import errno

import torch

from autotune.config import TrialStatus
from autotune.errors import WorkloadError
from autotune.knobs import KnobUnsupported

_OOM_MESSAGES = (
    "out of memory",  # CUDA, HIP, MPS, XPU
    "can't allocate memory",  # DefaultCPUAllocator
    "cannot allocate memory",  # ENOMEM from the OS
    "could not create a primitive",  # oneDNN when its scratchpad allocation fails under a cap
    "std::bad_alloc",
    "not enough memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is an out-of-memory error.

    ``torch.OutOfMemoryError`` is checked first, by type. Then Python's ``MemoryError`` and
    ``OSError(ENOMEM)``, then the messages CPU allocators and other backends raise as plain
    RuntimeError. Wrapped errors (e.g. a compile failure caused by an OOM) are followed.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (torch.OutOfMemoryError, MemoryError)):
            return True
        if isinstance(current, OSError) and current.errno == errno.ENOMEM:
            return True
        if isinstance(current, RuntimeError):
            message = str(current).lower()
            if any(text in message for text in _OOM_MESSAGES):
                return True
        current = current.__cause__ or current.__context__
    return False


def _is_compile_error(exc: BaseException) -> bool:
    names = {type(e).__module__ for e in _chain(exc)}
    return any(n.startswith(("torch._dynamo", "torch._inductor")) for n in names)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def classify_exception(exc: BaseException) -> TrialStatus:
    """Map an exception raised by a trial to its outcome status."""
    if is_out_of_memory(exc):
        return "oom"
    if isinstance(exc, KnobUnsupported):
        return "unsupported"
    if isinstance(exc, (WorkloadError, SystemExit)):  # SystemExit: the workload called exit
        return "workload_error"
    if _is_compile_error(exc):
        return "compile_error"
    return "error"
