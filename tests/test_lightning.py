"""Lightning: ``cfg.lightning_trainer_kwargs()`` and ``autotune.lightning.TunedCallback`` train
one effective batch as the plain loop does (the one-truth test the other adapters have)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.errors import ConfigError, MissingDependencyError
from autotune.usage import Tuned
from autotune.workload import Workload
from tests.one_truth import BlockLM, assert_same_grads
from tests.tuned_configs import make_tuned

pl = pytest.importorskip("lightning.pytorch", reason="pip install -e '.[lightning]'")
from autotune.lightning import TunedCallback  # noqa: E402  (after the skip: it needs lightning)

STEPS, MICRO, ACCUMULATE = 3, 2, 3


def tuned(**knobs: str) -> Tuned:
    return Tuned(make_tuned(micro_batch=MICRO, accumulate_steps=ACCUMULATE,
                            target_batch=MICRO * ACCUMULATE, **{"precision": "fp32",
                                                                 "compile_mode": "off", **knobs}))


def samples() -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(3)
    ids = torch.randint(1, 64, (STEPS * MICRO * ACCUMULATE, 12))
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def fresh_model() -> BlockLM:
    torch.manual_seed(0)
    return BlockLM().double()


def optimizer_and_scheduler(params, rebuild=lambda optimizer: optimizer
                            ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR]:
    optimizer = rebuild(torch.optim.SGD(params, lr=0.5, momentum=0.9))
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


class LitLM(pl.LightningModule):
    """A LightningModule as users write one: the model in ``self.model``, a ``batch_size``
    attribute its ``train_dataloader`` reads, an optimizer with a scheduler."""

    def __init__(self, data: list[dict[str, torch.Tensor]], batch_size: int = 32) -> None:
        super().__init__()
        self.model = fresh_model()
        self.data = data
        self.batch_size = batch_size
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        optimizer, scheduler = optimizer_and_scheduler(self.parameters())
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size)


def trainer(cfg: Tuned, tmp_path: Path, **callback: object) -> pl.Trainer:
    return pl.Trainer(**cfg.lightning_trainer_kwargs(), callbacks=[TunedCallback(cfg, **callback)],
                      max_steps=STEPS, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path)


def plain_loop(cfg: Tuned, data: list[dict[str, torch.Tensor]]) -> tuple[BlockLM, list[float]]:
    """The library's own loop: ``cfg.apply``, ``cfg.build_optimizer``, ``cfg.train_step``."""
    model = cfg.apply(fresh_model())
    optimizer, scheduler = optimizer_and_scheduler(model.parameters(), cfg.build_optimizer)
    workload = Workload(name="block-lm", build_model=fresh_model,
                        make_batch=lambda n: {}, loss=lambda m, batch: m(**batch))
    collate = torch.utils.data.default_collate
    losses = []
    for step in range(STEPS):
        start = step * MICRO * ACCUMULATE
        micro_batches = [collate(data[start + i * MICRO: start + (i + 1) * MICRO])
                         for i in range(ACCUMULATE)]
        losses.append(cfg.train_step(model, optimizer, micro_batches, workload).item())
        scheduler.step()
    return model, losses


@pytest.mark.parametrize("knobs", [
    {},
    {"checkpointing": "blocks", "optimizer_impl": "foreach"},
])
def test_a_lightning_module_trains_each_effective_batch_as_the_plain_loop(
        knobs: dict[str, str], tmp_path: Path) -> None:
    """Issue 50: Lightning users got nothing from autotune.json. Under
    ``Trainer(**cfg.lightning_trainer_kwargs(), callbacks=[TunedCallback(cfg)])`` a module
    built with another batch size trains at the tuned micro-batch and accumulation, with the
    tuned checkpointing and optimizer implementation (rebuilt in place: its LR scheduler still
    steps it), and after each of 3 effective batches its loss and, at the end, its weights
    are the plain loop's (float64, within the float32 rounding of the loop's weights)."""
    cfg = tuned(**knobs)
    data = samples()
    module = LitLM(data)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers).*")
        trainer(cfg, tmp_path, model=lambda m: m.model).fit(module)
    assert module.batch_size == MICRO and trainer is not None
    assert len(module.losses) == STEPS * ACCUMULATE
    effective = [sum(module.losses[i:i + ACCUMULATE]).item() / ACCUMULATE
                 for i in range(0, len(module.losses), ACCUMULATE)]
    model, losses = plain_loop(cfg, data)
    # Within float32 rounding: cfg.train_step weighs each micro-batch by a float32 ratio of
    # item counts (as tests/one_truth.py allows against one big batch); Lightning by 1/3.
    assert effective == pytest.approx(losses, rel=1e-6, abs=0)
    assert_same_grads(dict(module.model.named_parameters()), dict(model.named_parameters()),
                      float32_weights=True)
    if knobs:  # the knobs applied: checkpointed blocks, the optimizer foreach
        assert all(hasattr(b.forward, "__wrapped__") for b in module.model.blocks)
        assert module.trainer.optimizers[0].param_groups[0]["foreach"] is True
        assert module.trainer.lr_scheduler_configs[0].scheduler.optimizer is (
            module.trainer.optimizers[0])


def test_the_callback_refuses_a_loader_of_another_batch_size(tmp_path: Path) -> None:
    """A DataLoader built beside the module (not from its ``batch_size``) would train another
    effective batch than the one tuned: refused, naming both sizes."""
    cfg = tuned()
    module = LitLM(samples())
    loader = torch.utils.data.DataLoader(samples(), batch_size=4)
    with pytest.raises(ConfigError, match=r"the train loader has batch_size 4, the tuned "
                                          r"micro-batch is 2: build it with batch_size=cfg\."):
        trainer(cfg, tmp_path).fit(module, train_dataloaders=loader)


class LitAnyLoaders(LitLM):
    """Takes what a dict or a list of train loaders gives (Lightning's CombinedLoader shapes:
    a batch of the same structure), the loss summed over its parts."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        def parts(part: Any) -> list[dict[str, torch.Tensor]]:
            if isinstance(part, dict) and "input_ids" in part:
                return [part]
            inner = part.values() if isinstance(part, dict) else (
                part if isinstance(part, (list, tuple)) else ())
            return [p for item in inner for p in parts(item)]

        found = parts(batch)
        assert found, f"a training step on a batch without samples: {batch!r}"
        loss = sum(self.model(**p) for p in found)
        self.losses.append(loss.detach())
        return loss


class IndexBatches(torch.utils.data.Sampler):
    """A batch sampler without a ``batch_size`` attribute: runs of ``size`` indices."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(range(i, min(i + self.size, self.count)))
                     for i in range(0, self.count, self.size)])

    def __len__(self) -> int:
        return -(-self.count // self.size)


class PreBatched(torch.utils.data.IterableDataset):
    """A dataset that yields whole batches of ``size`` (a DataLoader with batch_size=None)."""

    def __init__(self, size: int, tensors: bool = True) -> None:
        self.size, self.tensors = size, tensors

    def __iter__(self) -> Iterator[Any]:
        data = samples()
        for i in range(0, len(data), self.size):
            batch = torch.utils.data.default_collate(data[i:i + self.size])
            yield batch if self.tensors else {"text": ["a sample"] * self.size}


def loader(size: int | None = None, *, sampler: str = "") -> torch.utils.data.DataLoader:
    """A DataLoader of ``size`` samples a batch: from its batch_size, a BatchSampler, a batch
    sampler without batch_size, or a dataset of whole batches."""
    data = samples()
    if sampler == "BatchSampler":
        return torch.utils.data.DataLoader(data, batch_sampler=torch.utils.data.BatchSampler(
            torch.utils.data.SequentialSampler(data), batch_size=size, drop_last=False))
    if sampler == "IndexBatches":
        return torch.utils.data.DataLoader(data, batch_sampler=IndexBatches(len(data), size))
    if sampler in ("pre-batched", "strings"):
        return torch.utils.data.DataLoader(PreBatched(size, sampler == "pre-batched"),
                                           batch_size=None)
    return torch.utils.data.DataLoader(data, batch_size=size)


def fit(cfg: Tuned, tmp_path: Path, loaders: Any) -> LitAnyLoaders:
    module = LitAnyLoaders(samples())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|"
                                "has no `__len__`|Total length of).*")
        pl.Trainer(**cfg.lightning_trainer_kwargs(), callbacks=[TunedCallback(cfg)],
                   max_steps=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=tmp_path).fit(module, train_dataloaders=loaders)
    return module


@pytest.mark.parametrize(("loaders", "says"), [
    (lambda: loader(4, sampler="BatchSampler"),
     "the train loader's batch_sampler (BatchSampler) has batch_size 4, the tuned micro-batch "
     "is 2"),
    (lambda: {"text": loader(2), "more": loader(4)},
     "the train loader ['more'] has batch_size 4, the tuned micro-batch is 2"),
    (lambda: [loader(2), loader(4)], "the train loader [1] has batch_size 4, the tuned "
                                     "micro-batch is 2"),
    (lambda: {"a": [loader(2), {"b": loader(4, sampler="BatchSampler")}]},
     "the train loader ['a'][1]['b']'s batch_sampler (BatchSampler) has batch_size 4"),
    (lambda: loader(4, sampler="IndexBatches"),
     "the train loader declares no batch size (its batch_sampler, IndexBatches, has no "
     "batch_size), and its first batch holds 4 samples (the first dimension of its first "
     "tensor), the tuned micro-batch is 2"),
    (lambda: {"text": loader(2), "more": loader(4, sampler="pre-batched")},
     "the train loader ['more'] declares no batch size (batch_size=None: it yields what its "
     "dataset gives), and its first batch holds 4 samples"),
    (lambda: loader(2, sampler="strings"),
     "the train loader's batch size cannot be checked: it declares none (batch_size=None: it "
     "yields what its dataset gives), and its first batch holds no tensor"),
], ids=["batch-sampler", "dict", "list", "nested", "sampler-without-size", "pre-batched",
        "no-tensor"])
def test_every_train_loader_of_another_or_unknown_batch_size_is_refused(
        tmp_path: Path, loaders: Callable[[], Any], says: str) -> None:
    """Issue 61: only ``DataLoader.batch_size`` was read, so a batch sampler, a dict or a list
    of loaders trained at another micro-batch (the effective batch doubled). Each loader is
    found, nested ones too, and refused before a training step, naming it and the fix."""
    with pytest.raises(ConfigError) as info:
        fit(tuned(), tmp_path, loaders())
    said = str(info.value)
    assert said.startswith(says), said
    assert said.endswith("build it with batch_size=cfg.micro_batch (a batch sampler's "
                         "batch_size too), or give the LightningModule or DataModule a "
                         "batch_size attribute that train_dataloader() reads (the callback "
                         "sets it)"), said


@pytest.mark.parametrize("loaders", [
    lambda: {"a": loader(2, sampler="BatchSampler"), "b": [loader(2, sampler="IndexBatches")]},
    lambda: [loader(2), loader(2, sampler="pre-batched")],
], ids=["dict-of-samplers", "list-with-pre-batched"])
def test_loaders_of_the_tuned_micro_batch_train(tmp_path: Path,
                                                loaders: Callable[[], Any]) -> None:
    module = fit(tuned(), tmp_path, loaders())
    assert len(module.losses) == ACCUMULATE  # one optimizer step of tuned micro-batches


@pytest.mark.parametrize(("knobs", "expected"), [
    ({}, {"precision": "32-true", "strategy": "auto"}),
    ({"precision": "bf16"}, {"precision": "bf16-mixed", "strategy": "auto"}),
    ({"precision": "fp16"}, {"precision": "16-mixed", "strategy": "auto"}),
    ({"precision": "tf32"}, {"precision": "32-true", "strategy": "auto"}),
])
def test_trainer_kwargs_carry_precision_accumulation_and_devices(knobs: dict[str, str],
                                                                 expected: dict) -> None:
    kwargs = tuned(**knobs).lightning_trainer_kwargs()
    assert kwargs == {**expected, "accumulate_grad_batches": ACCUMULATE, "accelerator": "cpu",
                      "devices": 1, "num_nodes": 1}


def test_trainer_kwargs_for_ranks_are_lightnings_strategies() -> None:
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    def job(strategy: str) -> Tuned:
        return Tuned(make_tuned(micro_batch=2, accumulate_steps=4, target_batch=64,
                                world_size=8, nproc_per_node=4, precision="fp32",
                                compile_mode="off", strategy=strategy))

    kwargs = job("ddp").lightning_trainer_kwargs()
    assert (kwargs["strategy"], kwargs["devices"], kwargs["num_nodes"]) == ("ddp", 4, 2)
    bucket = job("ddp-bucket-view").lightning_trainer_kwargs()["strategy"]
    assert isinstance(bucket, DDPStrategy) and bucket._ddp_kwargs == {
        "gradient_as_bucket_view": True}
    with pytest.warns(UserWarning, match="FSDP1 where the search measured FSDP2"):
        fsdp = job("fsdp-no-reshard").lightning_trainer_kwargs()["strategy"]
    assert isinstance(fsdp, FSDPStrategy)
    assert fsdp.sharding_strategy.name == "SHARD_GRAD_OP"


def test_the_callback_compiles_the_model_in_place_with_the_tuned_mode(tmp_path: Path) -> None:
    cfg = tuned(compile_mode="max-autotune-no-cudagraphs")
    module = LitLM(samples())
    TunedCallback(cfg, model=lambda m: m.model).setup(pl.Trainer(logger=False), module, "fit")
    compiled = module.model._compiled_call_impl  # what Module.compile installs (compiles lazily)
    assert compiled is not None and module.batch_size == MICRO


def test_trainer_kwargs_without_lightning_say_how_to_get_it(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setitem(sys.modules, "lightning.pytorch.strategies", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'autotune\[lightning\]'"):
        tuned().lightning_trainer_kwargs()
