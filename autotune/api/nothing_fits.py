"""Why not even the smallest micro-batch fits: a memory verdict (exit 1) saying what the budget
would have to be, or the workload's own failure (exit 2) where that is the cause. A hang, a
non-finite loss or an error at the smallest micro-batch is the workload's at once; a crash (of
its process, or of one rank of its job) is run once more without the memory cap, as a crash
under the cap can be the cap's doing, and is the workload's when it happens there too. A run
that failed in any of these ways is never said not to fit.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.api.request import Budget
from autotune.config import DeviceInfo, MemoryProbe, TrialResult, WorkloadSpec
from autotune.errors import (
    BROKEN,
    MEMORY_STATUS,
    AutotuneError,
    NoFeasibleConfigError,
    WorkloadError,
    error_for_status,
)
from autotune.knob_rules import device_skip_reason
from autotune.knobs import KNOBS, Knobs
from autotune.memory import probe_spec
from autotune.names import KEYWORDS, Names
from autotune.runner import run_isolated
from autotune.search import Candidate
from autotune.units import format_bytes


def uncapped_run(workload: WorkloadSpec, info: DeviceInfo, knobs: Knobs, micro_batch: int,
                 timeout_s: float, ranks: int = 1) -> TrialResult:
    """A probe of ``micro_batch`` capped only by what the device has free."""
    return run_isolated(probe_spec(workload, info.device, knobs, micro_batch,
                                   info.available_memory_bytes, timeout_s, ranks=ranks))


def failed_eager(probe: MemoryProbe, statuses: Sequence[str] = BROKEN) -> bool:
    """Whether fp32 eager ended its smallest micro-batch in one of ``statuses`` (``BROKEN``:
    a hang, a non-finite loss: the workload is broken, whatever else is tried)."""
    return (probe.knobs.precision, probe.knobs.compile_mode) == ("fp32", "off") and any(
        s.status in statuses and s.micro_batch == probe.candidates[0] for s in probe.steps)


def nothing_fits(workload: WorkloadSpec, info: DeviceInfo, budget: Budget,
                 first: MemoryProbe, timeout_s: float | None,
                 results: dict[Candidate, TrialResult] | None = None,
                 scope: str = "with any precision or compile mode tried",
                 ranks: int = 1, uncapped: TrialResult | None = None,
                 name: Names = KEYWORDS) -> AutotuneError:
    """Why not even the smallest micro-batch of ``first`` fits: a memory verdict (exit 1)
    with what the budget would have to be, or the workload's own failure (exit 2) when that is
    the cause. ``uncapped``: its smallest micro-batch run without the cap already (else it
    runs now, within ``timeout_s``; None: no time is left for it). ``name`` says the settings
    the user's way (``FLAGS`` on the command line)."""
    smallest = first.candidates[0]
    label = first.knobs.label()
    step = next((s for s in first.steps if s.micro_batch == smallest), None)
    timed = (results or {}).get(Candidate(knobs=first.knobs, micro_batch=smallest))
    # A leak shows in a timed run that did not fit: out of memory, or a peak over the usable
    # memory but under the cap (ran, over budget: where its steps happened to end).
    leak = (timed.leak_note() if timed is not None and not timed.fits(budget.usable_bytes)
            else None)
    if leak:
        how = ("ran out of memory" if timed.status == MEMORY_STATUS  # type: ignore[union-attr]
               else "went over the usable memory")
        return WorkloadError(
            f"micro-batch {smallest} ({label}) {how} after "
            f"{timed.num_optimizer_steps} optimizer steps: {leak}. A larger budget only "
            "delays it: fix the workload")  # type: ignore[union-attr]
    if step is not None and step.status in BROKEN:
        return error_for_status(step.status, _broken(smallest, label, step.status, step.message,
                                                     name=name))
    crashed = step is not None and step.status == "crash"
    if uncapped is None and timeout_s is None:
        if crashed:
            return error_for_status("crash", (
                f"at micro-batch {smallest} ({label}) the process died under the memory cap "
                f"[crash]: {step.message.strip() or 'no message'}. No run was left "  # type: ignore[union-attr]
                f"({name('time_budget_s')} or {name('max_trials')} spent) to run it without the "
                "cap and tell "
                "whether the cap caused it: allow more, or fix the workload"))
        return NoFeasibleConfigError(
            f"micro-batch {smallest} does not fit in {format_bytes(budget.usable_bytes)} "
            f"usable {scope} (the time budget is spent: what it needs was not measured)")
    # What the smallest micro-batch needs, capped only by what the device has free.
    result = uncapped or uncapped_run(workload, info, first.knobs, smallest,
                                      timeout_s or 0.0, ranks)
    if result.status not in ("ok", MEMORY_STATUS):
        # It fails without the cap too (a crash under the cap can be the cap's doing: a
        # stack that cannot grow is a SIGSEGV): the workload is broken.
        return error_for_status(result.status, _broken(
            smallest, label, result.status, result.message, " (also without the memory cap)",
            name))
    if crashed and result.fits(budget.usable_bytes):
        return error_for_status("crash", _broken(
            smallest, label, "crash", step.message,  # type: ignore[union-attr]
            f" (under the memory cap; without it the run fit, at a peak of "
            f"{format_bytes(result.peak_bytes)}: a crash that does not always happen)", name))
    if result.fits(budget.usable_bytes) and step is not None:
        # Under the cap it did not fit; the same run without it did: its peak moves between
        # runs at the budget's edge (CPU allocators keep freed blocks), or grows with the
        # steps a run happens to make.
        seen = format_bytes(step.peak_bytes) if step.peak_bytes else step.status
        return NoFeasibleConfigError(
            f"micro-batch {smallest} ({label}) did not fit in {format_bytes(budget.usable_bytes)}"
            f" usable in one run ({seen}) and fit in another without the cap (peak "
            f"{format_bytes(result.peak_bytes)}): its memory varies from run to run at the "
            f"edge of the budget. Give a little more {name('memory_budget')}, or a smaller "
            f"{name('headroom')}, so that every run fits")
    if result.ok and result.peak_bytes is not None:
        need = (f"it needs {format_bytes(result.peak_bytes)} at its peak "
                f"({label}), so the budget would have to be at least "
                f"{format_bytes(result.peak_bytes / (1 - budget.headroom))} with "
                f"{budget.headroom:.0%} headroom")
    else:
        need = (f"it did not fit in all {format_bytes(info.available_memory_bytes)} free on "
                f"{info.device} either ({result.status})")
    return NoFeasibleConfigError(
        f"micro-batch {smallest} does not fit in {format_bytes(budget.usable_bytes)} usable "
        f"(budget {format_bytes(budget.budget_bytes)} minus {budget.headroom:.0%} headroom) "
        f"{scope}: {need}. Try a larger {name('memory_budget')}, "
        f"{name.given('precisions', ['bf16'])} (halves activations), {_freeing(info, name)} "
        f"(if it was left out), or a shorter {name('seq_len')}."
    )


def _freeing(info: DeviceInfo, name: Names) -> str:
    """The knob values that free memory on this device, as settings: what to try next."""
    return " or ".join(name.given(k.name, [value]) for k in KNOBS
                       for value in k.frees_memory[:1]
                       if device_skip_reason(k, value, info.is_cuda) is None)


def _broken(micro_batch: int, label: str, status: str, message: str, where: str = "",
            name: Names = KEYWORDS) -> str:
    what = {"non_finite": "its loss is not finite", "timeout": "it hung (no result in time)",
            "crash": "its process died", "compile_error": "torch.compile failed",
            "error": "it raised an error", "workload_error": "the workload raised an error"}
    return (f"the workload is broken, not too big: at micro-batch {micro_batch} ({label}){where} "
            f"{what.get(status, status)} [{status}]: {message.strip() or 'no message'}. "
            f"No memory budget changes that: fix the workload (or raise {name('timeout_s')} if "
            "it is only slow)")
