"""How a child process starts: forked from a warm fork server, or as a new interpreter.

A child of ``runner.run_in_child`` spends seconds importing torch, transformers and autotune
before it runs anything (6-9 s per child on a 2-core CPU: more than a tiny trial's whole
training). A fork server imports them once, then forks each child from that state. The child is
still a fresh process: its own address space, session and process group, environment, working
directory and output file; only the imports are done. The server never runs a torch op, starts
no thread of its own and never initializes CUDA, so a child forks from what a new interpreter
would hold after its imports: the memory a trial measures is its growth over a baseline read
after that, as before.

Linux only (elsewhere fork is unsafe beside system frameworks, or absent). ``AUTOTUNE_CHILD_START``
chooses: ``fork`` (the default on Linux) or ``spawn`` (a new interpreter per child, as on other
systems). One server runs per environment (glibc reads its ``MALLOC_*`` settings once, at start):
a child whose environment differs beyond the variables read late (autotune's own, the inductor
cache folder) gets a server of its own. A forked child's ``/proc/PID/environ`` is its server's
(the kernel's copy from the server's start): its own environment is ``os.environ``.

No child outlives its parent: the server gets SIGKILL when the process that started it dies,
and each of its children when the server dies (``die_with_parent``, armed first thing in each).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.errors import ConfigError
from autotune.fork_server import PARENT_PID, SERVE

START_VARIABLE = "AUTOTUNE_CHILD_START"
START_METHODS = ("fork", "spawn")


def _read_late(name: str) -> bool:
    """Whether a variable is read only after a child starts, so a child may set it differently
    from its server: autotune's own (never read at an import) and ``_READ_LATE``."""
    return name.startswith("AUTOTUNE_") or name in _READ_LATE


_READ_LATE = frozenset({"TORCHINDUCTOR_CACHE_DIR", "PYTEST_CURRENT_TEST"})
"""Besides autotune's own: inductor's cache folder, and the variable pytest sets anew for each
phase of each test (nothing a child imports reads it): an ``assert_fits`` in a test suite would
otherwise start a server of its own for every test, paying the imports each time."""
PRELOAD = ("autotune.trial", "torch._dynamo")
"""What every server imports once: what every trial child imports before its memory baseline
(``trial``, and ``torch._dynamo``, which the optimizers import lazily). A server may preload more
(``start``'s ``preload``: what the workload imports anyway, e.g. transformers), never what a
child would import only while it trains: that would leave the import's memory out of the peak
(on CPU a compile's peak counts the inductor modules it imports: transformers preloaded, the
tiny default model compiled 3 MiB lower)."""
_SERVER_ONLY = {"OPENBLAS_NUM_THREADS": "1"}
"""Set for the server alone (its children get their own environment): numpy, which torch
imports, would start OpenBLAS's thread, and a thread alive at a fork leaves its stack in the
child's address-space high-water mark while the child unmaps it: on CPU the memory baseline would
sit 8 MiB above the address space, and every peak read 8 MiB low. A child's numpy BLAS runs one
thread then (torch's kernels are not numpy's)."""
_MAX_SERVERS = 4


def start_method() -> str:
    """``fork`` or ``spawn``: ``AUTOTUNE_CHILD_START`` when set, else fork on Linux.

    Raises:
        ConfigError: the variable holds something else.
    """
    value = os.environ.get(START_VARIABLE, "").strip()
    if not value:
        return "fork" if sys.platform.startswith("linux") else "spawn"
    if value not in START_METHODS:
        raise ConfigError(f"{START_VARIABLE}={value!r}: expected one of "
                          f"{', '.join(START_METHODS)} (fork: children fork from a warm fork "
                          "server; spawn: each child is a new interpreter)")
    if value == "fork" and not sys.platform.startswith("linux"):
        raise ConfigError(f"{START_VARIABLE}=fork: the fork server runs on Linux only "
                          f"(this is {sys.platform}); use spawn")
    return value


class Child:
    """A started child process: its pid (also its process group), waited for or killed."""

    pid: int

    def wait(self, timeout_s: float | None) -> int:
        """Its exit status (negative: the signal that killed it).

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout_s``.
        """
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL its whole process group, and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(30.0)


class _Spawned(Child):
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc, self.pid = proc, proc.pid

    def wait(self, timeout_s: float | None) -> int:
        return self.proc.wait(timeout=timeout_s)


class _Forked(Child):
    def __init__(self, server: _Server, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def wait(self, timeout_s: float | None) -> int:
        if self.returncode is None:
            self.returncode = self.server.wait(self.pid, timeout_s)
        return self.returncode


def start(module: str, args: Sequence[str], *, env: Mapping[str, str], output: str,
          preload: Sequence[str] = ()) -> Child:
    """Start ``python -m module *args`` with ``env``, stdout and stderr to the file ``output``,
    stdin from /dev/null, in a session (and process group) of its own.

    ``preload``: modules the child imports before anything it measures, which a fork server
    imports once beyond ``PRELOAD`` (the server for this environment and list).

    Raises:
        OSError: the child could not be started.
        ConfigError: ``AUTOTUNE_CHILD_START`` is not a start method.
    """
    if start_method() == "fork":
        server = _server_for(env, tuple(preload))
        if server is not None:
            child = server.fork(module, args, env=env, output=output)
            if child is not None:
                return child
    with open(output, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, env=dict(env), start_new_session=True)
    return _Spawned(proc)


# ----------------------------------------------------------------------------------------------
# The parent's side of a fork server.

_servers: dict[tuple[tuple[str, str], ...], _Server] = {}
"""The running servers, by environment and preload."""
_servers_lock = threading.Lock()


def _server_for(env: Mapping[str, str], preload: tuple[str, ...]) -> _Server | None:
    """The running server for this environment and preload, started if needed; None when none
    starts (the child then starts as a new interpreter)."""
    key = (*sorted((k, v) for k, v in env.items() if not _read_late(k)),
           ("", ",".join(preload)))
    with _servers_lock:
        server = _servers.get(key)
        if server is None or not server.alive():
            for old_key, old in list(_servers.items()):  # the dead, and idle ones over the limit
                if not old.alive() or (len(_servers) >= _MAX_SERVERS and old.idle()):
                    old.close()
                    del _servers[old_key]
            server = _Server(env, preload)
            _servers[key] = server
    return server if server.ready() else None


def close_servers() -> None:
    """Stop every fork server of this process (their running children die with them)."""
    with _servers_lock:
        for server in _servers.values():
            server.close()
        _servers.clear()


class _Server:
    """One fork server: started by a keeper thread that lives as long as it (the server's
    death signal follows the thread that started it), which also reads its replies."""

    _START_TIMEOUT_S = 300.0

    def __init__(self, env: Mapping[str, str], preload: Sequence[str]) -> None:
        self._env = {k: v for k, v in env.items() if k != PARENT_PID}
        self._preload = [*PRELOAD, *preload]
        self._cond = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._running: set[int] = set()
        self._next_id = 0
        self._pid = 0
        self._state = "starting"  # then ready, failed or dead
        self._proc: subprocess.Popen[bytes] | None = None
        self._write_lock = threading.Lock()
        threading.Thread(target=self._keep, name="autotune-fork-server", daemon=True).start()

    def _keep(self) -> None:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "autotune.fork_server", SERVE, *self._preload],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env={**self._env, **_SERVER_ONLY, PARENT_PID: str(os.getpid())},
                start_new_session=True)
        except OSError:
            self._set_state("failed")
            return
        self._proc = proc
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                if "ready" in message and message.get("threads") != 1:
                    self._state = "failed"  # a child would fork beside a thread: spawn them
                    self.close()
                elif "ready" in message:
                    self._pid = proc.pid
                    self._state = "ready"
                elif "exit" in message:
                    self._exits[int(message["exit"])] = int(message["code"])
                    self._running.discard(int(message["exit"]))
                elif "id" in message:
                    self._replies[int(message["id"])] = message
                self._cond.notify_all()
        proc.wait()
        self._set_state("dead")

    def _set_state(self, state: str) -> None:
        with self._cond:
            if not (state == "dead" and self._state == "failed"):
                self._state = "failed" if self._state == "starting" else state
            self._cond.notify_all()

    def ready(self) -> bool:
        """Wait until the server has imported what it preloads; False when it failed."""
        with self._cond:
            self._cond.wait_for(lambda: self._state != "starting", self._START_TIMEOUT_S)
            return self._state == "ready"

    def alive(self) -> bool:
        with self._cond:
            return self._state in ("starting", "ready")

    def idle(self) -> bool:
        with self._cond:
            return not self._running

    def fork(self, module: str, args: Sequence[str], *, env: Mapping[str, str],
             output: str) -> _Forked | None:
        """A child forked from the server; None when the server is gone (start it anew)."""
        with self._cond:
            self._next_id += 1
            request_id = self._next_id
        request = {"id": request_id, "module": module, "args": list(args), "output": output,
                   "cwd": os.getcwd(), "env": {**env, PARENT_PID: str(self._pid)}}
        try:
            with self._write_lock:
                assert self._proc is not None and self._proc.stdin is not None
                self._proc.stdin.write(json.dumps(request).encode() + b"\n")
                self._proc.stdin.flush()
        except (OSError, ValueError):
            return None
        with self._cond:
            try:
                self._cond.wait_for(
                    lambda: request_id in self._replies or self._state != "ready")
            except BaseException:  # Ctrl-C before the pid came back: the child must not live on
                self._cond.wait_for(
                    lambda: request_id in self._replies or self._state != "ready", 10.0)
                if "pid" in self._replies.get(request_id, {}):
                    pid = int(self._replies[request_id]["pid"])
                    for kill in (os.killpg, os.kill):  # before its setsid it has no group
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            kill(pid, signal.SIGKILL)
                raise
            reply = self._replies.pop(request_id, None)
            if reply is None:
                return None
            if "error" in reply:
                raise OSError(reply["error"])
            pid = int(reply["pid"])
            if pid not in self._exits:
                self._running.add(pid)
        return _Forked(self, pid)

    def wait(self, pid: int, timeout_s: float | None) -> int:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while pid not in self._exits:
                if self._state != "ready":  # the server died: its children died with it
                    self._running.discard(pid)
                    return -signal.SIGKILL
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"child {pid}", timeout_s or 0.0)
                self._cond.wait(left)
            return self._exits.pop(pid)

    def close(self) -> None:
        """End the server: it exits when its input closes (its children die with it)."""
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()
