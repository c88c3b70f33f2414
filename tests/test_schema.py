"""autotune.json on read: validated in one place (``tuned_file.read_tuned``), every problem reported
at once; written atomically with the user's umask, never over another file without force; the
generated script never turns one of its values into code (property-based, with hypothesis)."""

from __future__ import annotations

import ast
import copy
import json
import os
import stat
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autotune import api
from autotune.cli import app
from autotune.codegen import SCRIPT_NAME, render_train_script
from autotune.codegen_parts import parts
from autotune.config import WorkloadSpec
from autotune.errors import ConfigError, OutputExistsError
from autotune.files import write_json_atomic
from autotune.knobs import Knobs
from autotune.schema import SCHEMA_VERSION, SkipRecord
from autotune.serialize import to_json_dict
from autotune.tuned_file import read_tuned, save_tuned
from tests.tuned_configs import REPO, make_tuned, my_workload_spec, write

runner = CliRunner()
INVALID = "is not a valid autotune config"


def _words(text: str) -> str:
    return " ".join(text.split())


def _json(config: Any) -> dict[str, Any]:
    return json.loads(json.dumps(to_json_dict(config)))


def _write_json(data: Any, path: Path) -> Path:
    path.write_text(json.dumps(data))
    return path


def _problems(message: str) -> list[str]:
    """The ``field: got value: reason`` items of a validation message."""
    body = message.split("): ", 1)[1].rsplit(". Fix these fields", 1)[0]
    return body.split("; ")


# ----------------------------------------------------------------------------------------------
# Accepted files: what this code writes, and what earlier versions wrote.


def test_written_config_reads_back_equal(tmp_path: Path) -> None:
    for config in (make_tuned(), make_tuned(workload=my_workload_spec(), break_even_steps=float(
            "inf"), interrupted=True), make_tuned(workload=WorkloadSpec(
                kind="hf", target="some/model", seq_len=64), requested_batch=60)):
        path = write(config, tmp_path / "autotune.json")
        assert read_tuned(path) == config


def _schema_2(data: dict[str, Any]) -> dict[str, Any]:
    """A schema 3 file's JSON as schema 2 wrote it: the skips as sentences (``skipped``)."""
    out = {k: v for k, v in data.items() if k != "skips"}
    return {**out, "schema": 2, "skipped": [s["text"] for s in data.get("skips", [])]}


def _schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema 3 file's JSON as schema 1 wrote it: precision and compile mode at the top and
    in each trial, no other knob, no fragmentation_bytes, the skips as sentences."""
    data = _schema_2(data)

    def moved(holder: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in holder.items() if k not in ("knobs", "fragmentation_bytes")}
        return {**out, "precision": holder["knobs"]["precision"],
                "compile_mode": holder["knobs"]["compile_mode"]}

    return {**moved(data), "schema": 1, "trials": [moved(t) for t in data["trials"]]}


def test_file_of_an_earlier_version_reads(tmp_path: Path) -> None:
    """Schema 1 as written before validation: non-finite floats as strings, ints where floats
    go, optional fields left out; its precision and compile mode move into knobs."""
    data = _schema_1(_json(make_tuned()))
    data["break_even_steps"] = "inf"
    data["speedup"] = "nan"
    data["samples_per_s"] = 1210
    data["memory"]["headroom"] = 0
    for name in ("objective", "train_steps", "interrupted", "skipped", "extras"):
        del data[name]
    del data["trials"][0]["num_runs"]
    config = read_tuned(_write_json(data, tmp_path / "autotune.json"))
    assert config.break_even_steps == float("inf") and config.samples_per_s == 1210.0
    assert config.memory.headroom == 0.0 and config.trials[0].num_runs == 1
    assert config.knobs == Knobs(precision="bf16", compile_mode="default")
    assert [t.knobs for t in config.trials] == [t.knobs for t in make_tuned().trials]
    assert config.schema == SCHEMA_VERSION == 3 and config.memory_class() == "bf16/default"


def test_schema_2_file_reads_with_its_sentences_as_notes(tmp_path: Path) -> None:
    """Schema 2 wrote what the search skipped as sentences: each reads as a skip of rule
    ``note`` (no rule was recorded), the same sentence the user saw."""
    config = replace(make_tuned(), skips=(
        SkipRecord(text="fp32/max-autotune not tried: behind"),
        SkipRecord(text="bf16/off: micro-batches 4, 2 not timed: 8 was not faster")))
    read = read_tuned(_write_json(_schema_2(_json(config)), tmp_path / "a.json"))
    assert read == config and read.skipped == config.skipped
    assert {s.rule for s in read.skips} == {"note"}


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("skipped", "one sentence", "skipped: got 'one sentence': a list of sentences (strings)"),
    ("skipped", [1], "skipped: got [1]: a list of sentences (strings) in schema 2"),
    ("skips", [], "skips: got []: unknown field (not part of schema 2)"),
])
def test_schema_2_file_with_a_bad_skipped_field_is_refused(
        tmp_path: Path, field: str, value: Any, expected: str) -> None:
    data = _schema_2(_json(make_tuned()))
    data[field] = value
    with pytest.raises(ConfigError) as exc:
        read_tuned(_write_json(data, tmp_path / "a.json"))
    assert expected in str(exc.value)


def test_a_skip_keeps_its_rule_target_and_figures(tmp_path: Path) -> None:
    skip = SkipRecord(rule="gain-ceiling", target="bf16/default", text="bf16/default: ...",
                      figures={"share": 0.5, "ceiling": float("inf"), "leader": "bf16/off/8"})
    config = replace(make_tuned(), skips=(skip,))
    assert read_tuned(write(config, tmp_path / "autotune.json")).skips == (skip,)


@pytest.mark.parametrize("rule", ["", "Gain", "gain ceiling", "x" * 41, "1-rule"])
def test_a_skip_with_a_malformed_rule_id_is_refused(tmp_path: Path, rule: str) -> None:
    data = _json(make_tuned())
    data["skips"] = [{"rule": rule, "text": "t"}]
    with pytest.raises(ConfigError) as exc:
        read_tuned(_write_json(data, tmp_path / "a.json"))
    assert f"skips[0].rule: got {rule!r}: String should match pattern" in str(exc.value)


def test_schema_1_file_reads_as_written(tmp_path: Path) -> None:
    """A schema 1 file reads into what this autotune writes (knobs at their defaults)."""
    config = make_tuned()
    assert read_tuned(_write_json(_schema_1(_json(config)), tmp_path / "a.json")) == config


def test_schema_1_problems_name_the_files_own_fields(tmp_path: Path) -> None:
    data = _schema_1(_json(make_tuned()))
    data["precision"] = "fp64"
    data["trials"][2]["compile_mode"] = "warp"
    del data["trials"][1]["precision"]
    data["trials"][3]["knobs"] = {"checkpointing": "blocks"}
    with pytest.raises(ConfigError) as info:
        read_tuned(_write_json(data, tmp_path / "autotune.json"))
    problems = _problems(str(info.value))
    assert sorted(p.split(": ")[0] for p in problems) == [
        "precision", "trials[1].precision", "trials[2].compile_mode", "trials[3].knobs"]
    assert "trials[1].precision: missing (this field is required)" in problems
    assert any(p.startswith("trials[3].knobs: got {'checkpointing': 'blocks'}: unknown field "
                            "(not part of schema 1)") for p in problems), problems


# ----------------------------------------------------------------------------------------------
# Rejected files: named cases, one message with every problem.


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("micro_batch", "eight", "micro_batch: got 'eight': Input should be a valid integer"),
    ("micro_batch", 0, "micro_batch: got 0: Input should be greater than or equal to 1"),
    ("micro_batch", -8, "micro_batch: got -8: Input should be greater than or equal to 1"),
    ("micro_batch", 8.0, "micro_batch: got 8.0: Input should be a valid integer"),
    ("knobs.precision", "fp64", "knobs.precision: got 'fp64': Input should be 'fp32', 'tf32', "
                                "'bf16' or 'fp16'"),
    ("knobs.compile_mode", "warp", "knobs.compile_mode: got 'warp': Input should be 'off', "
                                   "'default'"),
    ("knobs.checkpointing", "sometimes", "knobs.checkpointing: got 'sometimes': Input should be "
                                         "'off', 'blocks', 'alternate' or 'budget-0.5'"),
    ("knobs.optimizer_impl", "apex", "knobs.optimizer_impl: got 'apex': Input should be "
                                     "'default', 'for-loop', 'foreach' or 'fused'"),
    ("knobs.memory_format", 4, "knobs.memory_format: got 4: Input should be 'contiguous' or "
                               "'channels_last'"),
    ("knobs.allocator", "", "knobs.allocator: got '': Input should be 'default' or "
                            "'expandable_segments'"),
    ("knobs.offload", True, "knobs.offload: got True: unknown field (not part of schema 3)"),
    ("knobs", "bf16/default", "knobs: got 'bf16/default': Input should be an object"),
    ("precision", "bf16", "precision: got 'bf16': unknown field (not part of schema 3)"),
    ("trials.0.verdict", "unsupported", None),
    ("trials.0.fragmentation_bytes", -1, "trials[0].fragmentation_bytes: got -1: Input should "
                                         "be greater than or equal to 0"),
    ("trials.0.round_shares", "1.2x", "trials[0].round_shares: got '1.2x': Input should be a "
                                       "valid array"),
    ("trials.0.round_shares", [1.2, "fast"], "trials[0].round_shares[1]: got 'fast': Input "
                                             "should be a valid number"),
    ("trials.0.round_shares", [1.2, 0.9, 1.1], None),
    ("interrupted", 1, "interrupted: got 1: Input should be a valid boolean"),
    ("workload", "list", "workload: got 'list': Input should be an object"),
    ("workload", ["l", "i"], "workload: got ['l', 'i']: Input should be an object"),
    ("trials", {"0": {}}, "trials: got {'0': {}}: Input should be a valid array"),
    ("micro_batch_size", 3, "micro_batch_size: got 3: unknown field"),
    ("workload_name", None, "workload_name: got None: Input should be a valid string"),
    # Issue 61: a text field with a control character (a line break became configuration in
    # an exported file); each named with the character and where it is.
    ("workload_name", 'x\n[experimental]\ncustom_import = "evil_module"',
     "workload_name: got 'x\\n[experimental]\\ncustom_import = \"evil_module\"': holds the "
     "control character '\\n' at character 1, which no text field may (in a file made from "
     "it, what follows would become configuration or code): remove it"),
    ("trials.0.reason", "ValueError:\tbad", "trials[0].reason: got 'ValueError:\\tbad': holds "
                                            "the control character '\\t' at character 11"),
    ("device.notes", ["ok", "\x1b[2J"], "device.notes[1]: got '\\x1b[2J': holds the control "
                                        "character '\\x1b' at character 0"),
    ("extras", {"key\u2028": "v"}, "extras['key\\u2028'] (the key): got 'key\\u2028': holds "
                                   "the control character '\\u2028' at character 3"),
    ("workload.target", "gpt2\x85", "workload.target: got 'gpt2\\x85': holds the control "
                                    "character '\\x85' at character 4"),
    ("workload_name", "caf\u00e9 \U0001f600 \u00a0tab-free", None),
])
def test_bad_field_is_named_with_value_and_reason(tmp_path: Path, field: str, value: Any,
                                                  expected: str | None) -> None:
    """``expected`` None: the value is valid."""
    data = _json(make_tuned())
    *parents, name = field.split(".")
    holder = data
    for key in parents:
        holder = holder[int(key) if key.isdigit() else key]
    holder[name] = value
    path = _write_json(data, tmp_path / "autotune.json")
    if expected is None:
        assert read_tuned(path)
        return
    with pytest.raises(ConfigError) as info:
        read_tuned(path)
    message = str(info.value)
    assert message.startswith(f"{path} {INVALID} (")
    assert message.endswith("Fix these fields, or re-run `autotune search` to write a fresh file")
    assert any(p.startswith(expected) for p in _problems(message)), message


def test_a_control_character_in_a_name_is_refused_by_every_command(tmp_path: Path) -> None:
    """Issue 61: autotune.json is committed and shared; a name with line breaks became
    ``[experimental] custom_import`` in ``autotune export --to torchtitan``'s file."""
    data = _json(make_tuned(workload_name='x\n[experimental]\ncustom_import = "evil_module"'))
    path = _write_json(data, tmp_path / "autotune.json")
    for command in (["export", str(path), "--to", "torchtitan", "-o", str(tmp_path)],
                    ["codegen", str(path), "--out", str(tmp_path)], ["check", str(path)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert (f"{INVALID} (1 problem): workload_name: got 'x\\n[experimental]\\n"
                "custom_import = \"evil_module\"': holds the control character '\\n' at "
                "character 1") in _words(result.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune.json"]


def test_text_a_search_records_is_written_so_that_it_reads_back(tmp_path: Path) -> None:
    """The first line of an error may hold a tab or a colour code: written escaped, so the
    reader that refuses control characters reads what the search wrote."""
    trial = replace(make_tuned().trials[0], reason="ValueError:\tbad \x1b[31mred\x1b[0m")
    config = replace(make_tuned(), trials=(trial, *make_tuned().trials[1:]),
                     stopped_by="a\u2028b")
    save_tuned(config, tmp_path / "autotune.json")
    read = read_tuned(tmp_path / "autotune.json")
    assert read.trials[0].reason == "ValueError:\\tbad \\x1b[31mred\\x1b[0m"
    assert read.stopped_by == "a\\u2028b"


def test_all_problems_at_once_with_dotted_paths(tmp_path: Path) -> None:
    data = _json(make_tuned())
    data["micro_batch"] = "eight"
    data["knobs"]["precision"] = "fp64"
    data["trials"][2]["knobs"]["compile_mode"] = "warp"
    data["memory"]["headroom"] = 1.5
    data["memory"]["max_micro_batch"]["fp32/off"] = -1
    data["device"]["device"] = "tpu"
    data["workload"]["extra"] = True
    del data["created_at"]
    path = _write_json(data, tmp_path / "autotune.json")
    with pytest.raises(ConfigError) as info:
        read_tuned(path)
    problems = _problems(str(info.value))
    assert f"({len(problems)} problems)" in str(info.value)
    assert sorted(p.split(": ")[0] for p in problems) == sorted([
        "micro_batch", "knobs.precision", "trials[2].knobs.compile_mode", "memory.headroom",
        "memory.max_micro_batch['fp32/off']", "device.device", "workload.extra", "created_at"])
    assert "created_at: missing (this field is required)" in problems


def test_effective_batch_rule(tmp_path: Path) -> None:
    """A hand-edited target of 8 with 8 x 3: the product rule names all four numbers."""
    data = _json(make_tuned())
    data.update(target_batch=8, micro_batch=8, accumulate_steps=3)
    path = _write_json(data, tmp_path / "autotune.json")
    with pytest.raises(ConfigError) as info:
        read_tuned(path)
    assert _problems(str(info.value)) == [
        "micro_batch x accumulate_steps x world_size: got 8 x 3 x 1 = 24: must equal "
        "target_batch (8)"]
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2 and "must equal target_batch (8)" in _words(result.output)


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda d: d["memory"].update(headroom="nan"), "memory.headroom: got 'nan': must be a "
                                                   "fraction in [0, 1)"),
    (lambda d: d["memory"].update(budget_bytes=0), "memory.budget_bytes: got 0: must be "
                                                   "positive"),
    (lambda d: d["memory"].update(usable_bytes=3 << 30), "memory.usable_bytes: got 3221225472: "
                                                         "must not exceed memory.budget_bytes"),
    (lambda d: d["device"].update(device="cuda"), "device.device: got 'cuda': must be 'cpu' or "
                                                  "'cuda:N'"),
    (lambda d: d["workload"].update(kind="file", target="m.py:not-a-name"),
     "workload.target: got 'm.py:not-a-name': a file workload must be 'path/to/file.py:factory'"),
    (lambda d: d["workload"].update(kind="file", target="model:make"),
     "workload.target: got 'model:make'"),
    (lambda d: d["workload"].update(seq_len=0), "workload.seq_len: got 0: must be at least 1"),
])
def test_rules_between_fields(tmp_path: Path, edit: Any, expected: str) -> None:
    data = _json(make_tuned())
    edit(data)
    with pytest.raises(ConfigError) as info:
        read_tuned(_write_json(data, tmp_path / "autotune.json"))
    assert [p for p in _problems(str(info.value)) if p.startswith(expected)], str(info.value)


@pytest.mark.parametrize(("schema", "expected"), [
    ("2", "the field 'schema' must be the number 3, got the string '2'"),
    (True, "the field 'schema' must be the number 3, got true"),
    (2.0, "the field 'schema' must be the number 3, got the number 2.0"),
    (None, "the field 'schema' must be the number 3, got null"),
    (4, "has schema 4; this autotune reads schema 1, 2 and 3: upgrade autotune"),
    (0, "has schema 0; this autotune reads schema 1, 2 and 3: re-run `autotune search`"),
])
def test_schema_field(tmp_path: Path, schema: Any, expected: str) -> None:
    data = _json(make_tuned())
    data["schema"] = schema
    path = _write_json(data, tmp_path / "autotune.json")
    with pytest.raises(ConfigError) as info:
        read_tuned(path)
    assert str(info.value).startswith(f"{path}: {expected}" if "field" in expected else
                                      f"{path} {expected}")


@pytest.mark.parametrize(("content", "expected"), [
    ("[1, 2]", "is not an autotune.json file: it holds a JSON array, not a JSON object"),
    ('"list"', "is not an autotune.json file: it holds the string 'list', not a JSON object"),
    ("3", "is not an autotune.json file: it holds the number 3, not a JSON object"),
])
def test_file_that_is_not_an_object(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "autotune.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        read_tuned(path)
    assert str(info.value).startswith(f"{path} {expected}")


def test_directory_is_said(tmp_path: Path) -> None:
    expected = f"{tmp_path} is a directory, not an autotune.json file"
    with pytest.raises(ConfigError) as info:
        api.load(tmp_path)
    assert str(info.value).startswith(expected)
    for command in (["check", str(tmp_path)], ["codegen", str(tmp_path), "--out",
                                               str(tmp_path / "out")]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2 and expected in _words(result.output), result.output
    assert not (tmp_path / "out").exists()


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.lists(st.sampled_from(["target_batch", "micro_batch", "accumulate_steps",
                                        "world_size", "requested_batch"]), min_size=1,
                       unique=True),
       digits=st.integers(8, 6000))
def test_a_huge_count_in_the_file_is_refused_with_the_limit(tmp_path: Path, fields: list[str],
                                                            digits: int) -> None:
    """A count of 1e30 (or of 6000 digits, past what Python's int() reads) is refused on read,
    naming the field and the limit: ``check`` on it once hung in the parent."""
    data = _json(make_tuned())
    number = "1" + "0" * (digits - 1)
    path = tmp_path / "autotune.json"
    text = json.dumps({**data, **{f: 424242 for f in fields}})
    path.write_text(text.replace("424242", number))
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2, result.output
    output = _words(result.output)
    if digits <= 4300:
        for field in fields:
            assert f"{field}: got {number[:20]}" in output, output
        assert "over the limit of 1048576" in output
    else:
        assert "is not valid JSON (Exceeds the limit (4300 digits)" in output, output


def test_a_fifo_is_said_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "autotune.json"
    os.mkfifo(fifo)
    expected = f"{fifo} is a FIFO (named pipe), not a regular file: give the path of an"
    with pytest.raises(ConfigError, match="FIFO"):
        api.load(fifo)
    for command in (["check", str(fifo)], ["report", str(fifo)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2 and expected in _words(result.output), result.output


def test_cli_rejects_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    """The "eight" case gave a traceback and exit 1 in check."""
    data = _json(make_tuned())
    data["micro_batch"] = "eight"
    data["workload_name"] = "[/] :smile: [bold]"  # rich markup in a value prints as typed
    data["knobs"]["precision"] = "[/]"
    path = _write_json(data, tmp_path / "autotune.json")
    for command in ("check", "codegen", "codegen"):
        result = runner.invoke(app, [command, str(path), "--out", str(tmp_path)] if
                               command == "codegen" else [command, str(path)])
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit), result.exception
        output = _words(result.output)
        assert f"{INVALID} (2 problems): micro_batch: got 'eight'" in output
        assert "knobs.precision: got '[/]'" in output
    assert not (tmp_path / SCRIPT_NAME).exists()


@pytest.mark.parametrize("knob", ["precision", "checkpointing", "optimizer_impl", "allocator"])
def test_injection_in_a_knob_is_refused(tmp_path: Path, knob: str) -> None:
    data = _json(make_tuned())
    data["knobs"][knob] = 'fp32"; import os; os.system("touch PWNED") #'
    path = _write_json(data, tmp_path / "autotune.json")
    result = runner.invoke(app, ["codegen", str(path), "--out", str(tmp_path)])
    assert result.exit_code == 2 and INVALID in result.output
    assert f"knobs.{knob}: got 'fp32\"; import os; os.system(" in _words(result.output)
    assert not (tmp_path / SCRIPT_NAME).exists() and not (tmp_path / "PWNED").exists()


def test_schema_command_prints_the_json_schema() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    props = schema["properties"]
    assert {"micro_batch", "target_batch", "knobs", "workload", "trials"} <= set(props)
    assert "precision" not in props
    assert props["micro_batch"] == {"minimum": 1, "maximum": 2**20, "title": "Micro Batch",
                                    "type": "integer"}
    knobs = schema["$defs"]["Knobs"]["properties"]
    assert knobs["precision"]["enum"] == ["fp32", "tf32", "bf16", "fp16"]
    assert knobs["checkpointing"] == {"default": "off",
                                      "enum": ["off", "blocks", "alternate", "budget-0.5"],
                                      "title": "Checkpointing", "type": "string"}
    assert schema["additionalProperties"] is False
    assert api.json_schema() == schema


# ----------------------------------------------------------------------------------------------
# Writing: atomic, umask, never over another file.


def test_outputs_get_the_users_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        save_tuned(make_tuned(), tmp_path / "autotune.json")
        script = api.write_train_script(make_tuned(), tmp_path)
        os.umask(0o077)
        save_tuned(make_tuned(), tmp_path / "private.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "autotune.json").stat().st_mode) == 0o644
    assert stat.S_IMODE(script.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600


def test_existing_file_is_never_replaced_without_force(tmp_path: Path) -> None:
    path = tmp_path / "autotune.json"
    path.write_text("mine")
    with pytest.raises(OutputExistsError) as info:
        write_json_atomic(path, "theirs", force=False)
    assert isinstance(info.value, ConfigError) and info.value.exit_code == 2
    assert str(info.value) == (f"{path} already exists and was not overwritten: pass --force "
                               "to replace it, or choose another --out folder")
    assert path.read_text() == "mine"
    write_json_atomic(path, "theirs", force=True)
    assert path.read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune.json"]  # no temp file


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize(("make", "said"), [
    (os.mkfifo, "is a FIFO (named pipe)"),
    (lambda at: os.symlink("/dev/null", at), "(a link to /dev/null) is a character device"),
    (lambda at: os.symlink("sub", at), "(a link to sub) is a directory"),
    (os.mkdir, "is a directory"),
])
def test_what_is_not_a_regular_file_is_never_replaced(tmp_path: Path, make: Any, said: str,
                                                      force: bool) -> None:
    """Issue 61: ``export -o /dev/full --force`` as root made the device node a JSON file.
    Whatever is not a regular file stays, with --force too (a link stays a link)."""
    (tmp_path / "sub").mkdir()
    path = tmp_path / "out.json"
    make(path)
    before = os.lstat(path)
    with pytest.raises(ConfigError) as info:
        write_json_atomic(path, "{}", force=force)
    assert not isinstance(info.value, OutputExistsError)
    assert str(info.value) == (f"{path} {said}, not a regular file: autotune writes its "
                               "outputs as files and replaces nothing else, also with --force; "
                               "choose another path")
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "sub"]  # no temp file


@pytest.mark.parametrize("under", ["some_file", "some_file/deeper"])
def test_an_output_under_a_file_says_the_file_is_not_a_folder(tmp_path: Path,
                                                               under: str) -> None:
    """``-o some_file/autotune.json`` said "File exists"."""
    (tmp_path / "some_file").write_text("mine")
    path = tmp_path / under / "autotune.json"
    with pytest.raises(ConfigError) as info:
        write_json_atomic(path, "{}", force=True)
    assert str(info.value) == (f"cannot write {path}: {tmp_path / 'some_file'} is a file, not "
                               "a folder; choose another --out folder, or move the file")
    assert (tmp_path / "some_file").read_text() == "mine"


def test_export_and_search_refuse_a_fifo_as_output_with_force(tmp_path: Path) -> None:
    """Every output goes through the one writer: export says so with exit 2; a search says
    so before it starts (no child run)."""
    source = write(make_tuned(), tmp_path / "autotune.json")
    fifo = tmp_path / "out.toml"
    os.mkfifo(fifo)
    result = runner.invoke(app, ["export", str(source), "--to", "torchtitan", "-o", str(fifo),
                                 "--force"])
    assert result.exit_code == 2 and f"{fifo} is a FIFO (named pipe), not a regular file" in (
        _words(result.output)), result.output
    (tmp_path / "out").mkdir()
    os.mkfifo(tmp_path / "out" / "autotune.html")
    result = runner.invoke(app, ["search", "--device", "cpu", "--target-batch", "4",
                                 "--out", str(tmp_path / "out"), "--force"])
    assert result.exit_code == 2, result.output
    assert (f"{tmp_path / 'out' / 'autotune.html'} is a FIFO (named pipe), not a regular file"
            in _words(result.output))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["autotune.html"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_file_appearing_after_the_check_is_not_replaced(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two searches into one --out: the other one writes between our check and our write."""
    path = tmp_path / "autotune.json"
    real_mkstemp = tempfile.mkstemp

    def other_search_writes_meanwhile(*args: Any, **kwargs: Any) -> tuple[int, str]:
        path.write_text("the other search's result")
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", other_search_writes_meanwhile)
    with pytest.raises(OutputExistsError):
        write_json_atomic(path, "ours")
    assert path.read_text() == "the other search's result"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune.json"]


def test_concurrent_writers_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "autotune.json"
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        barrier.wait()
        try:
            write_json_atomic(path, f"writer {i}\n" * 10000)
            outcomes.append(f"wrote {i}")
        except OutputExistsError:
            outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("wrote")]
    assert len(winners) == 1 and outcomes.count("refused") == 7
    assert path.read_text() == f"writer {winners[0].split()[1]}\n" * 10000


# ----------------------------------------------------------------------------------------------
# Fuzzing: replace, delete or add fields of a valid file with random JSON values.

NASTY = [
    'fp32"; import os; os.system("touch PWNED") #', 'evil"""\nimport os\nos.system("touch '
    'PWNED")\n"""', "back\\x slash", "\\x", "\\", "'''", '"', "\n", "\r", "\r\n#", "\u2028",
    "\x00", "\x0c", "é✓😀", "\ud800", "$workload", "${precision}", "%(prog)d", "[/]", ":smile:",
    "{}", "cpu", "cuda:0", "cuda:-1", "bf16", "max-autotune", "blocks", "alternate", "fused",
    "foreach", "channels_last", "expandable_segments", "inf", "-inf", "nan", "1", "",
    "x.py:f", "/tmp/x.py:os.system", "m.py:f\nimport os", "some/model (masked-lm, seq 64)",
    "m (classifier, seq 99999999999999999999)", "m (causal-lm, seq ٣)", "x" * 300,
]
SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, -8, 1, 2, 3, 8, 64, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(NASTY),
    st.text(max_size=20),
    st.booleans(),
    st.none(),
)
JSON_VALUES = st.one_of(
    st.sampled_from(NASTY),
    st.sampled_from(NASTY).map(lambda text: f"some/model {text} (causal-lm, seq 64)"),
    st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=6), inner, max_size=3), max_leaves=6),
)
SCRIPT_FIELDS = [  # the values that reach the script: drawn as often as all others together
    ("workload_name",), ("workload", "target"), ("workload", "seq_len"), ("workload", "kind"),
    ("workload", "pretrained"), ("knobs",), ("knobs", "precision"), ("knobs", "compile_mode"),
    ("knobs", "checkpointing"), ("knobs", "optimizer_impl"), ("knobs", "memory_format"),
    ("knobs", "allocator"), ("micro_batch",), ("target_batch",), ("world_size",),
    ("accumulate_steps",), ("device", "device"), ("device", "name"), ("device", "torch_version"),
    ("autotune_version",), ("created_at",), ("reason",), ("trials", 1, "knobs", "precision"),
    ("trials", 1, "knobs", "checkpointing"), ("trials", 3, "compile_s"), ("speedup",),
    ("break_even_steps",), ("memory", "headroom"), ("memory", "max_micro_batch"), ("schema",),
]

BASES = {
    "default": make_tuned(),
    "default-cuda": make_tuned(device=replace(make_tuned().device, device="cuda:0"),
                               precision="fp16", compile_mode="max-autotune"),
    "hf": make_tuned(workload=WorkloadSpec(kind="hf", target="some/model", seq_len=64),
                     workload_name="some/model (causal-lm, seq 64)"),
    "file": make_tuned(workload=my_workload_spec(), workload_name="mlp-classifier"),
    "knobs": make_tuned(checkpointing="alternate", optimizer_impl="fused",
                        memory_format="channels_last", allocator="expandable_segments"),
}
BASE_FILES = {**{name: _json(config) for name, config in BASES.items()},
              "schema-1": _schema_1(_json(make_tuned()))}
"""The JSON each fuzzed file starts from: what this autotune writes, and a schema 1 file."""


class _Blank(ast.NodeTransformer):
    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.copy_location(ast.Constant(value="CONSTANT"), node)


def skeleton(source: str) -> str:
    """The script's code with every literal blanked: what a config value must never change."""
    return ast.dump(_Blank().visit(ast.parse(source)))


def test_knob_values_change_the_code_only_through_the_parts_it_runs() -> None:
    """A knob value is a literal in the code its parts give (``codegen_parts.parts``: a
    config's script carries only the code it runs); two configs with the same parts have the
    same code, whatever their values: the fuzz test below relies on it."""
    by_parts: dict[tuple, set[str]] = {}
    for knobs in (
        Knobs(), Knobs(precision="bf16"), Knobs(precision="fp16"),
        Knobs(checkpointing="blocks", optimizer_impl="foreach"),
        Knobs(checkpointing="alternate", optimizer_impl="fused"),
        Knobs(precision="fp16", compile_mode="max-autotune", checkpointing="alternate",
              optimizer_impl="fused", memory_format="channels_last",
              allocator="expandable_segments"),
        Knobs(precision="bf16", compile_mode="reduce-overhead", checkpointing="blocks",
              optimizer_impl="foreach", memory_format="channels_last",
              allocator="expandable_segments"),
    ):
        config = make_tuned(knobs=knobs)
        by_parts.setdefault(tuple(sorted(parts(config).items())), set()).add(
            skeleton(render_train_script(config)))
    assert len(by_parts) == 3 and all(len(shapes) == 1 for shapes in by_parts.values())


def _skeletons(knobs: Knobs | None = None, artifacts: Any = None) -> dict[str, set[str]]:
    """Per workload kind, the code shapes the templates can give (tasks, weights, paths), for
    the bases' knobs or for ``knobs`` and ``artifacts`` (a config's script carries the code
    its parts run: ``test_knob_values_change_the_code_only_through_the_parts_it_runs``)."""
    out: dict[str, set[str]] = {"default": set(), "hf": set(), "file": set()}
    for base in BASES.values():
        kind = base.workload.kind
        if knobs is not None:
            base = replace(base, knobs=knobs, compile_artifacts=artifacts)
        variants = [base]
        if kind == "hf":
            variants = [replace(base, workload=replace(base.workload, pretrained=pretrained),
                                workload_name=f"m ({task}, seq 8)")
                        for task in ("causal-lm", "masked-lm", "classifier")
                        for pretrained in (False, True)]
        for config in variants:
            for script_dir in (None, REPO / "examples"):
                out[kind].add(skeleton(render_train_script(config, script_dir=script_dir)))
    return out


_LIKE: dict[tuple[Knobs, bool], dict[str, set[str]]] = {}


def _skeletons_like(config: Any) -> dict[str, set[str]]:
    """``_skeletons`` for a config's knobs and compile artifacts (validated values on read:
    a knob is one of its closed set), computed once per pair."""
    key = (config.knobs, config.compile_artifacts is not None)
    if key not in _LIKE:
        _LIKE[key] = _skeletons(config.knobs, config.compile_artifacts)
    return _LIKE[key]
PATHS = {name: [] for name in BASE_FILES}  # every (nested) key of each base, e.g. knobs/precision


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += _paths(value, (*prefix, i))
    return out


for _name, _base in BASE_FILES.items():
    PATHS[_name] = _paths(_base)


TEXT_FIELDS = [  # strings of any content are valid here: these edits give accepted files
    ("workload_name",), ("reason",), ("device", "name"), ("device", "torch_version"),
    ("autotune_version",), ("created_at",), ("workload_fingerprint",), ("trials", 0, "reason"),
    ("memory", "allocator"),
]


@st.composite
def fuzzed(draw: st.DrawFn) -> tuple[str, Any]:
    """A base config's JSON with 1 to 3 fields replaced, deleted or added; or, for a third of
    the cases, only text fields set to hostile text (files that should be accepted)."""
    name = draw(st.sampled_from(sorted(BASE_FILES)))
    data = copy.deepcopy(BASE_FILES[name])
    if draw(st.integers(0, 2)) == 0:
        for _ in range(draw(st.integers(1, 3))):
            parent, *keys = draw(st.sampled_from(TEXT_FIELDS))
            holder = data[parent]
            for key in keys[:-1]:
                holder = holder[key]
            text = draw(st.sampled_from(NASTY) | st.text(max_size=30))
            if keys:
                holder[keys[-1]] = text
            else:
                data[parent] = text
        if name == "hf" and draw(st.booleans()):
            data["workload"]["target"] = draw(st.sampled_from(NASTY))
        return name, data
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(SCRIPT_FIELDS) | st.sampled_from(PATHS[name]))
        action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
        parent: Any = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            if not path:  # the whole file
                data = draw(JSON_VALUES) if action == "replace" else data
            elif action == "replace":
                parent[path[-1]] = draw(JSON_VALUES)
            elif action == "delete" and isinstance(parent, dict):
                del parent[path[-1]]
            elif action == "add" and isinstance(parent[path[-1]], dict):
                parent[path[-1]][draw(st.text(min_size=1, max_size=8))] = draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):  # an earlier edit removed the way there
            pass
    return name, data


EXAMPLES = {"count": 0, "accepted": 0, "rejected": 0}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzzed())
def test_fuzzed_file_is_accepted_and_safe_or_rejected_cleanly(case: tuple[str, Any]) -> None:
    _, data = case
    EXAMPLES["count"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "autotune.json"
        path.write_text(json.dumps(data))
        try:
            config = read_tuned(path)
            error = None
        except ConfigError as exc:  # anything else fails the test
            config, error = None, exc
        try:
            api.load(path, world_size=1)
        except ConfigError:
            assert config is None or config.world_size != 1
        out = folder / "out"
        result = runner.invoke(app, ["codegen", str(path), "--out", str(out)])
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            repr(result.exception))
        if error is not None:
            EXAMPLES["rejected"] += 1
            assert result.exit_code == 2 and _words(str(error)) in _words(result.output), (
                str(error), result.output)
            checked = runner.invoke(app, ["check", str(path)])
            assert checked.exit_code == 2 and _words(str(error)) in _words(checked.output)
            assert isinstance(checked.exception, SystemExit), repr(checked.exception)
            assert not out.exists()
            return
        EXAMPLES["accepted"] += 1
        if result.exit_code == 2:  # a file workload whose file is not here (or not a file)
            assert config.workload.kind == "file", result.output
            assert "workload.target in" in _words(result.output)
            assert "pass --workload path/to/file.py:factory" in _words(result.output)
            return
        assert result.exit_code == 0, result.output
        source = (out / SCRIPT_NAME).read_text()
        compile(source, SCRIPT_NAME, "exec")
        assert skeleton(source) in _skeletons_like(config)[config.workload.kind], (
            f"a value of autotune.json became code: {data}")
        assert not any(Path(tmp).rglob("PWNED"))


def test_fuzzing_tried_both_outcomes() -> None:
    """The property test above saw accepted and rejected files (run after it, same session)."""
    if EXAMPLES["count"] == 0:
        pytest.skip("runs after the fuzz test")
    assert EXAMPLES["accepted"] > 0 and EXAMPLES["rejected"] > 0, EXAMPLES
