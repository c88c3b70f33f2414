"""Your own PyTorch loop with the tuned config: ``autotune.load`` instead of a generated script.

    autotune search --target-batch 64 --workload examples/my_workload.py:workload
    python examples/train_plain.py --config autotune.json --steps 100
"""

from __future__ import annotations

import argparse

import torch
from my_workload import workload  # next to this file: python puts its folder on sys.path

import autotune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="autotune.json")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    args = parser.parse_args()

    cfg = autotune.load(args.config)  # checks the schema and the world size
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg.set_matmul_precision()
    work = workload()
    torch.manual_seed(0)
    # Checkpointing and memory format change the model; the optimizer is rebuilt as the tuned
    # implementation (same groups and hyper-parameters): the knobs the search measured.
    model = cfg.apply(work.build_model().to(device), blocks=work.blocks)
    optimizer = cfg.build_optimizer(work.make_optimizer(model.parameters()))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    compiled = cfg.compile(model)  # same parameters as model; save model, not compiled
    print(f"{cfg} on {device}")

    for step in range(1, args.steps + 1):
        micro_batches = [cfg.batch(tuple(t.to(device) for t in work.make_batch(cfg.micro_batch)))
                         for _ in range(cfg.accumulate_steps)]
        # Autocast, loss normalization over the effective batch, GradScaler for fp16, one
        # optimizer step: the step the search measured.
        loss = cfg.train_step(compiled, optimizer, micro_batches, work)
        scheduler.step()  # once per optimizer step
        print(f"step {step}/{args.steps} | loss {loss.item():.4f}")
    torch.save(model.state_dict(), args.checkpoint)
    print(f"saved {args.checkpoint}")


if __name__ == "__main__":
    main()
