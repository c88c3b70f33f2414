"""``autotune cache list`` and ``clear``: the local study store a repeated search reuses."""

from __future__ import annotations

import typer

from autotune.cli.options import JsonOpt
from autotune.cli.output import err, exits, out, out_for_tables

cache_app = typer.Typer(
    help="The local study store: a repeated search reuses the runs it holds.",
    no_args_is_help=True)


@cache_app.command("list")
def cache_list(json_out: JsonOpt = False) -> None:
    """Show the stored studies: what each search was for, its runs, its last run."""
    with exits():
        import json

        from autotune import report
        from autotune.search import list_studies

        path, studies = list_studies()
        if json_out:
            print(json.dumps({"store": str(path), "studies": [
                {"name": s.name, "key": s.key, "num_runs": s.num_runs,
                 "last_run_at": s.last_run_at} for s in studies]}, indent=2))
            return
        if not studies:
            out.print(f"no stored studies ({path})", highlight=False, markup=False)
            return
        out_for_tables().print(report.cache_table(path, studies))
        out.print("open it in optuna-dashboard: optuna-dashboard sqlite:///" + str(path),
                  highlight=False, markup=False)


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove the local study store (every stored study; a search starts afresh)."""
    with exits():
        from autotune.search import clear_studies

        removed = clear_studies()
        for path in removed:
            err.print(f"removed {path}", highlight=False, markup=False)
        if not removed:
            err.print("nothing to remove: the study store is empty", highlight=False,
                      markup=False)

