"""``autotune.json`` on disk: ``save_tuned`` writes it, ``read_tuned`` reads and validates it,
``json_schema`` says what the reader accepts. No torch import here.

It is validated in one place, on read (``read_tuned``): pydantic checks every field's type and
range against the dataclasses of ``autotune.schema`` (strict: no coercion, no unknown field),
then the rules that tie fields together. Every problem is reported at once, each with its
dotted path. A field's range or pattern is in its type, never only in a rule, so the JSON
Schema that ``autotune schema`` prints (``json_schema``, from the same types) says what the
reader accepts; beyond it are only the rules between fields (``_rules``), which it says in
``$comment``s (``READ_RULES``: JSON Schema cannot state a product of fields).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from autotune.errors import ConfigError
from autotune.files import not_a_file, write_json_atomic
from autotune.knobs import KNOBS
from autotune.schema import SCHEMA_VERSION, TunedConfig
from autotune.serialize import CONTROL_CHARACTERS, TEXT_PATTERN, control_character, to_json_dict
from autotune.units import MAX_BATCH

_READS_OLDER: Final = (1, 2)
_READS: Final = (*_READS_OLDER, SCHEMA_VERSION)
"""Schema versions this autotune reads: its own, and 1 and 2 (moved into it on read)."""


def save_tuned(config: TunedConfig, path: Path, *, force: bool = False) -> None:
    """Write ``autotune.json`` atomically (never a half-written file, never over another one
    without ``force``), a file workload's path relative to it where they travel together
    (``stored_workload_target``), a control character in its text escaped
    (``_escape_controls``)."""
    data = to_json_dict(config)
    if config.workload.kind == "file":
        data["workload"]["target"] = stored_workload_target(config.workload.target,
                                                            Path(path).absolute().parent)
    write_json_atomic(path, json.dumps(_escape_controls(data), indent=2) + "\n", force=force)


def _escape_controls(data: Any) -> Any:
    """JSON data with each control character in its text as its escape (a tab as ``\\t``):
    the reader refuses them (``Text``), and the search records text it did not choose (the
    first line of an error, which may hold a tab or a colour code). The names a user gives
    are refused before a search starts (``Workload``, ``--workload``, ``--model``)."""
    if isinstance(data, str):
        return re.sub(f"[{CONTROL_CHARACTERS}]", lambda c: repr(c.group())[1:-1], data)
    if isinstance(data, dict):
        return {_escape_controls(k): _escape_controls(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_escape_controls(v) for v in data]
    return data


def stored_workload_target(target: str, folder: Path) -> str:
    """A ``file.py:factory`` as ``autotune.json`` in ``folder`` stores it: relative to that
    folder when the file lies in the same tree (under the folder, or under the git checkout
    that holds it), so the two move together (a CI checkout); absolute otherwise.
    ``read_tuned`` resolves a relative one from the folder again."""
    path_text, _, factory = target.rpartition(":")
    if not Path(path_text).is_absolute():
        return target
    try:  # a folder above that cannot be read leaves the path as it was, never the write
        file, folder = Path(path_text).resolve(), folder.resolve()
        root = next((p for p in (folder, *folder.parents) if (p / ".git").exists()), folder)
    except OSError:
        return target
    if not file.is_relative_to(root):
        return target
    return f"{Path(os.path.relpath(file, folder)).as_posix()}:{factory}"


def _resolve_workload(config: TunedConfig, path: Path) -> TunedConfig:
    """The config with a relative file workload's path resolved from ``path``'s folder."""
    path_text, _, factory = config.workload.target.rpartition(":")
    if config.workload.kind != "file" or Path(path_text).is_absolute():
        return config
    file = os.path.normpath(path.absolute().parent.resolve() / path_text)
    return replace(config, workload=replace(config.workload, target=f"{file}:{factory}"))


READ_RULES: Final = {
    ("schema",): f"files of schema {' and '.join(map(str, _READS_OLDER))} are read too (moved "
                 f"to schema {SCHEMA_VERSION} on read)",
    ("target_batch",): "micro_batch x accumulate_steps x world_size must equal target_batch",
    ("nproc_per_node",): "world_size must be a multiple of nproc_per_node (nodes x ranks per "
                         "node); above 1, knobs.strategy must not be none",
    ("knobs",): "a knob value only the compiler applies ("
                + ", ".join(f"{k.name} {v}" for k in KNOBS for v in k.compiled_only)
                + ") needs knobs.compile_mode other than off",
    ("memory", "usable_bytes"): "must not exceed memory.budget_bytes",
    ("workload", "target"): "with workload.kind file: 'path/to/file.py:factory' (the factory "
                            "a Python identifier)",
}
"""What the reader checks beyond each field's own type (``_from_schema_*``, ``_rules``), by
the field it is said at: ``json_schema`` writes each as a ``$comment`` there (JSON Schema
cannot state a product of fields)."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``autotune.json`` (what ``autotune schema`` prints): generated from
    the types ``read_tuned`` validates with, so their ranges, enums and patterns are its own;
    ``schema`` required as the reader requires it (``_check_schema_field``: it has a default
    in the type, never in a file), and the rules between fields (``READ_RULES``) said
    where they apply."""
    schema = _adapter().json_schema()
    schema["required"] = ["schema", *(f for f in schema["required"] if f != "schema")]
    for path, rule in READ_RULES.items():
        node = schema
        for key in path[:-1]:  # the field's own node, not a definition others share
            node = node["properties"][key]
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node
        node["properties"][path[-1]]["$comment"] = rule
    schema["$comment"] = "What the reader checks beyond each field's type: " + "; ".join(
        f"{'.'.join(path)}: {rule}" for path, rule in READ_RULES.items())
    return schema


def read_tuned(path: str | Path) -> TunedConfig:
    """Read and validate ``autotune.json``: the one place its values are checked.

    Pydantic checks each field's type and range (strict: ``"8"`` is not 8, no unknown field),
    then ``_rules`` checks the fields against each other. All problems are reported at once.

    Raises:
        ConfigError: missing, a directory, not JSON, not an autotune file, from another schema,
            or with bad fields (each named by its dotted path, with the value seen and why).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not an autotune.json file: give the file's "
                          f"path, e.g. {path / 'autotune.json'}")
    kind = not_a_file(path)
    if kind is not None:
        raise ConfigError(f"{path} is {kind}, not a regular file: give the path of an "
                          "autotune.json file")
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: run `autotune search` to create it")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: a number of over 4300 digits too
        raise ConfigError(f"{path} is not valid JSON ({exc}); re-run `autotune search`") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    version = _check_schema_field(path, data)
    problems: list[str] = []
    if version == 1:
        data, problems = _from_schema_1(data)
    if version in (1, 2):
        data, moved = _from_schema_2(data)
        problems += moved
        try:
            text = json.dumps(data)
        except RecursionError as exc:
            raise ConfigError(f"{path} is nested too deeply to read; re-run `autotune "
                              "search`") from exc
    config = None
    try:
        config = _adapter().validate_json(text)
    except ValidationError as exc:
        problems += [_problem(error, version) for error in exc.errors()]
    problems += _rules(data)
    if problems or config is None:
        raise ConfigError(
            f"{path} is not a valid autotune config ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}): " + "; ".join(problems)
            + ". Fix these fields, or re-run `autotune search` to write a fresh file")
    return _resolve_workload(config, path)


@functools.cache
def _adapter() -> TypeAdapter[TunedConfig]:
    """Pydantic's validator for the file, compiled once per process on first use."""
    return TypeAdapter(TunedConfig)




def _check_schema_field(path: Path, data: Any) -> int:
    """The file is a JSON object with a ``schema`` this autotune reads; returns it."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not an autotune.json file: it holds {_describe(data)}, "
                          "not a JSON object; re-run `autotune search` to write one")
    if "schema" not in data:
        raise ConfigError(f"{path} is not an autotune.json file (no 'schema' field)")
    version = data["schema"]
    if type(version) is not int:
        raise ConfigError(
            f"{path}: the field 'schema' must be the number {SCHEMA_VERSION}, got "
            f"{_describe(version)}; fix it, or re-run `autotune search` to write a fresh file")
    if version not in _READS:
        raise ConfigError(
            f"{path} has schema {version}; this autotune reads schema "
            f"{', '.join(map(str, _READS[:-1]))} and {_READS[-1]}"
            + (": upgrade autotune (pip install -U torch-autotune)" if version > SCHEMA_VERSION
               else ": re-run `autotune search` to write a current file"))
    return version


def _from_schema_1(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A schema 1 file as schema 2: ``precision`` and ``compile_mode`` (top level and in each
    trial) move into ``knobs``; the other knobs keep their defaults (schema 1 had none).

    Returns:
        The moved data, and what ``knobs`` would hide: a missing ``precision`` or
        ``compile_mode`` (it would take the default), a ``knobs`` field (not schema 1's).
    """
    problems = []
    trials = data.get("trials")
    holders = [("", data), *((f"trials[{i}].", t) for i, t in enumerate(
        trials if isinstance(trials, list) else []) if isinstance(t, dict))]
    for where, holder in holders:
        if "knobs" in holder:
            problems.append(f"{where}knobs: got {_shown(holder['knobs'])}: "
                            + _REASONS["extra_forbidden"].format(version=1))
        holder["knobs"] = {k: holder.pop(k) for k in ("precision", "compile_mode") if k in holder}
        problems += [f"{where}{k}: {_REASONS['missing']}" for k in ("precision", "compile_mode")
                     if k not in holder["knobs"]]
    return {**data, "schema": 2}, problems


def _from_schema_2(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A schema 2 file as schema 3: each sentence of ``skipped`` becomes a skip of rule
    ``note`` (schema 2 did not record the rules). Returns the moved data, and a ``skipped``
    that is not a list of strings or a ``skips`` field (not schema 2's) as problems."""
    data = dict(data)
    problems = []
    if "skips" in data:
        problems.append(f"skips: got {_shown(data['skips'])}: "
                        + _REASONS["extra_forbidden"].format(version=2))
    skipped = data.pop("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(t, str) for t in skipped):
        problems.append(f"skipped: got {_shown(skipped)}: a list of sentences (strings) in "
                        "schema 2")
        skipped = []
    data["skips"] = [{"rule": "note", "text": text} for text in skipped]
    return {**data, "schema": SCHEMA_VERSION}, problems


def _describe(value: Any) -> str:
    """A JSON value in words, e.g. ``the string '1'``."""
    if isinstance(value, str):
        return f"the string {_shown(value)}"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"the number {_shown(value)}"
    return f"a JSON {'array' if isinstance(value, list) else 'object'}"


def _shown(value: Any, limit: int = 60) -> str:
    """``repr`` of a value seen in the file, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _dotted(loc: tuple[int | str, ...]) -> str:
    """``("trials", 0, "precision")`` as ``trials[0].precision``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":  # pydantic's mark for a dict's key (the part before names it)
            out += " (the key)"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{_shown(part, 40)}]"
    return out or "(the file)"


_REASONS = {
    "missing": "missing (this field is required)",
    "less_than_equal": f"over the limit of {MAX_BATCH} (2**20) autotune tunes for",
    "unexpected_keyword_argument": "unknown field (not part of schema {version})",
    "extra_forbidden": "unknown field (not part of schema {version})",
}
_MEANINGS = {
    "memory.headroom": "must be a fraction in [0, 1), e.g. 0.1 for 10%",
    "memory.budget_bytes": "must be positive",
    "device.device": "must be 'cpu' or 'cuda:N'",
    "workload.seq_len": "must be at least 1, or null",
}
"""What a field's range or pattern (in its type: the JSON Schema says it too) means, in words:
said in place of pydantic's message for a value outside it."""


def _problem(error: Any, version: int = SCHEMA_VERSION) -> str:
    """One pydantic error as ``dotted.path: got VALUE: reason``. In a schema 1 file the path
    is the file's own: ``precision``, not the ``knobs.precision`` it was moved to."""
    loc = tuple(error["loc"])
    if version == 1 and loc[:1] == ("knobs",):
        loc = loc[1:]
    elif version == 1 and loc[:1] == ("trials",) and loc[2:3] == ("knobs",):
        loc = loc[:2] + loc[3:]
    where = _dotted(loc)
    if error["type"] == "missing":
        return f"{where}: {_REASONS['missing']}"
    reason = (_REASONS[error["type"]].format(version=version) if error["type"] in _REASONS
              else _MEANINGS.get(where, error["msg"]))
    if error.get("ctx", {}).get("pattern") == TEXT_PATTERN:
        reason = (f"holds the control character {control_character(error['input'])}, which "
                  "no text field may (in a file made from it, what follows would become "
                  "configuration or code): remove it")
    return f"{where}: got {_shown(error.get('input'))}: {reason}"


def _rules(data: dict[str, Any]) -> list[str]:
    """What pydantic cannot see field by field: the rules between fields. Each rule runs on
    the raw JSON where its inputs have the right type (a wrong type is pydantic's problem)."""
    problems = []
    batch = [_int(data, name) for name in ("micro_batch", "accumulate_steps", "world_size")]
    target = _int(data, "target_batch")
    in_range = all(n is not None and n <= MAX_BATCH for n in (*batch, target))  # else said
    if in_range and batch[0] * batch[1] * batch[2] != target:  # type: ignore[operator]
        problems.append(
            f"micro_batch x accumulate_steps x world_size: got {batch[0]} x {batch[1]} x "
            f"{batch[2]} = {batch[0] * batch[1] * batch[2]}: must equal target_batch "
            f"({target})")
    ranks, world = _int(data, "nproc_per_node"), batch[2]
    if ranks is not None and world is not None and ranks > 0 and world % ranks:
        problems.append(f"nproc_per_node: got {ranks}: world_size ({world}) must be a multiple "
                        "of it (nodes x ranks per node)")
    knobs = data.get("knobs")
    strategy = knobs.get("strategy", "none") if isinstance(knobs, dict) else "none"
    if ranks is not None and ranks > 1 and strategy == "none":
        problems.append(f"nproc_per_node: got {ranks}: ranks need knobs.strategy ddp or fsdp "
                        "(it is none)")
    if isinstance(knobs, dict) and knobs.get("compile_mode") == "off":
        problems += [f"knobs.{k.name}: got {_shown(knobs[k.name])}: needs a compiled mode "
                     "(knobs.compile_mode is off)" for k in KNOBS
                     if isinstance(knobs.get(k.name), str) and knobs[k.name] in k.compiled_only]
    memory = data.get("memory")
    if isinstance(memory, dict):
        budget, usable = _int(memory, "budget_bytes"), _int(memory, "usable_bytes")
        if budget is not None and usable is not None and usable > budget:
            problems.append(f"memory.usable_bytes: got {usable}: must not exceed "
                            f"memory.budget_bytes ({budget})")
    workload = data.get("workload")
    if isinstance(workload, dict):
        target_text = workload.get("target")
        if workload.get("kind") == "file" and isinstance(target_text, str) and not _is_factory(
                target_text):
            problems.append(f"workload.target: got {_shown(target_text)}: a file workload "
                            "must be 'path/to/file.py:factory' (factory a Python identifier)")
    return problems


def _is_factory(target: str) -> bool:
    """``path/to/file.py:factory`` with an identifier after the colon."""
    path_text, sep, name = target.rpartition(":")
    return bool(sep) and path_text.endswith(".py") and name.isidentifier() and "\0" not in target


def _int(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    return value if type(value) is int else None
