"""A job of ranks (``run_in_child`` with ``ranks``): the launcher child, where each rank's
result goes, and the job's result from its ranks' results.

``autotune.runner`` starts the launcher (``python -m autotune.runner --launch-ranks``, which
runs ``launch`` here), collects the ranks' result files and merges them (``merge_ranks``);
each rank's ``child_main`` writes its result where ``rank_path`` says. They are apart from the
runner's one plain child because only a job of ranks needs torch's elastic launcher or a rule
for which rank's failure is the job's.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.config import TrialResult
from autotune.fork_server import PARENT_PID, die_with_parent
from autotune.pinning import RANKS
from autotune.serialize import from_json_dict

_FAILURE_ORDER = ("oom", "workload_error", "non_finite", "compile_error", "unsupported",
                  "timeout", "crash", "error")
"""Which rank's failure is the job's when the ranks' results do not say when each failed: a
cause before its echoes (a rank that ran out of memory leaves its peers with a broken
connection, an ``error``)."""

FAILED_AT = "rank_failed_at_s"
"""The key of a failed rank's result file that says when it failed (``time.time()``, one
node's clock): the first rank to fail is the cause, its peers' broken connections come after."""

LAUNCH = "--launch-ranks"
"""The runner's first argument that makes its child the launcher of a job (``launch``)."""

EXITS = ".exits"
"""Beside the ranks' results: how each failed rank ended (rank -> exit code), from the
launcher (a rank it stopped with SIGTERM once another failed is no cause)."""

SUMMARY = "autotune: "
"""The start of the launcher's line that says how the job's ranks failed."""


def merge_ranks(ranks: Sequence[dict[str, Any] | None], launcher: str = "",
                stopped: Sequence[int] = ()) -> TrialResult:
    """The job's result from its ranks' results (``None``: a rank that left none).

    A failure on any rank is the job's outcome, the cause first: the rank that failed first
    (a rank fails only once a peer it waits for is gone, so its "connection closed by peer" comes
    after the peer's own error), or by ``_FAILURE_ORDER`` where the results do not say when;
    a rank that died without a result makes the job a ``crash`` (unless another rank names a
    cause such as an OOM). A job where every rank ran is ``ok``: its peak is its largest rank's,
    each timed step its slowest rank's (the ranks agree on them as they time).

    Args:
        ranks: each rank's result JSON, by rank.
        launcher: the end of the launcher's output (why a rank left no result).
        stopped: ranks the launcher stopped (SIGTERM) once another had failed: an echo of
            that failure, never its cause, even without a result of their own.
    """
    results: list[TrialResult | None] = []
    failed_at: list[float] = []
    for data in ranks:
        failed_at.append(float("inf"))
        if data is None:
            results.append(None)
            continue
        data = dict(data)
        if isinstance(data.get(FAILED_AT), (int, float)):
            failed_at[-1] = float(data.pop(FAILED_AT))
        if "child_error" in data:
            results.append(TrialResult(status="crash", message=str(data["child_error"])))
        else:
            results.append(from_json_dict(TrialResult, data))
    failed = [(i, r) for i, r in enumerate(results) if r is not None and not r.ok]
    missing = [i for i, r in enumerate(results) if r is None and i not in stopped]
    causes = [(i, r) for i, r in failed if r.status not in ("error", "crash") or not missing]
    if causes:
        rank, worst = min(causes, key=lambda ir: (
            failed_at[ir[0]], _FAILURE_ORDER.index(ir[1].status)
            if ir[1].status in _FAILURE_ORDER else 99))
        return replace(worst, message=f"rank {rank} of {len(ranks)}: {worst.message}".strip())
    if missing:
        return TrialResult(status="crash", message=(
            f"rank {', '.join(map(str, missing))} of {len(ranks)} left no result (killed, or "
            f"its process died){': ' + launcher if launcher else ''}")[:6000])
    done = [r for r in results if r is not None]
    first = done[0]
    peaks = tuple(r.peak_bytes or 0 for r in done)
    steps = zip(*(r.step_times_s for r in done), strict=False)

    def largest(name: str) -> int | None:
        values = [getattr(r, name) for r in done if getattr(r, name) is not None]
        return max(values) if values else None

    return replace(
        first, peak_bytes=max(peaks), rank_peak_bytes=peaks,
        peak_rss_bytes=largest("peak_rss_bytes"), context_bytes=largest("context_bytes"),
        fragmentation_bytes=largest("fragmentation_bytes"),
        num_alloc_retries=sum(r.num_alloc_retries for r in done),
        step_times_s=tuple(max(t) for t in steps),
        step_memory_bytes=tuple(max(m) for m in zip(*(r.step_memory_bytes for r in done),
                                                     strict=False)))


def rank_path(result_path: str, rank: int) -> str:
    """Where one rank of a job writes its result: beside the job's, by rank."""
    return f"{result_path}.rank{rank}"


def launch(ranks: int, module: str, request_path: str, result_path: str) -> int:
    """The launcher child of a job of ranks: torch's elastic launcher (``torchrun``'s engine)
    in this process, one node, no restarts; each rank runs ``python -m module`` and writes its
    own result. The ranks start in sessions of their own: they get SIGKILL when this process
    dies (``PR_SET_PDEATHSIG``, armed by their ``child_main`` against this pid), so killing
    this launcher's group on a timeout leaves no rank running. A rank that fails exits
    non-zero, and the launcher stops the others at once.

    Returns:
        The exit status: 0 when every rank ended well.
    """
    die_with_parent()
    os.environ[PARENT_PID] = str(os.getpid())
    os.environ[RANKS] = str(ranks)
    # torchrun's own default would be 1 thread per rank, with a warning: share the cores out.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # The launcher's log folders go beside the request, in the folder the job's parent
    # removes (left to itself, the launcher leaves a torchelastic_* folder in /tmp per job).
    log_dir = os.path.join(os.path.dirname(os.path.abspath(result_path)), "launcher")
    args = parse_args(["--standalone", "--nnodes=1", f"--nproc-per-node={ranks}",
                       "--max-restarts=0", "--monitor-interval=0.1", f"--log-dir={log_dir}",
                       "-m", module, request_path, result_path])
    try:
        run(args)
    except ChildFailedError as exc:
        Path(f"{result_path}{EXITS}").write_text(json.dumps(
            {str(rank): f.exitcode for rank, f in exc.failures.items()}))
        failures = sorted(exc.failures.items(), key=lambda rf: (rf[1].exitcode == -15, rf[0]))
        print(f"{SUMMARY}the job of {ranks} ranks failed: " + "; ".join(
            f"rank {rank} of {ranks} {_how(f.exitcode)}" for rank, f in failures), flush=True)
        return 1
    return 0


def _how(exitcode: int) -> str:
    """How a rank ended, from its exit code (negative: the signal)."""
    if exitcode == -signal.SIGTERM:
        return "stopped by the launcher (SIGTERM) once another rank had failed"
    if exitcode == -signal.SIGKILL:
        return "killed by SIGKILL (the kernel's OOM killer, or killed from outside)"
    if exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}" + (" (its result says why)" if exitcode == 3 else "")
