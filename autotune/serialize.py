"""The typed values as JSON. ``to_json_dict`` / ``from_json_dict`` turn a frozen dataclass (a
child's spec and result, a run the study store keeps, the tuned config) into JSON data and back;
``Text``, ``Pattern`` and ``STRICT_FIELDS`` say what a field of ``autotune.json`` may hold, for
pydantic's validation on read (``autotune.tuned_file.read_tuned``), without importing pydantic
here. No torch import here."""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from autotune.errors import ConfigError

STRICT_FIELDS: dict[str, Any] = {"extra": "forbid", "strict": True}
"""Pydantic config of the dataclasses written to ``autotune.json`` (validated on read by
``autotune.tuned_file.read_tuned``): no unknown field, no coercion ("8" is not 8). A plain
dict, so this module does not import pydantic."""


@dataclass(frozen=True)
class Pattern:
    """A string field's pattern (JSON Schema's ``pattern``: the whole value must match), for
    pydantic's validation and the JSON Schema it prints alike, without importing pydantic."""

    regex: str

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return {**handler(source), "pattern": self.regex}


CONTROL_CHARACTERS = r"\x00-\x1f\x7f-\x9f\u2028\u2029"
"""What a text field of ``autotune.json`` may not hold, as a regex class's inside: C0 and C1
control characters (tab, line breaks, escape, NEL) and Unicode's line and paragraph
separators (line breaks to YAML). Any of them would end a comment line in a file made from
the text, and what follows would be read as configuration or code."""

TEXT_PATTERN = f"^[^{CONTROL_CHARACTERS}]*$"
Text = Annotated[str, Pattern(TEXT_PATTERN)]
"""A text field of ``autotune.json``: one line, no control character."""


def control_character(text: str) -> str | None:
    """The first control character in ``text`` and where, e.g. ``'\\n' at character 4``
    (``CONTROL_CHARACTERS``), or None when it has none."""
    found = re.search(f"[{CONTROL_CHARACTERS}]", text)
    return None if found is None else f"{found.group()!r} at character {found.start()}"

T = TypeVar("T")


def to_json_dict(value: Any) -> Any:
    """A dataclass (nested, with tuples) as plain JSON-ready data."""
    if dataclasses.is_dataclass(value):
        return {f.name: to_json_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [to_json_dict(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json_dict(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def from_json_dict(cls: type[T], data: Any) -> T:
    """Rebuild a dataclass written by ``to_json_dict``; unknown keys are an error."""
    return _convert(cls, data)


def _convert(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    if isinstance(tp, str):
        raise TypeError(f"unresolved type {tp}")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(args[0], data) if len(args) == 1 else data
    if origin is tuple:
        args = typing.get_args(tp)
        return tuple(_convert(args[0], v) for v in data)
    if origin is dict:
        return dict(data)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        unknown = set(data) - names
        if unknown:
            raise ConfigError(f"unknown fields {sorted(unknown)} for {tp.__name__}")
        return tp(**{k: _convert(hints[k], v) for k, v in data.items()})
    if tp is float and isinstance(data, str):
        return float(data)
    return data
