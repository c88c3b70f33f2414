"""The compile scope knob (issue 49): ``model`` compiles the whole model, ``blocks`` each
repeated block on its own (regional compilation), in the trial, the script and ``Tuned``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autotune import step
from autotune.knobs import KNOB, Knobs, KnobUnsupported, WorkloadTraits, meaningful, skip_reason
from autotune.workload import TinyGPT, default_workload


def tiny(seed: int = 0, num_layers: int = 3) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(vocab_size=64, seq_len=16, dim=32, num_layers=num_layers, num_heads=2)


def batches(n: int) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(7)
    ids = [torch.randint(0, 64, (2, 16)) for _ in range(n)]
    return [{"input_ids": i, "labels": i} for i in ids]


def train(scope: str, steps: int = 3) -> tuple[list[float], nn.Module]:
    """``steps`` optimizer steps of the one step (``step.train_step``) on a fixed seed."""
    torch._dynamo.reset()
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stepped = step.compile_model(model, "default", scope=scope)
    workload = default_workload("cpu")
    losses = [float(step.train_step(stepped, optimizer, [b], workload, precision="fp32",
                                    device_type="cpu")) for b in batches(steps)]
    return losses, stepped


@pytest.mark.subprocess  # inductor runs the C++ compiler
def test_blocks_scope_compiles_each_block_and_trains_as_model_scope() -> None:
    """``blocks`` compiles every block's forward in place (the model itself is not wrapped,
    its parameter names unchanged) and the blocks share their compiled graphs: fewer graphs
    than blocks. The losses of 3 steps on a fixed seed equal ``model`` scope's within 1e-4
    relative (float32 on CPU: the two compile different fusions, so the last bits differ)."""
    from torch._dynamo.utils import counters

    counters.clear()
    blocks_losses, regional = train("blocks")
    graphs = counters["stats"]["unique_graphs"]
    assert not hasattr(regional, "_orig_mod")
    assert all(hasattr(b.forward, "_torchdynamo_orig_callable") for b in regional.blocks)
    assert not hasattr(regional.forward, "_torchdynamo_orig_callable")  # the rest is eager
    assert 1 <= graphs < len(regional.blocks), graphs
    assert list(dict(regional.named_parameters())) == list(dict(tiny().named_parameters()))

    model_losses, whole = train("model")
    assert hasattr(whole, "_orig_mod")
    assert blocks_losses == pytest.approx(model_losses, rel=1e-4)
    assert blocks_losses[-1] < blocks_losses[0]  # it trains


@pytest.mark.subprocess  # inductor runs the C++ compiler
def test_blocks_scope_composes_with_checkpointing() -> None:
    """Checkpointed blocks (``apply_to_model`` first) are compiled with the checkpoint
    inside: the same loss as eager checkpointed blocks, within 1e-4 relative."""
    torch._dynamo.reset()
    eager, compiled = tiny(), tiny()
    for model in (eager, compiled):
        step.apply_to_model(model, Knobs(checkpointing="blocks"))
    step.compile_model(compiled, "default", scope="blocks")
    batch = batches(1)[0]
    want, got = eager(**batch), compiled(**batch)
    got.backward()
    assert float(got) == pytest.approx(float(want), rel=1e-4)
    assert all(p.grad is not None for p in compiled.parameters())


def test_blocks_scope_without_repeated_blocks_is_unsupported_with_the_reason() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(KnobUnsupported, match="no repeated blocks to compile one by one"):
        step.compile_model(model, "default", scope="blocks")
    why = skip_reason(Knobs(compile_mode="default", compile_scope="blocks"),
                      WorkloadTraits(num_blocks=1))
    assert why is not None and why.startswith("compile_scope blocks: no repeated blocks")
    assert skip_reason(Knobs(compile_mode="default", compile_scope="blocks"),
                       WorkloadTraits(num_blocks=2)) is None


def test_eager_settings_never_carry_a_blocks_scope() -> None:
    """With compile_mode off the scope means nothing: the space holds no off+blocks twin of
    off (``meaningful``), and the search is told why it skips one (``skip_reason``)."""
    assert meaningful(Knobs(compile_scope="blocks")) == Knobs()
    assert meaningful(Knobs(compile_mode="default", compile_scope="blocks")).compile_scope == (
        "blocks")
    assert "compile_mode off compiles nothing" in (skip_reason(Knobs(compile_scope="blocks"),
                                                               None) or "")
    assert step.compile_model(tiny(), "off", scope="blocks").forward.__name__ == "forward"
    assert KNOB["compile_scope"].by_default is None  # both values tried where they apply
