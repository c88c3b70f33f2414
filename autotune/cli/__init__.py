"""The ``autotune`` command: thin typer adapters over ``autotune.api``.

Torch is imported only inside commands, so ``autotune --help`` stays fast.
Logs and progress go to stderr, results to stdout. ``output``: how a command prints and ends;
``options``: the options commands share, the knob options made from ``KNOBS``; the commands:
``tune`` (env, probe, search), ``fits`` (estimate, check), ``verify``, ``files`` (codegen,
export, report, schema) and ``cache``.
"""

from __future__ import annotations

import typer

from autotune.cli import cache, files, fits, tune, verify
from autotune.signals import ending, take_process_signals

app = typer.Typer(
    help="Find the fastest way to train your model at the effective batch size you want.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
for name, run in (("env", tune.env), ("probe", tune.probe), ("search", tune.search),
                  ("estimate", fits.estimate), ("check", fits.check),
                  ("verify", verify.verify),
                  ("codegen", files.codegen), ("export", files.export_command),
                  ("report", files.report_command), ("schema", files.schema_command)):
    app.command(name)(run)
app.add_typer(cache.cache_app, name="cache")


def main() -> None:
    """The CLI, under the autotune process's signal policy (``signals.take_process_signals``;
    the ``autotune`` command's entry point, ``autotune.__main__``, takes it before this module
    is imported): SIGTERM (``timeout``, a CI cancel, ``docker stop``) ends autotune the way
    Ctrl-C does, the running child killed with its process group, the best so far kept."""
    take_process_signals()
    try:
        app(prog_name="autotune")
    finally:
        ending()

