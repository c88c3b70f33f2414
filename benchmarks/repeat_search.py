"""A repeated search against the first: wall time and pick, through the local study store.

Runs ``autotune search --target-batch 64`` (the built-in default workload, or ``--workload``)
twice as a new user would, each in its own output folder, with a study store of its own (a
fresh ``AUTOTUNE_CACHE_DIR``) and a fresh inductor cache shared by both runs; then once more
with ``--no-cache`` for the cold figure a user without the store would see again. Prints and
writes a Markdown table: wall time of each search, its child runs, its pick, and the repeat's
share of the first's wall time (the target is at most 0.20). Run it on a quiet machine.

    python benchmarks/repeat_search.py --name repeat_search
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def run(args: list[str], out: Path, env: dict[str, str]) -> dict[str, object]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "search", *args, "--out",
                           str(out)], env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"search failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    config = json.loads((out / "autotune.json").read_text())
    fresh = [r for r in config["runs"] if r["stored_at"] is None]
    knobs = config["knobs"]
    return {
        "wall_s": wall, "child_runs": len(fresh),
        "reused": sum(1 for r in config["runs"] if r["stored_at"]),
        "kinds": sorted({r["kind"] for r in fresh}),
        "pick": f"{knobs['precision']}/{knobs['compile_mode']} "
                + "".join(f"{k}={v} " for k, v in knobs.items()
                          if k not in ("precision", "compile_mode")
                          and v not in ("off", "default", "contiguous"))
                + f"{config['micro_batch']}x{config['accumulate_steps']}",
        "samples_per_s": config["samples_per_s"],
        "rechecks": [s["text"] for s in config["skips"] if s["rule"] == "recheck"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="repeat_search")
    parser.add_argument("--workload", default=None)
    parser.add_argument("--target", type=int, default=64)
    ns = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="autotune-repeat-"))
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(work / "cache"),
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    args = ["--target-batch", str(ns.target)] + (["--workload", ns.workload] if ns.workload
                                                  else [])
    rows = {}
    for label, extra in (("first", []), ("repeat", []), ("no store (--no-cache)",
                                                         ["--no-cache"])):
        rows[label] = run(args + extra, work / label.split()[0], env)
        print(f"{label}: {rows[label]['wall_s']:.1f} s, {rows[label]['child_runs']} child runs, "
              f"pick {rows[label]['pick']}", flush=True)
    share = rows["repeat"]["wall_s"] / rows["first"]["wall_s"]
    lines = [
        f"# Repeated search: `autotune search {' '.join(args)}`",
        "",
        "2-core CPU, torch " + _torch() + "; a fresh study store and inductor cache for the "
        "first search (the inductor cache is shared by all three).",
        "",
        "| search | wall time | child runs | reused runs | pick | samples/s |",
        "|---|---:|---:|---:|---|---:|",
        *(f"| {label} | {r['wall_s']:.1f} s | {r['child_runs']} | {r['reused']} | {r['pick']} "
          f"| {r['samples_per_s']:.1f} |" for label, r in rows.items()),
        "",
        f"Repeat / first wall time: **{share:.2f}** (target <= 0.20); same pick: "
        f"**{'yes' if rows['repeat']['pick'] == rows['first']['pick'] else 'no'}**.",
        "",
        "Re-checks of the repeat:",
        "",
        *(f"- {s}" for s in rows["repeat"]["rechecks"]),
        "",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{ns.name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _torch() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
