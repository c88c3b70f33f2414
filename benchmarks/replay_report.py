"""The replay of the generated families (issue 59): every table and every family reported.

``python benchmarks/replay.py --families develop|judge|all [--seeds 30] [--json]`` replays the
search on every table of the set (``replay_families``: every perturbed family over every
recorded table, every synthetic family), each over its set's replay seeds, with the
successive-halving baseline (``replay_baseline``) beside it at each seed's search cost.

Per family: its tables; the worst one (the lowest median pick quality, then p10) named with
its median, p10 and minimum pick quality; the share of all its tables' seeds within 3% of the
best; the median cost; and the same for the baseline. Every table's own line follows. A
median of medians alone is never the report: one bad table in a family is its worst line.
"""

from __future__ import annotations

import statistics

from replay_families import REPLAY_SEEDS, SETS, Variant, build, variants
from replay_tables import Table

WITHIN = 0.03


def replay_set(which: str, seeds: int, tables: list[Table], score, only: str = "",
               exclude: tuple[str, ...] = ()) -> tuple[list[dict], list[str]]:
    """(every generated table's scores, the variants that do not apply and why); ``only``: a
    substring every replayed name holds; ``exclude``: substrings none holds (e.g.
    ``@cnn-epyc``: a rule judged apart from the table it was drawn from)."""
    by_name = {t.name: t for t in tables}
    results, skipped = [], []
    for v in variants(which, list(by_name)):
        if (only and only not in v.name) or any(x in v.name for x in exclude):
            continue
        t = build(v, by_name)
        if t is None:
            skipped.append(f"{v.name}: the family does not apply to this table")
            continue
        r = score(t, seeds, first_seed=REPLAY_SEEDS[which])
        results.append({**r, "set": which, "family": v.family, "param": v.param,
                        "table_seed": v.seed, "base": v.base or "synthetic"})
    return results, skipped


def family_summary(results: list[dict]) -> dict[str, dict]:
    """Per family (in ``SETS`` order): the worst table and the pooled figures, search and
    baseline."""
    out = {}
    for family in dict.fromkeys(r["family"] for r in results):
        part = [r for r in results if r["family"] == family]
        worst = min(part, key=lambda r: (r["pick_quality"]["median"], r["pick_quality"]["p10"]))
        seeds = sum(r["seeds"] for r in part)
        out[family] = {
            "tables": len(part), "worst": worst["name"],
            "worst_pick_quality": worst["pick_quality"],
            "within_3pct": sum(r["within_3pct"] * r["seeds"] for r in part) / seeds,
            "cost_median": statistics.median(r["cost"]["median"] for r in part),
            "tables_below_0.97": sum(r["pick_quality"]["median"] < 0.97 for r in part),
        }
        if all("baseline" in r for r in part):
            b = min(part, key=lambda r: (r["baseline"]["pick_quality"]["median"],
                                         r["baseline"]["pick_quality"]["p10"]))
            out[family]["baseline"] = {
                "worst": b["name"], "worst_pick_quality": b["baseline"]["pick_quality"],
                "on_search_worst": worst["baseline"]["pick_quality"],
                "within_3pct": sum(r["baseline"]["within_3pct"] * r["seeds"]
                                   for r in part) / seeds,
                "cost_median": statistics.median(r["baseline"]["cost"]["median"]
                                                 for r in part)}
    return out


def _q(q: dict) -> str:
    return f"{q['median']:.3f}/{q['p10']:.3f}/{q['min']:.3f}"


def render_families(results: list[dict], skipped: list[str]) -> str:
    lines = []
    for which in SETS:
        fams = family_summary([r for r in results if r["set"] == which])
        if fams:
            worst = min(fams, key=lambda f: fams[f]["worst_pick_quality"]["median"])
            w = fams[worst]
            lines.append(
                f"**{which}: {len(fams)} families, {sum(f['tables'] for f in fams.values())} "
                f"tables; the worst family table {w['worst']} at median "
                f"{w['worst_pick_quality']['median']:.3f}; families whose worst table is under "
                f"0.97: {sum(f['worst_pick_quality']['median'] < 0.97 for f in fams.values())}"
                + (f"; SH on it {w['baseline']['on_search_worst']['median']:.3f}"
                   if "baseline" in w else "") + "**")
    lines += ["", "Pick quality as median/p10/min over the seeds; within 3%: share of every "
              "seed of every table of the family; SH: successive halving at each seed's search "
              "cost.",
              "", "| set | family | tables | search: worst table | its median/p10/min | "
             "within 3% | cost median | tables < 0.97 | SH: worst table | its median/p10/min "
             "| SH on the search's worst | SH within 3% | SH cost |",
              "|---|---|---:|---|---|---:|---:|---:|---|---|---|---:|---:|"]
    for which in SETS:
        for family, s in family_summary([r for r in results if r["set"] == which]).items():
            b = s.get("baseline")
            lines.append(
                f"| {which} | {family} | {s['tables']} | {s['worst']} | "
                f"{_q(s['worst_pick_quality'])} | {s['within_3pct']:.0%} | "
                f"{s['cost_median']:.3f} | {s['tables_below_0.97']} | "
                + (f"{b['worst']} | {_q(b['worst_pick_quality'])} | "
                   f"{_q(b['on_search_worst'])} | {b['within_3pct']:.0%} | "
                   f"{b['cost_median']:.3f} |" if b else "- | - | - | - | - |"))
    lines += ["", "Every table (search | SH):", "", "```"]
    for r in results:
        b = r.get("baseline")
        lines.append(
            f"  {r['set']:7s} {r['name']:58s} best {r['best']:40s} search "
            f"{_q(r['pick_quality'])} w3 {r['within_3pct']:4.0%} cost {r['cost']['median']:.3f}"
            + (f" | SH {_q(b['pick_quality'])} w3 {b['within_3pct']:4.0%} cost "
               f"{b['cost']['median']:.3f}" if b else "")
            + f" | picks {', '.join(f'{k} x{n}' for k, n in list(r['picks'].items())[:2])}")
    lines.append("```")
    if skipped:
        lines += ["", "Not applicable: " + "; ".join(skipped)]
    return "\n".join(lines)


__all__ = ["Variant", "family_summary", "render_families", "replay_set"]
