"""``autotune schema`` says what ``read_tuned`` accepts: a value of a field is accepted by the
reader exactly when the printed JSON Schema allows it (ranges, enums, patterns, consts)."""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config import to_json_dict
from autotune.errors import ConfigError
from autotune.schema import read_tuned
from tests.tuned_configs import make_tuned

CASES: dict[tuple[str | int, ...], list[Any]] = {
    # Each field whose value alone the reader checks (no rule between fields), with values on
    # and around its bounds; a value of another type is drawn for every field below.
    ("schema",): [2, 1, 3, 0, "2", 2.0, True],
    ("memory", "headroom"): [0, 0.0, 0.1, 0.999, 1, 1.0, -0.001, 1.5, "nan", "0.1", math.nan],
    ("memory", "budget_bytes"): [1, 2**40, 0, -1, 1.0, "1"],
    ("device", "device"): ["cpu", "cuda:0", "cuda:1234", "cuda", "cuda:12345", "CPU", "cpu ",
                           "cuda:0\n", "cuda:\u0663", "tpu:0", ""],
    ("workload", "seq_len"): [None, 1, 64, 0, -1, "64", 1.5, True],
    ("knobs", "precision"): ["fp32", "bf16", "fp16", "tf32", "fp64", "FP32", ""],
    ("knobs", "checkpointing"): ["off", "blocks", "alternate", "on", None],
    ("trials", 0, "verdict"): ["winner", "ok", "oom", "unsupported", "lost", "OK"],
    ("trials", 0, "micro_batch"): [1, 64, 0, -3, "1", 1.0],
    ("trials", 0, "samples_per_s"): [1.5, 0, "inf", "-inf", "nan", "fast", None],
    # Text: one line, no control character (C0, DEL, C1, U+2028/9), any other character.
    ("workload_name",): ["gpt2", "", "caf\u00e9 \U0001f600", "a\nb", "a\tb", "\x1b[31m", "\x7f",
                         "\x85", "\x9f", "\xa0", "\u2028", "\u2029", "a\r"],
    ("trials", 0, "reason"): ["fastest", "line\n", "\x00"],
}
OTHER = [None, True, "x", -1, 0.5, [], {}]


def _document(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A file this autotune writes (usable bytes 0: no rule between fields can fire), with
    one field set to ``value``."""
    data = to_json_dict(make_tuned())
    data["memory"]["usable_bytes"] = 0
    holder = data
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return data


def _reader_accepts(data: dict[str, Any]) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "autotune.json"
        path.write_text(json.dumps(data))
        try:
            read_tuned(path)
        except ConfigError:
            return False
    return True


def _printed_schema() -> dict[str, Any]:
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


SCHEMA = _printed_schema()


def _node(schema: dict[str, Any], path: tuple[str | int, ...]) -> dict[str, Any]:
    """The schema of the field at ``path``, its ``$ref``s followed."""
    node = schema
    for key in path:
        node = _deref(node)
        node = node["items"] if isinstance(key, int) else node["properties"][key]
    return _deref(node)


def _deref(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _allows(node: dict[str, Any], value: Any) -> bool:
    """JSON Schema's verdict on one value, for the keywords a field's schema uses here (the
    file's text decides a type: ``2.0`` is a number, not an integer)."""
    if "anyOf" in node and not any(_allows(_deref(n), value) for n in node["anyOf"]):
        return False
    kinds = {"integer": lambda v: type(v) is int, "number": lambda v: type(v) in (int, float),
             "string": lambda v: type(v) is str, "boolean": lambda v: type(v) is bool,
             "null": lambda v: v is None, "array": lambda v: type(v) is list,
             "object": lambda v: type(v) is dict}
    if "type" in node and not kinds[node["type"]](value):
        return False
    same = [c for c in node.get("enum", []) + (
        [node["const"]] if "const" in node else []) if type(c) is type(value) and c == value]
    if ("enum" in node or "const" in node) and not same:
        return False
    if type(value) in (int, float):
        if "minimum" in node and not value >= node["minimum"]:
            return False
        if "exclusiveMaximum" in node and not value < node["exclusiveMaximum"]:
            return False
        if "maximum" in node and not value <= node["maximum"]:
            return False
    # ECMA-262's "$" ends the text (Python's also matches before a final newline).
    return not ("pattern" in node and type(value) is str and not re.search(
        node["pattern"].replace("$", r"\Z"), value))


@pytest.mark.parametrize(("path", "value"), [
    (path, value) for path, values in CASES.items() for value in [*values, *OTHER]])
def test_the_reader_accepts_a_value_exactly_when_the_printed_schema_allows_it(
        path: tuple[str | int, ...], value: Any) -> None:
    assert _reader_accepts(_document(path, value)) == _allows(_node(SCHEMA, path), value), (
        path, value, _node(SCHEMA, path))


@settings(max_examples=80, deadline=None)
@given(path=st.sampled_from(sorted(CASES, key=str)), value=st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40), st.floats(), st.text(max_size=12),
    st.text(alphabet="cpuda:0123456789\n ", max_size=9), st.none(), st.booleans()))
def test_any_drawn_value_is_accepted_exactly_when_the_schema_allows_it(
        path: tuple[str | int, ...], value: Any) -> None:
    assert _reader_accepts(_document(path, value)) == _allows(_node(SCHEMA, path), value)
