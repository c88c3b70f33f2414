"""Run by test_codegen under torchrun: the generated train_step on DDP ranks; saves gradients."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from one_truth import GradRecorder, TinyLM, load_script, token_batches
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    script, out = Path(sys.argv[1]), Path(sys.argv[2])
    generated = load_script(script)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(TinyLM().double())
    batches = token_batches(True, num_micro_batches=2 * world_size)[2 * rank:2 * rank + 2]
    recorder = GradRecorder(model)
    generated.train_step(model, recorder, torch.amp.GradScaler("cpu", enabled=False), batches,
                         torch.autocast("cpu", enabled=False))
    grads = {name.removeprefix("module."): g for name, g in recorder.grads.items()}
    torch.save(grads, out / f"rank{rank}.pt")
    # The DDP model freed before the group goes: torn down at interpreter exit, gloo's worker
    # threads wait for the lock the exiting main thread holds (a hang, 2 runs in 8).
    del model, recorder
    gc.collect()
    # Every rank done before any tears gloo down: a rank that destroys its group while a peer
    # still talks to it aborts ("terminate called without an active exception"), 1 run in ~12.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
