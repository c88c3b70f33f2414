"""The warnings a delivered compiled path gives: torch.compile's recompile limit hit (one
line that says what it costs and what to do), and compiled artifacts not loaded.

``autotune.usage`` and ``autotune.lightning`` install the note; both re-export them.
"""

from __future__ import annotations

import logging
import warnings


class _RecompileLimitNote(logging.Filter):
    """Turns torch's "hit config.recompile_limit" log record into one warning that says what
    it costs and what to do (the record itself passes on unchanged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str)
                and record.msg.startswith("torch._dynamo hit config.")):
            return True
        try:
            lines = record.getMessage().splitlines()
        except (TypeError, ValueError):  # arguments of another shape: say it without them
            lines = [record.msg]
        limit = lines[0].removeprefix("torch._dynamo hit config.")
        where = next((ln.strip().removeprefix("function: ") for ln in lines
                      if ln.strip().startswith("function:")), "a compiled function")
        warnings.warn(
            f"torch.compile hit its {limit} in {where}: that code runs eager from now on, "
            "slower than tuned (its input shapes keep changing); pad batches to a few fixed "
            'lengths, or set "compile_dynamic": true in autotune.json (dynamic from the first '
            "compile), or raise torch._dynamo.config.recompile_limit", RecompileLimitWarning,
            stacklevel=2)
        return True


class CompileArtifactsWarning(UserWarning):
    """The compiled artifacts beside ``autotune.json`` were not loaded: the first compile
    compiles from nothing (the message says why)."""


ARTIFACTS_LOG = logging.getLogger("autotune.artifacts")


class RecompileLimitWarning(UserWarning):
    """torch.compile hit its recompile limit in a delivered path: part of the model runs eager."""


_NOTE = _RecompileLimitNote()


def watch_recompile_limit() -> None:
    """Warn in one line when torch.compile hits its recompile limit in this process (once
    installed, for every compiled model: ``Tuned.compile`` and the Accelerate plugin)."""
    logger = logging.getLogger("torch._dynamo.convert_frame")
    if _NOTE not in logger.filters:
        logger.addFilter(_NOTE)
