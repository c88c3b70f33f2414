"""Workload factories for the tests, loaded the user's way: ``tests/workloads.py:NAME``.

Each factory is imported inside the runner's child process, so misbehaviour (NaN, a crash, a
hang, a bad batch) happens where it would in real use.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterable

import torch
from torch import nn

from autotune import Workload

SEQ = 128
"""Rows per sample: every sample is SEQ vectors of width IN_DIM."""
IN_DIM = 8
HIDDEN = 4096
"""Wide hidden layer: one hidden activation is SEQ * HIDDEN * 4 bytes = 2 MiB per sample, while
the parameters stay under 0.3 MiB, so memory grows steeply and linearly with the micro-batch."""


class WideMLP(nn.Module):
    """Per-row MLP with a wide hidden layer; returns the mean squared error against ``y``."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(IN_DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, IN_DIM)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.down(nn.functional.gelu(self.up(x)))
        return nn.functional.mse_loss(out, y)


def _batch(micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(micro_batch, SEQ, IN_DIM), torch.randn(micro_batch, SEQ, IN_DIM)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return model(*batch)


def tiny() -> Workload:
    """A small model whose activations dominate memory (several MiB per sample)."""
    return Workload(name="tiny-wide-mlp", build_model=WideMLP, make_batch=_batch, loss=_loss)


def nan_loss() -> Workload:
    """The loss is NaN from the first step: the trial must say ``non_finite``."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return model(*batch) * float("nan")

    return Workload(name="nan-loss", build_model=WideMLP, make_batch=_batch, loss=loss)


def crash() -> Workload:
    """The child kills itself in the loss, as the kernel's OOM killer would."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGKILL)
        return model(*batch)  # pragma: no cover

    return Workload(name="crash", build_model=WideMLP, make_batch=_batch, loss=loss)


def removes_its_folder() -> Workload:
    """At micro-batch 1 the child's temporary folder (its request, output and result) is
    removed while it trains, as a $TMPDIR cleaner or another job would; other micro-batches
    train as ``tiny``."""

    def make_batch(micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        if micro_batch == 1:
            shutil.rmtree(os.path.dirname(sys.argv[2]), ignore_errors=True)
        return _batch(micro_batch)

    return Workload(name="removes-its-folder", build_model=WideMLP, make_batch=make_batch,
                    loss=_loss)


def hang() -> Workload:
    """make_batch never returns: only the runner's timeout ends the child."""

    def make_batch(micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(600)
        return _batch(micro_batch)  # pragma: no cover

    return Workload(name="hang", build_model=WideMLP, make_batch=make_batch, loss=_loss)


def bad_batch() -> Workload:
    """make_batch returns a list of ints, not tensors."""
    return Workload(name="bad-batch", build_model=WideMLP,
                    make_batch=lambda micro_batch: [1, 2, 3], loss=_loss)


def wrong_rows() -> Workload:
    """make_batch returns tensors whose first dimension is not the micro-batch."""
    return Workload(name="wrong-rows", build_model=WideMLP,
                    make_batch=lambda micro_batch: _batch(micro_batch + 1), loss=_loss)


def raises() -> Workload:
    """The factory itself fails."""
    raise ValueError("workload factory failed on purpose")


def not_a_workload() -> dict[str, str]:
    """The factory returns something that is not an autotune.Workload."""
    return {"name": "not a workload"}


def reads_values() -> Workload:
    """A loss that branches on a tensor's value: fake tensors cannot trace it, a real step can."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        value = model(*batch)
        return value if value.item() > 0 else -value

    return Workload(name="reads-values", build_model=WideMLP, make_batch=_batch, loss=loss)


class BrokenMLP(WideMLP):
    """WideMLP with a graph break in its forward: torch.compile makes two graphs of it."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = nn.functional.gelu(self.up(x))
        torch._dynamo.graph_break()
        return nn.functional.mse_loss(self.down(hidden), y)


def graph_break() -> Workload:
    """A model whose compiled forward has a graph break (eager code between two graphs)."""
    return Workload(name="graph-break", build_model=BrokenMLP, make_batch=_batch, loss=_loss)


def wrong_in_bf16() -> Workload:
    """A loss that is 50% off whenever the model runs in bf16: the numerics guard must catch it."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        out = model.down(nn.functional.gelu(model.up(x)))
        value = nn.functional.mse_loss(out.float(), y)
        return value * 1.5 if out.dtype == torch.bfloat16 else value

    return Workload(name="wrong-in-bf16", build_model=WideMLP, make_batch=_batch, loss=loss)


# ----------------------------------------------------------------------------------------------
# Fault injection: each misbehaves one way, and the outcome must name it.


def nan_at_step() -> Workload:
    """The loss becomes NaN from optimizer step 3 on (steps counted by the optimizer's hook)."""
    steps = {"done": 0}

    def build_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        optimizer.register_step_post_hook(lambda *_: steps.update(done=steps["done"] + 1))
        return optimizer

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        value = model(*batch)
        return value * float("nan") if steps["done"] >= 2 else value

    return Workload(name="nan-at-step", build_model=WideMLP, make_batch=_batch, loss=loss,
                    build_optimizer=build_optimizer)


def segfault() -> Workload:
    """The loss reads address 0: the child dies of SIGSEGV."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ctypes.string_at(0)
        return model(*batch)  # pragma: no cover

    return Workload(name="segfault", build_model=WideMLP, make_batch=_batch, loss=loss)


def exits_in_factory() -> Workload:
    """The factory calls sys.exit(0): a clean exit code, and no workload."""
    sys.exit(0)


def exits_in_loss() -> Workload:
    """The loss calls sys.exit(3)."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        sys.exit(3)

    return Workload(name="exits-in-loss", build_model=WideMLP, make_batch=_batch, loss=loss)


def slow_build() -> Workload:
    """build_model sleeps AUTOTUNE_TEST_SLOW_BUILD_S seconds (default 20) before returning."""

    def build_model() -> nn.Module:
        time.sleep(float(os.environ.get("AUTOTUNE_TEST_SLOW_BUILD_S", "20")))
        return WideMLP()

    return Workload(name="slow-build", build_model=build_model, make_batch=_batch, loss=_loss)


def returns_dict_model() -> Workload:
    """build_model returns a dict of layers, not an nn.Module."""
    return Workload(name="returns-dict-model",
                    build_model=lambda: {"up": nn.Linear(IN_DIM, HIDDEN)},  # type: ignore
                    make_batch=_batch, loss=_loss)


def float_loss() -> Workload:
    """The loss is a Python float (``.item()`` taken too early)."""
    return Workload(name="float-loss", build_model=WideMLP, make_batch=_batch,
                    loss=lambda model, batch: model(*batch).item())  # type: ignore


def vector_loss() -> Workload:
    """The loss is one value per sample, never reduced to a scalar."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        out = model.down(nn.functional.gelu(model.up(x)))
        return nn.functional.mse_loss(out, y, reduction="none").mean(dim=(1, 2))

    return Workload(name="vector-loss", build_model=WideMLP, make_batch=_batch, loss=loss)


def no_params() -> Workload:
    """Every parameter of the model is frozen: nothing to train."""
    return Workload(name="no-params", build_model=lambda: WideMLP().requires_grad_(False),
                    make_batch=_batch, loss=_loss)


LEAKED: list[torch.Tensor] = []
"""What the ``leak`` workload keeps alive, as a training script keeping its losses would."""
LEAK_FLOATS = 512 * 1024
"""Floats kept per micro-batch sample and loss call: 2 MiB, so 4 MiB per optimizer step at the
default accumulation of 2."""


def bare_error_at_cap() -> Workload:
    """Fills its address space to the cap, then fails with a bare ``SystemError``, as a C
    extension that cannot allocate may (inductor's compile under a tight CPU cap: "error
    return without exception set"): the run ran out of memory."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        held = []
        try:
            while True:
                held.append(bytearray(1 << 20))
        except MemoryError:
            held.clear()
        raise SystemError("error return without exception set")

    return Workload(name="bare-error-at-cap", build_model=WideMLP, make_batch=_batch, loss=loss)


def bare_error() -> Workload:
    """Fails with the same bare ``SystemError`` far under its cap: an error, not an OOM."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        raise SystemError("error return without exception set")

    return Workload(name="bare-error", build_model=WideMLP, make_batch=_batch, loss=loss)


def leak() -> Workload:
    """Every loss call keeps 2 MiB per sample alive in a module-level list: a probe of 2 warm-up
    steps fits, a longer run of the same micro-batch runs out of memory."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        LEAKED.append(torch.randn(batch[0].shape[0], LEAK_FLOATS))
        return model(*batch)

    return Workload(name="leak", build_model=WideMLP, make_batch=_batch, loss=loss)


class _Residual(nn.Module):
    """One repeated block: a wide per-row MLP with a residual connection."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(IN_DIM, HIDDEN // 4)
        self.down = nn.Linear(HIDDEN // 4, IN_DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


class DeepMLP(nn.Module):
    """Six residual blocks in a ModuleList: activations (1 MiB per block and sample, kept for
    backward) dominate memory, so checkpointing the blocks lets a larger micro-batch fit."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Residual() for _ in range(6))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return nn.functional.mse_loss(x, y)


def deep() -> Workload:
    """Repeated blocks whose activations bind memory: what activation checkpointing is for."""
    return Workload(name="deep-mlp", build_model=DeepMLP, make_batch=_batch, loss=_loss)


def deep_nan() -> Workload:
    """Repeated blocks (so checkpointing could free memory) and a loss that is NaN from the
    first step: broken under every knob."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return model(*batch) * float("nan")

    return Workload(name="deep-nan", build_model=DeepMLP, make_batch=_batch, loss=loss)


def deep_hang() -> Workload:
    """Repeated blocks and a loss that never returns: only the runner's timeout ends it."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        time.sleep(600)
        return model(*batch)  # pragma: no cover

    return Workload(name="deep-hang", build_model=DeepMLP, make_batch=_batch, loss=loss)


def deep_crash() -> Workload:
    """Repeated blocks (so checkpointing could free memory) and a process that dies (SIGKILL)
    in its first loss, whatever the micro-batch and the memory cap."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGKILL)
        return model(*batch)  # pragma: no cover

    return Workload(name="deep-crash", build_model=DeepMLP, make_batch=_batch, loss=loss)


def blocks_raise() -> Workload:
    """Workload.blocks raises: user code the knobs run."""
    def blocks(model: nn.Module) -> list[nn.Module]:
        raise ValueError("blocks failed on purpose")

    return Workload(name="blocks-raise", build_model=DeepMLP, make_batch=_batch, loss=_loss,
                    blocks=blocks)


def blocks_exit() -> Workload:
    """Workload.blocks calls sys.exit(0)."""
    def blocks(model: nn.Module) -> list[nn.Module]:
        sys.exit(0)

    return Workload(name="blocks-exit", build_model=DeepMLP, make_batch=_batch, loss=_loss,
                    blocks=blocks)


# -- jobs of several ranks (--nproc-per-node): a fault on one rank is the job's ------------------

def _on_rank(rank: int, calls: list[int], at_call: int) -> bool:
    """True on ``rank`` of a job at the ``at_call``-th loss computed there."""
    calls.append(1)
    return os.environ.get("RANK") == str(rank) and len(calls) == at_call


def rank_killed() -> Workload:
    """Rank 1 is killed (SIGKILL) in the middle of its third micro-batch."""
    calls: list[int] = []

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if _on_rank(1, calls, 3):
            os.kill(os.getpid(), signal.SIGKILL)
        return model(*batch)

    return Workload(name="rank-killed", build_model=WideMLP, make_batch=_batch, loss=loss)


def rank_oom() -> Workload:
    """Rank 1 runs out of memory (a real allocation over its cap) at its third micro-batch."""
    calls: list[int] = []

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if _on_rank(1, calls, 3):
            torch.ones(1 << 34, dtype=torch.uint8)  # 16 GiB: more than any test's cap
        return model(*batch)

    return Workload(name="rank-oom", build_model=WideMLP, make_batch=_batch, loss=loss)


def rank_raises() -> Workload:
    """Rank 1's loss raises at its third micro-batch (a bug in the user's code on one rank):
    its peers see only a broken connection in their next collective."""
    calls: list[int] = []

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if _on_rank(1, calls, 3):
            raise ValueError("rank one's loss failed on purpose")
        return model(*batch)

    return Workload(name="rank-raises", build_model=WideMLP, make_batch=_batch, loss=loss)


def rank_raises_peer_busy() -> Workload:
    """Rank 1's loss raises at its third micro-batch while rank 0 is still computing (it
    sleeps there): the launcher stops rank 0 (SIGTERM) before it reaches a collective, so
    rank 0 leaves no result at all."""
    calls: list[int] = []

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if _on_rank(1, calls, 3):
            raise ValueError("rank one's loss failed on purpose")
        if os.environ.get("RANK") == "0" and len(calls) == 3:
            time.sleep(30)
        return model(*batch)

    return Workload(name="rank-raises-peer-busy", build_model=WideMLP, make_batch=_batch,
                    loss=loss)


def rank_crash() -> Workload:
    """Repeated blocks (so checkpointing could free memory), and rank 1 of a job dies
    (SIGKILL) at its first micro-batch, whatever the micro-batch and the memory cap: a crash
    of one rank that no memory setting changes."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        return model(*batch)

    return Workload(name="rank-crash", build_model=DeepMLP, make_batch=_batch, loss=loss)


def rank_hang() -> Workload:
    """Rank 1 hangs at its third micro-batch: its peers wait for it in the all-reduce."""
    calls: list[int] = []

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if _on_rank(1, calls, 3):
            time.sleep(3600)
        return model(*batch)

    return Workload(name="rank-hang", build_model=WideMLP, make_batch=_batch, loss=loss)


STATE_WIDTH = 1024
STATE_BLOCKS = 4


class _StateBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(STATE_WIDTH, STATE_WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class StateHeavy(nn.Module):
    """Residual blocks of square layers (4 x 1024 x 1024: 16 MiB of fp32 parameters) on short
    inputs: AdamW's state and the gradients dominate memory, as in large models."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_StateBlock() for _ in range(STATE_BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.pow(2).mean()


def state_heavy() -> Workload:
    """A model whose training state (parameters, gradients, AdamW's two moments: 64 MiB in
    all) dwarfs its activations (256 KiB per sample): FSDP's sharding is what frees memory."""
    return Workload(name="state-heavy", build_model=StateHeavy,
                    make_batch=lambda m: torch.randn(m, 64, STATE_WIDTH),
                    loss=lambda model, x: model(x),
                    build_optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4))


REFERENCE_SCRATCH_FLOATS = 16 * 2**20
"""64 MiB that the ``reference_heavy`` loss holds only without gradients (the numerics guard's
fp32 reference forward), never in a training step."""


def reference_heavy() -> Workload:
    """The tiny MLP whose loss, run without gradients, holds 64 MiB more during its forward:
    the guard's reference must not count in the trial's peak or cap."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if torch.is_grad_enabled():
            return model(*batch)
        scratch = torch.ones(REFERENCE_SCRATCH_FLOATS)
        return model(*batch) + (scratch[-1] - 1.0)

    return Workload(name="reference-heavy", build_model=WideMLP, make_batch=_batch, loss=loss)


def unseeded() -> Workload:
    """The tiny MLP initialised from the OS's entropy, not torch's seed: built twice, two
    different models (the guard cannot rebuild the model a trial started from)."""

    def build() -> nn.Module:
        model = WideMLP()
        generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
        return model

    return Workload(name="unseeded", build_model=build, make_batch=_batch, loss=_loss)


EAGER_PAUSE_S = 0.05  # per eager forward of Fusable: 50 ms, many times a step's compute here


class Fusable(nn.Module):
    """A small linear layer, then a chain of elementwise ops over a wide activation: eager runs
    each op over the whole activation, inductor fuses the chain into one loop (two ops: compiled
    2.8x eager, cold compile 14.5 s on the 2-core Xeon; eight: 2.0x, 64 s; sixteen: 220 s, by
    ``python benchmarks/fusable_compile.py 2 128``, ``... 8 128``, ``... 16 16``).

    The fusion alone did not make compiled the search's winner without timing luck: under the
    slow set's two busy workers, a CI run (2026-11-30) timed eager (eight ops) ahead. So eager
    also pauses ``EAGER_PAUSE_S`` per forward, a branch the compiled graph does not hold
    (``is_compiling`` is constant while dynamo traces): compiled wins by that pause whatever
    the load, and the chain can be short, its cold compile (the first-launch check's) cheap."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(IN_DIM, IN_DIM)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            time.sleep(EAGER_PAUSE_S)
        h = self.proj(x).repeat(1, 1, 128)
        for _ in range(2):
            h = torch.sin(h) * 0.9 + h * 0.1
        return nn.functional.mse_loss(h[..., :IN_DIM], y)


def fusable() -> Workload:
    """``Fusable`` on the tiny MLP's batches: compiled is much faster than eager."""
    return Workload(name="fusable", build_model=Fusable, make_batch=_batch, loss=_loss)
# ----------------------------------------------------------------------------------------------
# Variable-length batches (issue 48): lengths declared, make_batch(micro_batch, length).

VARLEN_WORST = 64
VARLEN_LENGTHS = (5, 9, 12, 17, 20, 23, 31, 40, 52, 64)


def _varlen_gpt() -> nn.Module:
    from autotune.builtin_workloads import TinyGPT

    return TinyGPT(vocab_size=64, seq_len=VARLEN_WORST, dim=32, num_layers=2, num_heads=2)


def _varlen_batch(micro_batch: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 64, (micro_batch, length))
    return {"input_ids": ids, "labels": ids}


def varlen(**changes: object) -> Workload:
    """A tiny causal LM whose real batches vary in length (declared lengths up to 64)."""
    fields: dict[str, object] = dict(
        name="varlen-tiny-gpt", build_model=_varlen_gpt, make_batch=_varlen_batch,
        loss=lambda model, batch: model(**batch), tokens_per_sample=VARLEN_WORST,
        lengths=VARLEN_LENGTHS)
    return Workload(**{**fields, **changes})  # type: ignore[arg-type]


def varlen_callable() -> Workload:
    """The lengths from a function (as read from a dataset)."""
    return varlen(lengths=lambda: list(VARLEN_LENGTHS))


def varlen_ignores_length() -> Workload:
    """make_batch takes the length and builds the worst case anyway."""
    return varlen(make_batch=lambda micro_batch, length: _varlen_batch(micro_batch, VARLEN_WORST))


def varlen_one_arg() -> Workload:
    """Lengths declared, and a make_batch that takes none."""
    return varlen(make_batch=lambda micro_batch: _varlen_batch(micro_batch, VARLEN_WORST))


def varlen_over_worst() -> Workload:
    """A declared length over the worst case."""
    return varlen(lengths=(8, 100))
