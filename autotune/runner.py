"""Run user code in a fresh child process: one TrialSpec to a TrialResult, or any handler.

OOM, compile errors, crashes (the child killed), hangs (timeout) and non-finite losses all come
back as values. The parent never imports the child's CUDA state: each child starts from nothing,
and no child outlives its parent. ``run_in_child`` / ``child_main`` are the generic pair any
stage uses to run a workload where it cannot decide an exit code (a ``sys.exit``, a segfault
or a hang in user code stays a value). A job of ranks (its launcher, where each rank writes
its result, the job's result from its ranks') is ``autotune.runner_ranks``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from autotune import child
from autotune.config import ChildRun, TrialResult, TrialSpec, WorkloadSpec
from autotune.device import backend_for
from autotune.errors import WorkloadError
from autotune.fork_server import PARENT_PID, die_with_parent
from autotune.knob_adapters import child_environment as knob_environment
from autotune.pinning import RANKS, pin_to_slot
from autotune.runner_ranks import EXITS, FAILED_AT, LAUNCH, SUMMARY, launch, merge_ranks, rank_path
from autotune.serialize import from_json_dict, to_json_dict

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


def run_isolated(spec: TrialSpec, *, slot_env: Mapping[str, str] | None = None,
                 on_start: Callable[[child.Child], None] | None = None) -> TrialResult:
    """Run ``spec`` in a new Python process and classify what happened.

    The child gets ``spec.timeout_s`` seconds of wall time; after that its whole process group
    is killed and the result is a ``timeout``. A child that dies without writing its result
    (killed by a signal, segfault, ``os._exit``) or cannot be started is a ``crash`` with the
    reason (and the end of its output).

    Args:
        spec: the run.
        slot_env: what pins the child to its slot of a parallel search
            (``search.slots.Slot.env``): its devices, or its cores (``SLOT_CORES``).
        on_start: called with the child once it started (a parallel search's cancel).
    """
    ranks = spec.ranks if spec.knobs.distributed else 0
    extra_env = {**knob_environment(spec.knobs, dict(os.environ)), **(slot_env or {})}
    with contextlib.ExitStack() as stack:
        if spec.cold_compile:  # inductor's on-disk caches (FX graphs, AOT autograd) live there
            extra_env["TORCHINDUCTOR_CACHE_DIR"] = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="autotune-cold-inductor-",
                                            ignore_cleanup_errors=True))
        run = run_in_child("autotune.runner", to_json_dict(spec), timeout_s=spec.timeout_s,
                           device=spec.device, extra_env=extra_env, ranks=ranks,
                           preload=preloads(spec.workload), on_start=on_start)
    if ranks and run.data is not None:
        return replace(merge_ranks(run.data["ranks"], run.message,
                                   stopped=run.data.get("stopped", ())), wall_s=run.wall_s)
    if run.status == "ok" and run.data is not None:
        return from_json_dict(TrialResult, {**run.data, "wall_s": run.wall_s})
    return TrialResult(status=run.status, message=run.message, wall_s=run.wall_s)


def preloads(workload: WorkloadSpec) -> tuple[str, ...]:
    """What a fork server may import for this workload's children (``child.start``): the
    Hugging Face models' common code, for a model named by id and for a workload file that
    imports transformers (each child imports it before its memory baseline anyway)."""
    if workload.kind == "hf":
        return _TRANSFORMERS
    if workload.kind != "file":
        return ()
    path = workload.target.rpartition(":")[0]
    try:
        text = Path(path).read_text(errors="replace")
    except (OSError, ValueError):
        return ()
    return _TRANSFORMERS if _IMPORTS_TRANSFORMERS.search(text) else ()


_TRANSFORMERS = ("transformers.modeling_utils",)
_IMPORTS_TRANSFORMERS = re.compile(r"^\s*(import|from)\s+transformers\b", re.MULTILINE)


def run_in_child(module: str, request: dict[str, Any], *, timeout_s: float,
                 device: str = "cpu", extra_env: dict[str, str] | None = None,
                 ranks: int = 0, preload: Sequence[str] = (),
                 on_start: Callable[[child.Child], None] | None = None) -> ChildRun:
    """Run ``python -m module request.json result.json`` in a child process and wait for it.

    The module's main calls ``child_main(handler)``. The child starts in its own session and
    process group with ``child_environment(device)`` (forked from a warm fork server that
    imported torch once, or a new interpreter: ``autotune.child``); its stdout and stderr go to
    a file whose end names a crash. After ``timeout_s`` seconds, or when this process gets any
    exception (Ctrl-C included), the child's whole process group is killed. On Linux the child
    also gets SIGKILL when this process dies (``PR_SET_PDEATHSIG``, armed by ``child_main``):
    no child outlives its parent.

    Args:
        module: the child's module, run with ``python -m``.
        request: JSON-ready data the child's handler gets.
        timeout_s: wall-clock limit for the child, start-up included.
        device: the device the child uses (sets up its allocator environment).
        extra_env: variables the child needs set before it starts (a knob's, e.g. the CUDA
            allocator's settings, which must be in place before CUDA initializes).
        ranks: run the module as a job of this many ranks under torch's elastic launcher
            (the engine of ``torchrun``; 0: one plain child). Each rank writes its own result;
            they come back as ``data["ranks"]`` (None for a rank that left none) whenever
            any rank wrote one, with ``data["stopped"]`` (the ranks the launcher stopped
            once another had failed), and the launcher's output end as ``message``.
        preload: modules the child imports before it measures anything, which a fork server
            may import once for every such child (``child.start``).
        on_start: called with the child once it started.

    Returns:
        ``ok`` with the handler's result in ``data``; ``timeout``; or ``crash`` (the child did
        not start, died without a result, or its handler raised: ``data["child_error"]``).
    """
    # Its folder may go while the child runs (a $TMPDIR cleaner, another job): what the
    # child left there is then missing, and so is the folder its cleanup would remove.
    with tempfile.TemporaryDirectory(prefix="autotune-child-",
                                     ignore_cleanup_errors=True) as tmp:
        request_path, result_path = Path(tmp, "request.json"), Path(tmp, "result.json")
        output_path = Path(tmp, "output.txt")
        args = [str(request_path), str(result_path)]
        if ranks:
            module, args = "autotune.runner", [LAUNCH, str(ranks), module, *args]
        start = time.perf_counter()
        try:
            request_path.write_text(json.dumps(request))
            output_path.write_bytes(b"")
            env = {**child_environment(device), **(extra_env or {}), PARENT_PID: str(os.getpid())}
            proc = child.start(module, args, env=env, output=str(output_path),
                               preload=preload)
        except OSError as exc:  # EACCES, ENOMEM, EAGAIN, a missing interpreter, no folder
            return ChildRun(status="crash", wall_s=time.perf_counter() - start, message=(
                f"could not start the child process: {type(exc).__name__}: {exc}"))
        try:
            if on_start is not None:
                on_start(proc)
            returncode = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            timed_out = ChildRun(status="timeout", wall_s=time.perf_counter() - start,
                                 message=f"no result after {timeout_s:.0f} s; killed")
            return _ranks_run(result_path, ranks, timed_out) if ranks else timed_out
        except BaseException:  # Ctrl-C in the parent: take the child down with it
            proc.kill()
            raise
        wall_s = time.perf_counter() - start
        output = _read(output_path)  # made before the child started: gone, its folder went
        if output is None:
            return ChildRun(status="crash", wall_s=wall_s, message=(
                f"the child's temporary folder {tmp} was removed while it ran (a $TMPDIR "
                "cleaner, another job?): its result and output are lost"))
        if ranks:
            summary = [line.removeprefix(SUMMARY) for line in output.splitlines()
                       if line.startswith(SUMMARY)]
            how = ("" if returncode == 0 else "\n".join(
                [*summary[-1:], output[-_OUTPUT_TAIL_CHARS:]]).strip())
            return _ranks_run(result_path, ranks, ChildRun(status="crash", wall_s=wall_s,
                                                           message=how))
        tail = output[-_OUTPUT_TAIL_CHARS:]
        text = _read(result_path)
        if text is not None:
            try:
                data = json.loads(text)
            except ValueError:  # written atomically by the child: someone else's file
                return ChildRun(status="crash", wall_s=wall_s, message=(
                    f"the child's result {result_path} is not JSON (replaced while it ran?)"
                    f"\n{tail}").strip())
            if isinstance(data, dict) and "child_error" in data:
                return ChildRun(status="crash", data=data, wall_s=wall_s,
                                message=f"the child failed: {data['child_error']}")
            return ChildRun(status="ok", data=data, wall_s=wall_s)
        if returncode < 0:
            name = signal.Signals(-returncode).name
            how = f"killed by {name}"
            if name == "SIGKILL":
                how += " (the kernel's OOM killer, or killed from outside)"
        else:
            how = f"exited with code {returncode} without a result"
        return ChildRun(status="crash", wall_s=wall_s, message=f"child {how}\n{tail}".strip())


def _ranks_run(result_path: Path, ranks: int, failed: ChildRun) -> ChildRun:
    """The ranks' results of a job (``run_in_child`` with ``ranks``), or ``failed`` when no
    rank wrote one."""
    found = [_read_json(Path(rank_path(str(result_path), rank))) for rank in range(ranks)]
    if not any(d is not None for d in found):
        return replace(failed, message=failed.message or "no rank wrote a result")
    exits = _read_json(Path(f"{result_path}{EXITS}")) or {}
    stopped = [rank for rank in range(ranks) if found[rank] is None
               and exits.get(str(rank)) == -signal.SIGTERM]
    return ChildRun(status="ok", data={"ranks": found, "stopped": stopped},
                    wall_s=failed.wall_s, message=failed.message)


def _read(path: Path) -> str | None:
    """A file a child wrote (or was to write) in its folder; None when it is not there: never
    written, or its folder was removed meanwhile."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object a child wrote in its folder (``_read``); None when it is not there or not
    an object (someone else's file)."""
    text = _read(path)
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def child_main(handler: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The child's side of ``run_in_child``: read the request, run ``handler``, write its result.

    Reads the JSON at ``sys.argv[1]`` and writes the handler's dict as JSON to ``sys.argv[2]``
    atomically (a reader sees the whole result or none). Handlers catch their own errors; when
    one raises anyway, the result is ``{"child_error": "Type: message"}``, and a ``sys.exit``
    from code it ran is ``{"child_error": "the workload called sys.exit(n)"}``: never a child
    that exits 0 without a result. KeyboardInterrupt ends the child. Before anything else it
    arms the parent-death signal (``fork_server.die_with_parent``).
    """
    die_with_parent()
    pin_to_slot()
    request_path, result_path = sys.argv[1], sys.argv[2]
    rank = os.environ.get("RANK") if os.environ.get(RANKS) else None
    if rank is not None:  # one rank of a job: its own result, beside its peers'
        result_path = rank_path(result_path, int(rank))
    try:
        request = json.loads(Path(request_path).read_text())
        text = json.dumps(handler(request))
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        text = json.dumps({"child_error": str(WorkloadError.from_exit(exc))})
    except BaseException as exc:
        text = json.dumps({"child_error": f"{type(exc).__name__}: {exc}"})
    rank_failed = rank is not None and json.loads(text).get("status", "crash") != "ok"
    if rank_failed:  # when: the first rank to fail is the job's cause (``merge_ranks``)
        text = json.dumps({**json.loads(text), FAILED_AT: time.time()})
    tmp = result_path + ".tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, result_path)
    if rank_failed:
        # A failed rank ends the job now: its peers may wait for it in a collective, and the
        # launcher stops them once one rank exits non-zero.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)


def _run_trial(request: dict[str, Any]) -> dict[str, Any]:
    from autotune.trial import run_trial  # torch and the workload load in the child only

    result = run_trial(from_json_dict(TrialSpec, request))
    return cast(dict[str, Any], to_json_dict(result))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == LAUNCH:
        sys.exit(launch(int(sys.argv[2]), *sys.argv[3:6]))
    child_main(_run_trial)
