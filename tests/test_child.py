"""child: a child forked from the warm fork server is a fresh process, as a new interpreter is.

Every test starts real processes (tests/child_state.py reports what the child sees of itself);
the fork server's own servers are stopped after each test, so none reuses another's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune import child
from autotune.config import WorkloadSpec
from autotune.device.cpu import CPU_ALLOCATOR
from autotune.errors import ConfigError
from autotune.runner import preloads

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux's"),
]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _own_servers() -> Iterator[None]:
    child.close_servers()
    yield
    child.close_servers()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != child.START_VARIABLE}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _start(tmp_path: Path, action: str = "state", *, how: str = "fork",
           env: dict[str, str] | None = None, preload: tuple[str, ...] = (),
           name: str = "state") -> tuple[child.Child, Path, Path]:
    out, output = tmp_path / f"{name}.json", tmp_path / f"{name}.txt"
    os.environ[child.START_VARIABLE] = how
    try:
        proc = child.start("tests.child_state", [str(out), action], env=env or _env(),
                           output=str(output), preload=preload)
    finally:
        del os.environ[child.START_VARIABLE]
    return proc, out, output


def _state(tmp_path: Path, **kwargs: object) -> dict:
    proc, out, output = _start(tmp_path, **kwargs)  # type: ignore[arg-type]
    assert proc.wait(60) == 0, output.read_text()
    return json.loads(out.read_text())


@pytest.mark.parametrize("how", ["fork", "spawn"])
def test_a_child_is_a_fresh_process_in_a_session_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env = _env(AUTOTUNE_TEST_VALUE="a 'quoted' \\ value")
    state = _state(tmp_path, how=how, env=env)
    assert state["pid"] != os.getpid()
    # forked: the server is its parent (and imported torch once); spawned: this process is
    assert (state["ppid"] == os.getpid()) == (how == "spawn")
    assert state["torch_loaded"] == (how == "fork")
    assert state["sid"] == state["pgid"] == state["pid"]  # killed as a group, never with ours
    assert state["cwd"] == str(work) and state["path0"] == str(work)  # as ``python -m``
    assert state["stdin_is_null"]
    expected = {k: v for k, v in env.items() if k != child.PARENT_PID}
    assert {k: v for k, v in state["env"].items() if k != child.PARENT_PID} == expected
    assert (tmp_path / "state.txt").read_text() == "the child's own output\n"


# slow: four fork servers started; the everyday run keeps a server's fork, its
# environment and its faults
@pytest.mark.slow
def test_one_server_per_environment_but_for_what_is_read_late(tmp_path: Path) -> None:
    first = _state(tmp_path, name="first")
    late = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "AUTOTUNE_CACHE_DIR": str(tmp_path),
            "PYTEST_CURRENT_TEST": "tests/test_other.py::test_other (call)"}
    again = _state(tmp_path, name="again", env=_env(**late))
    # read at each compile / by autotune / by nothing a child imports: one server
    assert again["ppid"] == first["ppid"]
    assert {k: again["env"][k] for k in late} == late
    other = _state(tmp_path, name="other", env=_env(MALLOC_ARENA_MAX="2"))
    assert other["ppid"] != first["ppid"]  # glibc reads it at start: a server of its own
    assert other["env"]["MALLOC_ARENA_MAX"] == "2"
    preloaded = _state(tmp_path, name="preloaded", preload=("json",))
    assert preloaded["ppid"] not in (first["ppid"], other["ppid"])


@pytest.mark.parametrize("how", ["fork", "spawn"])
@pytest.mark.parametrize(("action", "code", "says"), [
    ("exit", 3, ""), ("raise", 1, "ValueError: raised on purpose")])
def test_exit_statuses_are_a_new_interpreters(tmp_path: Path, how: str, action: str,
                                              code: int, says: str) -> None:
    proc, _, output = _start(tmp_path, action, how=how)
    assert proc.wait(60) == code
    assert says in output.read_text()


@pytest.mark.parametrize("how", ["fork", "spawn"])
def test_a_child_is_killed_with_its_group_and_reaped(tmp_path: Path, how: str) -> None:
    proc, out, _ = _start(tmp_path, "sleep", how=how)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.5)
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL
    assert out.exists()  # it ran


@pytest.mark.parametrize("how", ["fork", "spawn"])
def test_a_childs_address_space_high_water_is_its_own(tmp_path: Path, how: str) -> None:
    # Where a trial reads its memory baseline (the high-water mark VmPeak, once torch's
    # threads run: device.cpu._CPUMemory), it is the address space itself. numpy's OpenBLAS
    # thread, alive in a server at a fork, would leave its stack in the child's high-water
    # mark while the child unmaps it: VmPeak 8 MiB above VmSize, every peak 8 MiB low. The
    # server starts none.
    state = _state(tmp_path, action="threads", how=how, env=_env(**CPU_ALLOCATOR))
    assert state["torch_loaded"] == (how == "fork")
    assert state["vm_peak_over_size"] < 2**20, state["vm_peak_over_size"]
    assert "OPENBLAS_NUM_THREADS" not in state["env"]  # the server's alone


def test_a_server_beside_a_thread_forks_nothing_the_child_is_spawned(tmp_path: Path) -> None:
    state = _state(tmp_path, preload=("tests.child_thread",))
    assert state["ppid"] == os.getpid() and not state["torch_loaded"]


@pytest.mark.parametrize("value", ["forkserver", "FORK", " "])
def test_a_start_method_that_is_none_is_named(monkeypatch: pytest.MonkeyPatch,
                                              value: str) -> None:
    monkeypatch.setenv(child.START_VARIABLE, value)
    if not value.strip():
        assert child.start_method() == "fork"  # unset, as far as it goes
        return
    with pytest.raises(ConfigError) as error:
        child.start_method()
    assert str(error.value).startswith(
        f"AUTOTUNE_CHILD_START={value!r}: expected one of fork, spawn")


def test_transformers_is_preloaded_only_for_workloads_that_import_it(tmp_path: Path) -> None:
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def factory():\n    from transformers import GPT2Config\n")
    plain = tmp_path / "plain.py"
    plain.write_text("import torch  # no transformers here, but the word\n")
    assert preloads(WorkloadSpec(kind="hf", target="gpt2")) == ("transformers.modeling_utils",)
    assert preloads(WorkloadSpec(kind="file", target=f"{lazy}:factory")) == (
        "transformers.modeling_utils",)
    assert preloads(WorkloadSpec(kind="file", target=f"{plain}:factory")) == ()
    assert preloads(WorkloadSpec(kind="file", target=f"{tmp_path}/missing.py:f")) == ()
    assert preloads(WorkloadSpec()) == ()  # the built-in model is plain torch


class _InterruptedOnce:
    """The server's condition, but the first wait in this thread is cut by a Ctrl-C (as a
    KeyboardInterrupt arrives while ``fork`` waits for the child's pid)."""

    def __init__(self, cond: object) -> None:
        self._cond, self._interrupted = cond, False

    def __getattr__(self, name: str) -> object:
        return getattr(self._cond, name)

    def __enter__(self) -> object:
        return self._cond.__enter__()  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> object:
        return self._cond.__exit__(*exc)  # type: ignore[attr-defined]

    def wait_for(self, predicate, timeout=None):  # type: ignore[no-untyped-def]
        if not self._interrupted:
            self._interrupted = True
            raise KeyboardInterrupt
        return self._cond.wait_for(predicate, timeout)  # type: ignore[attr-defined]


def test_a_ctrl_c_while_the_fork_is_answered_kills_the_child(tmp_path: Path) -> None:
    env = _env()
    server = child._server_for(env, ())
    assert server is not None and server.ready()
    server._cond = _InterruptedOnce(server._cond)  # type: ignore[assignment]
    out = tmp_path / "sleep.json"
    with pytest.raises(KeyboardInterrupt):
        server.fork("tests.child_state", [str(out), "sleep"], env=env,
                    output=str(tmp_path / "sleep.txt"))
    server._cond = server._cond._cond  # type: ignore[attr-defined]
    with server._cond:  # the server reports the child's exit once it is reaped
        assert server._cond.wait_for(lambda: bool(server._exits), 30), "the child lives on"
        assert list(server._exits.values()) == [-signal.SIGKILL]
