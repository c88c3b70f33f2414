"""``autotune schema`` says what ``read_tuned`` accepts: a value of a field is accepted by the
reader exactly when the printed JSON Schema allows it (ranges, enums, patterns, consts)."""

from __future__ import annotations

import copy
import json
import math
import re
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from autotune.schema import CompileArtifacts, RunRecord, SearchCost, SkipRecord, StudyRecord
from autotune.serialize import to_json_dict
from autotune.tuned_file import READ_RULES, read_tuned
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


# ----------------------------------------------------------------------------------------------
# What the reader requires is what the printed schema requires (issue 61: `schema` was not).


def _full_document() -> dict[str, Any]:
    """A file this autotune writes, with every kind of object it can hold filled in."""
    config = replace(
        make_tuned(),
        cost=SearchCost(num_runs=5, child_s=10.0, compile_s=2.0, timed_s=4.0),
        study=StudyRecord(storage="sqlite:///autotune.db", name="autotune"),
        runs=(RunRecord(number=0, kind="probe", knobs=Knobs(), micro_batch=16, status="ok"),),
        skips=(SkipRecord(text="fp16 skipped: not supported on this device"),),
        compile_artifacts=CompileArtifacts(file="autotune.artifacts", size_bytes=1,
                                           sha256="0" * 64, torch_version="2.9.0",
                                           device_name="cpu", graphs_key="0" * 16))
    return to_json_dict(config)


def _objects(value: Any, path: tuple[str | int, ...] = ()
             ) -> list[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Every JSON object in the document, with its path, whose schema names its fields (not
    the maps: ``extras``, ``memory.max_micro_batch``, ...)."""
    found = []
    if isinstance(value, dict) and "properties" in _object_node(path):
        found.append((path, value))
        for key, item in value.items():
            found += _objects(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _objects(item, (*path, i))
    return found


def _object_node(path: tuple[str | int, ...]) -> dict[str, Any]:
    """The schema of the object at ``path``, through ``$ref``s and optional (``anyOf`` with
    null) fields."""
    node = SCHEMA
    for key in path:
        node = _deref(node)
        node = next((_deref(n) for n in node.get("anyOf", ()) if _deref(n).get("type") != "null"),
                    node)
        if isinstance(key, int):
            node = node.get("items", {})
        else:
            node = node.get("properties", {}).get(key, {})
    node = _deref(node)
    return next((_deref(n) for n in node.get("anyOf", ()) if "properties" in _deref(n)), node)


def test_the_schema_requires_exactly_the_fields_the_reader_refuses_a_file_without() -> None:
    """Each field of each object is left out once: the reader refuses the file exactly when
    the printed schema lists the field as required there (no list here to drift)."""
    full = _full_document()
    assert _reader_accepts(full)
    objects = _objects(full)
    assert {path for path, _ in objects} >= {(), ("memory",), ("device",), ("knobs",),
                                              ("workload",), ("trials", 0), ("runs", 0),
                                              ("skips", 0), ("cost",), ("study",),
                                              ("compile_artifacts",)}
    for path, holder in objects:
        required = _object_node(path).get("required", [])
        for key in holder:
            data = copy.deepcopy(full)
            target = data
            for step in path:
                target = target[step]
            del target[key]
            assert (not _reader_accepts(data)) == (key in required), (path, key, required)


def test_a_file_without_its_schema_field_is_refused_and_invalid_under_the_schema() -> None:
    data = _full_document()
    del data["schema"]
    assert not _reader_accepts(data)
    assert "schema" in SCHEMA["required"]


@pytest.mark.parametrize(("path", "change", "problem"), [
    (("target_batch",), {"accumulate_steps": 2}, "must equal target_batch"),
    (("nproc_per_node",), {"world_size": 3, "nproc_per_node": 2, "target_batch": 96},
     "world_size (3) must be a multiple of it"),
    (("knobs",), {"knobs": {"checkpointing": "budget-0.5", "compile_mode": "off"}},
     "needs a compiled mode"),
    (("memory", "usable_bytes"), {"memory": {"usable_bytes": 2**40}},
     "must not exceed memory.budget_bytes"),
    (("workload", "target"), {"workload": {"kind": "file", "target": "model.py"}},
     "a file workload must be 'path/to/file.py:factory'"),
])
def test_each_rule_between_fields_is_said_in_the_printed_schema_where_it_applies(
        path: tuple[str, ...], change: dict[str, Any], problem: str, tmp_path: Path) -> None:
    """The reader refuses a file that breaks a rule between fields (its types all fine); the
    printed schema, which cannot express the rule, says it in a ``$comment`` at that field
    and in its top-level ``$comment``."""
    data = _full_document()
    for key, value in change.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    file = tmp_path / "autotune.json"
    file.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=re.escape(problem)):
        read_tuned(file)
    holder = SCHEMA if len(path) == 1 else _object_node(path[:-1])
    rule = holder["properties"][path[-1]]["$comment"]
    assert rule == READ_RULES[path] and rule in SCHEMA["$comment"]
    words = {"target_batch": "micro_batch x accumulate_steps x world_size",
             "nproc_per_node": "multiple of nproc_per_node", "knobs": "compile_mode",
             "usable_bytes": "budget_bytes", "target": "path/to/file.py:factory"}
    assert words[path[-1]] in rule
