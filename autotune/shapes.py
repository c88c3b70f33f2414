"""Variable-length batches: a workload's declared lengths read, checked and applied.

The ``shapes`` knob (``knobs.py``) pads each batch to the worst case (``max``), to the next
bucket length (``buckets``) or leaves it at its own length with the sequence dimension compiled
dynamic (``dynamic``) or eager (``longest``: what a collate does, the baseline). The arithmetic
is ``autotune.lengths`` (no torch); here the workload's ``lengths`` are read once and
checked, batches are built at a length and checked to have it, and the sequence dimension is
marked dynamic. The trial, ``Tuned`` and the generated script
(its plain copy) apply a policy the same way (``docs/shapes.md``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from autotune.errors import ConfigError, WorkloadError
from autotune.lengths import POOL_STEPS, bucket_lengths, check_lengths, pad_length
from autotune.user_code import user_traceback
from autotune.workload import Batch, Workload, check_batch


@dataclass(frozen=True)
class Lengths:
    """A workload's declared lengths, checked, and its worst case."""

    values: tuple[int, ...]
    worst: int
    """The worst-case length: ``Workload.tokens_per_sample``, else the longest length."""

    def buckets(self, micro_batch: int = 1) -> tuple[int, ...]:
        """The bucket lengths of ``buckets`` at this micro-batch (``lengths.bucket_lengths``)."""
        return bucket_lengths(self.values, micro_batch=micro_batch)

    def pad(self, length: int, policy: str, micro_batch: int = 1) -> int:
        """The length a micro-batch whose longest sample is ``length`` runs at under
        ``policy``."""
        return pad_length(length, policy, self.worst,
                          self.buckets(micro_batch) if policy == "buckets" else ())


def declared_lengths(workload: Workload) -> Lengths | None:
    """The workload's ``lengths`` (called when a function), checked; None when it declares none.

    Raises:
        WorkloadError: the function raised; the lengths are empty, not integers, not positive or
            over the worst case; ``make_batch`` takes no length, or ignores it (a batch of one
            sample at the shortest length is built to see): each with the fix.
    """
    raw = workload.lengths
    if raw is None:
        return None
    source = f"workload {workload.name!r}: lengths"
    if callable(raw):
        try:
            raw = raw()
        except Exception as exc:
            frames = user_traceback(exc)
            raise WorkloadError(f"{source}() raised {type(exc).__name__}: {exc}"
                                + (f"\n{frames}" if frames else "")) from exc
    try:
        values = check_lengths(raw, source, workload.tokens_per_sample)
    except ConfigError as exc:
        raise WorkloadError(str(exc)) from None
    if not _takes_length(workload.make_batch):
        raise WorkloadError(
            f"workload {workload.name!r} declares lengths, and its make_batch takes only the "
            "micro-batch; define make_batch(micro_batch, length) returning a batch whose "
            "sequence dimension (dim 1) is that length")
    found = Lengths(values, workload.tokens_per_sample or max(values))
    if min(values) < found.worst:  # one batch of a single sample: does make_batch obey it?
        batch_at(workload, 1, min(values))
    return found


def _takes_length(make_batch: object) -> bool:
    try:
        inspect.signature(make_batch).bind(1, 1)  # type: ignore[arg-type]
    except TypeError:
        return False
    except ValueError:  # no signature to read: let the call say
        return True
    return True


def _all_tensors(batch: Batch) -> list[torch.Tensor]:
    tensors = (batch.values() if isinstance(batch, dict) else
               batch if isinstance(batch, (tuple, list)) else [batch])
    return [t for t in tensors if isinstance(t, torch.Tensor)]


def sequence_tensors(batch: Batch, length: int) -> list[torch.Tensor]:
    """The batch's tensors whose dim 1 (the sequence dimension) is ``length``."""
    return [t for t in _all_tensors(batch) if t.dim() >= 2 and t.shape[1] == length]


def batch_at(workload: Workload, micro_batch: int, length: int) -> Batch:
    """``make_batch(micro_batch, length)``, checked to have ``micro_batch`` rows and that length.

    Raises:
        WorkloadError: a bad batch, or one that ignores the length (no tensor has it in dim 1).
    """
    batch = workload.make_batch(micro_batch, length)
    check_batch(batch, micro_batch, workload.name)
    if not sequence_tensors(batch, length):
        tensors = (batch.items() if isinstance(batch, dict) else
                   enumerate(batch) if isinstance(batch, (tuple, list)) else [("batch", batch)])
        seen = ", ".join(f"{k}: {tuple(t.shape)}" for k, t in tensors)
        raise WorkloadError(
            f"workload {workload.name!r}: make_batch({micro_batch}, {length}) returned {seen}: "
            f"no tensor has the length {length} in its sequence dimension (dim 1), so it "
            "ignores the length; build the batch at that length, e.g. "
            "torch.randint(0, vocab_size, (micro_batch, length))")
    return batch


def worst_batch(workload: Workload, micro_batch: int, lengths: Lengths | None) -> Batch:
    """The worst-case batch: ``make_batch(micro_batch)``, or at the worst length when the
    workload declares lengths (memory is always probed there)."""
    if lengths is None:
        return workload.make_batch(micro_batch)
    return batch_at(workload, micro_batch, lengths.worst)


def mark_dynamic(batch: Batch, length: int | None = None) -> Batch:
    """The ``dynamic`` policy: the batch's sequence dimension marked dynamic for
    ``torch.compile`` (one graph for every length). Lengths 0 and 1, which dynamo always
    specializes, are marked only as a hint. ``length`` None: dim 1 of the batch's first tensor
    of two or more dims."""
    if length is None:
        found = [t for t in _all_tensors(batch) if t.dim() >= 2]
        if not found:
            return batch
        length = int(found[0].shape[1])
    mark = (torch._dynamo.mark_dynamic if length >= 2  # type: ignore[attr-defined]
            else torch._dynamo.maybe_mark_dynamic)  # type: ignore[attr-defined]
    for tensor in sequence_tensors(batch, length):
        mark(tensor, 1)
    return batch


@dataclass
class CompileCount:
    """Dynamo's graphs compiled and whether a frame hit the recompile limit (ran eager), over a
    stretch of a run (``watch_compiles``)."""

    graphs: int = 0
    hit_limit: str = ""
    """The limit's log line when torch gave up compiling a frame: it runs eager from then on."""


class _LimitRecord(logging.Filter):
    def __init__(self, count: CompileCount) -> None:
        super().__init__()
        self.count = count

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("torch._dynamo hit config."):
            with contextlib.suppress(TypeError, ValueError):
                self.count.hit_limit = record.getMessage().splitlines()[0]
            self.count.hit_limit = self.count.hit_limit or record.msg
        return True


@contextlib.contextmanager
def watch_compiles() -> Iterator[CompileCount]:
    """Count the graphs dynamo compiles inside the block and note a recompile limit hit."""
    from torch._dynamo.utils import counters

    count = CompileCount()
    before = int(counters["stats"].get("unique_graphs", 0))
    logger = logging.getLogger("torch._dynamo.convert_frame")
    note = _LimitRecord(count)
    logger.addFilter(note)
    try:
        yield count
    finally:
        logger.removeFilter(note)
        count.graphs = int(counters["stats"].get("unique_graphs", 0)) - before


@dataclass
class DrawnSteps:
    """A trial's optimizer steps of batches drawn from the declared lengths, each padded as the
    policy says (the same draw for every candidate of a micro-batch)."""

    steps: list[list[Batch]]
    """Per optimizer step, its micro-batches (on the trial's device, policy applied)."""
    real_tokens: int
    """Tokens that are not padding, over all the steps (each sample's drawn length)."""
    samples: int
    padded_lengths: tuple[int, ...]
    """The length each micro-batch runs at."""


def drawn_steps(workload: Workload, lengths: Lengths, policy: str, *, micro_batch: int,
                accumulate_steps: int, seed: int, device: torch.device) -> DrawnSteps:
    """``POOL_STEPS`` optimizer steps of micro-batches drawn (seeded) from ``lengths``: each
    micro-batch padded to its longest sample's length under ``policy``.

    Raises:
        WorkloadError: ``make_batch`` ignores the length (``batch_at``).
    """
    from autotune.lengths import draw_batches
    from autotune.workload import to_device

    draws = draw_batches(lengths.values, micro_batch, POOL_STEPS * accumulate_steps, seed)
    padded = tuple(lengths.pad(max(draw), policy, micro_batch) for draw in draws)
    built = [shape_batch(to_device(batch_at(workload, micro_batch, n), device), policy, n)
             for n in padded]
    steps = [built[i:i + accumulate_steps] for i in range(0, len(built), accumulate_steps)]
    return DrawnSteps(steps=steps, real_tokens=sum(sum(d) for d in draws),
                      samples=micro_batch * len(draws), padded_lengths=padded)


def shape_batch(batch: Batch, policy: str, length: int) -> Batch:
    """The batch as the policy runs it: its sequence dimension marked dynamic (``dynamic``),
    else as it is (``max`` and ``buckets`` act by the length they build it at)."""
    return mark_dynamic(batch, length) if policy == "dynamic" else batch
