"""Run user code in a fresh child process: one TrialSpec to a TrialResult, or any handler.

OOM, compile errors, crashes (the child killed), hangs (timeout) and non-finite losses all come
back as values. The parent never imports the child's CUDA state: each child starts from nothing,
and no child outlives its parent. ``run_in_child`` / ``child_main`` are the generic pair any
stage uses to run a workload where it cannot decide an exit code (a ``sys.exit``, a segfault
or a hang in user code stays a value).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from autotune.config import ChildRun, TrialResult, TrialSpec, from_json_dict, to_json_dict
from autotune.device import CPU_ALLOCATOR as CPU_ALLOCATOR  # re-exported
from autotune.device import backend_for
from autotune.errors import WorkloadError
from autotune.knobs import child_environment as knob_environment

_OUTPUT_TAIL_CHARS = 3000


def child_environment(device: str = "cpu") -> dict[str, str]:
    """Environment for a child: unbuffered, plus what its device's backend sets
    (``DeviceBackend.child_environment``: on CPU a glibc set up for repeatable peaks).

    Raises:
        ConfigError: ``device`` is of a kind no backend runs.
    """
    env = dict(os.environ)
    env.update(backend_for(device).child_environment(env))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env


def allocator_notes(device: str) -> str:
    """The allocator settings children on ``device`` run with (they move the CPU memory
    boundary)."""
    return backend_for(device).allocator_notes(child_environment(device))


def run_isolated(spec: TrialSpec) -> TrialResult:
    """Run ``spec`` in a new Python process and classify what happened.

    The child gets ``spec.timeout_s`` seconds of wall time; after that its whole process group
    is killed and the result is a ``timeout``. A child that dies without writing its result
    (killed by a signal, segfault, ``os._exit``) or cannot be started is a ``crash`` with the
    reason (and the end of its output).
    """
    run = run_in_child("autotune.runner", to_json_dict(spec), timeout_s=spec.timeout_s,
                       device=spec.device,
                       extra_env=knob_environment(spec.knobs, dict(os.environ)))
    if run.status == "ok" and run.data is not None:
        return from_json_dict(TrialResult, {**run.data, "wall_s": run.wall_s})
    return TrialResult(status=run.status, message=run.message, wall_s=run.wall_s)


def run_in_child(module: str, request: dict[str, Any], *, timeout_s: float,
                 device: str = "cpu", extra_env: dict[str, str] | None = None) -> ChildRun:
    """Run ``python -m module request.json result.json`` in a child process and wait for it.

    The module's main calls ``child_main(handler)``. The child starts in its own session and
    process group with ``child_environment(device)``; its stdout and stderr go to a file whose
    end names a crash. After ``timeout_s`` seconds, or when this process gets any exception
    (Ctrl-C included), the child's whole process group is killed. On Linux the child also gets
    SIGKILL when this process dies (``PR_SET_PDEATHSIG``, armed by ``child_main``): no child
    outlives its parent.

    Args:
        module: the child's module, run with ``python -m``.
        request: JSON-ready data the child's handler gets.
        timeout_s: wall-clock limit for the child, start-up included.
        device: the device the child uses (sets up its allocator environment).
        extra_env: variables the child needs set before it starts (a knob's, e.g. the CUDA
            allocator's settings, which must be in place before CUDA initializes).

    Returns:
        ``ok`` with the handler's result in ``data``; ``timeout``; or ``crash`` (the child did
        not start, died without a result, or its handler raised: ``data["child_error"]``).
    """
    with tempfile.TemporaryDirectory(prefix="autotune-child-") as tmp:
        request_path, result_path = Path(tmp, "request.json"), Path(tmp, "result.json")
        output_path = Path(tmp, "output.txt")
        request_path.write_text(json.dumps(request))
        cmd = [sys.executable, "-m", module, str(request_path), str(result_path)]
        start = time.perf_counter()
        with open(output_path, "wb") as output:
            try:
                env = {**child_environment(device), **(extra_env or {}),
                       _PARENT_PID: str(os.getpid())}
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=output,
                                        stderr=output, env=env, start_new_session=True)
            except OSError as exc:  # EACCES, ENOMEM, EAGAIN, a missing interpreter
                return ChildRun(status="crash", wall_s=time.perf_counter() - start, message=(
                    f"could not start the child process: {type(exc).__name__}: {exc}"))
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return ChildRun(status="timeout", wall_s=time.perf_counter() - start,
                                message=f"no result after {timeout_s:.0f} s; killed")
            except BaseException:  # Ctrl-C in the parent: take the child down with it
                _kill_group(proc)
                raise
        wall_s = time.perf_counter() - start
        if result_path.exists():
            data = json.loads(result_path.read_text())
            if isinstance(data, dict) and "child_error" in data:
                return ChildRun(status="crash", data=data, wall_s=wall_s,
                                message=f"the child failed: {data['child_error']}")
            return ChildRun(status="ok", data=data, wall_s=wall_s)
        tail = output_path.read_text(errors="replace")[-_OUTPUT_TAIL_CHARS:]
        if proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            how = f"killed by {name}"
            if name == "SIGKILL":
                how += " (the kernel's OOM killer, or killed from outside)"
        else:
            how = f"exited with code {proc.returncode} without a result"
        return ChildRun(status="crash", wall_s=wall_s, message=f"child {how}\n{tail}".strip())


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


_PR_SET_PDEATHSIG = 1
_PARENT_PID = "AUTOTUNE_PARENT_PID"


def _die_with_parent() -> None:
    """In the child, first thing: get SIGKILL when the parent dies, and exit if it already did.

    Not a ``preexec_fn``: with one, CPython runs its at-fork hooks in the parent, which print
    and drop any exception raised meanwhile, so a Ctrl-C arriving as a child starts was lost.
    Set here instead, the signal is armed once the interpreter starts; a parent that died
    before that is caught by comparing ``getppid()`` with the pid it passed down. The signal
    follows the parent *thread* that started the child; that thread waits for the child, so
    it outlives it. Elsewhere than Linux (or without libc's prctl), nothing.
    """
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = os.environ.get(_PARENT_PID, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)


@functools.cache
def _prctl() -> Any:
    """libc's ``prctl`` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def child_main(handler: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The child's side of ``run_in_child``: read the request, run ``handler``, write its result.

    Reads the JSON at ``sys.argv[1]`` and writes the handler's dict as JSON to ``sys.argv[2]``
    atomically (a reader sees the whole result or none). Handlers catch their own errors; when
    one raises anyway, the result is ``{"child_error": "Type: message"}``, and a ``sys.exit``
    from code it ran is ``{"child_error": "the workload called sys.exit(n)"}``: never a child
    that exits 0 without a result. KeyboardInterrupt ends the child. Before anything else it
    arms the parent-death signal (see ``_die_with_parent``).
    """
    _die_with_parent()
    request_path, result_path = sys.argv[1], sys.argv[2]
    try:
        request = json.loads(Path(request_path).read_text())
        text = json.dumps(handler(request))
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        text = json.dumps({"child_error": str(WorkloadError.from_exit(exc))})
    except BaseException as exc:
        text = json.dumps({"child_error": f"{type(exc).__name__}: {exc}"})
    tmp = result_path + ".tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, result_path)


def _run_trial(request: dict[str, Any]) -> dict[str, Any]:
    from autotune.trial import run_trial  # torch and the workload load in the child only

    result = run_trial(from_json_dict(TrialSpec, request))
    return cast(dict[str, Any], to_json_dict(result))


if __name__ == "__main__":
    child_main(_run_trial)
