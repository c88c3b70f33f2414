"""The knobs: labels, which values apply, and what applying each one does to a real model."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from autotune import knob_rules as R
from autotune import knobs as K
from autotune import step as S
from autotune.artifacts import GRAPH_SETTINGS
from autotune.builtin_workloads import TinyGPT, default_workload
from autotune.config import TrialSpec, WorkloadSpec
from autotune.errors import ConfigError
from autotune.knob_adapters import child_environment
from autotune.knobs import KNOBS, Knobs, KnobUnsupported
from autotune.step import train_step
from autotune.traits import WorkloadTraits
from autotune.trial import run_trial
from tests import one_truth
from tests.conftest import workload_target

KNOB_VALUES = st.builds(Knobs, **{k.name: st.sampled_from(k.values) for k in KNOBS})


@given(KNOB_VALUES)
def test_every_setting_has_a_label_that_reads_back(knobs: Knobs) -> None:
    assert Knobs.from_label(knobs.label()) == knobs
    assert knobs.label().startswith(f"{knobs.precision}/{knobs.compile_mode}")
    assert ("+" in knobs.label()) == bool(knobs.changed())


@pytest.mark.parametrize("label", ["fp32", "fp32/off+ckpt", "fp32/off+ckpt=sometimes",
                                   "fp64/off", "fp32/off+color=red", ""])
def test_a_bad_label_is_refused_with_what_is_known(label: str) -> None:
    for _ in range(2):  # labels are read back through a cache: a refusal is never kept
        with pytest.raises(ConfigError) as info:
            Knobs.from_label(label)
        assert repr(label) in str(info.value)


@pytest.mark.parametrize("label", [None, 3, ["fp32/off"], b"fp32/off"])
def test_a_label_that_is_not_text_is_refused_as_not_a_label(label: object) -> None:
    with pytest.raises(ConfigError, match=r" is not a knob label \(not text\)$"):
        Knobs.from_label(label)  # type: ignore[arg-type]


def test_a_user_subset_of_values_is_checked() -> None:
    knob = K.KNOB["checkpointing"]
    assert R.parse_values(knob, ["blocks", "off", "blocks"]) == ("blocks", "off")
    with pytest.raises(ConfigError, match="--checkpointing sometimes: not a value of "
                                          "checkpointing; choose from off,blocks,alternate"):
        R.parse_values(knob, ["sometimes"])


def test_every_knob_row_says_each_of_its_values_and_keys_what_it_compiles() -> None:
    # A new knob is a row of KNOBS: its report words are there, and a knob that changes what
    # torch.compile compiles keys the compiled artifacts (artifacts.GRAPH_SETTINGS spells its
    # name by hand: its order is the key's; shapes, not said at its default, is left out).
    for knob in KNOBS[2:]:
        assert set(knob.words) == set(knob.values), knob.name
        assert knob.default in knob.values and knob.option.startswith("--"), knob.name
    in_graph = {k.name for k in KNOBS if k.in_graph and k.said_at_default}
    assert in_graph == set(GRAPH_SETTINGS) - {"micro_batch", "compile_dynamic"}
    assert R.describe(Knobs(compile_scope="blocks"), ["compile_scope"]) == [
        "compile_scope = blocks: nothing compiled (eager)"]


@pytest.mark.subprocess
def test_importing_the_knobs_does_not_import_torch() -> None:
    code = "import sys, autotune.knobs, autotune.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------------------------
# Activation checkpointing.


def tiny_gpt(num_layers: int = 4) -> TinyGPT:
    return TinyGPT(vocab_size=64, seq_len=32, dim=32, num_layers=num_layers, num_heads=2)


def cnn() -> nn.Sequential:
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU())

    return nn.Sequential(block(3, 8), block(8, 8), block(8, 8), nn.Flatten(), nn.LazyLinear(4))


def test_the_repeated_blocks_are_found() -> None:
    model = tiny_gpt()
    assert S.find_blocks(model) == list(model.blocks)
    net = cnn()
    assert S.find_blocks(net) == [net[0], net[1], net[2]]
    assert S.find_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Conv1d(2, 2, 1))) == []


def saved_bytes(model: nn.Module, ids: torch.Tensor) -> int:
    """Bytes autograd keeps for backward during one forward (what checkpointing frees)."""
    return one_truth.saved_bytes(lambda: model(ids, ids).backward())


def test_checkpointing_frees_activations_every_block_more_than_every_second() -> None:
    ids = torch.randint(0, 64, (4, 32))
    saved = {}
    for setting in ("off", "alternate", "blocks"):
        torch.manual_seed(0)
        model = tiny_gpt()
        count = S.apply_checkpointing(model, setting)
        assert count == {"off": 0, "alternate": 2, "blocks": 4}[setting]
        saved[setting] = saved_bytes(model, ids)
    assert saved["blocks"] < saved["alternate"] < saved["off"]


def test_a_checkpointed_step_gives_the_same_gradients() -> None:
    workload = default_workload("cpu")
    grads = {}
    for setting in ("off", "blocks"):
        torch.manual_seed(0)
        model = tiny_gpt().double()
        S.apply_checkpointing(model, setting)
        torch.manual_seed(1)
        batches = [{"input_ids": (ids := torch.randint(0, 64, (2, 32))), "labels": ids}
                   for _ in range(2)]
        model.zero_grad()
        train_step(model, _Recorder(model), batches, workload, precision="fp32",
                   device_type="cpu")
        grads[setting] = model.recorded
    for name, grad in grads["off"].items():
        torch.testing.assert_close(grads["blocks"][name], grad, rtol=1e-12, atol=1e-14)


class _Recorder:
    """An optimizer stand-in that keeps the gradients of its step on the model."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def step(self) -> None:
        self.model.recorded = {n: p.grad.clone() for n, p in self.model.named_parameters()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)


def test_a_model_without_repeated_blocks_cannot_be_checkpointed() -> None:
    with pytest.raises(KnobUnsupported, match="no repeated blocks"):
        S.apply_checkpointing(nn.Linear(2, 2), "blocks")
    # A workload may name its blocks itself.
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    assert S.apply_checkpointing(model, "blocks", blocks=lambda m: [m[0], m[2]]) == 2


# ----------------------------------------------------------------------------------------------
# Optimizer implementation.


def two_groups() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW([
        {"params": model[0].parameters(), "lr": 1e-3},
        {"params": model[1].parameters(), "lr": 5e-4, "weight_decay": 0.0}],
        weight_decay=0.1, betas=(0.8, 0.95))
    return model, optimizer


@pytest.mark.parametrize("impl", ["for-loop", "foreach", "fused"])
def test_the_optimizer_is_rebuilt_with_the_same_groups_and_hyper_parameters(impl: str) -> None:
    model, optimizer = two_groups()
    calls = []
    optimizer.register_step_post_hook(lambda *_: calls.append(1))
    rebuilt = S.rebuild_optimizer(optimizer, impl)
    assert type(rebuilt) is torch.optim.AdamW and rebuilt is not optimizer
    for before, after in zip(optimizer.param_groups, rebuilt.param_groups, strict=True):
        assert after["params"] == before["params"]
        for key in ("lr", "weight_decay", "betas", "eps", "amsgrad"):
            assert after[key] == before[key]
        assert after["foreach"] == (impl == "foreach")
        assert bool(after["fused"]) == (impl == "fused")
    model(torch.randn(3, 4)).sum().backward()
    rebuilt.step()
    assert calls == [1]  # the workload's step hooks come along
    assert S.default_impl(optimizer) == "for-loop"  # what torch picks for CPU parameters
    assert S.default_impl(rebuilt) == impl


def test_an_optimizer_without_the_switch_is_unsupported() -> None:
    lbfgs = torch.optim.LBFGS(nn.Linear(2, 2).parameters())
    assert S.optimizer_impls(lbfgs) == ()
    with pytest.raises(KnobUnsupported, match="LBFGS cannot be rebuilt as fused"):
        S.rebuild_optimizer(lbfgs, "fused")
    assert S.rebuild_optimizer(lbfgs, "default") is lbfgs


# ----------------------------------------------------------------------------------------------
# Memory format, allocator, what applies to which workload.


def test_channels_last_applies_to_convolutions_and_images_only() -> None:
    net = cnn()
    net(torch.randn(1, 3, 8, 8))  # materialize the lazy layer
    S.apply_to_model(net, Knobs(memory_format="channels_last"))
    assert net[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    images, labels = S.apply_to_batch((torch.randn(2, 3, 8, 8), torch.tensor([1, 2])),
                                      Knobs(memory_format="channels_last"))
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.dim() == 1
    with pytest.raises(KnobUnsupported, match="2-D convolutions"):
        S.apply_to_model(tiny_gpt(), Knobs(memory_format="channels_last"))


def test_the_allocator_setting_goes_to_the_childs_environment() -> None:
    expandable = Knobs(allocator="expandable_segments")
    assert child_environment(Knobs(), {}) == {}
    assert child_environment(expandable, {}) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    user = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:False"}
    assert child_environment(expandable, user) == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    assert R.device_skip_reason(K.KNOB["allocator"], "expandable_segments", is_cuda=False)


def test_which_values_a_workload_can_take() -> None:
    _, optimizer = two_groups()
    traits = S.workload_traits(tiny_gpt(), optimizer, {"input_ids": torch.zeros(2, 32)})
    assert traits.num_blocks == 4 and traits.blocks == "4 x _Block"
    assert traits.optimizer_impls == ("for-loop", "foreach", "fused")
    assert not traits.image_input and not traits.has_conv2d
    assert R.skip_reason(Knobs(checkpointing="blocks"), traits) is None
    assert "already runs for-loop" in (R.skip_reason(Knobs(optimizer_impl="for-loop"),
                                                     traits) or "")
    assert "convolutions" in (R.skip_reason(Knobs(memory_format="channels_last"), traits) or "")
    flat = WorkloadTraits(num_blocks=1)
    assert "no repeated blocks" in (R.skip_reason(Knobs(checkpointing="alternate"), flat) or "")
    assert R.skip_reason(Knobs(checkpointing="alternate"), None) is None  # not known yet


def test_a_knob_the_workload_cannot_take_is_an_unsupported_run_not_a_failure() -> None:
    spec = TrialSpec(workload=WorkloadSpec(kind="file", target=workload_target("tiny")),
                     device="cpu", micro_batch=1, knobs=Knobs(memory_format="channels_last"),
                     num_warmup_steps=1)
    result = run_trial(spec)
    assert result.status == "unsupported"
    assert "2-D convolutions" in result.message
    assert result.traits is not None and result.traits.optimizer == "AdamW"


def test_hugging_face_checkpointing_uses_the_models_own_switch() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=4, n_embd=32, n_head=2, n_positions=32,
                                     vocab_size=64)
    ids = torch.randint(0, 64, (2, 32))

    def saved(setting: str) -> int:
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        S.apply_checkpointing(model, setting)
        return one_truth.saved_bytes(
            lambda: model(input_ids=ids, labels=ids).loss.backward())

    off, alternate, blocks = saved("off"), saved("alternate"), saved("blocks")
    assert blocks < alternate < off


def test_an_optimizer_left_to_torch_runs_as_the_modelled_device_would() -> None:
    _, optimizer = two_groups()
    assert S.apply_to_optimizer(optimizer, Knobs()) is optimizer  # as built
    as_cuda = S.apply_to_optimizer(optimizer, Knobs(), as_on_cuda=True)
    assert S.default_impl(as_cuda) == "foreach"  # what torch picks for CUDA parameters
    chosen = torch.optim.AdamW(nn.Linear(2, 2).parameters(), foreach=False)
    assert S.apply_to_optimizer(chosen, Knobs(), as_on_cuda=True) is chosen  # the user chose
    assert S.default_impl(S.apply_to_optimizer(optimizer, Knobs(optimizer_impl="fused"),
                                               as_on_cuda=True)) == "fused"


@pytest.mark.parametrize(("name", "status", "named"), [
    ("blocks_raise", "error", "ValueError: blocks failed on purpose"),
    ("blocks_exit", "workload_error", "the workload called sys.exit(0)"),
])
def test_a_blocks_callable_that_fails_is_the_workloads_failure(name, status, named) -> None:
    spec = TrialSpec(workload=WorkloadSpec(kind="file", target=workload_target(name)),
                     device="cpu", micro_batch=1, knobs=Knobs(checkpointing="blocks"),
                     num_warmup_steps=1)
    result = run_trial(spec)
    assert result.status == status
    assert named in result.message
