"""Compiler-chosen recompute: checkpointing ``budget-0.5`` (torch's
``torch._functorch.config.activation_memory_budget``), set around the compiled model's calls
in the trial, ``Tuned.compile``, the generated script and Lightning's fit; never eager."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
import torch._functorch.config as functorch_config
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from typer.testing import CliRunner

from autotune import step
from autotune.builtin_workloads import causal_lm_label_count, default_workload
from autotune.cli import app
from autotune.config import DeviceInfo, TrialSpec, WorkloadSpec
from autotune.errors import ConfigError
from autotune.estimate.fits import EstimateRequest, estimate_report
from autotune.knob_adapters import accelerator_kwargs, training_arguments
from autotune.knob_rules import skip_reason
from autotune.knobs import KNOB, Knobs, KnobUnsupported, memory_budget
from autotune.names import FLAGS
from autotune.space import compiled_values, knob_values, memory_classes
from autotune.trial import run_trial
from autotune.tuned_file import read_tuned
from autotune.units import GIB
from autotune.usage import Tuned
from autotune.workload import Workload
from tests.conftest import workload_target
from tests.one_truth import BlockLM, GradRecorder, assert_same_grads, saved_bytes, token_batches
from tests.test_codegen import script_for
from tests.tuned_configs import small, write

BUDGET = Knobs(compile_mode="default", checkpointing="budget-0.5")
DEFAULT_BUDGET = functorch_config.activation_memory_budget  # torch's own (1.0)
CPU = DeviceInfo(device="cpu", name="test cpu", total_memory_bytes=8 * GIB,
                 available_memory_bytes=4 * GIB, supports_bf16=True, supports_fp16=False,
                 supports_tf32=False)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Dynamo's compiled code dropped before and after: each test compiles its own graphs."""
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()


def _lm_workload() -> Workload:
    return Workload(name="block-lm", build_model=BlockLM, make_batch=lambda m: None,
                    loss=lambda m, b: m(**b), count_loss_items=causal_lm_label_count)


def _built(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return BlockLM(dim=32, num_blocks=4).to(dtype)


def _kept(model: nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes the (compiled) forward keeps for backward, after it compiled."""
    model(**batch).backward()  # the compile (a call under the hooks below reuses its graphs)
    return saved_bytes(lambda: model(**batch))


# ----------------------------------------------------------------------------------------------
# It changes what the compiled step keeps, trains the same, and stays where it was set.


def _compiled_run(model: nn.Module, batches: list[dict[str, torch.Tensor]],
                  train: Any) -> tuple[int, Any]:
    """Activations ``model`` keeps once compiled, and what ``train(model)`` gives, compiled
    from nothing: Dynamo's graphs are reset first (two instances of one class share them, as
    torch inlines their modules: the second would run the first one's graphs)."""
    torch._dynamo.reset()
    return _kept(model, batches[0]), train(model)


@pytest.mark.slow  # the default run keeps the trial, script and library compiling with the budget
@pytest.mark.subprocess  # inductor compiles its kernels with the C++ compiler
def test_a_budget_keeps_fewer_activations_trains_the_same_and_does_not_leak(
        fresh_dynamo: None) -> None:
    """The partitioner keeps fewer activations than the compiled step without it (measured
    here: BlockLM dim 32, 4 blocks, 2 x 12 tokens: 98996 bytes against 119684). The model
    compiled after it, in the same process, keeps as much as without it: the budget was set
    around the budgeted model's calls only. Loss over 6 AdamW steps from the same seed:
    equal within 1e-5 relative (the recompute is the same arithmetic; only the kernels'
    grouping differs)."""
    batches = token_batches(padded=True)
    workload = _lm_workload()

    def train(model: nn.Module) -> torch.Tensor:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return torch.stack([step.train_step(model, optimizer, batches, workload,
                                            precision="fp32", device_type="cpu")
                            for _ in range(6)])

    kept_budget, loss_budget = _compiled_run(step.apply_memory_budget(
        step.compile_model(_built(), "default"), BUDGET), batches, train)
    assert functorch_config.activation_memory_budget == DEFAULT_BUDGET
    kept_plain, loss_plain = _compiled_run(step.compile_model(_built(), "default"), batches,
                                           train)
    assert kept_budget < 0.9 * kept_plain, (kept_budget, kept_plain)
    assert functorch_config.activation_memory_budget == DEFAULT_BUDGET
    assert loss_plain[-1] < loss_plain[0]  # it trains
    torch.testing.assert_close(loss_budget, loss_plain, rtol=1e-5, atol=0)
    eager = _built()  # an eager model afterwards: the default, and its own activations
    assert functorch_config.activation_memory_budget == DEFAULT_BUDGET
    assert saved_bytes(lambda: eager(**batches[0])) > kept_plain


# slow: a compiled trial; the everyday run keeps the budget's traces in this
# process
@pytest.mark.slow
@pytest.mark.subprocess
def test_the_trial_compiles_with_the_budget(monkeypatch: pytest.MonkeyPatch,
                                            fresh_dynamo: None) -> None:
    """A trial (and so a memory probe) of ``budget-0.5`` runs the compiled step with the
    budget set when it compiles: the partitioner is asked for 0.5, and for torch's default in
    the trial of the same setting without it (the spy calls the real partitioner)."""
    from torch._functorch import partitioners

    asked: list[float] = []
    real = partitioners.choose_saved_values_set

    def spy(*args: Any, memory_budget: float | None = None, **kwargs: Any) -> Any:
        asked.append(functorch_config.activation_memory_budget
                     if memory_budget is None else memory_budget)
        return real(*args, memory_budget=memory_budget, **kwargs)

    monkeypatch.setattr(partitioners, "choose_saved_values_set", spy)
    for knobs, expected in ((BUDGET, 0.5), (BUDGET.with_(checkpointing="off"), DEFAULT_BUDGET)):
        asked.clear()
        torch._dynamo.reset()
        spec = TrialSpec(workload=WorkloadSpec(kind="file", target=workload_target("tiny")),
                         device="cpu", micro_batch=2, accumulate_steps=2, knobs=knobs,
                         num_timed_steps=2)
        # A graph loaded from AOTAutograd's cache (keyed by the budget) is not partitioned.
        with functorch_config.patch(enable_autograd_cache=False):
            result = run_trial(spec)
        assert result.status == "ok", result.message
        assert asked and set(asked) == {expected}, (knobs.label(), asked)
    assert functorch_config.activation_memory_budget == DEFAULT_BUDGET


# ----------------------------------------------------------------------------------------------
# One truth: the generated script and Tuned apply it as the trial does.


@pytest.mark.slow  # the default run keeps the trial compiling with the budget
@pytest.mark.subprocess
def test_the_script_and_tuned_apply_the_budget_as_the_library(tmp_path: Path,
                                                                fresh_dynamo: None) -> None:
    """The same activations kept (fewer than compiled without it) and the same gradients (as
    one big batch's) from ``step.apply_memory_budget`` (the trial's), ``Tuned.compile`` and
    the script's ``compiler_recompute``; float64, so the comparison is exact to rounding."""
    config = small(compile_mode="default", checkpointing="budget-0.5")
    script = script_for(config, tmp_path)
    assert (script.compile_mode, script.checkpointing) == ("default", "budget-0.5")
    batches = token_batches(padded=True)
    workload = _lm_workload()
    def grads_of(name: str) -> Any:
        def run(model: nn.Module) -> dict[str, torch.Tensor]:
            recorder = GradRecorder(model)
            if name == "generated":
                script.train_step(model, recorder, torch.amp.GradScaler("cpu", enabled=False),
                                  batches, torch.autocast("cpu", enabled=False))
            else:
                step.train_step(model, recorder, batches, workload, precision="fp32",
                                device_type="cpu")
            return {n.removeprefix("_orig_mod."): g for n, g in recorder.grads.items()}
        return run

    def script_built() -> nn.Module:
        model = _built(torch.float64)
        assert not hasattr(script, "checkpoint_blocks")  # the budget is the compiler's alone
        return script.compiler_recompute(torch.compile(model), script.checkpointing)

    built = {
        "library": lambda: step.apply_memory_budget(step.compile_model(
            step.apply_to_model(_built(torch.float64), BUDGET), "default"), BUDGET),
        "tuned": lambda: Tuned(config).compile(Tuned(config).apply(_built(torch.float64))),
        "generated": script_built,
        "plain": lambda: step.compile_model(_built(torch.float64), "default")}
    kept, grads = {}, {}
    for name, build in built.items():  # each compiled from nothing (``_compiled_run``)
        kept[name], grads[name] = _compiled_run(build(), batches, grads_of(name))
    assert kept["library"] == kept["tuned"] == kept["generated"] < kept["plain"], kept
    assert_same_grads(grads["tuned"], grads["library"])
    assert_same_grads(grads["generated"], grads["library"])
    assert functorch_config.activation_memory_budget == DEFAULT_BUDGET


def test_a_budget_checkpoints_no_block(tmp_path: Path) -> None:
    """``budget-0.5`` is the compiler's: the library wraps no block (eager, the model keeps
    every activation) and the script has no block checkpointing to wrap one with (before, its
    ``checkpoint_blocks`` took any value but ``off`` for ``alternate``; it now carries only
    the compiler's budget for such a config)."""
    batch = token_batches(padded=True)[0]
    script = script_for(small(compile_mode="default", checkpointing="budget-0.5"), tmp_path)
    plain, library = _built(), _built()
    assert step.apply_checkpointing(library, "budget-0.5") == 0
    assert not hasattr(script, "checkpoint_blocks") and hasattr(script, "compiler_recompute")
    kept = {name: saved_bytes(lambda m=m: m(**batch)) for name, m in (
        ("plain", plain), ("library", library))}
    assert kept["library"] == kept["plain"], kept


# ----------------------------------------------------------------------------------------------
# Never eager: the space never pairs it with compile_mode off; a run refuses it.


def test_eager_code_never_takes_a_budget() -> None:
    eager = BUDGET.with_(compile_mode="off")
    assert "needs a compiled mode" in (skip_reason(eager, None) or "")
    assert skip_reason(BUDGET, None) is None
    with pytest.raises(KnobUnsupported, match="needs a compiled mode"):
        step.apply_memory_budget(nn.Linear(2, 2), eager)
    with pytest.raises(KnobUnsupported, match="needs a compiled mode"):
        step.budget_patch(eager)
    assert functorch_config.activation_memory_budget == DEFAULT_BUDGET


def test_a_torch_without_the_setting_makes_it_unsupported(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.delattr(functorch_config, "activation_memory_budget")
    with pytest.raises(KnobUnsupported, match=r"has no torch\._functorch\.config\."
                                              r"activation_memory_budget"):
        step.apply_memory_budget(nn.Linear(2, 2), BUDGET)


@settings(max_examples=60, deadline=None)
@given(modes=st.lists(st.sampled_from(["off", "default"]), min_size=1, unique=True),
       asked=st.none() | st.lists(st.sampled_from(KNOB["checkpointing"].values), min_size=1,
                                  unique=True))
def test_the_space_never_holds_a_budget_with_compile_off(modes: list[str],
                                                         asked: list[str] | None) -> None:
    """Whatever the user asks: no eager class carries it, and with no compiled class it is no
    value to screen (said in a note); asked alone with compile off: a ConfigError naming what
    to do."""
    values, base, _ = knob_values(CPU, {"checkpointing": asked})
    classes, _ = memory_classes(CPU, ["fp32"], modes, base=base)
    assert all(skip_reason(c, None) is None for c in classes), classes
    only_budget = asked is not None and all(memory_budget(v) is not None for v in asked)
    if modes == ["off"] and only_budget:
        with pytest.raises(ConfigError, match=r"--checkpointing budget-0\.5: needs a "
                                              r"compiled mode.*choose from off,blocks,alternate"):
            compiled_values(values, classes, FLAGS)
        return
    kept, notes = compiled_values(values, classes)
    budgets = [v for v in kept["checkpointing"] if memory_budget(v) is not None]
    if modes == ["off"]:
        assert not budgets
        assert any(n.startswith("checkpointing budget-0.5 skipped") for n in notes) == (
            "budget-0.5" in values["checkpointing"])
    else:
        assert kept == values and not notes


def test_a_file_pairing_a_budget_with_compile_off_is_refused_on_read(tmp_path: Path) -> None:
    path = write(small(compile_mode="off", checkpointing="budget-0.5"), tmp_path / "a.json")
    with pytest.raises(ConfigError, match=r"knobs\.checkpointing: got 'budget-0\.5': needs a "
                                          r"compiled mode \(knobs\.compile_mode is off\)"):
        read_tuned(path)
    read_tuned(write(small(compile_mode="default", checkpointing="budget-0.5"), path))


def _words(text: str) -> str:
    return " ".join(text.split())


def test_a_bad_budget_and_a_budget_without_compile_exit_2_and_start_nothing(
        tmp_path: Path) -> None:
    # No child starts (no subprocess marker: the conftest guard would fail it).
    runner = CliRunner()
    bad = runner.invoke(app, ["search", "--target-batch", "8", "--out", str(tmp_path),
                              "--checkpointing", "budget-2"])
    assert bad.exit_code == 2, bad.output
    assert ("--checkpointing budget-2: not a value of checkpointing; choose from "
            "off,blocks,alternate,budget-0.5") in _words(bad.stderr)
    eager = runner.invoke(app, ["search", "--target-batch", "8", "--out", str(tmp_path),
                                "--checkpointing", "budget-0.5", "--compile-modes", "off"])
    assert eager.exit_code == 2, eager.output
    assert ("--checkpointing budget-0.5: needs a compiled mode, and --compile-modes compiles "
            "nothing here; add default to --compile-modes") in _words(eager.stderr)
    assert "Traceback" not in bad.output + eager.output and not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------------
# Where it is not the library's to apply: said, never guessed.


def test_the_estimator_says_it_does_not_model_the_budget() -> None:
    report = estimate_report(default_workload(), EstimateRequest(
        micro_batch=2, device_memory_bytes=GIB, knobs=BUDGET, find_max=False, kernels="cpu"))
    off = estimate_report(default_workload(), EstimateRequest(
        micro_batch=2, device_memory_bytes=GIB, knobs=BUDGET.with_(checkpointing="off"),
        find_max=False, kernels="cpu"))
    (note,) = [n for n in report.notes if n.startswith("checkpointing budget-0.5")]
    assert "not modelled" in note and "traced as checkpointing off" in note
    assert report.estimate.peak_bytes == off.estimate.peak_bytes  # the trace it says it is
    assert not any(n.startswith("checkpointing") for n in off.notes)


def test_adapters_say_how_to_set_it_by_hand() -> None:
    kwargs, notes = training_arguments(BUDGET, "cuda")
    assert not kwargs.get("activation_checkpointing", kwargs.get("gradient_checkpointing"))
    assert kwargs["torch_compile"] is True
    (note,) = [n for n in notes if n.startswith("checkpointing=budget-0.5")]
    assert "torch._functorch.config.activation_memory_budget = 0.5" in note
    _, notes = accelerator_kwargs(BUDGET)
    (note,) = [n for n in notes if n.startswith("checkpointing=")]
    assert "activation_memory_budget = 0.5" in note and "cfg.apply" not in note


def test_lightning_sets_it_for_the_fit_only() -> None:
    pytest.importorskip("lightning")
    from lightning.pytorch import LightningModule

    from autotune.lightning import TunedCallback

    class Lit(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 2)

    callback, module = TunedCallback(Tuned(small(compile_mode="default",
                                                 checkpointing="budget-0.5"))), Lit()
    callback.setup(None, module, "fit")  # compiles in place, lazily: nothing compiled yet
    try:
        assert functorch_config.activation_memory_budget == 0.5
    finally:
        callback.teardown(None, module, "fit")
    assert functorch_config.activation_memory_budget == DEFAULT_BUDGET
