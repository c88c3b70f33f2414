"""The public face from Python: autotune.search(...), autotune.estimate, autotune.check."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import autotune
from autotune import api
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
    ({"workload": 3}, "workload must be 'file.py:factory', a WorkloadSpec or a TuneRequest, "
                      "got a int"),
    ({"not_a_field": 1}, "not a search setting"),
    ({"workload": api.TuneRequest(target_batch=8), "device": "cpu"},
     "give a TuneRequest or its fields"),
    ({"workload": TINY, "model": "gpt2"}, "give either --workload"),
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
