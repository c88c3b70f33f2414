"""Lightning: the tuned config in a ``lightning.pytorch.Trainer``.

``cfg.lightning_trainer_kwargs()`` gives the Trainer's own arguments (precision,
accumulation, devices, strategy); ``TunedCallback(cfg)`` applies the rest, as the search
measured it::

    cfg = autotune.load("autotune.json")
    trainer = Trainer(**cfg.lightning_trainer_kwargs(), callbacks=[TunedCallback(cfg)])

At ``setup``: TF32 on or off as tuned, checkpointing of the repeated blocks and the memory
format (``cfg.apply``), ``torch.compile`` in place with the tuned mode and
``compile_dynamic`` (checkpointing ``budget-F``: the compiler's recompute set until the fit's
teardown), and the batch size (the module's or datamodule's ``batch_size``
attribute, which your ``train_dataloader`` reads, as Lightning's BatchSizeFinder sets it). At
``on_fit_start``: the optimizers ``configure_optimizers`` built, rebuilt as the tuned
implementation in place (the same objects, so the LR schedulers built on them still drive
them). At ``on_train_start`` (and a loader's first batch, where it declares no batch size):
every train loader, a dict or list of them included, must give the tuned micro-batch. Imported
only when used (``autotune.lightning``): it needs ``pip install 'autotune[lightning]'``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn
from torch.utils.data import DataLoader

from autotune import step
from autotune.errors import ConfigError, MissingDependencyError, WorkloadError
from autotune.fallback import batch_size
from autotune.usage import Tuned, watch_recompile_limit

try:
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.utilities.parsing import lightning_hasattr, lightning_setattr
except ImportError:  # said once, as the adapters say it
    raise MissingDependencyError(
        "autotune.lightning needs lightning: pip install 'autotune[lightning]' (or pip install "
        "lightning)") from None

__all__ = ["TunedCallback"]


class TunedCallback(Callback):
    """A Lightning callback that applies the tuned knobs the Trainer's arguments do not carry.

    Example:
        >>> cfg = autotune.load("autotune.json")
        >>> trainer = Trainer(**cfg.lightning_trainer_kwargs(), callbacks=[TunedCallback(cfg)])
        >>> trainer.fit(LitModel(), datamodule)
    """

    def __init__(self, cfg: Tuned, *,
                 model: Callable[[nn.Module], nn.Module] | None = None,
                 blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None) -> None:
        """Args:
            cfg: the tuned config (``autotune.load(...)`` or ``autotune.search(...)``).
            model: the tuned model inside the LightningModule, e.g. ``lambda m: m.model``
                (default: the LightningModule itself): checkpointed, converted and compiled
                in place. Compiling reaches only calls of that module, so name the one your
                ``training_step`` calls (the default compiles ``self(...)`` calls).
            blocks: its repeated blocks, as for ``cfg.apply`` (default: found as the search
                found them).
        """
        self.cfg = cfg
        self.model = model
        self.blocks = blocks
        self._budget = contextlib.ExitStack()
        self._unchecked: list[tuple[LoaderPath, str]] = []
        """The train loaders that declare no batch size, and why: checked by their first
        batch."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Before the strategy wraps the module and builds the optimizers: the model's
        knobs, compile, TF32 and the batch size. Build the model in ``__init__`` (a model
        built later, in ``configure_model``, is not there yet)."""
        if stage != "fit":
            return
        cfg = self.cfg
        cfg.set_matmul_precision()
        target = self.model(pl_module) if self.model is not None else pl_module
        cfg.apply(target, self.blocks)
        if cfg.knobs.memory_format == "channels_last":
            _convert_batches(pl_module, cfg)
        if cfg.compiled and cfg.knobs.compile_scope == "blocks":
            cfg.compile(target, self.blocks)  # each block's forward, in place
        elif cfg.compiled:
            watch_recompile_limit()
            target.compile(mode=None if cfg.compile_mode == "default" else cfg.compile_mode,
                           dynamic=cfg.config.compile_dynamic)
            # checkpointing budget-F: the compiler's recompute, set for the fit (the in-place
            # compile compiles at the first step), torch's own value again at its teardown
            self._budget.enter_context(step.budget_patch(cfg.knobs))
        if lightning_hasattr(pl_module, "batch_size"):
            lightning_setattr(pl_module, "batch_size", cfg.micro_batch)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """After the fit: torch's own ``activation_memory_budget`` again (``budget-F``)."""
        if stage == "fit":
            self._budget.close()

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """The optimizers as the tuned implementation, before their first step."""
        for optimizer in trainer.optimizers:
            rebuilt = self.cfg.build_optimizer(optimizer)
            if rebuilt is not optimizer:
                _adopt(optimizer, rebuilt)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Refuse a train loader whose batch is not the tuned micro-batch: the effective
        batch, the memory and the speed were all measured at that one. Every loader is
        checked (a dict or a list of them, nested: Lightning's CombinedLoader shapes), by its
        ``batch_size`` or its batch sampler's; one that declares neither, by its first batch
        (``on_train_batch_start``).

        Raises:
            ConfigError: naming the loader, both sizes and where to set the tuned one.
        """
        self._unchecked = []
        for path, loader in _leaves(trainer.train_dataloader):
            size, said = _declared_batch_size(loader)
            if size is None:
                self._unchecked.append((path, said))
            elif size != self.cfg.micro_batch:
                raise self._refusal(f"{_name(path)}{said} has batch_size {size}, the tuned "
                                    f"micro-batch is {self.cfg.micro_batch}")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        """The first batch of each loader that declares no batch size, before its step: it
        must hold the tuned micro-batch of samples (the first dimension of its first tensor).

        Raises:
            ConfigError: it holds another number, or no tensor to count by.
        """
        unchecked, self._unchecked = self._unchecked, []
        for path, why in unchecked:
            samples = _samples(_part(batch, path))
            if samples is None:
                raise self._refusal(f"{_name(path)}'s batch size cannot be checked: it declares "
                                    f"none ({why}), and its first batch holds no tensor")
            if samples != self.cfg.micro_batch:
                raise self._refusal(
                    f"{_name(path)} declares no batch size ({why}), and its first batch holds "
                    f"{samples} samples (the first dimension of its first tensor), the tuned "
                    f"micro-batch is {self.cfg.micro_batch}")

    @staticmethod
    def _refusal(problem: str) -> ConfigError:
        return ConfigError(
            f"{problem}: build it with batch_size=cfg.micro_batch (a batch sampler's "
            "batch_size too), or give the LightningModule or DataModule a batch_size attribute "
            "that train_dataloader() reads (the callback sets it)")


LoaderPath = tuple[Any, ...]
"""Where a loader sits among the train loaders: the keys and indices down to it."""


def _leaves(loaders: Any, path: LoaderPath = ()) -> list[tuple[LoaderPath, Any]]:
    """Each loader of a loader, a dict or a list (tuple) of them, nested as Lightning nests
    them (the batch has the same structure), with its path."""
    if isinstance(loaders, dict):
        return [leaf for key, value in loaders.items() for leaf in _leaves(value, (*path, key))]
    if isinstance(loaders, (list, tuple)):
        return [leaf for i, value in enumerate(loaders) for leaf in _leaves(value, (*path, i))]
    return [] if loaders is None else [(path, loaders)]


def _name(path: LoaderPath) -> str:
    return "the train loader" + (" " + "".join(f"[{key!r}]" for key in path) if path else "")


def _declared_batch_size(loader: Any) -> tuple[int | None, str]:
    """A loader's batch size, from its ``batch_size`` or its batch sampler's, and where it was
    read (``'s batch_sampler (BatchSampler)``); None and why none is declared otherwise."""
    size = getattr(loader, "batch_size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size, ""
    sampler = getattr(loader, "batch_sampler", None)
    if sampler is not None:
        size = getattr(sampler, "batch_size", None)
        kind = type(sampler).__name__
        if isinstance(size, int) and not isinstance(size, bool):
            return size, f"'s batch_sampler ({kind})"
        return None, f"its batch_sampler, {kind}, has no batch_size"
    if isinstance(loader, DataLoader):
        return None, "batch_size=None: it yields what its dataset gives"
    return None, f"a {type(loader).__name__}, not a DataLoader, with no batch_size"


def _part(batch: Any, path: LoaderPath) -> Any:
    """The part of a combined batch that a loader's ``path`` leads to (None: not there)."""
    for key in path:
        try:
            batch = batch[key]
        except (KeyError, IndexError, TypeError):
            return None
    return batch


def _samples(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (None: no tensor)."""
    try:
        return batch_size(batch)
    except WorkloadError:
        return None


def _adopt(optimizer: Any, rebuilt: Any) -> None:
    """Make ``optimizer`` the rebuilt one in place: the Trainer, its LightningOptimizer and
    any LR scheduler keep the object they hold. A scheduler's wrapper of ``step`` (an
    attribute of the instance, bound to it by reference) is kept."""
    wrapped_step = optimizer.__dict__.get("step")
    optimizer.__dict__.clear()
    optimizer.__dict__.update(rebuilt.__dict__)
    if wrapped_step is not None:
        optimizer.step = wrapped_step


def _convert_batches(pl_module: Any, cfg: Tuned) -> None:
    """Each batch channels-last after it reaches the device, after the module's own hook."""
    own = pl_module.on_after_batch_transfer

    def on_after_batch_transfer(batch: Any, dataloader_idx: int) -> Any:
        return cfg.batch(own(batch, dataloader_idx))

    pl_module.on_after_batch_transfer = on_after_batch_transfer
