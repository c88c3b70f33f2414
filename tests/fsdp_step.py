"""Run by test_codegen under torchrun: the generated script's FSDP2 wrap (``parallelize``) and
``train_step`` on gloo ranks, in float64; saves each strategy's full gradients per rank."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from tests.one_truth import BlockLM, GradRecorder, load_script, token_batches

STRATEGIES = ("fsdp", "fsdp-no-reshard")


class ShardedLM(BlockLM):
    """A float64-clean causal LM with two repeated blocks: FSDP shards each, then the root."""

    def __init__(self, vocab_size: int = 64, dim: int = 16) -> None:
        super().__init__(vocab_size, dim, num_blocks=2)


class FullGradRecorder(GradRecorder):
    """Keeps the full gradients: each rank holds a shard; ``full_tensor`` gathers them (a
    collective, in the same parameter order on every rank)."""

    def step(self) -> None:
        self.grads = {n: p.grad.full_tensor().clone() for n, p in self.model.named_parameters()}


def main() -> None:
    script, out = Path(sys.argv[1]), Path(sys.argv[2])
    generated = load_script(script)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batches = token_batches(True, num_micro_batches=2 * world_size)[2 * rank:2 * rank + 2]
    for strategy in STRATEGIES:
        torch.manual_seed(0)
        model = generated.parallelize(ShardedLM().double(), strategy, "fp32", "cpu")
        sharded = [name for name, module in model.named_modules()
                   if isinstance(module, FSDPModule)]
        assert sharded == ["", "blocks.0", "blocks.1"], sharded
        local = {n: p.to_local().shape[0] for n, p in model.named_parameters()}
        assert local["head.weight"] == 64 // world_size, local  # sharded, not replicated
        recorder = FullGradRecorder(model)
        generated.train_step(model, recorder, torch.amp.GradScaler("cpu", enabled=False),
                             batches, torch.autocast("cpu", enabled=False))
        torch.save(recorder.grads, out / f"{strategy}-rank{rank}.pt")
    # FSDP's modules hold the group: freed before it is destroyed (as the generated script
    # does), and every rank done before any tears gloo down.
    del model, recorder
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
