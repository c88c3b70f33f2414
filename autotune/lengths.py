"""Sequence lengths a workload declares, and the shape policies' arithmetic on them.

A workload whose real batches vary in length declares a sample of its lengths
(``Workload.lengths``, or ``--lengths FILE`` for ``--model``). Everything here is pure
arithmetic on that sample, with no torch: the file parser, the one validation, the bucket
lengths of the ``buckets`` policy, the length a policy pads a batch to, and the seeded draw
of batch lengths every timed candidate of a search sees alike (``docs/shapes.md``).
"""

from __future__ import annotations

import json
import math
import operator
import os
import random
from collections.abc import Sequence
from pathlib import Path

from autotune.errors import ConfigError
from autotune.files import file_kind
from autotune.units import format_bytes

POOL_STEPS = 4
"""Optimizer steps of drawn lengths a trial cycles through: each timed unit is one pass, so
every candidate's figure averages the same mix of lengths (and a unit takes this many steps'
time: the search's time limit on a trial counts them, ``search.executor``)."""

RECOMPILE_LIMIT = 8
"""``torch._dynamo.config.recompile_limit``'s default: past it a frame runs eager."""
MAX_BUCKETS = RECOMPILE_LIMIT - 2
"""The most bucket lengths ``buckets`` pads to: one static graph per bucket, kept under the
recompile limit with room for a graph of another cause (a grad-mode or a dtype guard)."""
BUCKET_MULTIPLE = 8
"""Bucket lengths are rounded up to a multiple of this (tensor-core and vector friendly),
never past the worst case."""
POLICIES = ("max", "buckets", "dynamic", "longest")
MAX_LENGTHS_FILE_BYTES = 128 * 2**20
"""The largest ``--lengths`` file read (128 MiB): ten million lengths of up to twelve
characters a line. A sample of the lengths is all a search needs, and the file is read whole:
past this it is refused unread, never read until memory runs out."""


def parse_lengths(text: str, source: str) -> tuple[int, ...]:
    """The lengths a file's text holds: one integer a line, or a JSON list of integers.

    Args:
        text: the file's content.
        source: how the user named it, for messages (e.g. ``--lengths lengths.txt``).

    Raises:
        ConfigError: not a JSON list and a line that is not an integer (its number and
            text), or nothing at all; values that are not positive (``check_lengths``).
    """
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}: not a JSON list of integers ({exc.msg} at line "
                              f"{exc.lineno}); give one integer a line or a JSON list such as "
                              "[128, 512, 77]") from None
        return check_lengths(values, source)
    values = []
    for number, line in enumerate(text.splitlines(), start=1):
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        try:
            values.append(int(item))
        except ValueError:
            raise ConfigError(f"{source}: line {number} is {item[:40]!r}, not an integer; give "
                              "one sequence length (a whole number of tokens) a line") from None
    return check_lengths(values, source)


def read_lengths(path: str | Path, source: str | None = None) -> tuple[int, ...]:
    """The lengths in a file (``parse_lengths``): a regular file of at most
    ``MAX_LENGTHS_FILE_BYTES``.

    Raises:
        ConfigError: the path is not a regular file (a FIFO, a device such as ``/dev/zero``,
            a folder: said what it is), is over the bound (its size, the bound and what to
            do), cannot be read, or holds no valid lengths.
    """
    source = source or f"--lengths {path}"
    fix = "give a text file with one integer a line, or a JSON list"
    try:
        # Not blocking: opening a FIFO waits for a writer otherwise. What is there is asked
        # of the open file itself, so nothing can be swapped in between the check and the read.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{source}: cannot read it ({type(exc).__name__}: {exc}); "
                          f"{fix}") from None
    info = os.fstat(fd)
    kind = file_kind(info.st_mode)
    if kind is not None:
        os.close(fd)
        raise ConfigError(f"{source}: {path} is {kind}, not a regular file; {fix}")
    with os.fdopen(fd, "rb") as file:
        try:
            # One byte past the bound: a file that grows while read (or a /proc file, whose
            # size says 0) is caught as well.
            data = file.read(MAX_LENGTHS_FILE_BYTES + 1) if (
                info.st_size <= MAX_LENGTHS_FILE_BYTES) else b""
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read it ({type(exc).__name__}: {exc}); "
                              f"{fix}") from None
    if max(info.st_size, len(data)) > MAX_LENGTHS_FILE_BYTES:
        size = (f"{info.st_size:,} bytes, over" if info.st_size > MAX_LENGTHS_FILE_BYTES
                else "more than")  # it grew while read, or its size says 0 (procfs)
        raise ConfigError(
            f"{source}: {path} holds {size} the limit of "
            f"{MAX_LENGTHS_FILE_BYTES:,} bytes ({format_bytes(MAX_LENGTHS_FILE_BYTES)}); a "
            "random sample of the lengths is enough to stand for their distribution: give "
            f"one, e.g. shuf -n 1000000 {path} > lengths-sample.txt")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: cannot read it (UnicodeDecodeError: {exc}); "
                          f"{fix}") from None
    return parse_lengths(text, source)


def check_lengths(values: object, source: str, worst: int | None = None) -> tuple[int, ...]:
    """The one validation of a sample of lengths, wherever it came from.

    Args:
        values: what the workload or file gave (a sequence of ints is wanted).
        source: how the user named it, for messages.
        worst: the workload's worst-case length, when known: no length may exceed it.

    Returns:
        The lengths as a tuple of ints.

    Raises:
        ConfigError: not a sequence, empty, an item that is not an integer, one that is not
            positive, or one over the worst case: each with the value seen and the fix.
    """
    if getattr(values, "ndim", None) == 1:  # a numpy array (or a tensor): a dataset's column
        values = list(values)  # type: ignore[call-overload]
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        shape = getattr(values, "shape", None)
        got = f"{type(values).__name__} of shape {tuple(shape)}" if shape is not None else (
            type(values).__name__)
        raise ConfigError(f"{source}: got {got}; give a list of integers (the token lengths "
                          "of real samples)")
    if not values:
        raise ConfigError(f"{source}: no lengths; give at least one sequence length (the token "
                          "lengths of real samples, e.g. read from your dataset)")
    numbers = []
    for value in values:
        number = _integer(value)
        if number is None:
            raise ConfigError(f"{source}: {value!r} ({type(value).__name__}) is not an "
                              "integer; every length is a whole number of tokens")
        numbers.append(number)
    low = min(numbers)
    if low <= 0:
        raise ConfigError(f"{source}: length {low} is not positive; every length is at least "
                          "1 token (drop empty samples)")
    high = max(numbers)
    if worst is not None and high > worst:
        raise ConfigError(f"{source}: length {high} is over the workload's worst case of "
                          f"{worst} tokens; truncate the samples to {worst}, or raise the worst "
                          "case (--seq-len, or Workload.tokens_per_sample)")
    return tuple(numbers)


def _integer(value: object) -> int | None:
    """``value`` as an int when it is an integer: a Python int or an integral numpy (or torch)
    scalar, through ``__index__``; None for anything else, a bool or a float with nothing after
    the point included (a length is a count of tokens, as the file parser reads it)."""
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def bucket_lengths(lengths: Sequence[int], max_count: int = MAX_BUCKETS,
                   micro_batch: int = 1) -> tuple[int, ...]:
    """The lengths ``buckets`` pads to: at most ``max_count``, ascending, the last one the
    longest length (so every length has a bucket at least as long).

    A pure function of the sample and the micro-batch: a micro-batch is padded to its longest
    sample, whose distribution is the lengths' to the power ``micro_batch``; the buckets are
    its quantiles at ``k / max_count`` (the lengths' at ``(k / max_count) ** (1 /
    micro_batch)``), each rounded up to a multiple of ``BUCKET_MULTIPLE`` but never past the
    longest length.
    """
    if not lengths or max_count < 1 or micro_batch < 1:
        raise ValueError("bucket_lengths needs lengths, max_count >= 1 and micro_batch >= 1")
    ordered = sorted(lengths)
    chosen = set()
    for k in range(1, max_count + 1):  # k = max_count is the longest: every length fits
        share = (k / max_count) ** (1 / micro_batch)
        at = ordered[max(0, math.ceil(share * len(ordered)) - 1)]
        chosen.add(min(ordered[-1], -(-at // BUCKET_MULTIPLE) * BUCKET_MULTIPLE))
    return tuple(sorted(chosen))


def pad_length(length: int, policy: str, worst: int,
               buckets: Sequence[int] = ()) -> int:
    """The length a batch whose longest sample is ``length`` is padded to under ``policy``:
    the worst case (``max``), the next bucket (``buckets``), itself (``dynamic``, and
    ``longest``: what a collate does).

    Raises:
        ValueError: a length over the worst case (or the last bucket), or an unknown policy.
    """
    if length > worst:
        raise ValueError(f"length {length} is over the worst case {worst}")
    if policy == "max":
        return worst
    if policy in ("dynamic", "longest"):
        return length
    if policy == "buckets":
        for bucket in buckets:
            if bucket >= length:
                return bucket
        return worst
    raise ValueError(f"unknown shapes policy {policy!r} (one of {', '.join(POLICIES)})")


def draw_batches(lengths: Sequence[int], micro_batch: int, count: int, seed: int
                 ) -> list[tuple[int, ...]]:
    """``count`` micro-batches of sample lengths drawn from ``lengths`` (with replacement)
    by a generator seeded with ``seed``: the same draw for every candidate of one micro-batch.
    A collate pads each to its longest sample (``max`` of it); the rest is padding."""
    rng = random.Random(seed)
    return [tuple(rng.choice(lengths) for _ in range(micro_batch)) for _ in range(count)]
