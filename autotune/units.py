"""Quantities a user writes and autotune reads back or prints: memory sizes (``"1.5GiB"``,
``"80%"`` of a device), durations (``"10m"``), and batch counts (their limit, ``MAX_BATCH``, and
the accumulation arithmetic on them). No torch import here."""

from __future__ import annotations

import math
import re

from autotune.errors import ConfigError

GIB = 1024**3
MIB = 1024**2

MAX_BATCH = 2**20
"""The most samples per optimizer step autotune tunes for (1,048,576, over all devices), and
so the most in a micro-batch, micro-batches accumulated, or devices in a world. A larger value
is refused where values are read (exit 2): the divisors of a target of 1e30 alone would run
for hours in the parent, outside every limit."""


def batch_limit_problem(name: str, value: int, what: str = "samples per optimizer step"
                        ) -> str | None:
    """Why ``value`` of the count ``name`` (e.g. ``--target-batch``) is over ``MAX_BATCH``, or
    None when it is not. A number too long to print whole is given by its size."""
    if value <= MAX_BATCH:
        return None
    digits = math.floor(math.log10(value)) + 1  # str() of a huge int is slow, or refused
    digits -= value < 10 ** (digits - 1)  # log10 rounds up just below a power of ten
    shown = str(value) if digits <= 60 else f"a number of {digits} digits"
    return (f"{name} {shown} is over the limit of {MAX_BATCH} (2**20) {what} autotune tunes "
            f"for; use at most {MAX_BATCH}")


def accumulate_steps(per_device_batch: int, micro_batch: int) -> int:
    """Micro-batches per optimizer step, ``per_device_batch / micro_batch``: exact, since a
    micro-batch is always a divisor of the per-device batch (DESIGN.md section 2)."""
    steps, rest = divmod(per_device_batch, micro_batch)
    if rest:
        raise ValueError(f"micro-batch {micro_batch} does not divide the per-device batch "
                         f"{per_device_batch}")
    return steps


_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": MIB, "gib": GIB, "tib": 1024**4,
}


def parse_bytes(text: str) -> int:
    """Parse a size such as ``"1.5GiB"``, ``"800MB"`` or ``"2147483648"`` into bytes.

    Raises:
        ConfigError: the text is not a positive size.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ConfigError(
            f"cannot read the memory size {text!r}: write a number with a unit, "
            "e.g. '1.5GiB', '800MiB' or '24GB'"
        )
    value = float(match.group(1)) * _UNITS[unit]
    if value < 1:
        raise ConfigError(f"memory size {text!r} is zero: give a positive size such as '2GiB'")
    return int(value)


def parse_budget(text: str, total_bytes: int) -> int:
    """Parse a memory budget: an absolute size (``"2GiB"``) or a share of the device (``"80%"``).

    Args:
        text: the user's budget.
        total_bytes: the device's total memory, for percentages.

    Raises:
        ConfigError: the budget does not parse, is not positive, or is over 100%.
    """
    stripped = str(text).strip()
    if stripped.endswith("%"):
        try:
            share = float(stripped[:-1])
        except ValueError:
            share = -1.0
        if not 0 < share <= 100:
            raise ConfigError(
                f"memory budget {text!r} is not a share between 0% and 100%: "
                "write e.g. '80%' or an absolute size such as '2GiB'"
            )
        return int(total_bytes * share / 100)
    return parse_bytes(stripped)


def parse_duration(text: str) -> float:
    """Parse ``"10m"``, ``"90s"``, ``"1.5h"`` or a number of seconds.

    Raises:
        ConfigError: not a positive duration.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h)?\s*", str(text).lower())
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"cannot read the duration {text!r}: write e.g. '90s', '10m' or '1h'")
    return float(match.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}[
        match.group(2) or "s"]


def format_bytes(num_bytes: float | None) -> str:
    """Render bytes in binary units, e.g. ``1.50 GiB``; ``-`` for unknown."""
    if num_bytes is None:
        return "-"
    sign = "-" if num_bytes < 0 else ""
    value = abs(float(num_bytes))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
