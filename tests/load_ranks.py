"""Run by test_ranks under torchrun: ``autotune.load`` of a tuned fsdp config on 2 gloo ranks,
``cfg.parallelize`` and one tuned step over the shards; writes what it saw per rank."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

import autotune
from tests.one_truth import BlockLM, token_batches


def main() -> None:
    config, out = Path(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo")
    cfg = autotune.load(config)
    torch.manual_seed(0)
    model = cfg.parallelize(cfg.apply(BlockLM()))
    optimizer = cfg.build_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    before = model.head.weight.full_tensor().clone()
    for batch in token_batches(False, num_micro_batches=cfg.accumulate_steps):
        (model(**batch) / cfg.accumulate_steps).backward()
    optimizer.step()
    seen = {"sharded": [isinstance(m, FSDPModule) for m in (model, *model.blocks)],
            "local_rows": model.head.weight.to_local().shape[0],
            "full_rows": model.head.weight.full_tensor().shape[0],
            "moved": not torch.equal(before, model.head.weight.full_tensor())}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen))
    # As README says a user's script ends: FSDP's modules hold the process group, so they are
    # freed before it is destroyed (left to the interpreter's exit, a gloo thread can still be
    # freeing a collective's tensors and the rank aborts: 1 run in ~15 without this).
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
