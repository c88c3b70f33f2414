"""Count the live tensor bytes of a traced step: the estimator's ledger.

A dispatch mode sees every op of the step under fake tensors and records the bytes of each new
tensor storage by kind (``CATEGORIES``); a weakref finalizer on the storage is its free. The
running total and the breakdown at its peak are kept apart for forward/backward and for the
optimizer step (``trace.estimate_step`` combines them).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

CATEGORIES = ("parameters", "gradients", "optimizer", "inputs", "activations", "temporaries")


class Storages:
    """Live storage bytes by kind, the running total and the breakdown at its peak."""

    def __init__(self) -> None:
        self.records: dict[int, list[Any]] = {}
        self.by_kind = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.phase = "forward"
        # Peaks kept apart for forward/backward and for the optimizer step (see estimate_step).
        self.peaks: dict[str, tuple[int, dict[str, int], str]] = {}

    def track(self, tensor: torch.Tensor, kind: str, *, relabel: bool = False) -> None:
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass

        if is_traceable_wrapper_subclass(tensor):  # a DTensor: its local shard holds the bytes
            for name in tensor.__tensor_flatten__()[0]:
                inner = getattr(tensor, name)
                if isinstance(inner, torch.Tensor):
                    self.track(inner, kind, relabel=relabel)
            return
        storage = tensor.untyped_storage()
        record = self.records.get(id(storage))
        if record is not None:
            if relabel and record[1] != kind:
                self.by_kind[record[1]] -= record[0]
                self.by_kind[kind] += record[0]
                record[1] = kind
            return
        size = storage.nbytes()
        key = id(storage)
        record = [size, kind]
        self.records[key] = record
        # The storage's Python object lives as long as any tensor on it: its end is the free.
        weakref.finalize(storage, self._free, key)
        self._grow(kind, size)

    def resized(self, storage: torch.UntypedStorage) -> None:
        """A storage resized in place: FSDP frees its gathered parameters so, and regrows them."""
        record = self.records.get(id(storage))
        if record is not None:
            size, record[0] = record[0], storage.nbytes()
            self._grow(record[1], record[0] - size)

    def _grow(self, kind: str, size: int) -> None:
        self.by_kind[kind] += size
        self.current += size
        group = "step" if self.phase == "optimizer step" else "fwdbwd"
        if self.current > self.peaks.get(group, (-1,))[0]:
            self.peaks[group] = (self.current, dict(self.by_kind), self.phase)

    def _free(self, key: int) -> None:
        size, kind = self.records.pop(key)
        self.by_kind[kind] -= size
        self.current -= size


def dispatch_mode(storages: Storages) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map_only

    class _Tracker(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            try:
                out = func(*args, **(kwargs or {}))
            except Exception as exc:
                raise OpFailed(func, args, exc) from exc
            in_backward = torch._C._current_graph_task_id() != -1
            if storages.phase == "optimizer step":
                kind = "optimizer"
            elif storages.phase in ("inputs", "parameters", "gradients"):
                kind = storages.phase
            else:
                storages.phase = "backward" if in_backward else "forward"
                kind = "temporaries" if in_backward else "activations"
            tree_map_only(torch.Tensor, lambda t: storages.track(t, kind), out)
            return out

    return _Tracker()


class OpFailed(Exception):
    def __init__(self, func: Any, args: Any, exc: Exception) -> None:
        shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
                  for a in (args if isinstance(args, (tuple, list)) else [args])][:4]
        super().__init__(f"{func} (inputs {shapes}) raised {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}")
