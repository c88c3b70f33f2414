"""What a setting of the knobs means for a workload and a device: the setting that actually
runs (``meaningful``), why a workload or a device cannot run a value (``skip_reason``,
``device_skip_reason``), a user's subset of a knob's values checked (``parse_values``) and
the knobs said in words (``describe``). The table they read is ``autotune.knobs``'s ``KNOBS``.
No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.errors import ConfigError
from autotune.knobs import KNOBS, Knob, Knobs
from autotune.traits import WorkloadTraits


def meaningful(knobs: Knobs) -> Knobs:
    """The knobs with each value that means nothing beside the others at its knob's default:
    the setting that actually runs (a ``Knob.compiled_only`` value with compile mode ``off``:
    eager with scope ``blocks`` is eager), and each value that runs as another as that one
    (``Knob.runs_as``: eager ``shapes=dynamic`` is ``longest``)."""
    swaps = {k.name: k.default for k in KNOBS
             if not knobs.compiled and getattr(knobs, k.name) in k.compiled_only}
    swaps |= {k.name: same[0] for k in KNOBS
              if (same := k.runs_as.get((getattr(knobs, k.name), knobs.compiled)))}
    return knobs.with_(**swaps) if swaps else knobs


def skip_reason(knobs: Knobs, traits: WorkloadTraits | None) -> str | None:
    """Why a workload with ``traits`` cannot run ``knobs`` (None: it can, or not known); a
    value that needs a compiled mode, eager, never runs (whatever the workload), nor one that
    runs as another value (``Knob.runs_as``: that one is timed)."""
    for knob in KNOBS:
        if getattr(knobs, knob.name) in knob.compiled_only and not knobs.compiled:
            return (f"{knob.name} {getattr(knobs, knob.name)}: needs a compiled mode (the "
                    "compiler applies it), and compile_mode is off")
    for knob in KNOBS:
        why = knob.needs(getattr(knobs, knob.name), traits) if traits is not None else None
        if why:
            return f"{knob.name} {getattr(knobs, knob.name)}: {why}"
        same = knob.runs_as.get((getattr(knobs, knob.name), knobs.compiled))
        if same:
            return (f"{knob.name} {getattr(knobs, knob.name)}: "
                    f"{'compiled' if knobs.compiled else 'eager'} it runs as {knob.name} "
                    f"{same[0]} ({same[1]}), timed as that")
    return None


def device_skip_reason(knob: Knob, value: str, is_cuda: bool) -> str | None:
    """Why ``value`` of ``knob`` does not run on this kind of device (None: it does)."""
    if value in knob.cuda_only and not is_cuda:
        return f"{knob.name} {value} skipped: CUDA only"
    return None


def parse_values(knob: Knob, wanted: Sequence[str] | None, option: str | None = None
                 ) -> tuple[str, ...] | None:
    """A user's subset of a knob's values, checked.

    Args:
        knob: the knob.
        wanted: the values asked for (None: not restricted).
        option: how the user named the setting (default: the knob's flag).

    Raises:
        ConfigError: an unknown value (named, with the ones there are).
    """
    if wanted is None:
        return None
    unknown = [v for v in wanted if v not in knob.values and v not in knob.families]
    if unknown:
        names = [*knob.values, *(f for f in knob.families if f not in knob.values)]
        raise ConfigError(f"{option or knob.option} {','.join(unknown)}: not a value of "
                          f"{knob.name}; choose from {','.join(names)}")
    return tuple(dict.fromkeys(v for w in wanted for v in knob.families.get(w, (w,))))


def describe(knobs: Knobs, names: Sequence[str] | None = None) -> list[str]:
    """One line per knob beyond precision and compile mode (or per knob in ``names``), for
    the report and the script."""
    return [f"{k.name} = {getattr(knobs, k.name)}: "
            + (k.eager_words if k.eager_words and not knobs.compiled
               else k.words[getattr(knobs, k.name)])
            for k in KNOBS[2:] if names is None or k.name in names]
