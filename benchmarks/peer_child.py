"""Run one peer batch-size finder in this process, under the cap autotune's runner applies.

Lightning's ``Tuner.scale_batch_size`` and Accelerate's ``find_executable_batch_size`` search
in-process, so each runs here in its own child: torch, the peer and the workload are imported,
the thread pool is started, then ``RLIMIT_AS`` is set to the measured address space plus the
budget (as ``autotune.trial._Memory`` does). Writes a JSON line to ``--out``.

Usage: ``python benchmarks/peer_child.py --workload FILE.py:FACTORY --peer accelerate
--budget-bytes N --target 64 --out result.json``
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
import traceback
from pathlib import Path

import torch

from autotune.builtin_workloads import load_workload
from autotune.config import WorkloadSpec
from autotune.workload import Workload

PEERS = ("lightning-power", "lightning-binsearch", "accelerate")
TRIED: list[int] = []
"""Batch sizes the peer tried, in order (kept when the peer raises)."""


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))


def apply_cap(budget_bytes: int) -> int:
    """Cap the address space at what it is now plus the budget; return the baseline."""
    torch.ones(64, 64) @ torch.ones(64, 64)  # thread pool stacks count in the baseline
    baseline = _vm_size()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (baseline + budget_bytes, hard))
    return baseline


def run_accelerate(workload: Workload, target: int, budget_bytes: int) -> dict:
    """``find_executable_batch_size`` from the target down, training as Accelerate's
    ``automatic_gradient_accumulation`` example does: accumulation = target // batch size."""
    from accelerate.utils import find_executable_batch_size

    tried = TRIED

    @find_executable_batch_size(starting_batch_size=target)
    def train(batch_size: int) -> int:
        tried.append(batch_size)
        torch.manual_seed(0)
        model = workload.build_model()
        optimizer = workload.make_optimizer(model.parameters())
        accumulate = max(1, target // batch_size)
        for _ in range(2):  # optimizer state appears at the first step
            for _ in range(accumulate):
                loss = workload.compute_loss(model, workload.make_batch(batch_size)) / accumulate
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return batch_size

    apply_cap(budget_bytes)
    start = time.perf_counter()
    found = train()
    return {"found": found, "tried": tried, "search_s": time.perf_counter() - start}


class _Rows(torch.utils.data.Dataset):
    def __init__(self, batch: object) -> None:
        self.batch = batch
        first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
        self.length = len(first)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> object:
        if isinstance(self.batch, dict):
            return {k: v[i] for k, v in self.batch.items()}
        return tuple(v[i] for v in self.batch)


def run_lightning(workload: Workload, target: int, budget_bytes: int, mode: str) -> dict:
    """``Tuner(trainer).scale_batch_size(mode=...)`` with its defaults (init 2, 3 steps/trial)."""
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    tried = TRIED
    data = _Rows(workload.make_batch(8 * target))

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = workload.build_model()
            self.batch_size = 2

        def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
            rows = len(next(iter(batch.values())) if isinstance(batch, dict) else batch[0])
            if not tried or tried[-1] != rows:
                tried.append(rows)
            return workload.compute_loss(self.model, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return workload.make_optimizer(self.parameters())

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

    torch.manual_seed(0)
    module = Module()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tempfile.mkdtemp())
    apply_cap(budget_bytes)
    start = time.perf_counter()
    found = Tuner(trainer).scale_batch_size(module, mode=mode)
    return {"found": found, "tried": tried, "search_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True, help="FILE.py:FACTORY")
    parser.add_argument("--peer", required=True, choices=PEERS)
    parser.add_argument("--budget-bytes", type=int, required=True)
    parser.add_argument("--target", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    workload = load_workload(WorkloadSpec(kind="file", target=args.workload), "cpu")
    start = time.perf_counter()
    try:
        if args.peer == "accelerate":
            result = run_accelerate(workload, args.target, args.budget_bytes)
        else:
            result = run_lightning(workload, args.target, args.budget_bytes,
                                   args.peer.removeprefix("lightning-"))
        result["status"] = "ok"
    except BaseException as exc:  # the peer gave up or did not recognize the OOM
        result = {"status": "error", "found": None, "tried": TRIED,
                  "search_s": time.perf_counter() - start,
                  "message": f"{type(exc).__name__}: {exc}"[:500],
                  "traceback": traceback.format_exc()[-1500:]}
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
