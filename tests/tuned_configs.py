"""Hand-built ``TunedConfig`` values for tests that need an ``autotune.json`` without a search."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from autotune.config import DeviceInfo, WorkloadSpec
from autotune.knobs import Knobs
from autotune.schema import MemoryRecord, TrialRecord, TunedConfig
from autotune.tuned_file import save_tuned

REPO = Path(__file__).resolve().parent.parent
GiB = 1 << 30

CPU = DeviceInfo(device="cpu", name="Test CPU", total_memory_bytes=8 * GiB,
                 available_memory_bytes=6 * GiB, supports_bf16=True, supports_fp16=True,
                 supports_tf32=False, torch_version="2.13.0")


def make_tuned(**overrides: Any) -> TunedConfig:
    """A plausible search result: bf16/default 16x4 for target 64 on the default workload.

    Pass ``micro_batch`` / ``accumulate_steps`` / ``target_batch`` together to keep them exact.
    A knob may be passed by name (``precision="fp16"``, ``checkpointing="blocks"``): it
    changes that knob of ``knobs``.
    """
    trials = (
        TrialRecord(number=0, micro_batch=64, accumulate_steps=1, knobs=Knobs(),
                    verdict="ok", is_baseline=True, samples_per_s=800.0,
                    median_step_s=0.08, reason="0.66x the winner's samples/s"),
        TrialRecord(number=1, micro_batch=32, accumulate_steps=2,
                    knobs=Knobs(compile_mode="default"), verdict="ok", samples_per_s=1000.0,
                    reason="0.83x the winner's samples/s"),
        TrialRecord(number=2, micro_batch=16, accumulate_steps=4,
                    knobs=Knobs(precision="bf16"), verdict="slower", samples_per_s=900.0),
        TrialRecord(number=3, micro_batch=16, accumulate_steps=4,
                    knobs=Knobs(precision="bf16", compile_mode="default"), verdict="winner",
                    samples_per_s=1210.0, median_step_s=0.053, compile_s=12.3, speedup=1.51,
                    reason="fastest"),
    )
    config = TunedConfig(
        autotune_version="0.1.0", created_at="2026-11-22T04:00:00+00:00",
        workload=WorkloadSpec(), workload_name="default-tiny-gpt", workload_fingerprint="0" * 16,
        target_batch=64, world_size=1, micro_batch=16, accumulate_steps=4,
        knobs=Knobs(precision="bf16", compile_mode="default"),
        memory=MemoryRecord(device_total_bytes=8 * GiB, budget_bytes=2 * GiB, headroom=0.1,
                            usable_bytes=int(1.8 * GiB), peak_bytes=int(1.2 * GiB),
                            max_micro_batch={"fp32/off": 16, "bf16/default": 32}),
        device=CPU, samples_per_s=1210.0, baseline_samples_per_s=800.0, speedup=1.51,
        break_even_steps=455.6,
        reason="bf16/default 16x4 won at 1,210.0 samples/s, 1.51x the baseline (fp32/off 64x1)",
        trials=trials,
    )
    return replace(config, **_knob_overrides(config.knobs, overrides))


def _knob_overrides(knobs: Knobs, overrides: dict[str, Any]) -> dict[str, Any]:
    """``precision="fp16"`` (any field of ``Knobs``) as ``knobs=...`` with that knob changed."""
    changes = {k: overrides.pop(k) for k in list(overrides)
               if k in {f.name for f in fields(Knobs)}}
    if changes:
        overrides["knobs"] = overrides.get("knobs", knobs).with_(**changes)
    return overrides


def small(**overrides: Any) -> TunedConfig:
    """Target 4 = micro-batch 2 x 2 accumulation, fp32 eager: quick to run on a CPU."""
    values: dict[str, Any] = dict(target_batch=4, micro_batch=2, accumulate_steps=2,
                                  precision="fp32", compile_mode="off")
    values.update(overrides)
    return make_tuned(**values)


def my_workload_spec() -> WorkloadSpec:
    """examples/my_workload.py:workload, by absolute path."""
    return WorkloadSpec(kind="file", target=f"{REPO / 'examples' / 'my_workload.py'}:workload")


def write(config: TunedConfig, path: Path) -> Path:
    """Save ``config`` as ``autotune.json`` at ``path``."""
    save_tuned(config, path, force=True)
    return path


def subprocess_env() -> dict[str, str]:
    """The environment for a child Python: this checkout first on the import path."""
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("WORLD_SIZE", None)
    return env


def torchrun(*args: str, cwd: Path | None = None, timeout: float = 300
             ) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc_per_node=2 ARGS`` (2 CPU gloo ranks) as a test runs it:
    this checkout importable, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         *args], cwd=cwd, capture_output=True, text=True, env=subprocess_env(), timeout=timeout)
