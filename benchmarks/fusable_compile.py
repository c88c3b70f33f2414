"""The test workload ``Fusable`` (tests/workloads.py): eager against compiled step time, and the
compiled model's first step with an empty inductor cache (the cold compile a compiled winner's
first-launch check pays), for a chain of N elementwise ops over an activation R times the
input's width.

Run: ``python benchmarks/fusable_compile.py N R`` (each in a fresh process: the cache folder is
made empty for it). The figures in ``Fusable``'s docstring: ``16 16`` (the old workload) and
``8 128`` (2026-11-29), ``2 128`` (today's, 2026-11-30), on the 2-core Xeon.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", type=int, help="elementwise ops in the chain (N)")
    parser.add_argument("repeat", type=int, help="activation width over the input's (R)")
    args = parser.parse_args()
    if not (1 <= args.ops <= 64 and 1 <= args.repeat <= 1024):
        parser.error(f"ops {args.ops}, repeat {args.repeat}: ops from 1 to 64, repeat 1 to 1024")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="fusable-cold-")
    import torch
    from torch import nn

    sys.path.insert(0, str(REPO))
    from tests.workloads import IN_DIM, _batch

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(IN_DIM, IN_DIM)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            h = self.proj(x).repeat(1, 1, args.repeat)
            for _ in range(args.ops):
                h = torch.sin(h) * 0.9 + h * 0.1
            return nn.functional.mse_loss(h[..., :IN_DIM], y)

    def bench(model: nn.Module) -> tuple[float, float]:
        opt = torch.optim.SGD(model.parameters(), 0.01)
        batch = _batch(4)
        start = time.perf_counter()
        model(*batch).backward()
        first = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(5):
            opt.zero_grad()
            model(*batch).backward()
            opt.step()
        return first, (time.perf_counter() - start) / 5

    torch.manual_seed(0)
    eager, compiled = bench(Chain()), bench(torch.compile(Chain()))
    print(f"ops {args.ops}, repeat {args.repeat}: eager step {eager[1] * 1e3:.1f} ms; compiled "
          f"first step (cold compile) {compiled[0]:.1f} s, step {compiled[1] * 1e3:.1f} ms; "
          f"compiled {eager[1] / compiled[1]:.2f}x eager")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
