"""Write ``benchmarks/results/INDEX.md``: one line per results file, so a reader can find which
file backs a figure and an engineer which code produced it.

Run: ``python benchmarks/results_index.py`` (``--check`` exits 1, writing nothing, when the
committed index is stale; ``tests/test_results_index.py`` runs the same check).

A file and its renders (``NAME.json``, ``NAME.md``, ``NAME.txt``) share one line. Each line says:

- **date** and **machine**: from the file's content (a JSON file's ``machine``, a Markdown or
  text file's first lines), else the date the file was first committed and "not recorded";
- **commit**: the commit of the code that produced it as the file records it (``commit``,
  ``code: HASH``, ``tree HASH``, ``search at HASH``), else the commit before the one that added
  the file to git (the code as it stood when the result was committed; marked ``~``), else, for
  a file not committed yet, ``HEAD`` at indexing (which becomes that parent once committed);
- **command**: the recorded command, where the file has one;
- **headline**: the figure the file is about (a search's pick quality and cost, the replay's
  summary, a tuned config's speed), else its title.

Files older than the naming rule in ``results/README.md`` keep their names; the index is where
their benchmark, machine and date are read.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
INDEX = RESULTS / "INDEX.md"
NOT_INDEXED = {"README.md", "INDEX.md"}
DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)(?:[ T](\d\d:\d\d)(?::\d\d)?(?: ?UTC)?)?")
COMMIT = re.compile(
    r"(?:\bcommit\b:?|\bcode:|\b[Tt]ree|\bsearch at|\bcode at)\s*`?([0-9a-f]{7,40})\b")
COMMAND = re.compile(r"`((?:[A-Z_]+=\S+ )*(?:python3? |autotune )[^`]*)`")
MACHINES = (("H200", "NVIDIA H200"), ("H100", "NVIDIA H100"), ("Xeon", "Intel Xeon"),
            ("EPYC", "AMD EPYC"))
NAME_MACHINES = (("h200", "NVIDIA H200"), ("h100", "NVIDIA H100"), ("xeon", "Intel Xeon"),
                 ("zen3", "AMD EPYC"), ("epyc", "AMD EPYC"))
HEAD_CHARS = 3000
FIGURE_LINE = re.compile(r"^(?:best \S+.*pick quality.*|.*\*\*[^*\n]*\d[^*\n]*\*\*.*)$", re.M)
"""A line that states the file's figure: a GPU suite step's "best ..., pick quality ...", or
the first line with a figure in bold."""


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True,
                          check=True).stdout


def added_in() -> dict[str, tuple[str, str]]:
    """Each results file's (parent of the commit that added it, that commit's date), following
    renames inside ``benchmarks/results`` (a move into ``archive/`` keeps its origin)."""
    root = Path(_git("rev-parse", "--show-toplevel").strip())
    if not RESULTS.is_relative_to(root):  # a folder outside this checkout: no history
        return {}
    prefix = RESULTS.relative_to(root).as_posix() + "/"
    log = _git("log", "--reverse", "-M", "--format=@@@%H %P|%cs", "--name-status", "--",
               str(RESULTS))
    origin: dict[str, tuple[str, str]] = {}
    for chunk in log.split("@@@")[1:]:
        head, *lines = chunk.strip("\n").split("\n")
        hashes, day = head.split("|")
        parents = hashes.split()[1:]
        parent = parents[0][:7] if parents else hashes.split()[0][:7]
        for line in lines:
            fields = line.split("\t")
            if not line or not fields[0]:
                continue
            status, paths = fields[0], [p.removeprefix(prefix) for p in fields[1:]]
            if status.startswith("R"):
                origin[paths[1]] = origin.get(paths[0], (parent, day))
            elif status == "A" and paths[0] not in origin:
                origin[paths[0]] = (parent, day)
    return origin


def _head() -> str:
    return _git("rev-parse", "HEAD").strip()[:7]


def _load_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None


def _machine_of(data, text: str, stem: str) -> str:
    """The machine a file was measured on: its recorded ``machine`` and ``device`` first, then
    the machine its name carries (the naming rule), then its first lines (which may also name
    another machine's oracle it is compared with)."""
    recorded = ""
    if isinstance(data, dict):
        machine = data.get("machine") or {}
        if isinstance(machine, dict):
            recorded = " ".join(str(v) for v in machine.values())
        device = data.get("device")
        if isinstance(device, dict):
            recorded = f"{device.get('name', '')} {device.get('device', '')} " + recorded
    for needle, name in MACHINES:
        if needle in recorded:
            return name
    for token, name in NAME_MACHINES:
        if token in stem.lower().replace("_", "-").split("-"):
            return name
    for needle, name in MACHINES:
        if needle in text:
            return name
    if isinstance(data, dict) and isinstance(data.get("device"), dict) and \
            data["device"].get("device") == "cpu":
        return "CPU (model not recorded)"
    return "not recorded"


def _date_of(data, text: str, stem: str) -> str | None:
    if isinstance(data, dict):
        machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
        for value in (machine.get("date"), data.get("date"), data.get("created_at")):
            if isinstance(value, str) and (m := DATE.search(value)):
                return f"{m[1]} {m[2]} UTC" if m[2] else m[1]
    for source in (text, stem):
        if m := DATE.search(source):
            return f"{m[1]} {m[2]} UTC" if m[2] else m[1]
    return None


def _commit_of(data, text: str) -> str | None:
    if isinstance(data, dict):
        for key in ("commit", "code_commit"):
            if isinstance(data.get(key), str) and re.fullmatch(r"[0-9a-f]{7,40}", data[key]):
                return data[key][:7]
    m = COMMIT.search(text)
    return m[1][:7] if m else None


def _command_of(data, text: str) -> str | None:
    if isinstance(data, dict) and isinstance(data.get("command"), str):
        return data["command"]
    for line in text.splitlines()[:6]:  # a search log's header: "# TORCHINDUCTOR... autotune ..."
        line = line.lstrip("# ").strip()
        if re.match(r"(?:[A-Z_]+=(?:\$\([^)]*\)|\S+) )*"
                    r"(?:python3? (?:-m autotune\.cli |benchmarks/)|autotune )"
                    r"(?:\S+\.py )?[a-z]+ --", line):
            return line
    m = COMMAND.search(text)
    return m[1] if m else None


def _pct(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _headline_of(data, text: str) -> str | None:
    if isinstance(data, dict) and isinstance(data.get("rows"), list) and data["rows"] and \
            isinstance(data["rows"][0], dict) and "pick_quality" in data["rows"][0]:
        parts = []
        for row in data["rows"]:
            search = row.get("search") or {}
            tuned = search.get("tuned") or "-"
            parts.append(f"{row.get('short', row.get('workload'))}: tuned {tuned}, pick quality "
                         f"{_pct(row.get('pick_quality'))}, cost {_pct(row.get('cost_ratio'))}"
                         + (f", {row['speedup_vs_naive']:.2f}x fp32 eager"
                            if isinstance(row.get("speedup_vs_naive"), (int, float)) else ""))
        return "; ".join(parts)
    if isinstance(data, dict) and isinstance(data.get("summary"), dict) and "tuning" in \
            data["summary"]:
        return "; ".join(
            f"{name} ({s['tables']} tables): pick quality median {s['pick_quality_median']:.3f}, "
            f"worst p10 {s['worst_p10']:.2f}, cost median {s['cost_median']:.3f}"
            for name, s in data["summary"].items())
    if isinstance(data, dict) and data.get("schema") and "micro_batch" in data:
        speed, speedup = data.get("samples_per_s"), data.get("speedup")
        return (f"autotune.json: {data.get('workload_name')}, micro-batch {data['micro_batch']}"
                f" x {data.get('accumulate_steps')}"
                + (f", {speed:.1f} samples/s" if isinstance(speed, (int, float)) else "")
                + (f", {speedup:.2f}x the baseline" if isinstance(speedup, (int, float)) else ""))
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), None)
    figure = FIGURE_LINE.search(text)
    if figure:
        figure_text = figure[0].replace("**", "").strip("-* ")
        return f"{title}: {figure_text}" if title else figure_text
    return title


def _cell(value: str | None, limit: int = 160) -> str:
    if not value:
        return "-"
    value = " ".join(value.split()).replace("|", "\\|")
    return value if len(value) <= limit else value[:limit - 1] + "…"


def entries() -> list[dict[str, str]]:
    """One entry per results stem (``NAME`` of ``NAME.json`` / ``.md`` / ``.txt`` / ``.png``)."""
    origin = added_in()
    head = None
    stems: dict[str, list[Path]] = {}
    for path in sorted(RESULTS.rglob("*")):
        if path.is_file() and not (path.parent == RESULTS and path.name in NOT_INDEXED):
            rel = path.relative_to(RESULTS).as_posix()
            stems.setdefault(rel.rsplit(".", 1)[0], []).append(path)
    out = []
    for stem, paths in stems.items():
        data, text = None, ""
        for path in paths:
            if path.suffix == ".json" and data is None:
                data = _load_json(path)
            elif path.suffix in (".md", ".txt"):
                text += path.read_text(errors="replace")[:HEAD_CHARS] + "\n"
        if isinstance(data, dict) and isinstance(data.get("machine"), dict):
            text = " ".join(str(v) for v in data["machine"].values()) + "\n" + text
        first = [origin[p.relative_to(RESULTS).as_posix()] for p in paths
                 if p.relative_to(RESULTS).as_posix() in origin]
        recorded = _commit_of(data, text)
        if recorded:
            commit = recorded
        elif first:
            commit = "~" + min(first, key=lambda f: f[1])[0]
        else:
            head = head or _head()
            commit = "~" + head
        date = _date_of(data, text, Path(stem).name) or (
            min(f[1] for f in first) + " (committed)" if first else "not recorded")
        out.append({
            "file": stem + "." + ",".join(p.suffix[1:] for p in paths)
            if len(paths) > 1 else paths[0].relative_to(RESULTS).as_posix(),
            "link": paths[0].relative_to(RESULTS).as_posix(),
            "date": date,
            "machine": _machine_of(data, text, Path(stem).name),
            "commit": commit,
            "command": _command_of(data, text),
            "headline": _headline_of(data, text),
        })
    return out


def render() -> str:
    lines = [
        "# Results index",
        "",
        "Generated by `python benchmarks/results_index.py` (do not edit; "
        "`tests/test_results_index.py` fails when it is stale). One line per results file "
        "(a `.json` and its `.md` render share one). Commit: as the file records it, else "
        "`~` and the commit before the one that added the file. "
        "Naming and the archive: [README.md](README.md).",
        "",
        "| file | date | machine | commit | command | headline |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries():
        lines.append(f"| [{e['file']}]({e['link']}) | {e['date']} | {e['machine']} | "
                     f"{e['commit']} | {_cell(e['command'])} | {_cell(e['headline'], 240)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when INDEX.md is stale (writes nothing)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if INDEX.exists() and INDEX.read_text() == text:
            return 0
        print(f"{INDEX} is stale: run python benchmarks/results_index.py", file=sys.stderr)
        return 1
    INDEX.write_text(text)
    print(f"wrote {INDEX} ({text.count(chr(10)) - 6} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
