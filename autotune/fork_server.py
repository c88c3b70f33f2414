"""The fork server's own process, and each child forked from it (``autotune.child`` starts
the server as ``python -m autotune.fork_server --serve`` and asks it for children).

The server imports what every child needs once (its ``preload``), then forks a child per
request: the child becomes what ``python -m module *args`` in a new session would be (its
own environment, working directory, output file and process group) and never returns into
the server's loop. Nothing here starts a thread or runs a torch op: a child forks from what a
new interpreter would hold after its imports. ``die_with_parent`` is armed first thing in the
server and in each child (and in a spawned child, ``autotune.runner``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import json
import os
import runpy
import select
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

PARENT_PID = "AUTOTUNE_PARENT_PID"
"""The pid a child expects as its parent: it leaves at once when that one is already gone."""
SERVE = "--serve"
"""The server's argument: ``python -m autotune.fork_server --serve PRELOAD...``."""



def die_with_parent() -> None:
    """First thing in a child: get SIGKILL when the parent dies, and exit if it already did.

    Not a ``preexec_fn``: with one, CPython runs its at-fork hooks in the parent, which print
    and drop any exception raised meanwhile, so a Ctrl-C arriving as a child starts was lost.
    Set here instead, the signal is armed once the child runs; a parent that died before that
    is caught by comparing ``getppid()`` with the pid it passed down (``AUTOTUNE_PARENT_PID``).
    The signal follows the parent *thread* that started the child; that thread waits for the
    child (or, for a fork server, lives as long as it), so it outlives it. Elsewhere than Linux
    (or without libc's prctl), nothing.
    """
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = os.environ.get(PARENT_PID, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)


_PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Any:
    """libc's ``prctl`` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_CWD_ON_PATH: int | None = None
"""Where ``python -m`` put the server's working directory on ``sys.path`` (None: it did not,
e.g. with PYTHONSAFEPATH): a child puts its own there."""


def _serve(preload: Sequence[str]) -> None:
    """The server's loop: fork a child per request line on stdin, reply with its pid, and
    report each child's exit status as it ends. Ends when stdin closes (the parent is done)."""
    global _CWD_ON_PATH
    die_with_parent()
    _CWD_ON_PATH = next((i for i, entry in enumerate(sys.path[:1])
                         if entry in ("", os.getcwd())), None)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # nothing else may write into the replies
    for name in preload:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    replies.write(json.dumps({"ready": True, "threads": _num_threads()}) + "\n")
    pending = b""
    while True:
        readable, _, _ = select.select([0, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(replies)
        if 0 not in readable:
            continue
        data = os.read(0, 65536)
        if not data:  # the parent closed its end, or died
            return
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            try:
                pid = os.fork()
            except OSError as exc:
                replies.write(json.dumps({"id": request["id"], "error": str(exc)}) + "\n")
                continue
            if pid == 0:
                _child(request, (wake_r, wake_w, replies.fileno(), null))
            replies.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
        _reap(replies)


def _num_threads() -> int:
    """This process's threads, native ones included (Python's own count misses those)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _reap(replies: Any) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        replies.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
                      + "\n")


def _child(request: dict[str, Any], server_fds: Sequence[int]) -> None:
    """In the forked child: become what ``python -m module *args`` in a new session would be,
    run it, and exit (never back into the server's loop)."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd in (*server_fds, out, null):
            with contextlib.suppress(OSError):
                os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        if _CWD_ON_PATH is not None:  # as ``python -m`` puts the working directory first
            sys.path[_CWD_ON_PATH] = os.getcwd()
        sys.argv = [request["module"], *request["args"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    """The status a new interpreter exits with for this ``SystemExit``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    if sys.argv[1:2] == [SERVE]:
        _serve(sys.argv[2:])
