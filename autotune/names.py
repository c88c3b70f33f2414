"""How the user wrote each setting: an error names it the user's way.

The same check runs for ``autotune search --target-batch 0`` and ``autotune.search(
target_batch=0)``; its message names ``--target-batch 0`` on the command line and
``target_batch=0`` from Python. A check takes a ``Names`` (``FLAGS`` or ``KEYWORDS``) and asks
it for each setting by its field name (``TuneRequest``'s, ``SearchSettings``', the knobs'),
never spelling a flag itself. No torch import here.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.knobs import KNOB

_FLAGS = {
    "time_budget_s": "--time-budget",
    "timeout_s": "--trial-timeout",
    "num_timed_steps": "--timed-steps",
    "micro_batches_per_class": "--micro-batches",
    "cache": "--no-cache",
    "max_oom_fallbacks": "--oom-fallbacks",
    "output": "-o/--output",
}
"""Fields whose flag is not the field's name with dashes."""


@dataclass(frozen=True)
class Names:
    """The naming of settings one interface uses: ``name(field)`` is how its user wrote the
    setting ``field``, ``name.given(field, value)`` the setting with its value.

    Args:
        cli: command-line flags (``--target-batch 8``); else Python keywords
            (``target_batch=8``, a knob as ``knob_values={'strategy': [...]}``).
    """

    cli: bool

    def __call__(self, field: str) -> str:
        """``--target-batch`` or ``target_batch`` (a knob: ``knob_values['strategy']``)."""
        if self.cli:
            knob = KNOB.get(field)
            return knob.option if knob is not None else _FLAGS.get(
                field, "--" + field.replace("_", "-"))
        return f"knob_values[{field!r}]" if field in KNOB else field

    def given(self, field: str, value: object) -> str:
        """The setting as the user would write it with ``value``: ``--target-batch 8`` (a
        list comma-separated, a switch alone, quoted for the shell where it needs it) or
        ``target_batch=8`` (the value's repr)."""
        if self.cli:
            if value is True:
                return self(field)
            shown = (",".join(map(str, value)) if isinstance(value, Sequence)
                     and not isinstance(value, str) else str(value))
            return f"{self(field)} {shlex.quote(shown)}"
        if field in KNOB:
            return f"knob_values={{{field!r}: {value!r}}}"
        return f"{field}={value!r}"


FLAGS = Names(cli=True)
"""The command line's naming: ``--target-batch 8``."""
KEYWORDS = Names(cli=False)
"""The Python API's naming: ``target_batch=8``."""
