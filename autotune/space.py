"""The space a search covers: micro-batch sizes and the knobs' values on this device.
No torch import here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.config import COMPILE_MODES, CUDA_GRAPH_MODES, PRECISIONS, DeviceInfo, Knobs
from autotune.device import backend_for
from autotune.errors import ConfigError
from autotune.knob_rules import device_skip_reason, meaningful, parse_values
from autotune.knobs import KNOBS
from autotune.names import KEYWORDS, Names
from autotune.units import batch_limit_problem


def divisors(n: int) -> tuple[int, ...]:
    """All divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def per_device_batch(target_batch: int, world_size: int, name: Names = KEYWORDS) -> int:
    """``target_batch / world_size``: the samples one device contributes per optimizer step.

    Args:
        name: how the user wrote the settings (``FLAGS`` on the command line).

    Raises:
        ConfigError: a non-positive target or world size, or a target that does not split
            evenly over the devices.
    """
    _check_counts(target_batch, world_size, name)
    if target_batch % world_size:
        raise ConfigError(
            f"{name.given('target_batch', target_batch)} does not split evenly over "
            f"{name.given('world_size', world_size)}; use a multiple of {world_size}")
    return target_batch // world_size


def _check_counts(target_batch: int, world_size: int, name: Names) -> None:
    """Raises ConfigError when the target or the world is not positive, or over ``MAX_BATCH``
    (its divisors, and every other sum on it, then stay quick)."""
    problems = []
    if target_batch <= 0:
        problems.append(f"{name('target_batch')} must be a positive number of samples, got "
                        f"{target_batch}")
    if world_size <= 0:
        problems.append(f"{name('world_size')} must be at least 1, got {world_size}")
    problems += filter(None, (batch_limit_problem(name("target_batch"), target_batch),
                              batch_limit_problem(name("world_size"), world_size, "devices")))
    if problems:
        raise ConfigError("; ".join(problems))


def exact_target(target_batch: int, world_size: int, allow_inexact: bool = False,
                 name: Names = KEYWORDS) -> int:
    """The effective batch to tune for: the target, or with ``allow_inexact`` the nearest
    multiple of the world size when the target does not split evenly over the devices.

    Raises:
        ConfigError: bad numbers, or an uneven split without ``allow_inexact`` (the message
            names the nearest exact targets).
    """
    _check_counts(target_batch, world_size, name)
    if target_batch % world_size:
        below = target_batch // world_size * world_size
        above = below + world_size
        if not allow_inexact:
            nearby = ", ".join(str(t) for t in (below, above) if t)
            raise ConfigError(
                f"{name.given('target_batch', target_batch)} does not split evenly over "
                f"{name.given('world_size', world_size)}: exact targets nearby are {nearby}; "
                f"use one, or pass {name.given('allow_inexact', True)} to tune the nearest and "
                "report the deviation")
        exact = below if below and target_batch - below <= above - target_batch else above
        _check_counts(exact, world_size, name)
        return exact
    return target_batch


def memory_classes(
    device: DeviceInfo,
    precisions: Sequence[str] | None = None,
    compile_modes: Sequence[str] | None = None,
    base: Knobs | None = None,
) -> tuple[tuple[Knobs, ...], tuple[str, ...]]:
    """The (precision, compile mode) settings to probe on ``device``, the other knobs as in
    ``base`` (default: their defaults), and notes on what was skipped.

    Args:
        device: what the device supports.
        precisions: restrict to these (default: every precision the device supports).
        compile_modes: restrict to these (default: ``off`` and ``default`` on CPU, every mode
            on CUDA).

    Raises:
        ConfigError: an unknown name, or nothing left to run.
    """
    unknown = [p for p in precisions or () if p not in PRECISIONS]
    unknown += [m for m in compile_modes or () if m not in COMPILE_MODES]
    if unknown:
        raise ConfigError(
            f"unknown precision or compile mode {', '.join(map(repr, unknown))}: precisions are "
            f"{', '.join(PRECISIONS)}; compile modes are {', '.join(COMPILE_MODES)}"
        )
    backend = backend_for(device.device)
    skipped: list[str] = []
    wanted_p = list(precisions) if precisions else list(PRECISIONS)
    supported_m = backend.compile_modes()
    if compile_modes:
        wanted_m = list(compile_modes)
    else:
        wanted_m = list(backend.default_compile_modes())
        skipped += [f"{m} not tried by default on {device.device.upper()} (long compiles); ask "
                    "for it with --compile-modes" for m in supported_m if m not in wanted_m]
    supported_p = backend.precisions(device)
    for p in wanted_p:
        if p not in supported_p:
            skipped.append(
                f"precision {p} skipped: not supported on {device.name} ({device.device})")
    for m in wanted_m:
        if m not in supported_m:
            skipped.append(f"compile mode {m} skipped: CUDA graphs need a CUDA device")
    base = base or Knobs()
    classes = tuple(  # a value only the compiler applies, eager, at its knob's default
        meaningful(base.with_(precision=p, compile_mode=m))
        for m in wanted_m if m in supported_m
        for p in wanted_p if p in supported_p
    )
    if not classes:
        raise ConfigError(
            f"nothing to run on {device.device}: precisions {wanted_p} x compile modes {wanted_m} "
            f"leave no supported pair (this device runs {', '.join(supported_p)} with "
            f"{', '.join(supported_m)})"
        )
    for p in wanted_p:
        if p in supported_p and p == "bf16" and not device.native_bf16:
            skipped.append("bf16 is emulated on this device (no native bf16 units): expect it slow")
    return classes, tuple(skipped)


def compiled_values(values: Mapping[str, tuple[str, ...]], classes: Sequence[Knobs],
                    name: Names = KEYWORDS) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """The knob values without those that need a compiled mode where no class compiles (the
    space never holds them), and a note on each left out.

    Raises:
        ConfigError: a knob left with no value (only compiled-only values were asked for).
    """
    if any(c.compiled for c in classes):
        return dict(values), ()
    kept, notes, problems = {}, [], []
    for knob in KNOBS[2:]:
        if knob.name not in values:
            continue
        gone = [v for v in values[knob.name] if v in knob.compiled_only]
        kept[knob.name] = tuple(v for v in values[knob.name] if v not in gone)
        if gone and not kept[knob.name]:
            problems.append(f"{name.given(knob.name, gone)}: needs a compiled mode, and "
                            f"{name('compile_modes')} compiles nothing here; add default to "
                            f"{name('compile_modes')}, or choose from "
                            f"{','.join(v for v in knob.values if v not in knob.compiled_only)}")
        notes += [f"{knob.name} {v} skipped: needs a compiled mode (none in the search)"
                  for v in gone]
    if problems:
        raise ConfigError("; ".join(problems))
    return kept, tuple(notes)


def timed_precisions(device: DeviceInfo, precisions: Sequence[str] | None
                     ) -> tuple[Sequence[str] | None, tuple[str, ...]]:
    """The precisions a search times by default, and a note on what it leaves out.

    A CPU that emulates bf16 (no AVX512-BF16 or AMX) runs it many times slower than fp32:
    it is timed only when asked for. An explicit list is kept as given.
    """
    if precisions is None and not device.is_cuda and not device.native_bf16:
        return ["fp32"], ("bf16 not timed: this CPU emulates it (many times slower than "
                          "fp32); ask for it with --precisions fp32,bf16",)
    return precisions, ()


def is_cuda_graph_mode(mode: str) -> bool:
    """True for compile modes that capture CUDA graphs."""
    return mode in CUDA_GRAPH_MODES


def knob_values(device: DeviceInfo, wanted: Mapping[str, Sequence[str] | None] | None = None,
                name: Names = KEYWORDS
                ) -> tuple[dict[str, tuple[str, ...]], Knobs, tuple[str, ...]]:
    """The values of each knob beyond precision and compile mode that a search may try on
    ``device``, the setting its first stage runs them at, and notes on what was skipped.

    Args:
        device: what the device runs (CUDA-only values are skipped elsewhere, said so).
        wanted: per knob name, the user's subset (None or missing: every value).
        name: how the user wrote the settings (``FLAGS`` on the command line).

    Returns:
        (values per knob name, the base setting: each knob's default when allowed, else the
        first value asked for, notes).

    Raises:
        ConfigError: an unknown knob value, or a subset that leaves nothing on this device.
    """
    wanted = wanted or {}
    values: dict[str, tuple[str, ...]] = {}
    base: dict[str, str] = {}
    notes: list[str] = []
    problems: list[str] = []
    for knob in KNOBS[2:]:
        try:
            asked = parse_values(knob, wanted.get(knob.name), name(knob.name))
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        kept = []
        for value in asked or knob.by_default or knob.values:
            why = device_skip_reason(knob, value, device.is_cuda)
            if why:
                notes.append(f"{why} ({device.device})")
            else:
                kept.append(value)
        if not kept:
            problems.append(f"{name.given(knob.name, asked or ())}: nothing runs on "
                            f"{device.device}; leave it out")
            continue
        values[knob.name] = tuple(kept)
        base[knob.name] = knob.default if knob.default in kept else kept[0]
    if problems:
        raise ConfigError("; ".join(problems))
    return values, Knobs(**base), tuple(notes)  # type: ignore[arg-type]
