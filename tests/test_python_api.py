"""The public face from Python: autotune.search(...), autotune.estimate, autotune.check."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import autotune
from autotune import api
from autotune.cli import app
from autotune.config import WorkloadSpec
from autotune.errors import ConfigError
from autotune.search import SearchSettings

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "tests" / "workloads.py") + ":tiny"
FAST = SearchSettings(num_timed_steps=3, min_timed_s=0.1, micro_batches_per_class=1,
                      num_confirm=0)


def test_search_estimate_and_check_are_the_public_face() -> None:
    """Issue 50: ``autotune.search`` was not in the package's face (only ``autotune.api``
    had it, returning a ``SearchResult``). ``search`` and ``estimate`` are also the names of
    subpackages: once imported, the import system set the package attribute to the module,
    so the function was unreachable as ``autotune.search``. Now the name is both."""
    import autotune.api  # imports both subpackages: the package attribute is set

    assert {"search", "estimate", "check", "Progress"} <= set(autotune.__all__)
    assert callable(autotune.search) and callable(autotune.estimate)
    assert autotune.check is api.check
    assert "progress" in inspect.signature(autotune.search).parameters
    assert "micro_batch" in inspect.signature(autotune.estimate).parameters
    # The packages stay packages: their own names, however they are imported.
    import autotune.estimate as estimate_module
    import autotune.search as search_module
    from autotune.search import SearchSettings as Settings

    assert search_module is autotune.search and Settings is search_module.SearchSettings
    assert estimate_module is autotune.estimate and hasattr(estimate_module, "__file__")


@pytest.mark.subprocess
def test_import_autotune_stays_light() -> None:
    code = ("import sys, autotune; assert 'torch' not in sys.modules; "
            "assert 'optuna' not in sys.modules; print(sorted(autotune.__all__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert "'search'" in done.stdout


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"time_budget_s": 0}, "time_budget_s must be a positive number of seconds, got 0"),
    ({"max_trials": 0}, "max_trials must be a whole number of at least 1, got 0"),
    ({"workload": 3}, "workload must be a WorkloadSpec (autotune.search also takes "
                      "'file.py:factory' or a TuneRequest; "),
    ({"not_a_field": 1}, "not a search setting"),
    ({"workload": api.TuneRequest(target_batch=8), "device": "cpu"},
     "give a TuneRequest or its fields"),
    ({"workload": TINY, "model": "gpt2"},
     "give either workload='FILE.py:FACTORY' or model='NAME', not both"),
])
def test_search_refuses_bad_input_before_running_anything(kwargs: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        autotune.search(**{"target_batch": 8, **kwargs})


@pytest.mark.parametrize(("name", "said"), [
    ('x\n[experimental]\ncustom_import = "evil_module"', "'\\n' at character 1"),
    ("tab\there", "'\\t' at character 3"), ("\x1b[2J", "'\\x1b' at character 0"),
    ("line\u2028separator", "'\\u2028' at character 4"),
])
def test_a_workload_name_with_a_control_character_is_refused(name: str, said: str) -> None:
    """Issue 61: the name is stored in autotune.json and written into the files made from it
    (comments of the exported TOML and YAML), where a line break started configuration."""
    with pytest.raises(ConfigError) as info:
        autotune.Workload(name=name, build_model=lambda: None, make_batch=lambda m: None)
    assert str(info.value) == (f"Workload(name={name!r}) holds the control character {said}: "
                               "a workload's name is one line of text; pass a name without "
                               "line breaks, tabs or escapes")
    assert autotune.Workload(name="caf\u00e9 \U0001f600", build_model=lambda: None,
                             make_batch=lambda m: None).name == "caf\u00e9 \U0001f600"


@pytest.mark.subprocess
def test_search_from_python_returns_the_tuned_config_and_reports_progress_by_callback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[autotune.Progress] = []
    cfg = autotune.search(TINY, target_batch=2, device="cpu", memory_budget="2GiB",
                          precisions=["fp32"], compile_modes=["off"], settings=FAST,
                          out=tmp_path, progress=seen.append)
    assert isinstance(cfg, autotune.Tuned)
    assert cfg.micro_batch * cfg.accumulate_steps == 2 and cfg.precision == "fp32"
    assert cfg.config.workload == WorkloadSpec(kind="file", target=TINY)
    assert autotune.load(tmp_path / "autotune.json").config == cfg.config
    kinds = {p.kind for p in seen}
    assert {"start", "trial"} <= kinds <= {"probe", "start", "trial"}, seen
    trials = [p for p in seen if p.kind == "trial"]
    assert trials and all(p.record is not None and str(p) == p.line for p in trials)
    assert len(trials) == len(cfg.config.trials)  # one line per timed run
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == ""  # progress goes to the callback only


def test_the_names_can_be_replaced_and_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test's monkeypatch of ``autotune.search`` takes, and its undo restores the package."""
    calls: list[dict] = []
    with monkeypatch.context() as patch:
        patch.setattr(autotune, "search", lambda **kwargs: calls.append(kwargs))
        autotune.search(target_batch=8)
    assert calls == [{"target_batch": 8}]
    assert callable(autotune.search) and hasattr(autotune.search, "SearchSettings")


# ----------------------------------------------------------------------------------------------
# Issue 61: a wrong type is a ConfigError before anything starts, each named as passed.


def _not(*kinds: type) -> Callable[[object], bool]:
    """True for a value of none of ``kinds`` (a bool counts as none of int and float)."""
    return lambda v: (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds)


_ANY = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                 st.binary(max_size=4), st.lists(st.integers(), max_size=3),
                 st.lists(st.text(max_size=4), max_size=3).map(tuple),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
                 st.sets(st.integers(), max_size=2), st.just(object()), st.just(print))
_NAMES = (list, tuple)
WRONG: dict[str, st.SearchStrategy[object]] = {
    # Each of autotune.search's parameters, with values of a type it does not take (a value
    # of the right type may be out of range: a ConfigError too, but it may also be fine and
    # start the search, so none is drawn).
    "workload": _ANY.filter(lambda v: v is not None and _not(str)(v)),
    "target_batch": _ANY.filter(_not(int)),
    "model": _ANY.filter(lambda v: v is not None and _not(str)(v)),
    "seq_len": _ANY.filter(lambda v: v is not None and _not(int)(v)),
    "out": _ANY.filter(lambda v: v is not None and _not(str, Path)(v)),
    "force": _ANY.filter(_not(bool)),
    "progress": _ANY.filter(lambda v: v is not None and not callable(v)),
    "time_budget_s": _ANY.filter(lambda v: v is not None and _not(int, float)(v)),
    "max_trials": _ANY.filter(lambda v: v is not None and _not(int)(v)),
    "settings": _ANY.filter(lambda v: v is not None),
    "device": _ANY.filter(lambda v: v is not None and _not(str)(v)),
    "memory_budget": _ANY.filter(lambda v: v is not None and _not(str, int)(v)),
    "headroom": _ANY.filter(_not(int, float)) | st.sampled_from([math.nan, math.inf]),
    "world_size": _ANY.filter(_not(int)),
    "nproc_per_node": _ANY.filter(_not(int)),
    "parallel": _ANY.filter(lambda v: _not(int)(v) and v != "auto"),
    "allow_inexact": _ANY.filter(_not(bool)),
    "precisions": _ANY.filter(lambda v: v is not None and not (
        isinstance(v, _NAMES) and all(isinstance(x, str) for x in v))),
    "compile_modes": _ANY.filter(lambda v: v is not None and not (
        isinstance(v, _NAMES) and all(isinstance(x, str) for x in v))),
    "knob_values": _ANY.filter(lambda v: not isinstance(v, dict))
    | st.dictionaries(st.sampled_from(["checkpointing", "strategy", "not_a_knob"]),
                      st.integers() | st.text(max_size=4), min_size=1),
}


def test_every_parameter_of_search_has_wrong_values_drawn() -> None:
    """The property below covers each parameter (a new one must be added there)."""
    assert set(WRONG) == set(inspect.signature(autotune.search).parameters) - {"fields"} | {
        f.name for f in dataclasses.fields(api.TuneRequest)}


def test_the_one_check_knows_every_field_of_a_request_and_of_the_search_settings() -> None:
    """A field added to TuneRequest or SearchSettings without its entry would fail every
    search (an internal error): the tables follow the dataclasses."""
    from autotune.api.settings import REQUEST, SEARCH

    assert list(REQUEST) == [f.name for f in dataclasses.fields(api.TuneRequest)]
    assert list(SEARCH) == [f.name for f in dataclasses.fields(SearchSettings)]


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_a_wrong_type_for_any_parameter_is_a_config_error_before_anything_starts(
        data: st.DataObject) -> None:
    """``target_batch="8"`` gave a raw TypeError, ``8.0`` ran and blamed the workload,
    ``max_trials=True`` ran, ``precisions="fp32"`` was read letter by letter, ``progress=5``
    failed after a probe. Any wrong type, of any parameter, alone or with others: a
    ConfigError naming each (as passed here, no CLI flag), with the value seen; never
    another exception, and no child started (this test is not marked ``subprocess``: the
    conftest fails it if one starts)."""
    names = data.draw(st.lists(st.sampled_from(sorted(WRONG)), min_size=1, max_size=3,
                               unique=True))
    bad = {name: data.draw(WRONG[name], label=name) for name in names}
    kwargs = {"workload": TINY, "target_batch": 8, "device": "cpu", **bad}
    with pytest.raises(ConfigError) as info:
        autotune.search(**kwargs)
    message = str(info.value)
    ours = message  # the message without the values quoted in it
    for value in bad.values():
        ours = ours.replace(repr(value)[:60], "")
    assert not re.search(r"--[a-z]", ours), message
    for name, value in bad.items():
        assert name in message, (name, message)
        if name != "knob_values" or not isinstance(value, dict):
            assert repr(value)[:60] in message, (name, message)


@pytest.mark.parametrize(("kwargs", "cli", "from_python", "from_cli"), [
    ({"target_batch": 7, "world_size": 2}, ["--target-batch", "7", "--world-size", "2"],
     "target_batch=7 does not split evenly over world_size=2: exact targets nearby are 6, 8; "
     "use one, or pass allow_inexact=True",
     "--target-batch 7 does not split evenly over --world-size 2: exact targets nearby are 6, "
     "8; use one, or pass --allow-inexact"),
    ({"nproc_per_node": 4096}, ["--nproc-per-node", "4096"],
     "nproc_per_node=4096 is more than this machine runs", "--nproc-per-node 4096 is more "
     "than this machine runs"),
    ({"knob_values": {"checkpointing": ["sometimes"]}}, ["--checkpointing", "sometimes"],
     "knob_values['checkpointing'] sometimes: not a value of checkpointing",
     "--checkpointing sometimes: not a value of checkpointing"),
    ({"memory_budget": "9999TiB"}, ["--memory-budget", "9999TiB"],
     "memory_budget='9999TiB' (10238976.00 GiB) is more than cpu has",
     "--memory-budget 9999TiB (10238976.00 GiB) is more than cpu has"),
    ({"settings": SearchSettings(rank_precision=2.0)}, ["--rank-precision", "2"],
     "rank_precision must be a share from 0 to 1 (e.g. 0.05: stop timing once the median is "
     "known within 5%; 0 times every run in full), got 2.0: pass e.g. rank_precision=0.05",
     "--rank-precision must be a share from 0 to 1 (e.g. 0.05: stop timing once the median "
     "is known within 5%; 0 times every run in full), got 2.0: pass e.g. --rank-precision "
     "0.05"),
    ({"settings": SearchSettings(fresh=True, storage="sqlite:///study.db")},
     ["--fresh", "--storage", "sqlite:///study.db"],
     "fresh applies to the local study store, not to storage='sqlite:///study.db': name "
     "another study_name", "--fresh applies to the local study store, not to --storage "
     "sqlite:///study.db: name another --study-name"),
    ({"seq_len": 64}, ["--seq-len", "64"], "seq_len applies to model;",
     "--seq-len applies to --model;"),
])
def test_the_api_names_its_parameters_and_the_cli_its_flags(
        kwargs: dict[str, Any], cli: list[str], from_python: str, from_cli: str,
        tmp_path: Path) -> None:
    """Issue 61: ``autotune.search``'s errors named the CLI's flags (``--target-batch``).
    One check, two namings: each interface names the setting as its user wrote it."""
    with pytest.raises(ConfigError) as info:
        autotune.search(**{"target_batch": 8, "device": "cpu", **kwargs})
    message = str(info.value)
    assert from_python in message and not re.search(r"--[a-z]", message), message
    result = CliRunner().invoke(app, ["search", "--device", "cpu", "--out", str(tmp_path),
                                      *(["--target-batch", "8"] if "--target-batch" not in cli
                                        else []), *cli])
    assert result.exit_code == 2, result.output
    assert from_cli in " ".join(result.stderr.split()), result.stderr
    assert not list(tmp_path.iterdir())
