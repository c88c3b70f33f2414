"""Ctrl-C and SIGTERM once a search has a result: the first ends the running stage, every later
one waits for the writes (autotune.signals), so no signal loses a finished search."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.config import TrialResult, TrialSpec, WorkloadSpec
from autotune.errors import Interrupted
from autotune.signals import SignalGuard, guarded
from tests.conftest import workload_target
from tests.scripted import CLASSES, SETTINGS, ScriptedDevice, by_class, plan


@pytest.fixture(autouse=True)
def _sigint_at_its_default() -> Iterator[None]:
    """A terminal's Ctrl-C reaches a process whose SIGINT is at Python's default; a test run
    started in the background (a CI job) inherits SIGINT ignored, which the guard rightly
    leaves ignored. These tests are about the first case."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.01)  # the handler runs at the next bytecode: it has by now


def test_outside_an_armed_region_a_signal_is_held_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with guarded() as guard:
        _signal_self(signal.SIGINT)
        _signal_self(signal.SIGTERM)
        assert guard.held == [signal.SIGINT, signal.SIGTERM] and guard.raised == []
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_in_an_armed_region_the_first_signal_raises_and_the_next_is_held(
        signum: int, code: int) -> None:
    with guarded() as guard:
        with pytest.raises(Interrupted) as info, guard.armed():
            _signal_self(signum)
            pytest.fail("the signal did not end the armed region")
        assert info.value.exit_code == code
        # The handling of the first: a second signal here must not raise again.
        _signal_self(signal.SIGINT)
        assert guard.raised == [signum] and guard.held == [signal.SIGINT]


def test_a_signal_held_before_an_armed_region_ends_it_as_it_starts() -> None:
    with guarded() as guard:
        _signal_self(signal.SIGTERM)
        ran = False
        with pytest.raises(Interrupted) as info, guard.armed():
            ran = True
        assert not ran and info.value.signal_name == "SIGTERM"
        assert guard.held == [] and guard.raised == [signal.SIGTERM]


def test_an_ignored_signal_stays_ignored() -> None:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with guarded() as guard:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            with guard.armed():
                _signal_self(signal.SIGINT)
            assert guard.held == guard.raised == []
    finally:
        signal.signal(signal.SIGINT, before)


def test_off_the_main_thread_the_guard_changes_nothing() -> None:
    seen: list[object] = []

    def work() -> None:
        with guarded() as guard, guard.armed():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [before]


def test_a_second_signal_while_the_first_is_handled_keeps_the_search_s_result() -> None:
    """Two signals 50 ms apart during a run: the first ends the stages, the second lands in
    the bookkeeping that follows (wherever it lands, it is held) and the outcome has its
    best so far."""
    from autotune.search import run_search

    class TwoSignals(ScriptedDevice):
        def __call__(self, spec: TrialSpec) -> TrialResult:
            if len(self.specs) == 6:
                def send() -> None:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.05)
                    os.kill(os.getpid(), signal.SIGTERM)

                sender = threading.Thread(target=send)
                try:  # the first signal may come as soon as the thread starts
                    sender.start()
                    time.sleep(5)  # the first signal ends this
                finally:
                    sender.join()
                    time.sleep(0.01)
            return super().__call__(spec)

    device = TwoSignals(by_class(100, 150, 160, 200, 300, 330))
    with guarded() as guard:
        outcome = run_search(plan(), CLASSES, SETTINGS, run=device, guard=guard)
    assert outcome.interrupted and str(outcome.stop_reason) == "interrupted (Ctrl-C): best so far"
    assert guard.raised == [signal.SIGINT] and guard.held == [signal.SIGTERM]
    assert outcome.baseline is not None and outcome.baseline in outcome.results


@pytest.mark.subprocess
@pytest.mark.parametrize("where", [
    # slow: the same window, entered one call earlier
    pytest.param("tuned_config", marks=pytest.mark.slow), "write_outputs"])
def test_a_signal_after_the_last_run_waits_for_the_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The window the defect lived in (4 of 4 tries lost the search): the runs are over, the
    config is being made or written. The signal is acted on once both files are written."""
    import autotune.api.tune as pipeline
    from autotune import api
    from autotune.search import SearchSettings

    real = getattr(pipeline, where)

    def signalled(*args, **kwargs):
        _signal_self(signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, where, signalled)
    tiny = WorkloadSpec(kind="file", target=workload_target("tiny"))
    try:
        result = api.search(tiny, target_batch=2, device="cpu", memory_budget="2GiB",
                            precisions=["fp32"], compile_modes=["off"], out=tmp_path,
                            settings=SearchSettings(num_timed_steps=3, min_timed_s=0.1,
                                                    micro_batches_per_class=1, num_confirm=0,
                                                    cache=False))
    except Interrupted as exc:  # held to the end: acted on after the writes
        assert exc.exit_code == 143
        assert exc.written == tmp_path / "autotune.json"  # type: ignore[attr-defined]
    else:  # held until the calibration, which it ended at once
        assert str(result.stop_reason) == \
            "interrupted (SIGTERM) while calibrating: best config kept"
    config = json.loads((tmp_path / "autotune.json").read_text())
    assert any(t["verdict"] == "winner" for t in config["trials"])
    assert (tmp_path / "train_autotuned.py").is_file()


@pytest.mark.subprocess
@pytest.mark.slow  # 30 s (a new interpreter, a real search): the CLI's side runs everyday in
# test_output.py::test_a_ctrl_c_while_the_search_prints_names_what_was_written, the held
# signal's in test_a_signal_after_the_last_run_waits_for_the_writes
def test_the_cli_says_what_was_written_when_a_signal_comes_while_it_prints(
        tmp_path: Path) -> None:
    """After the writes the CLI prints its table; a signal there names the written file, not
    "nothing written"."""
    code = (
        "import os, signal, sys\n"
        "import autotune.report as report\n"
        "real = report.search_table\n"
        "def table(*a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(*a, **k)\n"
        "report.search_table = table\n"
        "from autotune.cli import main\n"
        "sys.argv = ['autotune', 'search', '--workload', sys.argv[1], '--target-batch', '2',\n"
        "            '--device', 'cpu', '--precisions', 'fp32', '--compile-modes', 'off',\n"
        "            '--timed-steps', '3', '--no-cache', '--out', sys.argv[2]]\n"
        "main()\n")
    proc = subprocess.run([sys.executable, "-c", code, workload_target("tiny"), str(tmp_path)],
                          capture_output=True, text=True, timeout=240,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 130, proc.stderr
    words = " ".join(proc.stderr.split())
    assert f"interrupted (Ctrl-C): wrote {tmp_path / 'autotune.json'}" in words
    assert (tmp_path / "autotune.json").is_file()


def test_a_bare_guard_is_inert() -> None:
    guard = SignalGuard()
    with guard.armed():
        pass
    assert guard.held == guard.raised == []


# ----------------------------------------------------------------------------------------------
# A write that fails part-way (issue 44, item 8): what was written is said.

_FULL_DISK = """
import resource, signal, sys, warnings
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tests.test_report_html import searched
from autotune.api.deliver import write_outputs
from autotune.errors import ConfigError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
out = Path(sys.argv[2])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        write_outputs(searched(), out / "autotune.json", out / "train_autotuned.py", force=False)
    except ConfigError as exc:
        print("error:", exc)
        sys.exit(2)
for w in caught:
    print("warning:", w.message)
"""


def _write_under_a_file_size_limit(tmp_path: Path, limit_bytes: int) -> tuple[int, str]:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", _FULL_DISK, str(root), str(tmp_path),
                           str(limit_bytes)], capture_output=True, text=True, timeout=120)
    return proc.returncode, " ".join(proc.stdout.split()) + proc.stderr


# slow: the everyday run keeps a config the disk cannot take; the page's and
# script's writes are the same atomic write
@pytest.mark.slow
@pytest.mark.subprocess
def test_a_page_the_disk_cannot_take_costs_neither_config_nor_script(tmp_path: Path) -> None:
    """The page (megabytes) fails, the config and script (kilobytes) were written: a warning
    names them and how to write the page later; no exit 2."""
    code, said = _write_under_a_file_size_limit(tmp_path, 1 << 20)
    assert code == 0, said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune.json", "train_autotuned.py"]
    assert f"cannot write {tmp_path / 'autotune.html'}: File too large" in said
    assert (f"Written: {tmp_path / 'autotune.json'} and {tmp_path / 'train_autotuned.py'}; "
            f"`autotune report {tmp_path / 'autotune.json'}` writes the page") in said


# slow: the everyday run keeps a config the disk cannot take; the page's and
# script's writes are the same atomic write
@pytest.mark.slow
@pytest.mark.subprocess
def test_a_script_the_disk_cannot_take_names_the_config_that_was_written(tmp_path: Path) -> None:
    code, said = _write_under_a_file_size_limit(tmp_path, 15_000)  # the config fits, not the script
    assert code == 2, said
    assert [p.name for p in tmp_path.iterdir()] == ["autotune.json"]
    assert f"cannot write {tmp_path / 'train_autotuned.py'}: File too large" in said
    assert (f"Written, complete: {tmp_path / 'autotune.json'}; `autotune codegen "
            f"{tmp_path / 'autotune.json'} --out {tmp_path}` writes the script") in said


@pytest.mark.subprocess
def test_a_config_the_disk_cannot_take_leaves_nothing(tmp_path: Path) -> None:
    code, said = _write_under_a_file_size_limit(tmp_path, 4_000)
    assert code == 2, said
    assert list(tmp_path.iterdir()) == []
    assert "Nothing written" in said


def test_a_warning_prints_as_one_line_as_typed() -> None:
    """The store's and the page's warnings reach the terminal as one line each."""
    from typer.testing import CliRunner

    from autotune.cli import app

    @app.command("warn-test-only", hidden=True)
    def warn() -> None:
        from autotune.cli.output import exits

        with exits():
            import warnings

            warnings.warn("study store: [/] not used: its disk is full", stacklevel=1)

    try:
        result = CliRunner().invoke(app, ["warn-test-only"])
    finally:
        app.registered_commands.pop()
    assert result.exit_code == 0
    assert result.stderr == "warning: study store: [/] not used: its disk is full\n"


def test_the_last_line_shows_after_a_signal_cut_one_of_the_consoles_prints_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal raised inside a progress line's print, between the halves of rich's buffer
    bookkeeping, left the console holding every later print back: the search ended 143 with
    no line at all."""
    import io

    import typer

    from autotune.cli import output as cli

    buffer = io.StringIO()
    console = cli.plain_console(file=buffer, width=1000)
    monkeypatch.setattr(cli, "err", console)
    console._enter_buffer()  # what that signal leaves behind
    console.print("trial probe fp32/off 2x1 ok")  # held back from here on
    with pytest.raises(typer.Exit) as info, cli.exits():
        raise Interrupted("SIGTERM", signal.SIGTERM)
    assert info.value.exit_code == 143
    assert buffer.getvalue() == "interrupted (SIGTERM): nothing written\n"


# ----------------------------------------------------------------------------------------------
# The autotune process's own policy: a signal while it starts, and a second one while it exits.

def _autotune(*args: str, importtime: bool = False) -> subprocess.Popen[str]:
    """``python -m autotune ARGS`` (the console script's entry), SIGINT at its default as a
    terminal leaves it."""
    root = Path(__file__).resolve().parent.parent
    return subprocess.Popen(
        [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "autotune",
         *args], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _said(stderr: str) -> list[str]:
    """Its lines, without ``-X importtime``'s."""
    return [line for line in stderr.splitlines() if not line.startswith("import time:")]


@pytest.mark.subprocess
@pytest.mark.parametrize(("signum", "code", "name"), [
    (signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_while_autotune_imports_ends_it_in_one_line(signum: int, code: int,
                                                            name: str, tmp_path: Path) -> None:
    """Ctrl-C in the first second, while the CLI's modules import (typer, rich; then torch):
    it was a KeyboardInterrupt traceback from inside an import, or a silent exit."""
    proc = _autotune("search", "--workload", workload_target("tiny"), "--target-batch", "2",
                     "--device", "cpu", "--out", str(tmp_path), importtime=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # each import is said as it ends: typer's parts, inside it
        seen.append(line)
        if line.rpartition("|")[2].strip().startswith("typer."):
            proc.send_signal(signum)
            break
    _, rest = proc.communicate(timeout=120)
    said = _said("".join(seen) + rest)
    assert proc.returncode == code, said
    assert said == [f"interrupted ({name}): nothing written"], said
    assert not (tmp_path / "autotune.json").exists()


@pytest.mark.subprocess
@pytest.mark.slow  # a search in a new interpreter (25 s): one signal during a search runs
# everyday (test_search.py's Ctrl-C, this file's signals after the last run)
def test_more_signals_while_autotune_exits_change_nothing(tmp_path: Path) -> None:
    """SIGTERM during a search, then SIGTERM after SIGTERM until it has exited (a CI runner's
    cancel, repeated): it was a traceback from an exit handler, or an end by the signal itself
    instead of exit 143."""
    proc = _autotune("search", "--workload", workload_target("tiny"), "--target-batch", "2",
                     "--device", "cpu", "--precisions", "fp32", "--compile-modes", "off",
                     "--timed-steps", "3", "--no-cache", "--out", str(tmp_path))
    assert proc.stderr is not None and proc.stdout is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("trial "):  # a run ended: the search is under way
            break
    reader = threading.Thread(target=lambda: seen.append(proc.stderr.read()))  # type: ignore[union-attr]
    reader.start()
    while proc.poll() is None:  # a burst, until it has exited
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.005)
    reader.join()
    said, printed = _said("".join(seen)), proc.stdout.read()
    assert proc.returncode == 143, said
    assert len([line for line in said if line.startswith("interrupted")]) <= 1, said
    # Said once: on stderr, or in the footer of a search that kept its best so far.
    assert "SIGTERM" in printed or said[-1].startswith("interrupted (SIGTERM): "), said
    assert not any("Traceback" in line or "Exception ignored" in line for line in said), said
