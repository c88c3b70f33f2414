"""What a newcomer reads after a search (issue 45 items 7, 8): a table that fits 100 columns,
a short ``why:``, the skipped reasons grouped, what to do next, a first line at once, what a
search stopped early never reached, and ``autotune report`` right after a search."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from autotune import api, report, report_progress, report_skips
from autotune.cli import app
from autotune.cli.output import plain_console, progress_bar, say
from autotune.config import DeviceInfo, ProbeStep
from autotune.knobs import Knobs
from autotune.report_html import render_html
from autotune.report_width import abbreviate, label_pieces, shorten
from autotune.schema import SearchResult, SkipRecord, TrialRecord, TunedConfig, notes
from autotune.search import RunCount
from autotune.search._records import Candidate
from autotune.search.rules import RULES
from tests.tuned_configs import make_tuned, write

runner = CliRunner()

LONG_LABELS = ("bf16/default+ckpt=blocks+opt=fused", "bf16/default+ckpt=blocks+opt=foreach",
               "bf16/default+ckpt=alternate+opt=fused", "bf16/default+opt=fused",
               "bf16/max-autotune-no-cudagraphs+ckpt=blocks+opt=for-loop", "fp32/off")


def realistic() -> TunedConfig:
    """A search's result whose knob labels share a long prefix (rows told apart at its end)."""
    trials = tuple(
        TrialRecord(number=i, micro_batch=16, accumulate_steps=4, knobs=Knobs.from_label(label),
                    verdict="winner" if i == 0 else "ok", is_baseline=label == "fp32/off",
                    samples_per_s=1200.0 - 50 * i, median_step_s=0.05 + 0.001 * i,
                    halfwidth=0.03, tokens_per_s=300_000.0 - 1000 * i, peak_bytes=(900 + i) << 20,
                    compile_s=None if label == "fp32/off" else 31.5, speedup=1.5 - 0.05 * i,
                    num_runs=2, tflops_per_s=1.23, mfu=0.31)
        for i, label in enumerate(LONG_LABELS))
    return replace(make_tuned(), trials=trials, knobs=trials[0].knobs)


def _rows(text: str, column: int) -> list[str]:
    """One cell of the table's column per row, its wrapped lines joined (a row's ``#`` cell is
    on its first line only)."""
    rows: list[str] = []
    for line in text.splitlines():
        cells = line.split("│")
        if len(cells) < column + 2:
            continue
        if cells[1].strip():
            rows.append("")
        rows[-1] += cells[column + 1].strip()
    return rows


def test_the_search_table_fits_100_columns_and_every_knobs_label_stays_whole() -> None:
    config = realistic()
    console = plain_console(width=100, record=True)
    console.print(report.search_table(config, width=console.width))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "…" not in text
    legend = {"max-autotune-no-cudagraphs": "manc"}  # said under the table
    assert _rows(text, 1) == ["".join(shorten(label, legend)) for label in LONG_LABELS]
    assert text.rstrip().endswith("manc = max-autotune-no-cudagraphs")
    # Wide enough, every column is there, every value whole; so in --json and the page.
    wide = plain_console(width=200, record=True)
    wide.print(report.search_table(config, width=wide.width))
    header = wide.export_text()
    assert all(name in header for name in ("±", "tokens/s", "compile s", "runs", "TFLOP/s"))
    assert _rows(header, 1) == list(LONG_LABELS) and "manc" not in header


def _whole(cell_lines: list[str], label: str) -> bool:
    """Whether a cell's lines break ``label`` only between its parts (``label_pieces``)."""
    bounds = {0}
    for piece in label_pieces(label):
        bounds.add(max(bounds) + len(piece))
    at = 0
    for line in cell_lines:
        at += len(line)
        if at not in bounds:
            return False
    return "".join(cell_lines) == label


def _cells(text: str, column: int) -> list[list[str]]:
    """Each row's lines of one column (as ``_rows``, not joined)."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        cells = line.split("│")
        if len(cells) < column + 2:
            continue
        if cells[1].strip():
            rows.append([])
        if cells[column + 1].strip():
            rows[-1].append(cells[column + 1].strip())
    return rows


ISSUE_LABELS = ("fp32/default", "bf16/default+scope=blocks", "bf16/default+ckpt=budget-0.5",
                "fp32/max-autotune-no-cudagraphs+alloc=expandable_segments+format="
                "channels_last", "bf16/reduce-overhead+dp=fsdp-no-reshard+opt=for-loop")


def test_every_line_of_a_search_fits_80_columns_and_no_label_is_split() -> None:
    """issue 62: at COLUMNS=80 the search's pieces, as the CLI prints them (the first line,
    a probe's and a run's lines, the progress line, the table, the footer, the skipped
    lines), fit 80 columns; a knobs label wraps between its parts or is abbreviated by the
    legend, never broken mid-word (``fp32/defau``/``lt``, ``+scop``/``e=blocks`` were)."""
    labels = tuple(Knobs.from_label(label).label() for label in (*LONG_LABELS, *ISSUE_LABELS))
    config = realistic()
    trials = tuple(replace(config.trials[0], number=i, knobs=Knobs.from_label(label),
                           verdict="winner" if i == 0 else "over_budget" if i == 1 else "ok",
                           reason="" if i else "the fastest of 11 runs, by 4% over the next")
                   for i, label in enumerate(labels))
    config = replace(config, trials=trials, skips=notes(*SKIPPED), train_steps=1000)
    console = plain_console(width=80, record=True)
    cpu = DeviceInfo(device="cpu", name="Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                     total_memory_bytes=1 << 34, available_memory_bytes=1 << 33,
                     supports_bf16=True, supports_fp16=False, supports_tf32=False)
    say(console, report_progress.start_line("examples/a_rather_long_folder/train.py:workload",
                                            cpu, 64))
    step = ProbeStep(micro_batch=128, status="ok", peak_bytes=900 << 20, fits=True, wall_s=3.2)
    for label in labels:
        say(console, report_progress.probe_step_line(label, step))
    for record in trials:
        say(console, report_progress.trial_line(record, "confirm"))
    console.print(report.search_table(config, width=console.width))
    for line in report.search_footer(SearchResult(config=config, path=None, probe=None)):
        say(console, line)
    with progress_bar(console) as progress:
        task = progress.add_task("", total=None)
        progress.update(task, completed=8, total=23, description=report_progress.run_line(
            RunCount(done=8, total=23, left_s=100.0), "knobs", f"{labels[-2]}/128"))
        console.print(progress.get_renderable())  # what its live display shows
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, [
        line for line in text.splitlines() if len(line) > 80]
    assert "knobs: run 9/~23, ~1 min 40 s left: fp32/" in text  # one line, cut with …
    assert "on cpu (Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz" in " ".join(text.split())
    # the table: every label whole, or its long values abbreviated and said in the legend
    legend = abbreviate(labels)
    assert set(legend) == {"max-autotune-no-cudagraphs", "expandable_segments",
                           "channels_last", "reduce-overhead", "fsdp-no-reshard"}
    cells = _cells(text, 1)
    assert len(cells) == len(labels)
    for lines, label in zip(cells, labels, strict=True):
        assert _whole(lines, "".join(shorten(label, legend))), (lines, label)
    assert all(f"{short} = {value}" in " ".join(text.split()) for value, short in legend.items())
    # the lines: no label cut across two of them
    lines = text.splitlines()
    for label in labels:
        assert sum(label in line for line in lines) >= 2, label  # its probe and its run
    # skipped lines: cut between words, the rest in the file
    for line in (line for line in lines if line.startswith("skipped") and line.endswith("…")):
        head = line[:-1].partition(": ")[2]
        sentence = next(" ".join(s.split()) for s in SKIPPED if " ".join(s.split())
                        .startswith(head))
        assert sentence[len(head)] in " ,;:", (head, sentence)


def test_why_is_two_short_sentences_and_the_file_keeps_the_whole_reason() -> None:
    long_reason = ("bf16/default+ckpt=blocks+opt=fused 16x4 won at 1,200.0 samples/s, 1.50x the "
                   "baseline (fp32/off 16x4); ahead of the runner-up bf16/default+ckpt=blocks+"
                   "opt=foreach 16x4 by 4.2% +- 3.1% (beyond the spread within each run, but "
                   "the winner ran once: the drift between runs of a shared machine is not in "
                   "that; --confirm-within re-measures leads up to that share)")
    config = replace(realistic(), reason=long_reason)
    why = next(line for line in report.summary_lines(config) if line.startswith("why: "))
    assert why.count(". ") + why.endswith(".") <= 2 and len(why) <= 160, why
    assert why == ("why: bf16/default+ckpt=blocks+opt=fused 16x4 won at 1,200.0 samples/s, "
                   "1.50x the baseline. Runner-up bf16/default+ckpt=blocks+opt=foreach 16x4 "
                   "at 0.96x.")
    assert config.reason == long_reason  # autotune.json and the page keep it whole
    assert "ahead of the runner-up" in render_html(config)


def _judged(trials: tuple[TrialRecord, ...], drift: dict | None = None) -> TunedConfig:
    """``realistic()`` with these trials, its reason and runner-up as the search writes them."""
    from autotune.search.outcome import _standing, _why

    winner = next(t for t in trials if t.verdict == "winner")
    base = next(t for t in trials if t.is_baseline)
    return replace(realistic(), trials=trials, reason=_why(winner, base, trials, {}, drift),
                   runner_up=_standing(winner, trials, drift)[1])


def test_why_says_either_would_do_only_where_the_interval_says_so() -> None:
    """Issue 62: a winner 1.02x its baseline (within the baseline's measured spread) made
    ``why:`` call a runner-up at 0.72x "within the noise: either would do": the words were
    found in the reason, which said that of the baseline. The interval comparison decides."""
    trials = tuple(replace(t, spread=0.1, halfwidth=0.02) for t in realistic().trials)
    win, second, *rest = trials
    base = rest[-1]
    trials = (replace(win, speedup=1.02, samples_per_s=1000.0),
              replace(second, samples_per_s=720.0),
              *(replace(t, verdict="slower", samples_per_s=None) for t in rest[:-1]),
              replace(base, samples_per_s=980.0, verdict="ok"))
    config = _judged(trials)
    assert "within the measured noise (10% spread)" in config.reason  # of the baseline
    why = report.short_reason(config)
    assert config.runner_up == "within-noise" and why.endswith(  # 2% apart, +- 2.8%
        "Runner-up fp32/off 16x4 at 0.98x (within the noise: either would do)."), why
    # Without the baseline close behind, the runner-up at 0.72x is behind.
    trials = (*trials[:-1], replace(base, samples_per_s=500.0, verdict="slower"))
    config = _judged(trials)
    why = report.short_reason(config)
    assert "within the measured noise" in config.reason and config.runner_up == "behind"
    assert why.endswith(f"Runner-up {second.label()} at 0.72x (behind, beyond the noise)."), why
    # The winner's own two runs 40% apart: the 0.72x lead is within that noise; another
    # config's drift leaves a pair both re-measured as they are.
    config = _judged(trials, {Candidate(knobs=win.knobs, micro_batch=16): 0.4})
    assert config.runner_up == "within-noise"
    assert report.short_reason(config).endswith("(within the noise: either would do).")
    assert _judged(trials, {Candidate(knobs=base.knobs, micro_batch=16): 0.4}).runner_up == \
        "behind"
    # A runner-up timed once: the noise is at least --confirm-within (5%), and any drift.
    once = (*trials[:1], replace(trials[1], num_runs=1, samples_per_s=960.0), *trials[2:])
    config = _judged(once)
    assert config.runner_up == "within-noise" and config.reason.endswith(
        "(within the noise: either would do: the noise is --confirm-within 0.05)")
    assert _judged(once[:1] + (replace(once[1], samples_per_s=720.0),) + once[2:],
                   {Candidate(knobs=base.knobs, micro_batch=16): 0.4}).runner_up == \
        "within-noise"


SKIPPED = (
    "bf16/max-autotune not tried: bf16's best is 0.62x the leader (bf16/default+opt=fused 16), "
    "under --refine-within 0.9: a refinement of default rarely gains more than that gap",
    "fp32/max-autotune not tried: fp32's best is 0.55x the leader (bf16/default+opt=fused 16), "
    "under --refine-within 0.9: a refinement of default rarely gains more than that gap",
    "bf16/default+ckpt=blocks not tried: bf16/default fits the whole per-device batch 64 "
    "without it, and checkpointing recomputes, so it runs no faster there",
    "bf16/default: micro-batches above 16 not probed: its peak at 16 (1.20 GiB) grows to about "
    "2.31 GiB at 32 (71.0 MiB a sample), over the 1.80 GiB usable",
    "fp32/default: micro-batches above 8 not probed: its peak at 8 (1.20 GiB) grows to about "
    "2.31 GiB at 16 (71.0 MiB a sample), over the 1.80 GiB usable",
    "bf16/off: micro-batches 8, 4, 2, 1 not timed: 4 was not faster than 8 by more than the "
    "noise (3%)",
    "fp32/off: micro-batches 4, 2, 1 not timed: the class's 3 largest were (--micro-batches)",
    "fp32/default: micro-batches 2, 1 not timed: fp32's best is 0.55x the leader",
    "re-check of bf16/default+opt=fused/16: stored 35.9 samples/s, now 36.2 samples/s (within "
    "the noise): the stored run stands",
    "bf16/default+opt=foreach/16 re-measured: timed once at 0.97x the leader "
    "(bf16/default+opt=fused/16), within the 12% two runs of bf16/default/16 drifted apart here",
    "no re-measurement: the runner-up (bf16/default/16) is 0.80x the leader "
    "(bf16/default+opt=fused/16), a gap wider than the noise measured (4%: 95% interval of the "
    "ratio, at least --confirm-within 0.05)",
    "no estimator calibration: the search stopped early: --time-budget reached (12m)",
    "fp16 not timed: " + "this CPU runs fp16 autocast in software, slower than fp32; " * 5,
    "fsdp: no repeated blocks to shard one by one, so FSDP2 shards the root alone (every "
    "parameter gathered at once in forward and backward: less memory saved at the peak); name "
    "them with Workload(blocks=...)",
    "bf16/default+opt=fused/16: not run again compiled afresh: bf16/default/16 compiled the "
    "same graphs afresh at a peak of 1.1 GiB; compiling adds at most that to its own 1.2 GiB",
)


def _footer(config: TunedConfig, path: Path | None = None) -> list[str]:
    return report.search_footer(SearchResult(config=config, path=path, probe=None))


def test_fifteen_long_skipped_reasons_print_as_a_few_short_grouped_lines() -> None:
    assert len(SKIPPED) == 15 and max(len(s) for s in SKIPPED) >= 300
    lines = _footer(replace(realistic(), skips=notes(*SKIPPED)))
    about = [line for line in lines if line.startswith(("skipped", "measured again",
                                                        "the full reasons"))]
    assert len(about) <= report_skips.MAX_SKIPPED_LINES + 2 == 6
    assert all(len(line) <= 100 for line in about), about
    assert "skipped (3 not tried): bf16/max-autotune not tried: bf16's best" in about[0]
    # The two runs that were made are not "skipped".
    assert sum(line.startswith("skipped") for line in about) == 4
    assert any(line.startswith("measured again (2 runs): re-check of") for line in about)
    assert about[-1] == "the full reasons: autotune.json (skipped)"


RULE_IDS = st.sampled_from(["note", *RULES])


@given(st.lists(st.tuples(RULE_IDS, st.text(min_size=1, max_size=400)), max_size=40))
def test_any_skipped_reasons_take_at_most_seven_lines_of_100(
        skipped: list[tuple[str, str]]) -> None:
    lines = report_skips.skipped_lines(tuple(SkipRecord(rule=r, text=t) for r, t in skipped))
    assert len(lines) <= report_skips.MAX_SKIPPED_LINES + 3 == 7
    assert all(len(line) <= 100 and len(line.splitlines()) <= 1 for line in lines)
    assert bool(lines) == bool(skipped)


def test_skipped_lines_group_by_rule_and_put_runs_made_apart() -> None:
    skips = (SkipRecord(rule="gain-ceiling", text="bf16/off: micro-batches above 8 not probed"),
             SkipRecord(rule="gain-ceiling", text="fp32/off: micro-batches above 4 not probed"),
             SkipRecord(rule="recheck", text="bf16/off/8: stored 10.0, now 9.9"),
             SkipRecord(text="re-check of fp32/off/4 (stored run): a schema 2 note"))
    lines = report_skips.skipped_lines(skips)
    assert lines == [
        "skipped (2 gain-ceiling): bf16/off: micro-batches above 8 not probed",
        "measured again (2 runs): bf16/off/8: stored 10.0, now 9.9",
        "the full reasons: autotune.json (skipped)"]
    # the space's notes are one rule, however they are worded; the calibration's are said
    # apart, after the rest (what `check` will lack is never folded into "more")
    space = (SkipRecord(rule="space", text="precision tf32 skipped: not supported on X (cpu)"),
             SkipRecord(rule="space", text="precision fp16 skipped: not supported on X (cpu)"))
    many = tuple(SkipRecord(rule=r, text=f"{r}: a reason") for r in (
        "frees-nothing", "not-applicable", "behind-refine", "walk-not-faster"))
    calibration = SkipRecord(rule="calibration", text="no estimator calibration: interrupted")
    lines = report_skips.skipped_lines((*space, calibration, *skips[:2], *many))
    assert lines[0] == "skipped (2 space): precision tf32 skipped: not supported on X (cpu)"
    assert lines[3].startswith("skipped: 3 more, of 3 other kinds")
    assert lines[-2:] == ["calibration: no estimator calibration: interrupted",
                          "the full reasons: autotune.json (skipped)"]
    # a file without rules (schema 2) is grouped by each sentence's words, as before
    notes = tuple(SkipRecord(text=s.text) for s in space)
    assert len(report_skips.skipped_lines(notes)) == 3


def test_the_footer_says_how_to_use_the_result_next(tmp_path: Path) -> None:
    path = tmp_path / "out" / "autotune.json"
    lines = _footer(realistic(), path)
    script = path.with_name("train_autotuned.py")
    assert f"next: python {script} --steps 100   (train with the tuned config)" in lines
    assert f'  or in your own script: cfg = autotune.load("{path}")' in lines


def test_a_search_stopped_early_says_what_it_never_reached_in_the_footer_and_page() -> None:
    config = replace(realistic(), interrupted=True, stopped_by="--time-budget reached (12m)",
                     not_reached=("knob screening (checkpointing, optimizer_impl)",
                                  "the re-measure of the leaders", "the first-launch check"))
    line = ("not reached before the search stopped: knob screening (checkpointing, "
            "optimizer_impl); the re-measure of the leaders; the first-launch check (a larger "
            "--time-budget or --max-trials reaches them)")
    assert line in _footer(config)
    assert line in render_html(config)
    assert not any(s.startswith("not reached") for s in _footer(realistic()))


def test_search_says_what_it_starts_at_once_on_stderr(tmp_path: Path) -> None:
    # Off a terminal the progress bar shows nothing: the first line is printed before the
    # search begins (here it ends right after, on a workload file that does not exist).
    result = runner.invoke(app, ["search", "--target-batch", "8", "--workload",
                                 f"{tmp_path / 'nope.py'}:workload", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    first = " ".join(result.stderr.split("error:")[0].split())  # wrapped at the width
    assert first.startswith(f"autotune search: probing the memory of {tmp_path / 'nope.py'}"
                            f":workload on {report_progress.device_words(api.env())} for "
                            "target batch 8"), first  # the device it runs on, named
    assert "(cuda when available)" not in first and "this takes minutes" in first


def test_report_right_after_a_search_replaces_its_own_page_and_no_other_file(
        tmp_path: Path) -> None:
    config = realistic()
    path = write(config, tmp_path / "autotune.json")
    page = tmp_path / "autotune.html"
    assert runner.invoke(app, ["report", str(path)]).exit_code == 0
    page.write_text(page.read_text().replace("</body>", "<!-- old --></body>"))
    # The page this file's search wrote: replaced, as README's 30-second example runs it.
    result = runner.invoke(app, ["report", str(path)])
    assert result.exit_code == 0, result.output
    assert "<!-- old -->" not in page.read_text()
    # A page of another search, or any other file: kept, unless --force.
    for other in (render_html(replace(config, created_at="2026-11-23T04:00:00+00:00")),
                  "<html>my notes</html>"):
        page.write_text(other)
        result = runner.invoke(app, ["report", str(path)])
        assert result.exit_code == 2, result.output
        assert page.read_text() == other and "--force" in result.stderr
        assert runner.invoke(app, ["report", str(path), "--force"]).exit_code == 0
        assert page.read_text() != other


def test_a_ctrl_c_while_the_search_prints_names_what_was_written(
        tmp_path: Path, monkeypatch) -> None:
    # The CLI's side of test_signals' real search (marked slow: a new interpreter, 30 s): once
    # the search returned, its files are written, and a Ctrl-C while the table prints says so.
    from autotune import api

    path = write(realistic(), tmp_path / "autotune.json")

    def searched(*args, **kwargs):
        return SearchResult(config=realistic(), path=path, probe=None)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "search", searched)
    monkeypatch.setattr(report, "search_table", interrupted)
    result = runner.invoke(app, ["search", "--target-batch", "8", "--out", str(tmp_path)])
    assert result.exit_code == 130, result.output
    assert f"interrupted (Ctrl-C): wrote {path}, its train_autotuned.py first" in " ".join(
        result.stderr.split())
