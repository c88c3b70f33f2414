"""Small workloads for the estimator benchmark (``file.py:factory`` targets)."""

from __future__ import annotations

import functools

import torch
from torch import nn

import autotune


def tiny_hf_gpt2() -> autotune.Workload:
    """A 2-layer GPT-2 (Hugging Face), width 128, 128 tokens, dropout as published."""
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=128,
                                     vocab_size=2048, bos_token_id=0, eos_token_id=0)

    def make_batch(micro_batch: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 2048, (micro_batch, 128))
        return {"input_ids": ids, "labels": ids}

    return autotune.Workload(name="tiny-hf-gpt2", build_model=lambda: (
        transformers.GPT2LMHeadModel(config)), make_batch=make_batch, tokens_per_sample=128)


def tiny_bert() -> autotune.Workload:
    """A 2-layer BERT masked LM, width 128, 128 tokens."""
    import transformers

    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=128,
                                     num_attention_heads=4, intermediate_size=512,
                                     vocab_size=2048, max_position_embeddings=128)

    def make_batch(micro_batch: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 2048, (micro_batch, 128))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    return autotune.Workload(name="tiny-bert", build_model=lambda: (
        transformers.BertForMaskedLM(config)), make_batch=make_batch, tokens_per_sample=128)


def small_cnn() -> autotune.Workload:
    """A small ResNet-like CNN on 64x64 images, 10 classes."""
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))

    def build() -> nn.Module:
        return nn.Sequential(block(3, 32), block(32, 64), block(64, 128),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))

    return autotune.Workload(
        name="small-cnn", build_model=build,
        make_batch=lambda m: (torch.randn(m, 3, 64, 64), torch.randint(0, 10, (m,))),
        loss=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]))


def null() -> autotune.Workload:
    """One parameter, one number per sample: what a training step costs the process itself."""
    return autotune.Workload(
        name="null", build_model=lambda: nn.Linear(1, 1),
        make_batch=lambda m: torch.randn(m, 1),
        loss=lambda model, batch: model(batch).square().mean())


# Smaller still, for the search benchmark (benchmarks/search_quality.py, benchmarks/peers.py):
# hundreds of child runs and a few dozen inductor compiles must fit in about 25 minutes of a
# shared 2-core CPU.
_PICK_SEQ, _PICK_VOCAB = 64, 1024


def _lm_batch(micro_batch: int, mask: bool) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, _PICK_VOCAB, (micro_batch, _PICK_SEQ))
    batch = {"input_ids": ids, "labels": ids}
    if mask:
        batch["attention_mask"] = torch.ones_like(ids)
    return batch


def pick_gpt2() -> autotune.Workload:
    """A 2-layer GPT-2 causal LM (Hugging Face), width 64, 64 tokens, vocab 1024."""
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=_PICK_SEQ,
                                     vocab_size=_PICK_VOCAB, bos_token_id=0, eos_token_id=0)
    return autotune.Workload(
        name="pick-gpt2", build_model=lambda: transformers.GPT2LMHeadModel(config),
        make_batch=lambda m: _lm_batch(m, mask=False), tokens_per_sample=_PICK_SEQ)


def pick_bert() -> autotune.Workload:
    """A 2-layer BERT masked LM (Hugging Face), width 64, 64 tokens, vocab 1024."""
    import transformers

    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                                     intermediate_size=256, vocab_size=_PICK_VOCAB,
                                     max_position_embeddings=_PICK_SEQ)
    return autotune.Workload(
        name="pick-bert", build_model=lambda: transformers.BertForMaskedLM(config),
        make_batch=lambda m: _lm_batch(m, mask=True), tokens_per_sample=_PICK_SEQ)


def pick_cnn() -> autotune.Workload:
    """A plain-torch CNN (three conv blocks with batch norm) on 32x32 images, 10 classes."""
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))

    def build() -> nn.Module:
        return nn.Sequential(block(3, 16), block(16, 32), block(32, 64),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    return autotune.Workload(
        name="pick-cnn", build_model=build,
        make_batch=lambda m: (torch.randn(m, 3, 32, 32), torch.randint(0, 10, (m,))),
        loss=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]))


# The checkpointing workload of the knob benchmark: deep and narrow with a long sequence, so
# the blocks' activations (about 16 x seq x width floats per block and sample) dominate memory
# and checkpointing them frees most of it. ``deep_gpt_cap_bytes`` (search_quality.py's cap for
# it, measured on the machine) sits between fp32 eager's peaks at micro-batches 4 and 8:
# without checkpointing 4 is its largest fit under the cap, with ``checkpointing=blocks`` 16
# fits.
_DEEP_SEQ, _DEEP_VOCAB, _DEEP_WIDTH, _DEEP_LAYERS = 256, 128, 64, 6


def pick_deep_gpt() -> autotune.Workload:
    """A plain-torch GPT (``autotune.builtin_workloads.TinyGPT``): 6 blocks, width 64, 256 tokens,
    vocab 128: activations dominate its memory (the checkpointing workload)."""
    from autotune.builtin_workloads import TinyGPT, causal_lm_label_count

    def make_batch(micro_batch: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, _DEEP_VOCAB, (micro_batch, _DEEP_SEQ))
        return {"input_ids": ids, "labels": ids}

    return autotune.Workload(
        name="pick-deep-gpt",
        build_model=lambda: TinyGPT(vocab_size=_DEEP_VOCAB, seq_len=_DEEP_SEQ, dim=_DEEP_WIDTH,
                                    num_layers=_DEEP_LAYERS, num_heads=2),
        make_batch=make_batch, loss=lambda model, batch: model(**batch),
        count_loss_items=causal_lm_label_count, tokens_per_sample=_DEEP_SEQ)


DEEP_GPT_HEADROOM = 0.1


@functools.cache
def deep_gpt_cap_bytes() -> int:
    """The memory cap of ``pick_deep_gpt`` in the search benchmark, measured on this machine:
    its usable budget (the cap less 10% headroom) sits midway between fp32 eager's peak at
    micro-batch 8 and the larger of fp32 eager's at 4 and ``checkpointing=blocks``' at 16
    (three uncapped probe runs at per-device batch 16). So micro-batch 8 needs checkpointing
    to fit, on any CPU: the peaks are not the same everywhere (AMD EPYC: 35.2, 61.2 and 34.7
    MiB, a cap of about 53.6 MiB; the first knob benchmarks there ran under 50 MiB; Intel Xeon with
    AMX: 57.9, 92.9 and 66.9 MiB, a cap of 88.6 MiB).

    Raises:
        RuntimeError: a run failed, or checkpointing does not free enough memory for the
            workload to need it (no cap separates the peaks by 10% on each side).
    """
    from autotune.knobs import BASELINE, Knobs
    from autotune.memory import probe_spec
    from autotune.runner import run_isolated

    spec = autotune.WorkloadSpec(kind="file", target=f"{__file__}:pick_deep_gpt")

    def peak(knobs: Knobs, micro_batch: int) -> int:
        result = run_isolated(probe_spec(spec, "cpu", knobs, micro_batch, None, 300,
                                         per_device_batch=16))
        if not result.ok or not result.peak_bytes:
            raise RuntimeError(f"pick_deep_gpt {knobs.label()} at {micro_batch}: "
                               f"{result.status} {result.message[:300]}")
        return result.peak_bytes

    fits = max(peak(BASELINE, 4), peak(Knobs(checkpointing="blocks"), 16))
    too_big = peak(BASELINE, 8)
    if fits * 1.1 > too_big / 1.1:
        raise RuntimeError(f"pick_deep_gpt: fp32 eager at 8 peaks at {too_big / 2**20:.1f} MiB, "
                           f"too close to {fits / 2**20:.1f} MiB (fp32 eager at 4, "
                           "checkpointing at 16) for a cap between them")
    return int((fits + too_big) / 2 / (1 - DEEP_GPT_HEADROOM))


# Slow-step workloads for the search benchmark (target 64): memory binds (under its cap fp32
# eager fits micro-batch 8 of 64, bf16 eager 8 or 16) and one optimizer step of 64 samples
# takes seconds on the 2-core CPU, so a pick's throughput differences weigh more than a child's
# own start-up cost. Measured figures beside each cap: ``probe_spec`` children (2 warm-up steps
# of 2 accumulated micro-batches; peak = address-space growth over the child's baseline;
# timed: 3 steps at per-device batch 64), 2-core AMD EPYC, torch 2.13 CPU, quiet machine.
# With another process busy on one core the steps took 2-4x as long.
_SLOW_SEQ, _SLOW_VOCAB, _SLOW_WIDTH, _SLOW_LAYERS, _SLOW_HEADS = 128, 8192, 256, 4, 4


def _slow_lm_batch(micro_batch: int, mask: bool) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, _SLOW_VOCAB, (micro_batch, _SLOW_SEQ))
    batch = {"input_ids": ids, "labels": ids}
    if mask:
        batch["attention_mask"] = torch.ones_like(ids)
    return batch


def slow_gpt2() -> autotune.Workload:
    """A 4-layer GPT-2 causal LM (Hugging Face), width 256, 4 heads, 128 tokens, vocab 8192
    (5.3M parameters)."""
    import transformers

    config = transformers.GPT2Config(n_layer=_SLOW_LAYERS, n_embd=_SLOW_WIDTH,
                                     n_head=_SLOW_HEADS, n_positions=_SLOW_SEQ,
                                     vocab_size=_SLOW_VOCAB, bos_token_id=0, eos_token_id=0)
    return autotune.Workload(
        name="slow-gpt2", build_model=lambda: transformers.GPT2LMHeadModel(config),
        make_batch=lambda m: _slow_lm_batch(m, mask=False), tokens_per_sample=_SLOW_SEQ)


SLOW_GPT2_CAP_BYTES = 480 * 2**20
"""The memory cap of ``slow_gpt2`` (usable 432 MiB with 10% headroom). fp32 eager peaks:
213.0 MiB at micro-batch 4, 335.3 at 8, 578.5 at 16, 1064.9 at 32; bf16 eager: 305.2 at 8,
497.8 at 16, 882.9 at 32; fp32 eager with ``checkpointing=blocks`` (capped): 297.9 at 16, oom
at 32. So fp32 and bf16 eager fit 8, checkpointing 16. fp32 eager at 8 (capped, 335.8 MiB):
3.39-3.41 s per step of 64 samples."""


def slow_bert() -> autotune.Workload:
    """A 4-layer BERT masked LM (Hugging Face), width 256, 4 heads, 128 tokens, vocab 8192
    (5.4M parameters)."""
    import transformers

    config = transformers.BertConfig(num_hidden_layers=_SLOW_LAYERS, hidden_size=_SLOW_WIDTH,
                                     num_attention_heads=_SLOW_HEADS,
                                     intermediate_size=4 * _SLOW_WIDTH, vocab_size=_SLOW_VOCAB,
                                     max_position_embeddings=_SLOW_SEQ)
    return autotune.Workload(
        name="slow-bert", build_model=lambda: transformers.BertForMaskedLM(config),
        make_batch=lambda m: _slow_lm_batch(m, mask=True), tokens_per_sample=_SLOW_SEQ)


SLOW_BERT_CAP_BYTES = 440 * 2**20
"""The memory cap of ``slow_bert`` (usable 396 MiB with 10% headroom). fp32 eager peaks:
192.2 MiB at micro-batch 4, 292.0 at 8, 490.1 at 16, 886.5 at 32; bf16 eager: 284.7 at 8,
458.9 at 16, 807.2 at 32; fp32 eager with ``checkpointing=blocks`` (capped): 305.8 at 16, oom
at 32. So fp32 and bf16 eager fit 8, checkpointing 16. fp32 eager at 8 (capped, 292.4 MiB):
2.88-2.93 s per step of 64 samples."""


_SLOW_IMAGE = 128


def slow_cnn() -> autotune.Workload:
    """A plain-torch CNN (four blocks of two convs with batch norm, 32 to 128 channels) on
    128x128 images, 10 classes (0.6M parameters)."""
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))

    def build() -> nn.Module:
        return nn.Sequential(block(3, 32), block(32, 64), block(64, 128), block(128, 128),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))

    return autotune.Workload(
        name="slow-cnn", build_model=build,
        make_batch=lambda m: (torch.randn(m, 3, _SLOW_IMAGE, _SLOW_IMAGE),
                              torch.randint(0, 10, (m,))),
        loss=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]))


SLOW_CNN_CAP_BYTES = 270 * 2**20
"""The memory cap of ``slow_cnn`` (usable 243 MiB with 10% headroom). fp32 eager peaks:
95.8 MiB at micro-batch 4, 167.7 at 8 (175.7 when timing 8 accumulated), 308.5 at 16, 593.4
at 32; bf16 eager: 115.1 at 8, 195.1 at 16, 355.6 at 32; fp32 eager with
``checkpointing=blocks`` (capped): 222.0 at 16, oom at 32. So fp32 eager fits 8, bf16 eager
16, checkpointing 16 (by 9% only). fp32 eager at 8 (capped): 2.55-2.59 s per step of 64
samples."""


# A variable-length causal LM (issue 48): real lengths from a skewed (log-normal) distribution,
# most batches well under the worst case.
VARLEN_SEQ = 256
VARLEN_VOCAB = 1024


def varlen_lengths(count: int = 2000, seed: int = 48) -> list[int]:
    """``count`` lengths, log-normal (median 48 tokens, sigma 0.8), clipped to 8..256."""
    import random

    rng = random.Random(seed)
    return [min(VARLEN_SEQ, max(8, round(rng.lognormvariate(3.87, 0.8)))) for _ in range(count)]


def _varlen_batch(micro_batch: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VARLEN_VOCAB, (micro_batch, length))
    return {"input_ids": ids, "labels": ids}


def varlen_gpt() -> autotune.Workload:
    """A GPT in plain torch (4 layers, width 256, 4 heads, 256 tokens at worst, vocab 1024)
    fed batches whose lengths follow ``varlen_lengths``."""
    from autotune.builtin_workloads import TinyGPT, causal_lm_label_count

    return autotune.Workload(
        name="varlen-gpt",
        build_model=lambda: TinyGPT(vocab_size=VARLEN_VOCAB, seq_len=VARLEN_SEQ, dim=256,
                                    num_layers=4, num_heads=4),
        make_batch=_varlen_batch, loss=lambda model, batch: model(**batch),
        count_loss_items=causal_lm_label_count, tokens_per_sample=VARLEN_SEQ,
        lengths=varlen_lengths)
