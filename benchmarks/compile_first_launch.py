"""The user's first launch of a tuned compiled config, with and without the compiled artifacts
the search saves beside ``autotune.json`` (issue 49; DESIGN.md section 9: >= 3x shorter).

Saves the artifacts of the slow causal LM's compiled config once (``first_launch``, as a search
does after it ends), writes ``train_autotuned.py`` for it, then runs the script ``--runs`` times
each way, alternating, each a fresh process with an empty inductor cache of its own (a new
machine): with the artifacts beside it, and with them moved away. Each run's compile seconds
to the first optimizer step: the first step's time minus the second's (the same step, compiled);
inductor's cache hits and misses as the script prints them.

Run: ``python benchmarks/compile_first_launch.py [--runs 3] [--micro-batch 8]``
-> ``results/compile-first-launch_slow-gpt2-<machine>-<date>.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from oracle import machine, write_results

HERE = Path(__file__).resolve().parent
STEP = re.compile(r"^step (\d+)/\d+ \| loss \S+ \| .* \| ([0-9.]+) s$")
CACHES = re.compile(r"inductor caches: (\d+) hits, (\d+) misses")


def launch(folder: Path, *, with_artifacts: bool) -> dict:
    """One first launch: ``train_autotuned.py --steps 2`` in a fresh process and cache."""
    bin_path = folder / "autotune.compile-cache.bin"
    away = folder / "away.bin"
    if not with_artifacts:
        bin_path.rename(away)
    try:
        with tempfile.TemporaryDirectory(prefix="first-launch-inductor-") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            out = subprocess.run([sys.executable, "train_autotuned.py", "--steps", "2",
                                  "--log-every", "1", "--out", str(folder / "ckpt")],
                                 cwd=folder, env=env, capture_output=True, text=True,
                                 timeout=1800)
    finally:
        if not with_artifacts:
            away.rename(bin_path)
    text = out.stdout + out.stderr
    times = {int(m[1]): float(m[2]) for m in (STEP.match(line) for line in text.splitlines())
             if m}
    caches = CACHES.search(text)
    row = {"with_artifacts": with_artifacts, "returncode": out.returncode,
           "loaded": "compiled artifacts loaded" in text,
           "first_step_s": times.get(1), "second_step_s": (times[2] - times[1])
           if {1, 2} <= times.keys() else None,
           "cache_hits": int(caches[1]) if caches else None,
           "cache_misses": int(caches[2]) if caches else None}
    if row["first_step_s"] is not None and row["second_step_s"] is not None:
        row["compile_s"] = row["first_step_s"] - row["second_step_s"]
    if out.returncode:
        row["output_tail"] = text[-2000:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes each way")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--name", default=None, help="results name (default: from the date)")
    args = parser.parse_args()
    from dataclasses import replace

    from autotune.api.deliver import write_train_script
    from autotune.artifacts import artifacts_name
    from autotune.config import WorkloadSpec
    from autotune.device import describe_device
    from autotune.files import write_json_atomic
    from autotune.first_launch import save_compile_artifacts
    from autotune.knobs import Knobs
    from autotune.schema import MemoryRecord, TunedConfig
    from autotune.tuned_file import save_tuned

    target = args.micro_batch * args.accumulate
    config = TunedConfig(
        autotune_version="bench", created_at="2026-11-28T00:00:00+00:00",
        workload=WorkloadSpec(kind="file", target=f"{HERE / 'workloads.py'}:slow_gpt2"),
        workload_name="slow-gpt2", workload_fingerprint="0" * 16, target_batch=target,
        world_size=1, micro_batch=args.micro_batch, accumulate_steps=args.accumulate,
        knobs=Knobs.checked(precision=args.precision, compile_mode="default"),
        memory=MemoryRecord(device_total_bytes=1 << 34, budget_bytes=1 << 33, headroom=0.1,
                            usable_bytes=int(0.9 * (1 << 33)), peak_bytes=None),
        device=describe_device("cpu"))
    folder = Path(tempfile.mkdtemp(prefix="first-launch-"))
    path = folder / "autotune.json"
    saved, why = save_compile_artifacts(config, artifacts_name(path), 1800.0)
    if saved is None:
        raise SystemExit(why)
    write_json_atomic(folder / saved.record.file, saved.data)
    config = replace(config, compile_artifacts=saved.record)
    save_tuned(config, path)
    write_train_script(config, folder)
    print(f"saved {saved.record.size_bytes / 2**20:.1f} MiB, entries {saved.record.entries}, "
          f"saving run {saved.record.compile_s:.1f} s", flush=True)
    rows = []
    for i in range(args.runs):
        for with_artifacts in ((True, False) if i % 2 == 0 else (False, True)):
            row = launch(folder, with_artifacts=with_artifacts)
            rows.append(row)
            print(row, flush=True)

    def med(key: str, flag: bool) -> float | None:
        values = [r[key] for r in rows if r["with_artifacts"] == flag and r.get(key) is not None]
        return statistics.median(values) if values else None

    warm, cold = med("compile_s", True), med("compile_s", False)
    m = machine()
    label = (f"{args.precision}/default {args.micro_batch}x{args.accumulate}")
    lines = [
        "# First launch of a tuned compiled config: with and without the compiled artifacts", "",
        f"{m['date']}; {m.get('cpu_model') or m['processor']}, {m['cpus']} CPUs; torch "
        f"{m['torch']}. `python benchmarks/compile_first_launch.py --runs {args.runs} "
        f"--micro-batch {args.micro_batch} --accumulate {args.accumulate} --precision "
        f"{args.precision}`: the slow causal LM (`benchmarks/workloads.py:slow_gpt2`), {label}; "
        "each launch `train_autotuned.py --steps 2` in a fresh process with an empty inductor "
        "cache. Compile seconds = first optimizer step minus the second. The machine is shared "
        "(2 cores, other jobs running): one sample per launch, noisy.", "",
        f"Artifacts: {saved.record.size_bytes / 2**20:.2f} MiB, entries "
        f"{saved.record.entries}.", "",
        "| run | artifacts | loaded | compile s | first step s | cache hits | cache misses |",
        "|---:|---|---|---:|---:|---:|---:|"]
    for n, r in enumerate(rows, start=1):
        lines.append(
            f"| {n} | {'with' if r['with_artifacts'] else 'without'} | {r['loaded']} | "
            f"{r.get('compile_s', 0) or 0:.1f} | {r['first_step_s'] or 0:.1f} | "
            f"{r['cache_hits']} | {r['cache_misses']} |")
    if warm and cold:
        lines += ["", f"Median compile seconds to the first optimizer step: {cold:.1f} without, "
                  f"{warm:.1f} with the artifacts: {cold / warm:.2f}x shorter (target >= 3x)."]
    name = args.name or f"compile-first-launch_slow-gpt2-epyc-{m['date'][:10]}"
    result = write_results(name, {"machine": m, "config": label, "rows": rows,
                                  "entries": saved.record.entries,
                                  "size_bytes": saved.record.size_bytes,
                                  "command": " ".join(sys.argv), "commit": _commit()},
                           "\n".join(lines) + "\n")
    print(result.read_text())


def _commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                         text=True)
    return run.stdout.strip() or "not recorded"


if __name__ == "__main__":
    main()
