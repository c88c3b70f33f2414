"""A workload file that calls sys.exit(0) as it is imported (factory ``workload``)."""

from __future__ import annotations

import sys

sys.exit(0)


def workload() -> None:  # pragma: no cover - never reached
    """Would return the workload, had the import finished."""
