"""The winner's compiled artifacts for the user's first launch, saved by one more child run.

The search's children compiled the winner's graphs on this machine minutes before, into
inductor's on-disk caches. One short child run of the winner (its own micro-batch and
accumulation, one optimizer step, through ``trial.run_trial`` like every run) compiles them
again, mostly read from those caches, and torch records every cache entry it wrote or read
(``torch.compiler.save_cache_artifacts``, torch >= 2.7: entries read from the local cache are
recorded too). The child saves them with what they are valid for
(``autotune.artifacts.graphs_key``, torch version, device name); the parent writes the file
beside ``autotune.json`` (``api.deliver.write_outputs``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.artifacts import compile_cache_counts, device_name, graph_settings, graphs_key
from autotune.config import TrialResult, TrialSpec
from autotune.runner import child_main, preloads, run_in_child
from autotune.schema import CompileArtifacts, TunedConfig
from autotune.serialize import from_json_dict, to_json_dict


@dataclass(frozen=True)
class Saved:
    """The artifacts' bytes and their record (``TunedConfig.compile_artifacts``)."""

    data: bytes
    record: CompileArtifacts


def save_compile_artifacts(config: TunedConfig, file: str, timeout_s: float
                           ) -> tuple[Saved | None, str]:
    """Run the winner once more in a child and take its compiled artifacts.

    Args:
        config: the tuned config (its winner is compiled, one process).
        file: the artifacts' file name (``artifacts.artifacts_name``).
        timeout_s: the child's limit (what is left of the search's).

    Returns:
        The artifacts, or None and why there are none (one sentence).
    """
    if not config.compiled:
        return None, "the winner is eager: no compiled artifacts"
    if config.knobs.distributed:
        return None, (f"no compiled artifacts: the winner runs as a job of ranks "
                      f"({config.knobs.strategy}), each compiling its own graphs")
    spec = TrialSpec(workload=config.workload, device=config.device.device,
                     micro_batch=config.micro_batch, accumulate_steps=config.accumulate_steps,
                     knobs=config.knobs, num_warmup_steps=1, num_timed_steps=0,
                     memory_budget_bytes=config.memory.budget_bytes, timeout_s=timeout_s)
    with tempfile.TemporaryDirectory(prefix="autotune-artifacts-",
                                     ignore_cleanup_errors=True) as tmp:
        out = Path(tmp, "artifacts.bin")
        run = run_in_child("autotune.first_launch", {
            "spec": to_json_dict(spec), "out": str(out), "settings": graph_settings(config)},
            timeout_s=timeout_s, device=spec.device, preload=preloads(spec.workload))
        data = run.data or {}
        result = (from_json_dict(TrialResult, data["result"]) if "result" in data
                  else TrialResult(status=run.status, message=run.message))
        if not result.ok:
            first = (result.message.strip().splitlines() or ["no message"])[0]
            return None, (f"no compiled artifacts: the run that saves them ended "
                          f"{result.status}: {first}")
        if data.get("unsaved"):
            return None, f"no compiled artifacts: {data['unsaved']}"
        try:
            payload = out.read_bytes()
        except OSError:  # its folder was removed meanwhile (a $TMPDIR cleaner)
            return None, (f"no compiled artifacts: their file {out} was removed before it "
                          "was read (its temporary folder went)")
    return Saved(payload, CompileArtifacts(
        file=file, size_bytes=len(payload), sha256=hashlib.sha256(payload).hexdigest(),
        torch_version=data["torch_version"], device_name=data["device_name"],
        graphs_key=data["graphs_key"], entries=data["entries"], compile_s=result.warmup_s,
        cache_hits=data["cache_hits"], cache_misses=data["cache_misses"])), ""


def _save(request: dict[str, Any]) -> dict[str, Any]:
    """The child: the winner's step (compiled), then its cache entries to ``request["out"]``."""
    import torch

    from autotune.builtin_workloads import load_workload
    from autotune.step import apply_to_model
    from autotune.trial import run_trial

    spec = from_json_dict(TrialSpec, request["spec"])
    result = run_trial(spec)
    reply: dict[str, Any] = {"result": to_json_dict(result)}
    if not result.ok:
        return reply
    save = getattr(getattr(torch, "compiler", None), "save_cache_artifacts", None)
    if save is None:
        return {**reply, "unsaved": f"torch {torch.__version__} has no "
                "torch.compiler.save_cache_artifacts (2.7 or later has)"}
    hits, misses = compile_cache_counts()
    saved = save()
    if saved is None:
        return {**reply, "unsaved": "torch recorded no cache entry (inductor's caches off?)"}
    data, info = saved
    tmp = request["out"] + ".tmp"
    Path(tmp).write_bytes(data)
    os.replace(tmp, request["out"])
    torch.manual_seed(spec.seed)  # the model as the run compiled it: its parameters' names
    workload = load_workload(spec.workload, spec.device)
    model = apply_to_model(workload.build_model(), spec.knobs, workload.blocks)
    return {**reply, "torch_version": torch.__version__, "device_name": device_name(spec.device),
            "graphs_key": graphs_key(model, request["settings"]),
            "entries": {kind: len(keys) for kind, keys in info.artifacts.items() if keys},
            "cache_hits": hits, "cache_misses": misses}


if __name__ == "__main__":
    child_main(_save)
