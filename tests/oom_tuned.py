"""Run by test_fallback: ``Tuned.train_step(oom_fallback=True)`` over workloads_oom's growing
sequences (under the cap its environment sets), alone or as a rank under torchrun; rank 0
saves the model and says how far it fell back."""

from __future__ import annotations

import gc
import os
import sys

import torch
import torch.distributed as dist
from workloads_oom import workload

import autotune
from autotune import step


def main() -> None:
    config, out = sys.argv[1], sys.argv[2]
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    work = workload()
    cfg = autotune.load(config)
    model = cfg.parallelize(cfg.apply(work.build_model()))
    optimizer = cfg.build_optimizer(work.make_optimizer(model.parameters()))
    for _ in range(4):
        micro_batches = [work.make_batch(cfg.micro_batch) for _ in range(cfg.accumulate_steps)]
        cfg.train_step(model, optimizer, micro_batches, work, oom_fallback=True)
    if not distributed or dist.get_rank() == 0:
        torch.save({"model": step.unwrapped(model).state_dict()}, out)
        fell = cfg.fallback
        print(f"fallbacks {fell.fallbacks if fell else 0}, micro-batch "
              f"{fell.micro_batch if fell and fell.micro_batch else cfg.micro_batch}")
    if distributed:
        del model, optimizer
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
