"""The ``autotune`` command: exit codes and messages, through typer's CliRunner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config import Knobs
from autotune.knobs import KNOBS
from autotune.serialize import to_json_dict
from tests.conftest import ROOT, WORKLOADS, workload_target

# Click >= 8.2 keeps stderr apart in result.stderr (result.output interleaves both); older
# releases need mix_stderr=False for that.
try:
    runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
except TypeError:
    runner = CliRunner()

FAST = ["--device", "cpu", "--precisions", "fp32", "--compile-modes", "off"]


def _words(text: str) -> str:
    """Rich wraps long lines at the console width: compare with whitespace collapsed."""
    return " ".join(text.split())


def _invoke(*args: str):
    result = runner.invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_env() -> None:
    result = _invoke("env", "--device", "cpu")
    assert result.exit_code == 0, result.output
    out = _words(result.stdout)
    assert "autotune env" in out and "total memory" in out and "fp32" in out


def test_env_json() -> None:
    result = _invoke("env", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["device"] == "cpu"
    assert data["total_memory_bytes"] > 0


@pytest.mark.subprocess
def test_probe_default_workload_prints_the_table() -> None:
    result = _invoke("probe", "--target-batch", "8", *FAST)
    assert result.exit_code == 0, result.output
    out = _words(result.stdout)
    assert "Largest micro-batch that fits" in out
    assert "fp32/off" in out
    assert "8x1" in out  # micro-batch 8 fits the whole target: one step, no accumulation
    assert "probes in all" in out
    assert "micro-batch 8: ok" in _words(result.stderr)  # progress goes to stderr


@pytest.mark.subprocess
def test_probe_json() -> None:
    result = _invoke("probe", "--target-batch", "8", *FAST, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # stdout holds the JSON alone
    assert data["target_batch"] == 8
    [probe] = data["probes"]
    assert probe["knobs"] == to_json_dict(Knobs())  # fp32 eager, every knob at its default
    assert probe["max_micro_batch"] == 8
    assert probe["peak_bytes"] > 0
    assert probe["steps"][0]["status"] == "ok"


@pytest.mark.parametrize(("args", "says"), [
    (["--target-batch", "0"], "Invalid value for '--target-batch'"),
    (["--memory-budget", "garbage"], "cannot read the memory size 'garbage'"),
    (["--memory-budget", "150%"], "memory budget '150%' is not a share between 0% and 100%"),
    (["--workload", "missing.py:f"], "workload file 'missing.py' does not exist"),
    (["--workload", str(WORKLOADS)], "must look like path/to/file.py:factory"),
    (["--precisions", "fp8"], "unknown precision or compile mode 'fp8': precisions are fp32"),
    (["--compile-modes", "fast"], "compile modes are off, default"),
    (["--world-size", "3", "--target-batch", "8"], "does not split evenly over --world-size 3"),
])
def test_probe_bad_input_exits_2(args: list[str], says: str) -> None:
    result = _invoke("probe", "--device", "cpu", *args)
    assert result.exit_code == 2, result.output
    assert says in _words(result.output)


@pytest.mark.parametrize(("value", "says"), [
    ("1.5", "--rank-precision must be a share from 0 to 1"),
    ("-0.1", "--rank-precision must be a share from 0 to 1"),
    ("nan", "--rank-precision must be a share from 0 to 1"),
    ("fast", "Invalid value for '--rank-precision': Input should be a valid number"),
])
def test_a_rank_precision_outside_0_to_1_exits_2_naming_it(value: str, says: str) -> None:
    result = _invoke("search", "--device", "cpu", "--target-batch", "8", "--rank-precision",
                     value)
    assert result.exit_code == 2, result.output
    out = _words(result.output)
    assert says in out
    assert value == "fast" or f"got {value}" in out  # the value seen (typer's own: not said)


def test_a_child_start_method_that_is_none_exits_2_before_any_child(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CHILD_START", "vfork")
    result = _invoke("search", "--device", "cpu", "--target-batch", "8", "--precisions", "fp8")
    assert result.exit_code == 2, result.output
    out = _words(result.stderr)  # said with the other problems of the request, at once
    assert "AUTOTUNE_CHILD_START='vfork': expected one of fork, spawn" in out
    assert "fp8" in out


@pytest.mark.subprocess
def test_factory_that_raises_exits_2_with_the_traceback() -> None:
    result = _invoke("probe", "--target-batch", "1", *FAST,
                     "--workload", workload_target("raises"))
    assert result.exit_code == 2, result.output
    err = _words(result.stderr)
    assert "error:" in err
    assert "the workload failed at micro-batch 1" in err
    assert "ValueError: workload factory failed on purpose" in err
    assert "Traceback" in err and "in raises" in err


@pytest.mark.subprocess
def test_bad_batch_exits_2() -> None:
    result = _invoke("probe", "--target-batch", "1", *FAST,
                     "--workload", workload_target("bad_batch"))
    assert result.exit_code == 2, result.output
    assert "make_batch(1) returned list; it must return a tensor" in _words(result.stderr)


@pytest.mark.subprocess
def test_micro_batch_1_not_fitting_exits_1_and_says_what_would() -> None:
    # The tiny model peaks 7.1-7.3 MiB at micro-batch 1 on this machine: under an 8 MiB
    # budget (7.20 usable) it fit by 37 KiB on some runs. 6 MiB leaves it well over.
    result = _invoke("probe", "--target-batch", "2", *FAST, "--memory-budget", "6MiB",
                     "--workload", workload_target("tiny"))
    assert result.exit_code == 1, result.output
    err = _words(result.stderr)
    assert "micro-batch 1 does not fit in 5.40 MiB usable (budget 6.00 MiB" in err
    assert "so the budget would have to be at least" in err
    needed = err.split("would have to be at least ")[1].split(" MiB")[0]
    assert float(needed) > 6.0


@pytest.mark.subprocess
def test_cli_import_does_not_import_torch() -> None:
    code = "import sys, autotune.cli; print(sorted(m for m in sys.modules if m == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stderr


def test_bad_knob_options_are_all_named_at_once_and_start_nothing(tmp_path) -> None:
    # No child starts (this test has no subprocess marker: the conftest guard would fail it).
    result = _invoke("search", "--target-batch", "8", "--out", str(tmp_path),
                     "--optimizer-impls", "fused,turbo", "--precisions", "fp8",
                     "--memory-formats", 'x"y\\z')
    assert result.exit_code == 2, result.output
    message = _words(result.stderr)
    assert "--optimizer-impls turbo: not a value of optimizer_impl" in message
    assert "--memory-formats x\"y\\z: not a value of memory_format" in message
    assert "unknown precision or compile mode 'fp8'" in message
    assert "Traceback" not in result.output and not list(tmp_path.iterdir())
    empty = _invoke("search", "--target-batch", "8", "--out", str(tmp_path),
                    "--checkpointing", " , ")
    assert empty.exit_code == 2 and "--checkpointing ' , ' names nothing" in _words(empty.stderr)
    cuda_only = _invoke("probe", "--target-batch", "8", "--device", "cpu",
                        "--allocators", "expandable_segments")
    assert cuda_only.exit_code == 2
    assert "--allocators expandable_segments: nothing runs on cpu" in _words(cuda_only.stderr)


@pytest.mark.parametrize("command", ["probe", "search"])
def test_every_knob_is_an_option_of_the_command_checked_with_the_others(
        command: str, tmp_path: Path) -> None:
    # The options come from KNOBS (cli.knob_options): each row is an option whose help says
    # its values, what it does and its default once, and whose value reaches the request.
    params = {p.opts[0]: p for p in typer.main.get_command(app).commands[command].params}
    for knob in KNOBS[2:]:
        said = params[knob.option].help or ""
        assert said.startswith(f"Comma-separated subset of {','.join(knob.values)}: ")
        assert knob.help in said and said.endswith(knob.default_help or ".")
        assert ".." not in said
    out = ["--out", str(tmp_path)] if command == "search" else []
    result = _invoke(command, "--target-batch", "8", "--device", "cpu", *out,
                     *(a for knob in KNOBS[2:] for a in (knob.option, "nope")))
    assert result.exit_code == 2, result.output
    message = _words(result.stderr)
    for knob in KNOBS[2:]:
        assert f"{knob.option} nope: not a value of {knob.name}" in message


def test_a_bad_option_is_said_before_an_existing_output(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """README's two commands in one folder: the main command's autotune.json is there when a
    later search has a bad option; that option is what gets said (the outputs are checked
    once the request is valid)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "autotune.json").write_text("{}")
    result = _invoke("search", "--device", "cpu", "--target-batch", "8", "--precisions", "fp8")
    assert result.exit_code == 2, result.output
    assert "fp8" in _words(result.stderr) and "already exists" not in result.stderr
    result = _invoke("search", "--device", "cpu", "--target-batch", "8", "--precisions", "fp32")
    assert result.exit_code == 2 and "autotune.json already exists" in _words(result.stderr)


@pytest.mark.parametrize(("args", "said"), [
    (["--workload", ""], "--workload is empty (got ''): name a FILE.py:FACTORY"),
    (["--model", " "], "--model is empty (got ' '): name a model id"),
    (["--model", "gpt2\n[x]"], "--model 'gpt2\\n[x]' holds the control character '\\n' at "
                               "character 4: it is stored in autotune.json, whose text is one "
                               "line; name a model id without control characters"),
    (["--workload", "w\x1b.py:f"], "--workload 'w\\x1b.py:f' holds the control character "
                                   "'\\x1b' at character 1"),
])
def test_an_empty_workload_or_model_is_refused_not_taken_for_the_default(
        tmp_path: Path, args: list[str], said: str) -> None:
    result = runner.invoke(app, ["search", "--target-batch", "8", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert said in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []  # nothing written, no child started
