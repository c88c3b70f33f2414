"""Slots: the devices (or cores) a search runs its children on at once (``--parallel N``).

A search process is the coordinator: it decides, and it alone writes the study store; its
children run on slots. With one slot every run goes as before (``Executor.run``, one after
another). With N, a batch of runs a stage makes whatever their results (the joint screen's
proposals, a re-measure's), or chains of runs each decided on its own results (the classes'
memory probes, a knob's values: ``batch.run_chains``, each chain's next run fed in as it is
decided), goes through ``dispatch``: up to N at once, a new one started as soon as a slot
frees, each result told in the order it arrives.

A slot pins its child (``Slot.env``): on CUDA to its own device(s) by UUID
(``CUDA_VISIBLE_DEVICES`` with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), on CPU to a disjoint set of
cores (``AUTOTUNE_SLOT_CORES``: the child sets its affinity and torch's threads before it runs
anything, ``runner.child_main``); each gets its share of inductor's compile threads
(``TORCHINDUCTOR_COMPILE_THREADS``). ``Slots`` is what the executor talks to (``submit``,
``wait``): ``ThreadSlots`` runs real children, one thread each; the replay's simulated pool
(``benchmarks/replay_parallel.py``) runs the same ``dispatch`` on its simulated clock.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from autotune.child import Child
from autotune.config import TrialResult, TrialSpec
from autotune.pinning import SLOT_CORES
from autotune.runner import run_isolated

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Slot:
    """Where one child runs: its device(s) or cores, and the variables that pin it there."""

    index: int
    label: str
    """Said with each run (progress, ``RunRecord.slot``): ``cuda:0`` or ``cpu 0-3``."""
    env: tuple[tuple[str, str], ...] = ()
    """Set in the child's environment (``runner.run_isolated``'s ``slot_env``)."""
    devices: int = 1
    """Devices it holds (a job of k ranks: k)."""


def plan_slots(device: str, width: int, ranks: int = 1, *,
               uuids: Sequence[str] | None = None,
               cores: Sequence[int] | None = None) -> list[Slot]:
    """``width`` slots on ``device``'s kind, each of ``ranks`` devices (CUDA) or an equal
    share of the cores (CPU); the request's check (``TuneRequest.validate``) made sure they
    exist.

    Args:
        device: ``cpu`` or ``cuda[:N]``.
        width: slots (``--parallel``, resolved).
        ranks: devices a job holds (``--nproc-per-node``).
        uuids: the visible CUDA devices' UUIDs in torch's order (default: ``device_ids``).
        cores: the CPU cores this process may use (default: its affinity).
    """
    if device.startswith("cuda"):
        ids = list(uuids if uuids is not None else device_ids())
        compile_threads = max(1, (os.cpu_count() or 1) // width)
        slots = []
        for i in range(width):
            mine = ids[i * ranks:(i + 1) * ranks]
            slots.append(Slot(i, f"cuda:{i * ranks}" + (f"-{(i + 1) * ranks - 1}"
                                                          if ranks > 1 else ""),
                              (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
                               ("CUDA_VISIBLE_DEVICES", ",".join(mine)),
                               ("TORCHINDUCTOR_COMPILE_THREADS", str(compile_threads))),
                              devices=ranks))
        return slots
    have = sorted(cores if cores is not None else available_cores())
    each = max(1, len(have) // width)
    slots = []
    for i in range(width):
        mine = have[i * each:(i + 1) * each] or have[-each:]
        label = f"cpu {mine[0]}" + (f"-{mine[-1]}" if len(mine) > 1 else "")
        slots.append(Slot(i, label, (
            (SLOT_CORES, ",".join(map(str, mine))), ("OMP_NUM_THREADS", str(len(mine))),
            ("TORCHINDUCTOR_COMPILE_THREADS", str(len(mine)))), devices=ranks))
    return slots


def available_cores() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def device_ids() -> list[str]:
    """The visible CUDA devices' UUIDs (NVML, without a CUDA context here), in torch's order;
    their indices where NVML cannot say."""
    from autotune.device.cuda import visible_uuids

    return visible_uuids()


@dataclass(frozen=True)
class Done:
    """A run that ended on a slot: its result, or what its runner raised."""

    ticket: int
    slot: Slot
    result: TrialResult | None
    error: BaseException | None = None


class Slots:
    """A pool of slots the executor submits runs to and waits on (``dispatch``)."""

    width: int = 1
    alone: str = ""
    """The slot a run outside a batch goes to (``run_alone``): said in its record."""

    def run_alone(self, spec: TrialSpec) -> TrialResult:
        """A run outside a batch (nothing else running), pinned as the batch's runs are: on
        CPU its timings then compare with theirs (the same cores per child)."""
        raise NotImplementedError

    def submit(self, ticket: int, spec: TrialSpec) -> Slot:
        """Start ``spec`` on a free slot (one is free: ``dispatch`` counts them)."""
        raise NotImplementedError

    def wait(self) -> Done:
        """The next run to end (blocks until one does)."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Stop every running child (Ctrl-C in the coordinator); each still ends in ``wait``."""


SlotRunner = Callable[[TrialSpec, Slot, Callable[[Child], None]], TrialResult]
"""Runs a spec pinned to a slot; calls its third argument with the child once started (so a
cancel can kill it)."""


class ThreadSlots(Slots):
    """Real children, one thread per running one (each waits on its child: the coordinator's
    thread stays free to decide)."""

    def __init__(self, slots: Sequence[Slot], run: SlotRunner) -> None:
        self.slots, self.run, self.width = list(slots), run, len(slots)
        self.alone = self.slots[0].label
        self._free = list(self.slots)
        self._ended: queue.Queue[Done] = queue.Queue()
        self._children: dict[int, Child] = {}
        self._lock = threading.Lock()

    def submit(self, ticket: int, spec: TrialSpec) -> Slot:
        slot = self._free.pop(0)

        def work() -> None:
            try:
                result = self.run(spec, slot, lambda child: self._started(ticket, child))
                done = Done(ticket, slot, result)
            except BaseException as exc:  # said in the coordinator, which raises it
                done = Done(ticket, slot, None, exc)
            with self._lock:
                self._children.pop(ticket, None)
            self._ended.put(done)

        threading.Thread(target=work, name=f"autotune-slot-{slot.index}", daemon=True).start()
        return slot

    def run_alone(self, spec: TrialSpec) -> TrialResult:
        return self.run(spec, self.slots[0], lambda child: None)

    def _started(self, ticket: int, child: Child) -> None:
        with self._lock:
            self._children[ticket] = child

    def wait(self) -> Done:
        done = self._ended.get()
        self._free.append(done.slot)
        self._free.sort(key=lambda s: s.index)
        return done

    def cancel(self) -> None:
        with self._lock:
            children = list(self._children.values())
        for child in children:
            child.kill()


@dataclass
class Begun(Generic[T]):
    """What ``dispatch``'s ``start`` made of an item: a run to submit (``spec``, with what its
    end needs in ``token``), or the item's answer without a run (``value``)."""

    spec: TrialSpec | None = None
    token: object = None
    value: object = None


def dispatch(slots: Slots, items: Sequence[T], start: Callable[[T], Begun[T]],
             end: Callable[[T, object, Done], R],
             started: Callable[[T, object, Slot], None] | None = None,
             feed: list[T] | None = None) -> Iterator[tuple[T, R | object]]:
    """Run ``items`` on ``slots``: each started in order (``start``) as a slot frees (and
    said, ``started``, once it has its slot), each yielded with its ``end`` in the order the
    runs end (an item answered without a run, at once). ``feed``: items the caller adds
    while it runs (at a yield: a chain's next run once the one before it was told), started
    after those waiting.

    Nothing finished is lost: where ``start`` or ``end`` raises (a limit's ``Stop``), no item
    starts after it, the runs still running end and are yielded, then it is raised; where the
    caller stops (its own exception at a yield), the runs still running end and are recorded
    (``end``) before it goes on up; Ctrl-C kills them first (``Slots.cancel``).
    """
    waiting = list(items)
    running: dict[int, tuple[T, object]] = {}
    tickets = itertools.count()
    error: BaseException | None = None
    try:
        while waiting or running or feed:
            if feed:
                waiting += feed
                feed.clear()
            if waiting and error is None and len(running) < slots.width:
                item = waiting.pop(0)
                try:
                    begun = start(item)
                except Exception as exc:  # no later item starts; the running ones end first
                    error, waiting = exc, []
                    continue
                if begun.spec is None:
                    yield item, begun.value
                    continue
                ticket = next(tickets)
                running[ticket] = (item, begun.token)
                slot = slots.submit(ticket, begun.spec)
                if started is not None:
                    started(item, begun.token, slot)
                continue
            if not running:
                break
            done = slots.wait()
            item, token = running.pop(done.ticket)
            try:
                value = end(item, token, done)
            except Exception as exc:
                error = error or exc
                continue
            yield item, value
        if error is not None:
            raise error
    except BaseException as exc:
        # Ctrl-C, SIGTERM: the children go now, and a run killed so says nothing of its
        # candidate (its trial fails, as one run at a time). Else (a limit, the caller's own
        # exception at a yield) the running ones end and are recorded.
        interrupted = not isinstance(exc, (Exception, GeneratorExit))
        if interrupted:
            slots.cancel()
        while running:
            done = slots.wait()
            item, token = running.pop(done.ticket)
            if interrupted:
                done = Done(done.ticket, done.slot, None, exc)
            with contextlib.suppress(BaseException):  # the first error is the one raised
                end(item, token, done)
        raise


def run_pinned(spec: TrialSpec, slot: Slot, on_start: Callable[[Child], None]) -> TrialResult:
    """``run_isolated`` pinned to ``slot``: on CUDA the child sees its slot's devices alone,
    so it runs on ``cuda:0`` (a job's ranks on theirs, by local rank)."""
    if any(name == "CUDA_VISIBLE_DEVICES" for name, _ in slot.env):
        spec = replace(spec, device="cuda:0")
    return run_isolated(spec, slot_env=dict(slot.env), on_start=on_start)


def thread_slots(device: str, width: int, ranks: int = 1) -> ThreadSlots | None:
    """``width`` pinned slots of real children on ``device`` (``plan_slots``); None for
    one: a search of one child at a time runs as it always did."""
    if width <= 1:
        return None
    return ThreadSlots(plan_slots(device, width, max(1, ranks)), run_pinned)
