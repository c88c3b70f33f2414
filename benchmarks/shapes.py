"""The shape policies on variable-length data (issue 48): max, buckets and dynamic side by side,
and what the search picks, against the user's own loop (issue 62).

A variable-length causal LM (``workloads.py:varlen_gpt``: lengths log-normal, median 50 of 256
tokens) is searched with ``--shapes max,buckets,dynamic`` (fp32, compile off and default; the
other knobs held at their defaults, as the side-by-side runs them), then
the three policies compiled, and eager (where ``dynamic`` runs as ``longest``: each batch padded
to its longest sample, what a collate does, the search's baseline) run side by side at the pick's
micro-batch in interleaved rounds, each in a fresh child as the search times it: real tokens/s
(tokens that are not padding), samples/s, the graphs each compiled, and each over the baseline.

Run: ``python benchmarks/shapes.py --target 16 --rounds 3``; writes
``benchmarks/results/shapes_varlen-gpt-<machine>-<date>.{json,md}``. On a GPU (the GPU suite's
entry, ``gpu_call.sh``): ``--device cuda --precision bf16 --machine h100``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from oracle import machine, run_side_by_side, write_results
from search_quality import fresh_inductor_cache, log

from autotune import api, report, report_progress
from autotune.config import Knobs, WorkloadSpec
from autotune.knob_rules import meaningful
from autotune.knobs import timed_baseline
from autotune.search import SearchSettings

HERE = Path(__file__).resolve().parent
POLICIES = ("max", "buckets", "dynamic")


def _tokens_per_s(result, per_device: int) -> float | None:
    median = result.median_step_s() if result.ok else None
    if not median or not result.tokens_per_sample:
        return None
    return per_device / median * result.tokens_per_sample


def _log_probe(knobs, step) -> None:  # the search's runs, as `autotune search` prints them
    if not step.timed:
        log(report_progress.probe_step_line(knobs.label(), step))


def _log_trial(num_runs, stage, candidate, record) -> None:
    if record is not None:
        log(report_progress.trial_line(record, stage))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--machine", default="epyc")
    parser.add_argument("--modes", default="off,default")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16", "tf32"),
                        help="the one precision searched and run side by side")
    parser.add_argument("--name", default=None)
    parser.add_argument("--pick", default=None,
                        help="a search's pick (label/micro_batch) from an earlier run of this "
                        "benchmark: skip the search, time the policies side by side")
    parser.add_argument("--search-s", type=float, default=None,
                        help="with --pick: how long that search took")
    parser.add_argument("--timed-steps", type=int, default=10,
                        help="timed units per side-by-side run (each a pass over the draw)")
    parser.add_argument("--load-note", default="",
                        help="what else ran on the machine meanwhile (said in the table)")
    args = parser.parse_args()
    fresh_inductor_cache()
    start = time.perf_counter()
    workload = WorkloadSpec(kind="file", target=f"{HERE / 'workloads.py'}:varlen_gpt")
    modes = args.modes.split(",")
    request = api.TuneRequest(
        workload=workload, target_batch=args.target, device=args.device,
        precisions=[args.precision],
        compile_modes=modes, knob_values={"shapes": list(POLICIES), "checkpointing": ["off"],
                                          "optimizer_impl": ["default"],
                                          "compile_scope": ["model"]})
    trials: list[dict] = []
    if args.pick:
        micro_batch = args.pick.rpartition("/")[2]
        pick_key, pick_micro_batch = args.pick, int(micro_batch)
        search_s, search_tps, search_sps = args.search_s, None, None
        search_speedup, search_baseline = None, None
    else:
        log(f"search: {args.target} samples, {args.precision} on {args.device}, compile "
            f"{args.modes}, shapes {','.join(POLICIES)}")
        pick = api.search(request, out=None, settings=SearchSettings(cache=False),
                          on_step=_log_probe, on_trial=_log_trial).config
        search_s = time.perf_counter() - start
        pick_key, pick_micro_batch = f"{pick.knobs.label()}/{pick.micro_batch}", pick.micro_batch
        search_tps, search_sps = pick.tokens_per_s, pick.samples_per_s
        search_speedup = pick.speedup
        search_baseline = next((f"{t.knobs.label()}/{t.micro_batch}" for t in pick.trials
                                if t.is_baseline), None)
        trials = [{"key": f"{t.knobs.label()}/{t.micro_batch}", "verdict": t.verdict,
                   "tokens_per_s": t.tokens_per_s, "samples_per_s": t.samples_per_s,
                   "num_graphs": t.num_graphs, "reason": t.reason} for t in pick.trials]
        from rich.console import Console
        Console(stderr=True, width=160).print(report.search_table(pick, width=160))
    log(f"search pick {pick_key} ({search_s or 0:.0f} s)")
    # Eager, dynamic runs as longest (the search's baseline: a collate's padding), timed once.
    contenders = list(dict.fromkeys(
        (meaningful(Knobs(precision=args.precision, compile_mode=m,  # type: ignore[arg-type]
                          shapes=p)), pick_micro_batch)
        for m in modes for p in POLICIES))
    baseline_knobs = timed_baseline(Knobs(precision=args.precision), True)  # type: ignore[arg-type]
    if all(k != baseline_knobs for k, _ in contenders):
        contenders.append((baseline_knobs, pick_micro_batch))
    picked = Knobs.from_label(pick_key.rpartition("/")[0])
    if all(k != picked for k, _ in contenders):  # another knob won too (e.g. compile_scope)
        contenders.append((picked, pick_micro_batch))
    runs = run_side_by_side(workload, args.device, args.target, contenders, rounds=args.rounds,
                            budget_bytes=None, num_timed_steps=args.timed_steps, log=log)
    rows = []
    for (knobs, micro_batch), (key, results) in zip(contenders, runs.items(), strict=True):
        tps = [t for r in results if (t := _tokens_per_s(r, args.target)) is not None]
        sps = [args.target / r.median_step_s() for r in results if r.ok and r.median_step_s()]
        rows.append({
            "key": key, "shapes": knobs.shapes, "compile_mode": knobs.compile_mode,
            "micro_batch": micro_batch, "tokens_per_s": tps,
            "median_tokens_per_s": statistics.median(tps) if tps else None,
            "median_samples_per_s": statistics.median(sps) if sps else None,
            "real_tokens_per_sample": results[0].tokens_per_sample,
            "num_graphs": [r.num_graphs for r in results],
            "status": [r.status for r in results],
            "messages": sorted({r.message[:300] for r in results if r.message})})
    best = max((r for r in rows if r["median_tokens_per_s"]),
               key=lambda r: r["median_tokens_per_s"])
    picked = next((r for r in rows if r["key"] == pick_key), None)
    base_key = f"{baseline_knobs.label()}/{pick_micro_batch}"
    base = next(r for r in rows if r["key"] == base_key)
    for r in rows:
        r["is_baseline"] = r is base
        r["over_baseline"] = (r["median_tokens_per_s"] / base["median_tokens_per_s"]
                              if r["median_tokens_per_s"] and base["median_tokens_per_s"]
                              else None)
    out = {
        "machine": machine(), "command": "python benchmarks/shapes.py " + " ".join(
            sys.argv[1:]), "workload": "varlen-gpt", "target_batch": args.target,
        "pick": pick_key, "search_s": search_s,
        "search_tokens_per_s": search_tps, "search_samples_per_s": search_sps,
        "search_speedup": search_speedup, "search_baseline": search_baseline,
        "baseline": base_key, "best_side_by_side": best["key"],
        "pick_over_baseline": picked["over_baseline"] if picked else None,
        "pick_over_best": (picked["median_tokens_per_s"] / best["median_tokens_per_s"]
                           if picked and picked["median_tokens_per_s"] else None),
        "rows": rows, "wall_s": time.perf_counter() - start, "load": args.load_note,
        "trials": trials,
    }
    name = args.name or f"shapes_varlen-gpt-{args.machine}-{time.strftime('%Y-%m-%d')}"
    print(write_results(name, out, render(out)))
    return 0


def render(out: dict) -> str:
    m = out["machine"]
    lines = [
        "# Shape policies on variable-length data: varlen-gpt", "",
        f"{m['date']}; " + (f"{m['gpu']} (CUDA {m['cuda']}), " if m.get("gpu") else "")
        + f"{m.get('cpu_model') or m['processor']}, {m['cpus']} CPUs; torch "
        f"{m['torch']}. Run {out['wall_s']:.0f} s: `{out['command']}`. {out['load']}", "",
        f"Lengths log-normal (median 50, worst 256 tokens); target batch {out['target_batch']}. "
        f"The search ({out['search_s'] or 0:.0f} s) picked **{out['pick']}**"
        + (f" at {out['search_tokens_per_s']:,.0f} real tokens/s" if out["search_tokens_per_s"]
           else "") + ". Side by side at its micro-batch, each in a fresh child as the search "
        "times it (median of the rounds; real tokens are those that are not padding):", "",
        "| config | real tokens/s | samples/s | over the baseline | graphs per run | status |",
        "|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        tps = f"{r['median_tokens_per_s']:,.0f}" if r["median_tokens_per_s"] else "-"
        sps = f"{r['median_samples_per_s']:,.1f}" if r["median_samples_per_s"] else "-"
        over = f"{r['over_baseline']:.2f}x" if r.get("over_baseline") else "-"
        graphs = ",".join("-" if g is None else str(g) for g in r["num_graphs"])
        key = r["key"] + (" (baseline: eager, each batch padded to its longest sample)"
                          if r.get("is_baseline") else "")
        lines.append(f"| {key} | {tps} | {sps} | {over} | {graphs} | "
                     f"{','.join(r['status'])} |")
    ratio, over = out["pick_over_best"], out.get("pick_over_baseline")
    lines += ["", f"Best side by side: {out['best_side_by_side']}; the pick runs at "
              + (f"{ratio:.2f}x its real tokens/s" if ratio else "(not among the rows)")
              + (f", {over:.2f}x the baseline's" if over else "") + "."]
    if out.get("search_speedup"):
        lines += ["", f"The search reported {out['search_speedup']:.2f}x against its baseline "
                  f"{out['search_baseline']}."]
    if out["trials"]:
        lines += ["", "The search's runs (its own figures, in the order it ran them):", "",
                  "| run | verdict | real tokens/s | samples/s | graphs | reason |",
                  "|---|---|---|---|---|---|"]
        for t in out["trials"]:
            tps = f"{t['tokens_per_s']:,.0f}" if t["tokens_per_s"] else "-"
            sps = f"{t['samples_per_s']:,.1f}" if t["samples_per_s"] else "-"
            graphs = "-" if t["num_graphs"] is None else str(t["num_graphs"])
            reason = (t["reason"] or "").replace("|", "/")[:160]
            lines.append(f"| {t['key']} | {t['verdict']} | {tps} | {sps} | {graphs} | {reason} |")
    notes = [msg for r in out["rows"] for msg in r["messages"]]
    if notes:
        lines += ["", "Messages:", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
