"""The compile scope knob (issue 49): ``model`` compiles the whole model, ``blocks`` each
repeated block on its own (regional compilation), in the trial, the script and ``Tuned``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autotune import step
from autotune.builtin_workloads import TinyGPT, default_workload
from autotune.knob_rules import meaningful, skip_reason
from autotune.knobs import KNOB, Knobs, KnobUnsupported
from autotune.traits import WorkloadTraits


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
@pytest.mark.slow  # the default run keeps test_script_tuned_and_trial_compile_the_same_parts
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


@pytest.mark.slow  # the default run keeps the blocks scope's compile and step
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
    assert skip_reason(Knobs(compile_scope="blocks"), None) == (
        "compile_scope blocks: needs a compiled mode (the compiler applies it), and "
        "compile_mode is off")
    assert step.compile_model(tiny(), "off", scope="blocks").forward.__name__ == "forward"
    assert KNOB["compile_scope"].by_default is None  # both values tried where they apply


def test_a_bad_compile_scope_is_refused_with_the_values_and_starts_nothing(tmp_path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    for command in ("search", "probe"):
        result = CliRunner().invoke(app, [command, "--target-batch", "8", "--device", "cpu",
                                          "--out" if command == "search" else "--json",
                                          *([str(tmp_path)] if command == "search" else []),
                                          "--compile-scopes", "foo,blocks"])
        assert result.exit_code == 2, result.output
        words = " ".join((result.stderr if result.stderr_bytes is not None
                          else result.output).split())
        assert ("--compile-scopes foo: not a value of compile_scope; choose from model,blocks"
                in words), words
        assert "Traceback" not in result.output and not list(tmp_path.iterdir())


def compiled_parts(model: nn.Module) -> list[str]:
    """The modules whose forward torch.compile wraps ("" for the model wrapped whole)."""
    if hasattr(model, "_orig_mod"):
        return [""]
    return [name for name, m in model.named_modules()
            if hasattr(m.forward, "_torchdynamo_orig_callable")]


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_script_tuned_and_trial_compile_the_same_parts(tmp_path, scope: str) -> None:
    """One truth: the generated script's ``compile_model``, ``Tuned.compile`` and the trial's
    ``step.compile_model`` compile the same modules for each scope (torch.compile is lazy:
    nothing compiles here), checkpointed blocks included."""
    from autotune.codegen import render_train_script
    from autotune.usage import Tuned
    from tests.one_truth import load_script
    from tests.tuned_configs import make_tuned

    tuned = Knobs(compile_mode="default", checkpointing="blocks", compile_scope=scope)
    config = make_tuned(knobs=tuned)
    path = tmp_path / "train_autotuned.py"
    path.write_text(render_train_script(config))
    script = load_script(path)
    assert script.compile_scope == scope

    def fresh() -> nn.Module:
        model = tiny()
        step.apply_to_model(model, tuned)
        return model

    trial = step.compile_model(fresh(), "default", scope=tuned.compile_scope)
    want = ["blocks.0", "blocks.1", "blocks.2"] if scope == "blocks" else [""]
    assert compiled_parts(trial) == want
    assert compiled_parts(script.compile_model(fresh(), None)) == want
    assert compiled_parts(Tuned(config, device_type="cpu").compile(fresh())) == want


def test_adapters_carry_the_blocks_scope_or_say_they_cannot() -> None:
    """Accelerate's TorchDynamoPlugin takes it (``use_regional_compilation``, accelerate 1.15
    here); Trainer has no switch: its one warning says so and what to do; a model scope
    needs no word anywhere."""
    from autotune.usage import Tuned
    from tests.tuned_configs import make_tuned

    blocks = Tuned(make_tuned(knobs=Knobs(compile_mode="default", compile_scope="blocks")),
                   device_type="cpu")
    kwargs = blocks.accelerator_kwargs()
    assert kwargs["dynamo_plugin"].use_regional_compilation is True
    with pytest.warns(UserWarning, match="compile_scope=blocks: Trainer has no switch for "
                      "regional compilation"):
        args = blocks.training_arguments()
    assert args["torch_compile"] is True
    whole = Tuned(make_tuned(knobs=Knobs(compile_mode="default")), device_type="cpu")
    assert not whole.accelerator_kwargs()["dynamo_plugin"].use_regional_compilation


def scope_search(scope_speed: float, *, num_blocks: int = 4, eager_wins: bool = False):
    """A scripted search (``tests/scripted.py``'s device) where ``blocks`` scope runs
    ``scope_speed`` times the whole-model compile's speed, and ``compile_scope`` is offered
    with both values, as it is by default."""
    from dataclasses import dataclass, replace

    from autotune.search import run_search
    from tests.scripted import (
        CLASSES,
        SETTINGS,
        TRAITS,
        VALUES,
        KnobDevice,
        by_class,
        plan,
    )

    @dataclass
    class ScopeDevice(KnobDevice):
        def __call__(self, spec):  # type: ignore[no-untyped-def]
            regional = spec.knobs.compile_scope == "blocks"
            result = super().__call__(replace(spec, knobs=spec.knobs.with_(
                compile_scope="model")))
            self.specs[-1] = spec
            if regional:
                result = replace(result, step_times_s=tuple(
                    t / scope_speed for t in result.step_times_s))
            return result

    speeds = (300, 150, 160, 310, 200, 290) if eager_wins else (100, 150, 160, 200, 300, 330)
    device = ScopeDevice(by_class(*speeds), traits=replace(TRAITS, num_blocks=num_blocks))
    values = {**VALUES, "compile_scope": ("model", "blocks")}
    outcome = run_search(plan(), CLASSES, SETTINGS, values=values, run=device)
    return outcome, {f"{r.knobs.label()}/{r.micro_batch}" for r in outcome.records}


@pytest.mark.parametrize("scope_speed", [0.97, 1.05])
def test_the_search_times_the_blocks_scope_on_a_compiled_leader(scope_speed: float) -> None:
    """Screened on the compiled leader like any knob: timed at its micro-batch, and kept only
    where it is faster."""
    from autotune.search import tuned_config
    from tests.scripted import SETTINGS, plan

    outcome, records = scope_search(scope_speed)
    assert any(r.startswith("bf16/max-autotune+") and r.endswith("+scope=blocks/32")
               for r in records), records
    tuned = tuned_config(plan(), outcome, SETTINGS)
    assert tuned.knobs.compile_scope == ("blocks" if scope_speed > 1 else "model")


def test_the_search_skips_the_blocks_scope_with_the_reason_where_it_means_nothing() -> None:
    """Without repeated blocks, and on an eager leader, ``blocks`` is never run: each skip
    says why."""
    outcome, records = scope_search(1.05, num_blocks=1)
    assert not any("scope=blocks" in r for r in records)
    assert any("+scope=blocks not tried: compile_scope blocks: no repeated blocks to compile "
               "one by one" in s for s in outcome.skipped), outcome.skipped
    outcome, records = scope_search(1.05, eager_wins=True)
    assert not any("scope=blocks" in r for r in records)
    assert any("+scope=blocks not tried: compile_scope blocks: needs a compiled mode (the "
               "compiler applies it), and compile_mode is off" in s for s in outcome.skipped), \
        outcome.skipped


def test_the_lightning_callback_compiles_each_block_in_place() -> None:
    pytest.importorskip("lightning.pytorch", reason="pip install -e '.[lightning]'")
    import lightning.pytorch as pl

    from autotune import step as steps
    from autotune.lightning import TunedCallback
    from tests.test_lightning import LitLM, samples, tuned

    module = LitLM(samples())
    TunedCallback(tuned(compile_mode="default", compile_scope="blocks"),
                  model=lambda m: m.model).setup(pl.Trainer(logger=False), module, "fit")
    blocks = steps.find_blocks(module.model)
    names = {id(m): n for n, m in module.model.named_modules()}
    assert len(blocks) >= 2
    assert compiled_parts(module.model) == [names[id(b)] for b in blocks]
    assert module.model._compiled_call_impl is None  # the rest stays eager


@pytest.mark.slow  # the default run keeps the script, tuned and trial compiling the same parts
@pytest.mark.subprocess
def test_a_generated_script_with_the_blocks_scope_trains_and_saves_plain_keys(tmp_path) -> None:
    import subprocess
    import sys

    from autotune import api
    from tests.tuned_configs import small, subprocess_env

    script = api.write_train_script(small(compile_mode="default", compile_scope="blocks"),
                                    tmp_path)
    result = subprocess.run([sys.executable, str(script), "--steps", "2", "--checkpoint",
                             "ck.pt"], cwd=tmp_path, capture_output=True, text=True,
                            env=subprocess_env(), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step 2/2" in result.stdout
    saved = torch.load(tmp_path / "ck.pt")
    assert saved["model"] and not any("_orig_mod" in k for k in saved["model"])


@pytest.mark.subprocess
@pytest.mark.parametrize("strategy", [  # with the slow tests: the default run keeps the
    # blocks scope with checkpointing in one process, and jobs of ranks (test_ranks)
    pytest.param("ddp", marks=pytest.mark.slow), pytest.param("fsdp", marks=pytest.mark.slow)])
def test_blocks_scope_composes_with_checkpointing_under_ddp_and_fsdp(strategy: str) -> None:
    """A trial of 2 gloo ranks: checkpointed blocks, sharded (FSDP2) or replicated (DDP),
    each compiled on its own: one graph for both blocks, no graph break (FSDP's hooks stay
    eager around the compiled forward), and the first loss equal to fp32 eager's (the
    numerics guard's reference) within 1e-4 relative."""
    from autotune.config import WorkloadSpec
    from autotune.memory import probe_spec
    from autotune.runner import run_isolated

    knobs = Knobs.checked(compile_mode="default", compile_scope="blocks", strategy=strategy,
                          checkpointing="blocks")
    result = run_isolated(probe_spec(WorkloadSpec(), "cpu", knobs, 4, None, 600,
                                     per_device_batch=4, num_timed_steps=1, ranks=2))
    assert result.status == "ok", result.message
    assert (result.num_graphs, result.num_graph_breaks) == (1, 0)
    assert result.first_loss == pytest.approx(result.reference_loss, rel=1e-4)
