"""Ctrl-C and SIGTERM during a search: the first one ends the running stage, every later one
waits until the outputs are written (DESIGN.md section 10).

A search holds a result from its first timed run on; a signal must then cost the rest of the
search, never the result. ``guarded()`` installs one handler for SIGINT and SIGTERM for the
whole pipeline (search, calibration, writing). It holds each signal (records it and returns)
except inside ``SignalGuard.armed()``, the regions a signal may cut short (the stages, the
calibration), where the first one raises ``Interrupted`` and the guard goes back to holding at
once: a second Ctrl-C 0.3 s later lands in the bookkeeping of the first and is held, not
raised there. A signal held before an armed region ends it as it starts. What was held is
acted on after the writes (``Interrupted`` saying what was written).

The ``autotune`` process itself (``take_process_signals``, first thing in its entry point) has
one policy around that: before a command runs (torch and the CLI importing, the options being
read) a signal ends it at once in one line, nothing written; while a command runs the first one
raises ``Interrupted`` (the command says what it kept) and any later one is held; once the
command is ending (``ending``) every signal is ignored, so its exit code and line stand, never a
traceback from an exit handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from autotune.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def interrupted_by(signum: int) -> Interrupted:
    """The ``Interrupted`` a signal number stands for (130 for SIGINT, 143 for SIGTERM)."""
    return Interrupted(signal.Signals(signum).name, signum)


class SignalGuard:
    """Where a signal may raise during a search, and the signals held elsewhere.

    Without ``guarded()`` (a guard never installed, or off the main thread) it holds nothing
    and ``armed()`` changes nothing: signals behave as Python's defaults.
    """

    def __init__(self) -> None:
        self.held: list[int] = []
        """Signals that came while holding, in order, not yet acted on."""
        self.raised: list[int] = []
        """Signals that ended an armed region (at most one per region)."""
        self._armed = False

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        """The installed handler: raise in an armed region (once), else hold."""
        if self._armed:
            self._armed = False  # whatever comes next lands in the handling of this one
            self.raised.append(signum)
            raise interrupted_by(signum)
        self.held.append(signum)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """A region a signal may cut short: the first signal raises ``Interrupted``; one
        held before the region raises as it starts.

        Raises:
            Interrupted: a signal came (or had been held).
        """
        if self.held:
            signum = self.held.pop(0)
            self.raised.append(signum)
            raise interrupted_by(signum)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False


@contextlib.contextmanager
def guarded() -> Iterator[SignalGuard]:
    """Install a ``SignalGuard`` for SIGINT and SIGTERM until the block ends, then restore the
    handlers before. A signal ignored before (``SIG_IGN``, e.g. a job started in the
    background) stays ignored. Only the main thread can handle signals: elsewhere the guard is
    inert."""
    guard = SignalGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    # SIG_IGN stays; None is a handler set outside Python, which cannot be put back.
    taken = {sig: h for sig, h in previous.items() if h not in (signal.SIG_IGN, None)}
    for sig in taken:
        signal.signal(sig, guard.handle)
    try:
        yield guard
    finally:
        for sig, handler in taken.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------------------------------------
# The autotune process's own policy (the CLI's entry point): before, during and after a command.

_phase: list[str] = []
"""``startup``, ``command`` or ``ending`` once ``take_process_signals`` ran; empty (no policy:
Python's defaults, a library's caller's own) before."""
_acted_on: list[int] = []
"""The signal a command's ``Interrupted`` came from (later ones are held)."""


def take_process_signals() -> None:
    """Put SIGINT and SIGTERM under the autotune process's policy (the module docstring); in the
    startup phase until a command runs. Only for the process ``autotune`` is: never a library
    caller's. A signal ignored before (a job started in the background) stays ignored."""
    if _phase:
        return
    _phase.append("startup")
    for sig in SIGNALS:
        if signal.getsignal(sig) not in (signal.SIG_IGN, None):
            signal.signal(sig, _on_signal)


@contextlib.contextmanager
def command() -> Iterator[None]:
    """A command runs: the first signal raises ``Interrupted``, any later one is held. When
    the block ends, however it ends, the command is ending (``ending``). Without the process
    policy it changes nothing."""
    if not _phase:
        yield
        return
    _phase[0] = "command"
    try:
        yield
    finally:
        ending()


def ending() -> None:
    """The command is ending, its exit code decided: every later SIGINT and SIGTERM is ignored
    (ignored, not handled: Python puts back the default action of a handled signal as it shuts
    down, which would end the process by the signal instead of its code)."""
    if not _phase:
        return
    _phase[0] = "ending"
    for sig in SIGNALS:
        if signal.getsignal(sig) is not None:
            signal.signal(sig, signal.SIG_IGN)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if _phase[0] == "startup":  # nothing ran, nothing written: leave now, in one line
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        with contextlib.suppress(OSError):
            os.write(2, f"interrupted ({name}): nothing written\n".encode())
        os._exit(128 + signum)
    if _phase[0] == "command" and not _acted_on:
        _acted_on.append(signum)
        raise interrupted_by(signum)
