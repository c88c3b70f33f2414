"""An allocator's out-of-memory error said in one clause (``oom_clause``): what a probe's
progress line, the table's "ran, not timed" row and ``autotune.json`` show of a run that did
not fit. An expected outcome of a probe, so said briefly, with the size it asked for."""

from __future__ import annotations

import re

from autotune.units import format_bytes

_CPU_ALLOCATOR = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                           r"(\d{1,20}) bytes")
"""The size is a ``size_t`` (20 digits at most): a workload's own error that mimics the text
with a longer number is said as raised, never turned into a float that overflows."""
_CUDA_OOM = re.compile(r"^(CUDA out of memory)\. Tried to allocate ([\d.]+ [KMGT]?i?B)\."
                       r"(?: GPU \d+ has a total capacity of ([\d.]+ [KMGT]?i?B) of which "
                       r"([\d.]+ [KMGT]?i?B) is free)?")


def oom_clause(exc: BaseException) -> str | None:
    """An allocator's out-of-memory error said in one clause, with the size it asked for
    (the CPU allocator's is three lines of its source location and error code in a probe's
    progress line), inside no parentheses of its own (a progress line wraps it in one pair);
    None for another error (said as raised)."""
    text = str(exc)
    if cpu := _CPU_ALLOCATOR.search(text):
        return (f"out of memory: the CPU allocator could not allocate "
                f"{format_bytes(int(cpu.group(1)))} more")
    if cuda := _CUDA_OOM.match(text):
        free = f", {cuda.group(4)} free of {cuda.group(3)}" if cuda.group(3) else ""
        return f"{cuda.group(1)}: could not allocate {cuda.group(2)} more{free}"
    return None


def oom_cause(exc: BaseException) -> str:
    """What an out-of-memory fallback says ran out, in the parentheses of "out of memory at
    micro-batch 4 (...)": the allocator's error as ``oom_clause`` says it, without its own
    "out of memory: " (the sentence says it already), or else the error's type and its first
    line (200 characters at most). ``train_autotuned.py`` carries the same function
    (``codegen_fallback.FALLBACK``: ``oom_cause``; a test keeps the two equal)."""
    clause = oom_clause(exc)
    if clause is not None:
        return clause.removeprefix("out of memory: ")
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"
