"""Pruning rules the search could take, checked against every committed oracle.

Prints, from ``benchmarks/results/search_quality*.json``: (1) where a setting's smallest
micro-batch beat its walked best although the line through the walked ones predicted a loss;
(2) checkpointing at the same micro-batch against the same setting without it; (3) how far a
peak at the next micro-batch fell below the line through the two before it (slow workloads);
(4) what compiling gained over the same setting eager at the same micro-batch (the GPU oracles
under ``results/gpu/`` too): whether a compiled class could be skipped on its eager twin's speed;
(5) the smallest micro-batch against the walked best, compiled settings apart from eager ones;
(6) whether a compiled setting ever fits a micro-batch larger than its eager twin's largest (its
memory probe above that boundary, a compile that often ends in an out-of-memory, could then be
skipped); (7) how far apart two runs of one candidate in an oracle's two passes are: the drift
between runs that a single run's interval (its own steps' spread) does not show; (8) a
compiled setting bound by memory (a larger micro-batch did not fit) at the next smaller
micro-batch against its largest fit: whether its walk down is worth a compile without a
sibling's timed evidence; (9) checkpointing at a micro-batch above its setting's largest fit,
against what that fit's own pair of micro-batches bounds a larger one to (``gain_ceiling``):
whether a setting that got slower with its larger micro-batch can skip its checkpointing;
(10) a compiled setting whose run at a micro-batch peaked over the usable budget (it ran, every
time) against its largest fit below that: whether its probe can stop there, without compiling a
smaller one, where that run is behind the best by more than ``--refine-within``; (11) whether a
compiled run that loads its graphs from inductor's cache runs slower than one that compiled
them afresh: an oracle's pass 2 loads every compiled candidate from the cache, so pass 1 over
pass 2 medians are compared between candidates that compiled afresh in pass 1 and those that
loaded the cache there too (a slower cache shows as a lower ratio for the first); (12) a
compiled class's optimistic bound where it ran out of memory everywhere (``oom-class-reach``):
its precision's eager class's best times the most another compiled class gained over its own
precision's eager best, 1 at least (the classes at default knobs, as the probe stage times
them), against what the class reached with checkpointing (its best checkpointed setting) and
the oracle's best: where the bound is behind the best of the classes by more than 5% and the
class's checkpointed best came within 3% of the oracle's best, the rule would have cut a pick.
Run: ``python benchmarks/rule_checks.py``.
"""

from __future__ import annotations

import collections
import glob
import json
import statistics
from pathlib import Path

from autotune.timing import gain_ceiling, predict_step_s

RESULTS = Path(__file__).parent / "results"


def rows(pattern: str):
    """Each results file's rows, oldest file first, but for a row whose oracle runs are all
    those of a row before it (a later search against runs wholly reused with --oracle-from:
    its oracle adds nothing, and counting it again would weigh those runs twice)."""
    seen: set[tuple] = set()
    files = [(json.loads(Path(path).read_text()), Path(path).name)
             for path in glob.glob(str(RESULTS / pattern))]
    for data, name in sorted(files, key=lambda f: ((f[0].get("machine") or {}).get("date", ""),
                                                  f[1])):
        for row in data["rows"]:
            runs = tuple(sorted((c["key"], tuple(c.get("medians_s") or ()))
                                for c in (row.get("oracle") or {}).get("candidates", ())))
            if runs and runs in seen:
                continue
            seen.add(runs)
            yield name, row


def walks() -> list[tuple[float | None, float, str, str]]:
    """Each oracle setting walked down as the search walks it (largest first, while faster),
    with its smallest micro-batch not walked: (the line's predicted share of the walked best
    at the smallest, None where the line cannot be extended that far (a non-positive time per
    micro-batch there), the smallest's measured share, file name, setting)."""
    found = []
    for name, row in rows("search_quality*.json"):
        target = row["target_batch"]
        speed: dict[str, dict[int, float]] = collections.defaultdict(dict)
        for c in row["oracle"]["candidates"]:
            if c.get("samples_per_s") and c.get("fits_usable", True) \
                    and c.get("ran_ok_every_time", True):
                speed[c["key"].rsplit("/", 1)[0]][c["micro_batch"]] = c["samples_per_s"]
        for label, by_mb in speed.items():
            sizes = sorted(by_mb, reverse=True)
            if len(sizes) < 3:
                continue
            walked = [sizes[0]]
            for m in sizes[1:-1]:
                walked.append(m)
                if by_mb[m] <= max(by_mb[x] for x in walked[:-1]):
                    break
            small = sizes[-1]
            if small in walked:
                continue
            points = [(m, target / by_mb[m] / (target // m), 0.0) for m in walked]
            step_s = predict_step_s(points, small, target)
            best = max(by_mb[m] for m in walked)
            found.append((target / step_s / best if step_s else None, by_mb[small] / best,
                          name, label))
    return found


def other_end(found: list[tuple[float | None, float, str, str]]) -> None:
    found = [f for f in found if f[0] is not None]
    lost = [f for f in found if f[0] < 0.6]
    worst = max(lost, key=lambda f: f[1])
    print(f"(1) {len(found)} walks; where the line predicted under 0.6x the walked best "
          f"({len(lost)}), the smallest micro-batch ran up to {worst[1]:.2f}x it "
          f"({worst[3]} in {worst[2]}, predicted {worst[0]:.2f}x)")


def other_end_compiled(found: list[tuple[float | None, float, str, str]]) -> None:
    """Whether the leader's compiled setting needs its smallest micro-batch timed regardless
    of the line (each micro-batch of a compiled setting is a compile of its own), and where
    the line cannot be extended to it."""
    for kind, keep in (("compiled", True), ("eager", False)):
        walked = [f for f in found if (f[3].split("+")[0].split("/")[1] != "off") == keep]
        none = [f[1] for f in walked if f[0] is None]
        some = [f for f in walked if f[0] is not None]
        top = max(some, key=lambda f: f[1])
        print(f"(5) {kind} settings: {len(some)} walks, the smallest micro-batch at most "
              f"{top[1]:.2f}x the walked best ({top[3]} in {top[2]}, predicted "
              f"{top[0]:.2f}x); faster than it in {sum(f[1] > 1 for f in some)}")
        # A predicted tie (within a 10% noise either way), and a predicted gain over it.
        tie = [f for f in some if 0.9 <= f[0] <= 1.1]
        gain = [f for f in some if f[0] > 1.1]
        print(f"    line predicted a tie (0.90-1.10x): {len(tie)}, the smallest faster by "
              f"more than 10% in {sum(f[1] > 1.1 for f in tie)} (at most "
              f"{max((f[1] for f in tie), default=0):.2f}x); predicted a gain (over 1.10x): "
              f"{len(gain)}, faster in {sum(f[1] > 1 for f in gain)}")
        print(f"    the line cannot be extended to the smallest (time per micro-batch at or "
              f"below zero there): {len(none)} walks, the smallest at most "
              f"{max(none, default=0):.2f}x the walked best, faster in "
              f"{sum(x > 1 for x in none)}")


def same_micro_batch_checkpointing() -> None:
    for name, row in rows("search_quality*.json"):
        by_key = {c["key"]: c for c in row["oracle"]["candidates"]}
        ratios = []
        for key, c in by_key.items():
            if c.get("knobs", {}).get("checkpointing", "off") == "off" or not c.get(
                    "samples_per_s"):
                continue
            base = by_key.get(key.replace("+ckpt=blocks", "").replace("+ckpt=alternate", ""))
            if base and base.get("samples_per_s") and base.get("fits_usable", True):
                ratios.append((c["samples_per_s"] / base["samples_per_s"], key))
        if ratios:
            top = max(ratios)
            faster = sum(r > 1 for r, _ in ratios)
            print(f"(2) {name} {row.get('short', '')}: checkpointed / not at the same "
                  f"micro-batch, max {top[0]:.2f}x ({top[1]}), faster in {faster} of "
                  f"{len(ratios)}")


def peak_line() -> None:
    ratios = []
    for name, row in rows("search_quality_slow*.json"):
        peaks: dict[str, dict[int, int]] = collections.defaultdict(dict)
        for c in row["oracle"]["candidates"]:
            runs = [p for p in (c.get("run_peak_bytes") or []) if p]
            if runs and all(s == "ok" for s in c.get("statuses", ["ok"])):
                peaks[c["key"].rsplit("/", 1)[0]][c["micro_batch"]] = max(runs)
        for label, by_mb in peaks.items():
            sizes = sorted(by_mb)
            for a, b, c in zip(sizes, sizes[1:], sizes[2:], strict=False):
                line = by_mb[b] + (by_mb[b] - by_mb[a]) / (b - a) * (c - b)
                ratios.append((by_mb[c] / line, name, label, c))
    low = min(ratios)
    print(f"(3) {len(ratios)} triples on the slow workloads: peak over the line's, median "
          f"{statistics.median(r for r, *_ in ratios):.3f}, lowest {low[0]:.2f} ({low[2]} at "
          f"{low[3]} in {low[1]})")


def oracle_candidates():
    """(file name, one oracle's candidates) of every committed oracle, CPU and GPU."""
    for name, row in rows("search_quality*.json"):
        yield name, row["oracle"]["candidates"]
    for path in sorted(glob.glob(str(RESULTS / "gpu" / "*oracle*.json"))):
        for step in json.loads(Path(path).read_text())["steps"].values():
            if "candidates" in step:
                yield Path(path).name, step["candidates"]


def fits_everywhere(c: dict) -> bool:
    """An oracle candidate that fit: within the usable budget, every run ok, and (compiled
    on CPU) also as a first launch compiles it."""
    return bool(c.get("fits_usable", True) and c.get("ran_ok_every_time", True)
                and c.get("fits_first_launch", True) is not False)


def compile_gain() -> None:
    """A rule proposed for the GPU search (a compiled class probed for 34 s of 162, its eager
    twin at 0.11x the leader): skip a compiled class whose eager twin is under 1/C of the
    leader. Sound only if compiling never gains more than C."""
    gains = []
    for name, candidates in oracle_candidates():
        speed = {c["key"]: c["samples_per_s"] for c in candidates
                 if c.get("samples_per_s") and c.get("ran_ok_every_time", True)}
        for key, sps in speed.items():
            label, micro_batch = key.rsplit("/", 1)
            precision, rest = label.split("/", 1)
            mode, *extras = rest.split("+")
            eager = f"{precision}/{'+'.join(['off', *extras])}/{micro_batch}"
            if mode != "off" and eager in speed:
                gains.append((sps / speed[eager], name, key))
    gains.sort()
    top = gains[-1]
    over = sum(1 for g, *_ in gains if g > 3)
    gpu = [g for g, name, _ in gains if name.startswith("gpu_suite")]
    print(f"(4) {len(gains)} compiled candidates against their eager twin: median "
          f"{statistics.median(g for g, *_ in gains):.2f}x, over 3x in {over}, up to "
          f"{top[0]:.0f}x ({top[2]} in {top[1]}); on the GPU "
          f"{min(gpu, default=0):.2f}-{max(gpu, default=0):.2f}x: no cap holds, so the "
          "eager twin's speed cannot rule a compiled class out")


def compiled_above_eager() -> None:
    """A compiled setting's probe above its eager twin's largest fit costs a compile and, on
    the slow causal LM here, ends in an out-of-memory in every search (50-61 s). Skipping it
    is sound only if compiling never fits more than eager."""
    tried, above = 0, []
    for name, candidates in oracle_candidates():
        fit: dict[str, set[int]] = collections.defaultdict(set)
        ran: dict[str, set[int]] = collections.defaultdict(set)
        for c in candidates:
            label = c["key"].rsplit("/", 1)[0]
            if c.get("statuses"):
                ran[label].add(c["micro_batch"])
            if c.get("fits_first_launch", c.get("fits_usable")) \
                    and c.get("ran_ok_every_time", True):
                fit[label].add(c["micro_batch"])
        for label, sizes in ran.items():
            precision, rest = label.split("/", 1)
            mode, *extras = rest.split("+")
            eager = f"{precision}/{'+'.join(['off', *extras])}"
            if mode == "off" or eager not in ran:
                continue
            boundary = max(fit[eager], default=0)
            if any(m > boundary for m in sizes):
                tried += 1
                if max(fit[label], default=0) > boundary:
                    above.append((name, label, boundary, max(fit[label])))
    first = above[0] if above else None
    print(f"(6) {tried} compiled settings (per results file) run above their eager twin's "
          f"largest fit: a larger micro-batch fit in {len(above)}"
          + (f" (e.g. {first[1]}: {first[3]} against {first[2]} eager, in {first[0]})"
             if first else "") + ": the probe above the eager boundary stays")


def run_to_run() -> None:
    """The search takes a lead wider than ``--confirm-within`` (5%) or than the runs' own
    intervals as settled on one run each. Two runs of one candidate in an oracle's passes show
    how far apart runs of the same config land on the same machine (each oracle once: one
    reused by a later results file is not counted twice)."""
    seen: set[tuple] = set()
    lines = []
    for name, row in rows("search_quality*.json"):
        gaps = []
        for c in row["oracle"]["candidates"]:
            medians = [m for m, st, n in zip(c["medians_s"], c["statuses"],
                                             c["num_timed_steps"], strict=False)
                       if st == "ok" and m and n >= 5]
            if len(medians) >= 2:
                gaps.append(max(medians[:2]) / min(medians[:2]) - 1)
        key = tuple(sorted(round(g, 9) for g in gaps))
        if len(gaps) < 10 or key in seen:
            continue
        seen.add(key)
        gaps.sort()
        lines.append(f"    {name} ({row['workload']}): {len(gaps)} pairs, median "
                     f"{statistics.median(gaps):.1%}, 90th percentile "
                     f"{gaps[int(0.9 * len(gaps))]:.1%}, over 5% in {sum(g > 0.05 for g in gaps)}")
    print("(7) two runs of one candidate in an oracle's two passes (at least 5 timed steps "
          "each), how far apart their medians are: a lead the search settles on one run each "
          "can be this drift")
    print("\n".join(lines))


def compiled_walk_down() -> None:
    """A compiled setting's walk down from its largest fit costs a compile per micro-batch.
    Where memory binds (a larger micro-batch ran and did not fit), how the next smaller
    micro-batch ran against the largest fit, CPU and GPU oracles, each distinct setting once
    (results files that reuse an oracle's runs repeat its numbers): over all, and for the
    settings within 0.90 of their oracle's best (``--refine-within``: the ones a search walks
    down)."""
    seen: set[tuple] = set()
    ratios: list[tuple[float, float, str, str]] = []  # (smaller / largest, share, file, setting)
    for name, candidates in oracle_candidates():
        speed: dict[str, dict[int, float]] = collections.defaultdict(dict)
        over: dict[str, set[int]] = collections.defaultdict(set)
        for c in candidates:
            label = c["key"].rsplit("/", 1)[0]
            fits = fits_everywhere(c)
            if fits and c.get("samples_per_s"):
                speed[label][c["micro_batch"]] = c["samples_per_s"]
            elif c.get("statuses"):
                over[label].add(c["micro_batch"])
        best = max((s for by_mb in speed.values() for s in by_mb.values()), default=0.0)
        for label, by_mb in speed.items():
            if label.split("+")[0].endswith("/off") or len(by_mb) < 2:
                continue
            largest, smaller = sorted(by_mb, reverse=True)[:2]
            if not any(m > largest for m in over[label]):
                continue  # the whole batch fits: the search does not walk it down
            key = (label, tuple(sorted((m, round(s, 6)) for m, s in by_mb.items())))
            if key in seen:
                continue
            seen.add(key)
            ratios.append((by_mb[smaller] / by_mb[largest], by_mb[largest] / best, name, label))
    near = [r for r in ratios if r[1] >= 0.90]
    top, top_near = max(ratios), max(near)
    median = statistics.median(r[0] for r in ratios)
    print(f"(8) compiled settings bound by memory, the next smaller micro-batch against the "
          f"largest fit: {len(ratios)} settings, median {median:.2f}x, "
          f"faster by more than 5% in {sum(r[0] > 1.05 for r in ratios)}, by more than 10% in "
          f"{sum(r[0] > 1.10 for r in ratios)} (up to {top[0]:.2f}x: {top[3]} in {top[2]}, "
          f"{top[1]:.2f}x its oracle's best); within 0.90 of their oracle's best: {len(near)} "
          f"settings, faster in {sum(r[0] > 1.0 for r in near)}, at most {top_near[0]:.2f}x "
          f"({top_near[3]} in {top_near[2]})")


def checkpointing_above_the_bound() -> None:
    """The search skips checkpointing where the leader's setting ran slower at its largest
    fit ``M`` than at the next smaller one, and ``M``'s speed times the gain ceiling from that
    pair is behind the leader: checkpointing recomputes, so above ``M`` it is bounded by what
    the setting itself could gain there. Each checkpointed setting that fit above its
    un-checkpointed setting's largest fit, against that bound (each distinct setting once)."""
    seen: set[tuple] = set()
    ratios: list[tuple[float, float, str, str]] = []  # (actual / bound, pair ratio, file, key)
    for name, candidates in oracle_candidates():
        speed: dict[str, dict[int, float]] = collections.defaultdict(dict)
        per_device = {}
        for c in candidates:
            fits = fits_everywhere(c)
            if fits and c.get("samples_per_s") and c.get("accumulate_steps"):
                label = c["key"].rsplit("/", 1)[0]
                speed[label][c["micro_batch"]] = c["samples_per_s"]
                per_device[label] = c["micro_batch"] * c["accumulate_steps"]
        for label, by_mb in speed.items():
            if "+ckpt=" in label or len(by_mb) < 2:
                continue
            small, top = sorted(by_mb)[-2:]
            ratio = by_mb[top] / by_mb[small]
            ceiling = gain_ceiling(ratio, small, top, top, per_device[label]) \
                if top < per_device[label] else None
            if ceiling is None:
                continue
            bound = by_mb[top] * ceiling
            for value in ("blocks", "alternate"):
                parts = label.split("+")
                ckpt = "+".join([parts[0], f"ckpt={value}", *parts[1:]])
                for m, sps in speed.get(ckpt, {}).items():
                    key = (ckpt, m, round(sps, 6), round(bound, 6))
                    if m > top and key not in seen:
                        seen.add(key)
                        ratios.append((sps / bound, ratio, name, f"{ckpt}/{m}"))
    slower = [r for r in ratios if r[1] < 1.0]
    top_all = max(ratios)
    print(f"(9) checkpointed above its setting's largest fit, against that fit times the gain "
          f"ceiling of the setting's own pair: {len(ratios)} candidates, over the bound by more "
          f"than 5% in {sum(r[0] > 1.05 for r in ratios)} (at most {top_all[0]:.2f}x: "
          f"{top_all[3]} in {top_all[2]}); where the setting got slower with its larger "
          f"micro-batch (the search's case): {len(slower)}, over it by more than 5% in "
          f"{sum(r[0] > 1.05 for r in slower)}"
          + (f", at most {max(slower)[0]:.2f}x ({max(slower)[3]} in {max(slower)[2]})"
             if slower else ""))


def compiled_below_over() -> None:
    """The search does not probe a compiled setting below a run that peaked over the usable
    budget (it ran) where that run is under ``--refine-within`` (0.90) of the leader: a
    smaller compiled micro-batch only adds accumulation steps. Each compiled setting that ran
    over the usable budget at a micro-batch and fit a smaller one, its largest such fit against
    that run, CPU and GPU oracles, each distinct setting once; and where the run over the
    budget was under 0.90 of its oracle's best, how near the best its fit below came."""
    seen: set[tuple] = set()
    found: list[tuple[float, float, float, str, str]] = []  # (fit / over, over share, fit share,
    # file, setting)
    for name, candidates in oracle_candidates():
        fit: dict[str, dict[int, float]] = collections.defaultdict(dict)
        over: dict[str, dict[int, float]] = collections.defaultdict(dict)
        for c in candidates:
            label = c["key"].rsplit("/", 1)[0]
            fits = fits_everywhere(c)
            if fits and c.get("samples_per_s"):
                fit[label][c["micro_batch"]] = c["samples_per_s"]
            elif c.get("samples_per_s") and c.get("ran_ok_every_time", True) \
                    and c.get("statuses") and all(st == "ok" for st in c["statuses"]):
                over[label][c["micro_batch"]] = c["samples_per_s"]
        best = max((s for by_mb in fit.values() for s in by_mb.values()), default=0.0)
        for label, by_mb in over.items():
            if label.split("+")[0].endswith("/off") or not best:
                continue
            m = min(by_mb)
            below = [x for x in fit.get(label, {}) if x < m]
            if not below:
                continue
            f = max(below)
            key = (label, m, round(by_mb[m], 6), f, round(fit[label][f], 6))
            if key in seen:
                continue
            seen.add(key)
            found.append((fit[label][f] / by_mb[m], by_mb[m] / best, fit[label][f] / best,
                          name, f"{label} {m}->{f}"))
    if not found:
        print("(10) no compiled setting ran over the usable budget above a fit")
        return
    skipped = [r for r in found if r[1] < 0.90]
    top = max(found)
    print(f"(10) compiled settings that ran over the usable budget at a micro-batch, their "
          f"largest fit below it against that run: {len(found)} settings, faster by more than "
          f"5% in {sum(r[0] > 1.05 for r in found)} (up to {top[0]:.2f}x: {top[4]} in "
          f"{top[3]}); where the run over the budget was under 0.90 of the best (not probed "
          f"below): {len(skipped)}, its fit below at most "
          + (f"{max(r[2] for r in skipped):.2f}x the best "
             f"({max(skipped, key=lambda r: r[2])[4]} in "
             f"{max(skipped, key=lambda r: r[2])[3]})" if skipped else "-"))


def cached_against_afresh() -> None:
    """(11): per two-pass oracle (each once), compiled candidates ok in both passes with cache
    counts, the median of pass 1's median step time over pass 2's, for those whose pass-1 run
    compiled afresh (no cache hit) and those whose pass-1 run loaded the cache as well."""
    seen: set[tuple] = set()
    print("(11) compiled candidates, pass 1 over pass 2 median step time (pass 2 loads the "
          "cache): pass 1 compiled afresh against pass 1 from the cache too")
    for name, row in rows("search_quality*.json"):
        split: dict[bool, list[float]] = {True: [], False: []}
        for c in row["oracle"]["candidates"]:
            hits, medians = c.get("cache_hits") or [], c.get("medians_s") or []
            if c["compile_mode"] == "off" or len(hits) < 2 or None in hits[:2] \
                    or c["statuses"][:2] != ["ok", "ok"] or not all(medians[:2]):
                continue
            split[hits[0] == 0].append(medians[0] / medians[1])
        key = tuple(sorted(round(r, 9) for r in split[True] + split[False]))
        if not (split[True] and split[False]) or key in seen:
            continue
        seen.add(key)
        print(f"    {name} ({row['workload']}): afresh {len(split[True])}, median "
              f"{statistics.median(split[True]):.3f}; from the cache {len(split[False])}, "
              f"median {statistics.median(split[False]):.3f}")


def oom_class_reach() -> None:
    """``reach_bounds.oom_class_reach`` on every oracle: each compiled class's bound (its eager
    class's best times the most any other compiled class gained over its precision's eager
    best, 1 at least; all at default knobs, as the probe stage leaves them) against its
    checkpointed best and the best of the classes (the probe stage's leader)."""
    seen: set[tuple] = set()
    bounded, over, cut = 0, [], []
    for name, candidates in oracle_candidates():
        cls: dict[tuple[str, str], float] = collections.defaultdict(float)
        ckpt: dict[tuple[str, str], float] = collections.defaultdict(float)
        best = 0.0
        for c in candidates:
            if not c.get("samples_per_s") or not fits_everywhere(c):
                continue
            precision, rest = c["key"].rsplit("/", 1)[0].split("/", 1)
            mode, *extras = rest.split("+")
            sps = c["samples_per_s"]
            best = max(best, sps)
            if not extras:
                cls[(precision, mode)] = max(cls[(precision, mode)], sps)
            elif any(e.startswith("ckpt=") for e in extras):
                ckpt[(precision, mode)] = max(ckpt[(precision, mode)], sps)
        key = tuple(sorted((k, round(v, 6)) for k, v in cls.items()))
        if key in seen or not best:
            continue
        seen.add(key)
        for (precision, mode), sps in ckpt.items():
            # the probe stage's leader: the best of the other classes (this one fit nothing)
            leader = max((v for k, v in cls.items() if k != (precision, mode)), default=0.0)
            eager = cls.get((precision, "off"))
            gains = [v / e for (p, m), v in cls.items() if m != "off" and (p, m) != (
                precision, mode) and (e := cls.get((p, "off")))]
            if mode == "off" or not eager or not gains:
                continue
            bounded += 1
            bound = eager * max(1.0, *gains)
            if sps > bound * 1.05:
                over.append((sps / bound, name, f"{precision}/{mode}"))
            if bound < leader * 0.95 and sps >= best * 0.97 and leader:
                cut.append((sps / best, name, f"{precision}/{mode}", bound / leader))
    top = max(over, default=None)
    print(f"(12) {bounded} compiled classes (per distinct oracle) with a checkpointed fit and "
          f"another compiled class's gain to bound them: their checkpointed best over the bound "
          f"by more than 5% in {len(over)}"
          + (f" (at most {top[0]:.2f}x: {top[2]} in {top[1]})" if top else "")
          + f"; the bound behind the classes' best by more than 5% where the class "
          f"checkpointed came within 3% of the oracle's best: {len(cut)}"
          + "".join(f"\n    {n}: {label} at {share:.2f} of the best, its bound "
                    f"{b:.2f} of the classes' best" for share, n, label, b in cut))


if __name__ == "__main__":
    found = walks()
    other_end(found)
    same_micro_batch_checkpointing()
    peak_line()
    compile_gain()
    other_end_compiled(found)
    compiled_above_eager()
    run_to_run()
    compiled_walk_down()
    checkpointing_above_the_bound()
    compiled_below_over()
    cached_against_afresh()
    oom_class_reach()
