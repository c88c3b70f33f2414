"""What each setting of a search takes: the one check of every setting's type (and of the
ranges no later check has), for ``autotune search`` / ``probe`` and ``autotune.search`` alike,
before anything starts. The values a device judges (a budget over the device's memory, more
ranks than cores) are ``TuneRequest.validate``'s.

Each problem names the setting as its user wrote it (``names.FLAGS``: ``--target-batch``;
``names.KEYWORDS``: ``target_batch=``), with the value seen and what to pass.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from autotune.config import WorkloadSpec
from autotune.errors import ConfigError
from autotune.knobs import KNOB, KNOBS
from autotune.names import Names
from autotune.search import SearchSettings, check_storage, redact
from autotune.search.joining import check_join

if TYPE_CHECKING:
    from autotune.api.request import TuneRequest


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What one setting takes."""

    what: str
    """The requirement in words: ``a whole number of at least 1``."""
    example: object
    """A good value, shown as the user would write it."""
    kind: Callable[[object], bool]
    """The type test (a bool is not a number here)."""
    ok: Callable[[Any], bool] = lambda value: True
    """The range test, on a value of the right type."""
    optional: bool = False
    """None is allowed (the default)."""


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return _count(value) or (isinstance(value, float) and math.isfinite(value))


def _names(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def _text(value: object) -> bool:
    return isinstance(value, str)


def _switch(value: object) -> bool:
    return isinstance(value, bool)


def _share(value: float) -> bool:
    return 0 <= value <= 1


_NAMES = "a list of strings (a string alone would be read letter by letter)"
REQUEST: dict[str, Setting] = {
    "workload": Setting(
        what="a WorkloadSpec (autotune.search also takes 'file.py:factory' or a TuneRequest; "
        "the search runs the workload in child processes, which import it by file and factory "
        "name: put the factory in a file)", example=None,
        kind=lambda v: isinstance(v, WorkloadSpec)),
    "target_batch": Setting(what="a whole number of samples", example=64, kind=_count),
    "world_size": Setting(what="a whole number of devices", example=8, kind=_count),
    "device": Setting(what="a device name", example="cuda", kind=_text, optional=True),
    "memory_budget": Setting(what="a size such as '2GiB' or '80%', or a number of bytes",
                             example="2GiB", kind=lambda v: _text(v) or _count(v),
                             optional=True),
    "headroom": Setting(what="a fraction such as 0.1", example=0.1, kind=_number),
    "precisions": Setting(what=_NAMES, example=["fp32", "bf16"], kind=_names, optional=True),
    "compile_modes": Setting(what=_NAMES, example=["off", "default"], kind=_names,
                             optional=True),
    "knob_values": Setting(what="a dict of knob names to lists of their values",
                           example={"checkpointing": ["off", "blocks"]},
                           kind=lambda v: isinstance(v, Mapping)),
    "allow_inexact": Setting(what="True or False", example=True, kind=_switch),
    "nproc_per_node": Setting(what="a whole number of ranks", example=2, kind=_count),
    "parallel": Setting(
        what="a whole number of child runs at once, at least 1, or 'auto' (every visible "
        "device)", example=2, kind=lambda v: _count(v) or v == "auto",
        ok=lambda v: v == "auto" or v >= 1),
}
"""``TuneRequest``'s fields (their ranges: ``TuneRequest.validate``, against the device)."""
SEARCH: dict[str, Setting] = {
    "num_timed_steps": Setting(what="a whole number of at least 1", example=10, kind=_count,
                               ok=lambda v: v >= 1),
    "rank_precision": Setting(
        what="a share from 0 to 1 (e.g. 0.05: stop timing once the median is known within "
        "5%; 0 times every run in full)", example=0.05, kind=_number, ok=_share,
        optional=True),
    "min_timed_s": Setting(what="seconds, 0 or more", example=1.0, kind=_number,
                           ok=lambda v: v >= 0),
    "micro_batches_per_class": Setting(what="a whole number, 0 or more (0: every one that "
                                       "fits)", example=3, kind=_count, ok=lambda v: v >= 0),
    "refine_within": Setting(what="a share from 0 to 1", example=0.9, kind=_number, ok=_share),
    "max_trials": Setting(what="a whole number of at least 1", example=60, kind=_count,
                          ok=lambda v: v >= 1, optional=True),
    "time_budget_s": Setting(what="a positive number of seconds", example=600, kind=_number,
                             ok=lambda v: v > 0, optional=True),
    "train_steps": Setting(what="a whole number of at least 1", example=1000, kind=_count,
                           ok=lambda v: v >= 1, optional=True),
    "storage": Setting(what="a database URL", example="sqlite:///autotune.db", kind=_text,
                       optional=True),
    "study_name": Setting(what="a name", example="my-search", kind=_text, optional=True),
    "join": Setting(what="True or False", example=True, kind=_switch),
    "cache": Setting(what="True or False", example=False, kind=_switch),
    "fresh": Setting(what="True or False", example=True, kind=_switch),
    "timeout_s": Setting(what="a positive number of seconds", example=900, kind=_number,
                         ok=lambda v: v > 0),
    "slower_factor": Setting(what="a positive number", example=2.0, kind=_number,
                             ok=lambda v: v > 0),
    "stop_margin": Setting(what="a share, 0 or more", example=0.15, kind=_number,
                           ok=lambda v: v >= 0),
    "num_confirm": Setting(what="a whole number, 0 or more", example=2, kind=_count,
                           ok=lambda v: v >= 0),
    "confirm_within": Setting(what="a share from 0 to 1", example=0.05, kind=_number,
                              ok=_share),
}
"""``SearchSettings``' fields."""
SETTINGS: dict[str, Setting] = {
    **REQUEST,
    **SEARCH,
    # The Python API's own (autotune.search, api.search, api.probe)
    "model": Setting(what="a Hugging Face model id", example="gpt2", kind=_text,
                     optional=True),
    "seq_len": Setting(what="a whole number of tokens", example=512, kind=_count,
                       optional=True),
    "out": Setting(what="a folder (a str or a pathlib.Path)", example="runs/tuned",
                   kind=lambda v: isinstance(v, (str, os.PathLike)), optional=True),
    "force": Setting(what="True or False", example=True, kind=_switch),
    "include_baseline": Setting(what="True or False", example=True, kind=_switch),
    "settings": Setting(what="an autotune.search.SearchSettings", example=None,
                        kind=lambda v: isinstance(v, SearchSettings), optional=True),
    **{hook: Setting(what="a function (e.g. print)", example=None, kind=callable,
                     optional=True) for hook in ("progress", "on_step", "on_trial")},
}
"""Every setting of a search by its field name (``TuneRequest``'s, ``SearchSettings``', the
Python API's own)."""


def check_settings(name: Names, *parts: TuneRequest | SearchSettings | None,
                   request_fields: Mapping[str, Any] | None = None, **values: Any) -> None:
    """Refuse settings of the wrong type or out of range, all problems at once, before
    anything runs: the one check ``autotune search`` / ``probe`` and ``autotune.search`` share
    (the values a device judges: ``TuneRequest.validate``).

    Args:
        name: how the user wrote the settings (``FLAGS`` on the command line, ``KEYWORDS``
            from Python); each problem names the setting so.
        *parts: a ``TuneRequest`` and ``SearchSettings``, every field checked.
        request_fields: keyword fields for a ``TuneRequest`` (each must be one, not its
            workload).
        **values: further settings by field name (over the parts' own).

    Raises:
        ConfigError: each problem naming the setting, the value seen (its repr) and what to
            pass; a setting no search has; the storage's (``check_storage``).
    """
    given: dict[str, Any] = {}
    for part in parts:
        if part is not None:
            given.update({f.name: getattr(part, f.name) for f in fields(part)})
    given.update(values)
    problems = []
    for field_name, value in (request_fields or {}).items():
        if field_name in _REQUEST_FIELDS:
            given[field_name] = value
        else:
            where = ("a SearchSettings field: pass settings=SearchSettings("
                     f"{field_name}=...)" if field_name in SEARCH else
                     f"a TuneRequest's fields are {', '.join(_REQUEST_FIELDS)}")
            problems.append(f"{name(field_name)} (got {_shown(value)}) is not a search "
                            f"setting: {where}")
    for field_name, value in given.items():
        setting = SETTINGS.get(field_name)
        assert setting is not None, f"no SETTINGS entry for {field_name!r}"
        if not ((value is None and setting.optional) or (
                setting.kind(value) and setting.ok(value))):
            shown = _shown(value) + ("" if setting.kind(value) else
                                     f" (a {type(value).__name__})")
            example = "" if setting.example is None else (
                f": pass e.g. {name.given(field_name, setting.example)}")
            problems.append(f"{name(field_name)} must be {setting.what}, got {shown}{example}")
    knobs = given.get("knob_values")
    if isinstance(knobs, Mapping):
        problems += _knob_problems(knobs, name)
    if given.get("fresh") is True and _text(given.get("storage")):
        problems.append(
            f"{name('fresh')} applies to the local study store, not to "
            f"{name.given('storage', redact(given['storage']))}: name another "
            f"{name('study_name')} to start that study afresh")
    problems += check_join(given.get("join") is True, given.get("storage"), name)
    if _text(given.get("storage")):
        try:
            check_storage(given["storage"], name)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("; ".join(problems))


def _shown(value: object) -> str:
    """The value as Python writes it, cut short when long (an int too long for ``repr``
    said so)."""
    try:
        text = repr(value)
    except ValueError:  # int -> str is refused beyond sys.get_int_max_str_digits()
        return "a number too long to print"
    return text if len(text) <= 100 else f"{text[:97]}..."


_REQUEST_FIELDS = [field_name for field_name in REQUEST if field_name != "workload"]
"""What ``request_fields`` may hold (the workload is given on its own)."""


def _knob_problems(knobs: Mapping[Any, Any], name: Names) -> list[str]:
    """A ``knob_values`` key that is no knob, or a value that is not a list of names."""
    problems = []
    known = [k.name for k in KNOBS[2:]]
    for knob, value in knobs.items():
        if knob not in known:
            problems.append(f"knob_values has {knob!r}, not a knob: the knobs are "
                            f"{', '.join(known)} (precisions and compile modes have their own "
                            "settings)")
        elif value is not None and not _names(value):
            problems.append(f"{name(knob)} must be {_NAMES} or None, got {_shown(value)} (a "
                            f"{type(value).__name__}): pass e.g. "
                            f"{name.given(knob, list(KNOB[knob].values[:2]))}")
    return problems
