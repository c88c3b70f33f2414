"""A tuned config's step as a user's own loop runs it, in a child process, measured as the
search measures its runs (``autotune verify``, ``api.verify``).

The child does what a first launch of ``autotune.json`` in a training script does:
``Tuned(config)`` (as ``autotune.load`` gives it, with the folder of its compiled
artifacts), the workload's model built and moved to the device, ``cfg.apply``,
``cfg.build_optimizer`` over the workload's optimizer, ``cfg.compile`` (from nothing: an
inductor cache of its own, empty, unless the artifacts saved beside ``autotune.json``
apply and load), then ``cfg.train_step`` on the config's micro-batches at the workload's
worst case: warm-up steps (the compile in them), then timed steps. Its memory is capped at
the config's budget and counted as every probe and trial counts it
(``DeviceBackend.open_memory``, ``DeviceBackend.peak_counted``).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config import TrialResult, TrialSpec
from autotune.device import backend_for
from autotune.errors import ConfigError
from autotune.knob_adapters import child_environment as knob_environment
from autotune.runner import child_main, preloads, run_in_child
from autotune.schema import TunedConfig
from autotune.serialize import from_json_dict, to_json_dict
from autotune.units import format_bytes


@dataclass(frozen=True, kw_only=True)
class UserLoopRun:
    """What the child's loop measured, and what its compile did."""

    result: TrialResult
    """Its status, peak (``peak_bytes``, as the search counts it), warm-up and timed steps."""
    artifacts: str = ""
    """What ``cfg.compile`` did with the compiled artifacts (loaded, or why not; "" eager)."""
    warnings: tuple[str, ...] = ()
    """What the library path warned while it ran (one line each)."""
    varied_lengths: bool = False
    """The workload declares lengths and the config's shape policy is not ``max``: the search
    timed it on the declared lengths, this loop at the worst case."""


def capped_device(device: str, budget_bytes: int, *, ranks: int = 1, strategy: str = "none",
                  instead: str = "check it without --measure") -> str:
    """The device a measured step of a config tuned on ``device`` runs on here (``cpu`` or
    ``cuda:0``), capped at ``budget_bytes`` as the search's runs were. ``instead``: what to
    do where it cannot, said in the error.

    Raises:
        ConfigError: the job needs more ranks than this machine runs, or a child's cap cannot
            hold the budget here (a hard address-space limit).
    """
    device = "cpu" if device == "cpu" else "cuda:0"
    backend = backend_for(device)
    here = backend.max_ranks()
    if ranks > here:
        raise ConfigError(
            f"measuring this config needs a job of {ranks} ranks ({strategy}), and this "
            f"machine runs {here}: {instead} (the estimator traces one rank of the job) or on "
            "a machine with as many devices")
    limit = backend.budget_limit()
    if limit is not None and budget_bytes > limit[0]:
        raise ConfigError(
            f"measuring this config caps its step at the config's memory budget "
            f"({format_bytes(budget_bytes)}), more than a child process's cap can be here: "
            f"{limit[1]}. {instead[:1].upper() + instead[1:]}, or raise the hard limit where it "
            "is set (the ulimit -v of the shell or job script, the container's or scheduler's "
            "limit)")
    return device


def run_user_loop(config: TunedConfig, folder: Path | None, spec: TrialSpec) -> UserLoopRun:
    """Run the config's step through the library path in a child (module docstring).

    Args:
        config: the tuned config (its ``workload`` the one to build).
        folder: where ``autotune.json`` and its compiled artifacts lie (None: none load).
        spec: the device, the cap (``memory_budget_bytes``), the steps (``num_warmup_steps``,
            ``num_timed_steps``), the seed and the child's timeout; its knobs and
            micro-batches are the config's.

    Returns:
        What it measured; a run that failed comes back as its status (``oom``, ``timeout``,
        ``crash``, ``error``...), never raised.
    """
    extra_env = knob_environment(config.knobs, dict(os.environ))
    with tempfile.TemporaryDirectory(prefix="autotune-verify-inductor-",
                                     ignore_cleanup_errors=True) as cache:
        extra_env["TORCHINDUCTOR_CACHE_DIR"] = cache  # a first launch's: empty
        run = run_in_child("autotune.user_loop", {
            "config": to_json_dict(config), "folder": str(folder) if folder else "",
            "spec": to_json_dict(spec)}, timeout_s=spec.timeout_s, device=spec.device,
            extra_env=extra_env, preload=preloads(config.workload))
    data = run.data or {}
    if "result" not in data:
        return UserLoopRun(result=TrialResult(status=run.status, message=run.message,
                                              wall_s=run.wall_s))
    return UserLoopRun(
        result=from_json_dict(TrialResult, {**data["result"], "wall_s": run.wall_s}),
        artifacts=data.get("artifacts", ""), warnings=tuple(data.get("warnings", ())),
        varied_lengths=bool(data.get("varied_lengths")))


@dataclass
class _Child:
    """What the child's loop found out so far: a failure's result reads its memory too."""

    memory: Any = None
    """The run's ``TrialMemory``, once opened."""
    artifacts: str = ""
    varied_lengths: bool = False


def _loop(request: dict[str, Any]) -> dict[str, Any]:
    """The child: the config's steps through ``Tuned`` (module docstring)."""
    from autotune.trial_status import classify_exception

    spec = from_json_dict(TrialSpec, request["spec"])
    config = from_json_dict(TunedConfig, request["config"])
    info: dict[str, Any] = {"samples_per_step": config.micro_batch * config.accumulate_steps}
    child = _Child()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = _steps(spec, config, request["folder"], info, child)
        except BaseException as exc:  # every outcome is a value; KeyboardInterrupt ends it
            if isinstance(exc, KeyboardInterrupt):
                raise
            status = classify_exception(exc)
            if child.memory is not None:
                info.update(child.memory.peak())
                if status in ("compile_error", "error") and child.memory.at_cap(
                        info["peak_bytes"]):
                    status = "oom"  # it had reached its cap (as a trial says it)
            result = TrialResult(status=status, message=f"{type(exc).__name__}: {exc}"[:6000],
                                 **info)
    return {"result": to_json_dict(result), "artifacts": child.artifacts,
            "varied_lengths": child.varied_lengths,
            "warnings": list(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))}


def _steps(spec: TrialSpec, config: TunedConfig, folder: str, info: dict[str, Any],
           child: _Child) -> TrialResult:
    """Build, apply, compile and train as a user's loop does; time and measure it."""
    import torch

    from autotune.artifacts import compile_cache_counts
    from autotune.builtin_workloads import load_workload
    from autotune.shapes import declared_lengths, shape_batch, worst_batch
    from autotune.usage import Tuned
    from autotune.user_code import check_model
    from autotune.workload import check_batch, to_device

    cfg = Tuned(config, folder=Path(folder) if folder else None)
    workload = load_workload(config.workload, spec.device)
    info["workload_name"], info["tokens_per_sample"] = workload.name, workload.tokens_per_sample
    cfg.set_matmul_precision()
    torch.manual_seed(spec.seed)
    model = workload.build_model()
    check_model(model, workload.name)
    memory = child.memory = backend_for(spec.device).open_memory(spec, model)
    if memory.budget is not None and memory.model_bytes > memory.budget:
        return TrialResult(status="oom", peak_bytes=memory.model_bytes, message=(
            f"the model's parameters and buffers alone take {format_bytes(memory.model_bytes)}"
            f", over the budget of {format_bytes(memory.budget)}"), **info)
    model = cfg.apply(model.to(memory.device), workload.blocks)
    model.train()
    optimizer = cfg.build_optimizer(workload.make_optimizer(model.parameters()))
    stepped = cfg.compile(model, workload.blocks)
    child.artifacts = cfg.artifacts_note
    lengths = declared_lengths(workload)
    child.varied_lengths = lengths is not None and config.knobs.shapes != "max"
    torch.manual_seed(spec.seed + 1)
    batches = []
    for _ in range(config.accumulate_steps):
        batch = worst_batch(workload, config.micro_batch, lengths)
        check_batch(batch, config.micro_batch, workload.name)
        batch = to_device(batch, memory.device)
        if lengths is not None:  # padded to the worst case as the search's runs were
            batch = shape_batch(batch, config.knobs.shapes, lengths.worst)
        batches.append(cfg.batch(batch))
    torch.manual_seed(spec.seed + 2)
    losses, times = [], []
    for _ in range(spec.num_warmup_steps + spec.num_timed_steps):
        start = time.perf_counter()
        losses.append(cfg.train_step(stepped, optimizer, batches, workload))
        memory.sync()
        times.append(time.perf_counter() - start)
    info.update(memory.peak())
    warmup, timed = times[:spec.num_warmup_steps], times[spec.num_warmup_steps:]
    values = torch.stack(losses).float().tolist()
    info.update(step_times_s=tuple(timed), warmup_s=sum(warmup), first_loss=values[0],
                last_loss=values[-1], num_optimizer_steps=len(values))
    if config.compiled:  # the warm-up beyond its steps once compiled; whether it compiled afresh
        info["compile_s"] = max(0.0, sum(warmup) - len(warmup) * min(timed, default=0.0))
        with contextlib.suppress(Exception):  # inductor's counters, where this torch has them
            info["compile_cache_hits"], info["compile_cache_misses"] = compile_cache_counts()
    bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
    if bad is not None:
        return TrialResult(status="non_finite", message=(
            f"loss became {values[bad]} at optimizer step {bad + 1} of {len(values)}"), **info)
    return TrialResult(status="ok", **info)


if __name__ == "__main__":
    child_main(_loop)
