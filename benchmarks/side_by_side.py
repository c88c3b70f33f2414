"""Several configs of one workload timed side by side, in interleaved rounds (CPU).

What one exhaustive pass cannot say: its best is the highest of many single runs on a noisy
machine, so a pick judged against it scores low even when it runs as fast. Here every config
runs once a round in a fresh child (the spec the search times with, never stopped early:
``oracle.run_side_by_side``), the order reversed every other round, under the workload's cap;
each is judged against the first config named (the reference, e.g. the oracle's best): the
ratio of the medians, and the lowest and highest ratio within a round.

Run: ``python benchmarks/side_by_side.py --workload slow_gpt2 --target 32 --rounds 3
REFERENCE_KEY KEY [KEY ...]`` (keys as the results files write them, e.g.
``fp32/default+ckpt=alternate/16``); writes ``benchmarks/results/<--name>.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time

from oracle import (
    machine,
    per_round_cell,
    run_side_by_side,
    side_by_side_summary,
    write_results,
)
from search_quality import BY_SHORT, HEADROOM, fresh_inductor_cache, log

from autotune.config import Knobs
from autotune.errors import ConfigError
from autotune.space import divisors
from autotune.units import format_bytes

NAME = "side_by_side"


def parse_key(key: str, target: int) -> tuple[Knobs, int]:
    """A candidate key (``label/micro_batch``) as knobs and a micro-batch that divides the
    target; ValueError with what was wrong otherwise."""
    label, _, micro_batch = key.rpartition("/")
    try:
        knobs = Knobs.from_label(label)
    except ConfigError as exc:
        raise ValueError(f"{key!r}: {exc} (a key reads like fp32/default+ckpt=blocks/16)") \
            from exc
    if not micro_batch.isdigit() or int(micro_batch) not in divisors(target):
        raise ValueError(f"{key!r}: the micro-batch {micro_batch!r} is not a divisor of the "
                         f"target {target} (one of {', '.join(map(str, divisors(target)))})")
    return knobs, int(micro_batch)


def render(out: dict) -> str:
    m, d = out["machine"], out["summary"]
    ref = d["first"]
    lines = [
        f"# Side by side: {out['workload']}", "",
        f"{m['date']}; {m.get('cpu_model') or m['processor']}, {m['cpus']} CPUs; torch "
        f"{m['torch']}, transformers {m['transformers']}. Run {out['wall_s']:.0f} s: "
        f"`{out['command']}`. {out['concurrency'] or 'Other jobs may have run at the same time.'}",
        "",
        f"Target batch {out['target_batch']} under a {format_bytes(out['budget_bytes'])} cap. "
        f"{out['rounds']} rounds; each config once a round in a fresh child (the search's timing "
        "spec, never stopped early), the order reversed every other round. Each config against "
        f"the reference ({ref}): the ratio of the medians, in brackets the lowest and highest "
        "within a round (run back to back).", "",
        "| config | samples/s per round | median samples/s | over the reference |",
        "|---|---:|---:|---:|"]
    for key in d["samples_per_s"]:
        runs = per_round_cell(d, key)
        median = d["median_samples_per_s"][key]
        if key == ref:
            cell = "(reference)"
        else:
            vs = d["against"][key]  # the reference over this one: inverted to this over it
            cell = "-" if not vs["ratio"] else f"{1 / vs['ratio']:.2f}" + (
                f" ({1 / vs['highest']:.2f}-{1 / vs['lowest']:.2f})" if vs["lowest"] else "")
        lines.append(f"| {key} | {runs} | {'-' if median is None else f'{median:.1f}'} | "
                     f"{cell} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True, choices=sorted(BY_SHORT))
    parser.add_argument("--target", type=int, required=True, help="target (effective) batch")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (1-10, default 3)")
    parser.add_argument("--concurrency", default="",
                        help="note for the results, e.g. what else this run shared the CPU with")
    parser.add_argument("--name", default=NAME, help=f"results file name (default {NAME})")
    parser.add_argument("keys", nargs="+", metavar="KEY",
                        help="configs as label/micro-batch, the reference first")
    args = parser.parse_args()
    if args.target < 1:
        parser.error(f"--target must be at least 1, got {args.target}")
    if not 1 <= args.rounds <= 10:
        parser.error(f"--rounds takes 1 to 10, got {args.rounds}")
    if len(args.keys) < 2 or len(set(args.keys)) != len(args.keys):
        parser.error(f"name two or more different configs, got {args.keys}")
    try:
        contenders = [parse_key(k, args.target) for k in args.keys]
    except ValueError as exc:
        parser.error(str(exc))
    bench = BY_SHORT[args.workload]
    fresh_inductor_cache()  # every config's first round compiles afresh, as on a new machine
    start = time.perf_counter()
    runs = run_side_by_side(bench.spec(), "cpu", args.target, contenders, rounds=args.rounds,
                            budget_bytes=bench.budget_bytes, log=log)
    out = {"machine": machine(), "workload": bench.title, "short": bench.short,
           "target_batch": args.target, "budget_bytes": bench.budget_bytes,
           "headroom": HEADROOM, "rounds": args.rounds, "concurrency": args.concurrency,
           "command": "python benchmarks/side_by_side.py " + " ".join(sys.argv[1:]),
           "summary": side_by_side_summary(runs, args.target, args.keys[0]),
           "wall_s": time.perf_counter() - start}
    print(write_results(args.name, out, render(out)).read_text())


if __name__ == "__main__":
    main()
