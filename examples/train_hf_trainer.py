"""Hugging Face Trainer with the tuned config: ``cfg.training_arguments()``.

    autotune search --target-batch 64 --model path/to/model_dir
    python examples/train_hf_trainer.py --config autotune.json --steps 100

The model here is a tiny GPT-2 built from a config (random weights, nothing downloaded) and
the data random tokens: swap in your model and dataset.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
import transformers

import autotune

SEQ_LEN = 32


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, num_samples: int, vocab_size: int) -> None:
        self.ids = torch.randint(0, vocab_size, (num_samples, SEQ_LEN))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="autotune.json")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--output-dir", default=None, help="default: a temporary folder")
    args = parser.parse_args()

    cfg = autotune.load(args.config)
    model_config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256,
                                           n_positions=SEQ_LEN)
    model = transformers.GPT2LMHeadModel(model_config)
    samples = args.steps * cfg.micro_batch * cfg.accumulate_steps
    training_args = transformers.TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="autotune-hf-"),
        max_steps=args.steps,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        **cfg.training_arguments(),  # micro-batch, accumulation, bf16/fp16/tf32, torch_compile
    )
    trainer = transformers.Trainer(model=model, args=training_args,
                                   train_dataset=RandomTokens(samples, model_config.vocab_size))
    result = trainer.train()
    print(f"trained {result.global_step} steps, loss {result.training_loss:.4f}")


if __name__ == "__main__":
    main()
