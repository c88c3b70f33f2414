"""The ``autotune`` command (its console script, and ``python -m autotune``).

The process's signal policy (``signals.take_process_signals``) is taken before the CLI and
torch are imported: a Ctrl-C or SIGTERM while they load ends the command in one line, exit 130
or 143, never a traceback from the middle of an import.
"""

from __future__ import annotations

from autotune.signals import take_process_signals


def main() -> None:
    """Take the signal policy, then import and run the CLI."""
    take_process_signals()
    from autotune.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
