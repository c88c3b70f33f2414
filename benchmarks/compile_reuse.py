"""What a second compile costs in the same process: the slow causal LM (``workloads.slow_gpt2``)
compiled with torch.compile's defaults, one optimizer step per micro-batch given, each twice
(the first pays the compile), with an empty inductor cache of its own.

Whether one child measuring several micro-batches of a compiled class would spare compiles
(issue 18). torch.compile's default (``dynamic=None``) compiles a second shape with dynamic
shapes; the search compiles each micro-batch in a child of its own (the same default: its one
shape compiles static).
Run: ``python benchmarks/compile_reuse.py 8 16 8`` (about 2.5 minutes on 2 CPUs).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile-reuse-")

import torch
import workloads


def main(sizes: list[int]) -> None:
    workload = workloads.slow_gpt2()
    model = workload.build_model()
    optimizer = torch.optim.AdamW(model.parameters())
    compiled = torch.compile(model)

    def step(micro_batch: int) -> float:
        start = time.perf_counter()
        compiled(**workload.make_batch(micro_batch)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - start

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    for m in sizes:
        first, second = step(m), step(m)
        print(f"micro-batch {m}: first step {first:.1f} s (compile included), "
              f"second {second:.1f} s")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [8, 16, 8])
