"""Run one TrialSpec in a fresh child process and get a TrialResult back.

OOM, compile errors, crashes (the child killed), hangs (timeout) and non-finite losses all come
back as values. The parent never imports the child's CUDA state: each child starts from nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.config import TrialResult, TrialSpec, from_json_dict, to_json_dict


@dataclass(frozen=True, kw_only=True)
class ChildRun:
    status: str
    data: dict | None
    message: str
    wall_s: float

_STDERR_TAIL_CHARS = 3000


# glibc defaults make a CPU child's address space wander by tens of MiB for the same step
# (per-thread arenas reserve 64 MiB heaps; freed blocks stay in the heap): one arena and an
# immediate trim make the measured peak repeat to about 1 MiB. A user's own MALLOC_* wins.
CPU_ALLOCATOR = {"MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0"}


def child_environment(device: str = "cpu") -> dict[str, str]:
    """Environment for a child: unbuffered, and on CPU a glibc set up for repeatable peaks.

    Inductor compiles with its default threads (one per core): the child starts them before
    its cap (``trial._start_compile_threads``), so they cost compile time, not budget."""
    env = dict(os.environ)
    if device == "cpu" and not any(k.startswith("MALLOC_") for k in env):
        env.update(CPU_ALLOCATOR)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env


def allocator_notes(device: str) -> str:
    """The allocator settings children run with (they move the CPU memory boundary)."""
    env = child_environment(device)
    keys = [k for k in sorted(env) if k.startswith(("MALLOC_", "PYTORCH_CUDA_ALLOC"))]
    return ", ".join(f"{k}={env[k]}" for k in keys) or "glibc and torch allocator defaults"


def run_isolated(spec: TrialSpec) -> TrialResult:
    """Run ``spec`` in a new Python process and classify what happened.

    The child gets ``spec.timeout_s`` seconds of wall time; after that its whole process group
    is killed and the result is a ``timeout``. A child that dies without writing its result
    (killed by a signal, segfault, ``os._exit``) is a ``crash`` with the end of its stderr.
    """
    with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
        spec_path, result_path = Path(tmp, "spec.json"), Path(tmp, "result.json")
        stderr_path = Path(tmp, "stderr.txt")
        spec_path.write_text(json.dumps(to_json_dict(spec)))
        cmd = [sys.executable, "-m", "autotune.runner", str(spec_path), str(result_path)]
        start = time.perf_counter()
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                                    env=child_environment(spec.device),
                                    start_new_session=True)
            try:
                proc.wait(timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return TrialResult(status="timeout", wall_s=time.perf_counter() - start,
                                   message=f"no result after {spec.timeout_s:.0f} s; killed")
            except BaseException:  # Ctrl-C in the parent: take the child down with it
                _kill_group(proc)
                raise
        wall_s = time.perf_counter() - start
        if result_path.exists():
            data = json.loads(result_path.read_text())
            data["wall_s"] = wall_s
            return from_json_dict(TrialResult, data)
        tail = stderr_path.read_text(errors="replace")[-_STDERR_TAIL_CHARS:]
        if proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            how = f"killed by {name}"
            if name == "SIGKILL":
                how += " (the kernel's OOM killer, or killed from outside)"
        else:
            how = f"exited with code {proc.returncode} without a result"
        return TrialResult(status="crash", wall_s=wall_s, message=f"child {how}\n{tail}".strip())


def run_in_child(module: str, request: dict, *, timeout_s: float,
                 device: str = "cpu") -> ChildRun:
    """Run ``python -m module request.json result.json`` (temporary stand-in)."""
    with tempfile.TemporaryDirectory(prefix="autotune-child-") as tmp:
        request_path, result_path = Path(tmp, "request.json"), Path(tmp, "result.json")
        stderr_path = Path(tmp, "stderr.txt")
        request_path.write_text(json.dumps(request))
        cmd = [sys.executable, "-m", module, str(request_path), str(result_path)]
        start = time.perf_counter()
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                                    env=child_environment(device), start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return ChildRun(status="timeout", data=None, wall_s=time.perf_counter() - start,
                                message=f"no result after {timeout_s:.0f} s; killed")
            except BaseException:
                _kill_group(proc)
                raise
        wall_s = time.perf_counter() - start
        if result_path.exists():
            return ChildRun(status="ok", data=json.loads(result_path.read_text()), message="",
                            wall_s=wall_s)
        tail = stderr_path.read_text(errors="replace")[-_STDERR_TAIL_CHARS:]
        return ChildRun(status="crash", data=None, wall_s=wall_s,
                        message=f"child exited with {proc.returncode} without a result\n{tail}")


def child_main(handler) -> None:
    """The child side of ``run_in_child`` (temporary stand-in)."""
    request = json.loads(Path(sys.argv[1]).read_text())
    try:
        data = handler(request)
    except (Exception, SystemExit) as exc:
        data = {"child_error": f"{type(exc).__name__}: {exc}"}
    tmp = sys.argv[2] + ".tmp"
    Path(tmp).write_text(json.dumps(data))
    os.replace(tmp, sys.argv[2])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _child_main(spec_path: str, result_path: str) -> None:
    from autotune.trial import run_trial

    spec = from_json_dict(TrialSpec, json.loads(Path(spec_path).read_text()))
    result = run_trial(spec)
    tmp = result_path + ".tmp"
    Path(tmp).write_text(json.dumps(to_json_dict(result)))
    os.replace(tmp, result_path)


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2])
