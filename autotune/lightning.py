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
them). Imported only when used (``autotune.lightning``): it needs ``pip install
'autotune[lightning]'``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from autotune import step
from autotune.errors import ConfigError, MissingDependencyError
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
        if cfg.compile_mode != "off" and cfg.knobs.compile_scope == "blocks":
            cfg.compile(target, self.blocks)  # each block's forward, in place
        elif cfg.compile_mode != "off":
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
        batch, the memory and the speed were all measured at that one.

        Raises:
            ConfigError: naming both sizes and where to set the tuned one.
        """
        size = getattr(trainer.train_dataloader, "batch_size", None)
        if isinstance(size, int) and size != self.cfg.micro_batch:
            raise ConfigError(
                f"the train DataLoader's batch_size is {size}, the tuned micro-batch is "
                f"{self.cfg.micro_batch}: build it with batch_size=cfg.micro_batch, or give "
                "the LightningModule or DataModule a batch_size attribute that "
                "train_dataloader() reads (the callback sets it)")


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
