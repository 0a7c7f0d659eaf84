"""wrappers/bench_report.py on the files of real bench_train runs of the tiny model: ok, stopped, OOM-injected,
SIGKILLed, and a 2-rank job under tuning.launch whose last rank runs out of memory. The runs are made once per
session, all at the same time (the ``bench_runs`` fixture, which tests/test_launch.py reads too); faults come in
through bench_train's ``--callbacks`` (tests/helpers/bench_callbacks.py)."""

import csv
import json
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
from matplotlib.colors import to_rgba

from tests.helpers.bench import BENCH_RUNS, BENCH_RUNS_EXPECTED, csv_by, markdown_rows, rebuild
from tests.helpers.dumps import mlperf_runs, write_dump
from tests.helpers.training import REPO_ROOT, load_script, run_python
from tuning.benchmarking.goodput import PARTS as GOODPUT_PARTS
from tuning.benchmarking.report import (
    NODE_COLUMNS,
    PointRuns,
    find_files,
    group_points,
    load,
    points_table,
    row,
    runs_table,
    write_report,
)

BENCH_REPORT = REPO_ROOT / "wrappers" / "bench_report.py"
BATCH_SIZE = "per_device_train_batch_size"

RUNS, EXPECTED = BENCH_RUNS, BENCH_RUNS_EXPECTED


@pytest.fixture(scope="module")
def runs_dir(bench_runs) -> Path:
    """One directory with the dumps, journals and rank reports of every run in RUNS."""
    return bench_runs.dir


@pytest.fixture(scope="module")
def bench_report():
    """The script as a module, for checks below the command line."""
    return load_script(BENCH_REPORT)


def report(*args: str) -> subprocess.CompletedProcess:
    return run_python(str(BENCH_REPORT), *args, timeout=120)


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    return csv_by(path, "run")


@pytest.mark.slow
def test_table_csv_and_plots_of_a_directory_of_runs(runs_dir, tmp_path):
    out = tmp_path / "report"
    result = report(
        str(runs_dir), "--labels", "model,batch_size", "--x", "batch_size", "--group", "model", "--output_dir", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert "skipped" not in result.stderr  # model configs and tokenizers beside the dumps are not benchmark files
    names = ("report.md", "report.csv", "points.csv", "throughput.png", "peak_memory.png", "goodput.png")
    outputs = [out / name for name in names]
    assert result.stdout.split()[-len(names) :] == [str(path) for path in outputs]

    rows = read_csv(out / "report.csv")
    assert set(rows) == set(RUNS)
    for name, (status, category, rank) in EXPECTED.items():
        row = rows[name]
        assert (row["status"], row["error_category"], row["error_rank"]) == (status, category, rank), name
        metadata = RUNS[name][0]
        assert (row["model"], row["batch_size"]) == (metadata["model"], str(metadata["batch_size"]))
    for name in ("ok-a2", "ok-a4"):
        assert rows[name]["training_steps"] == "3"
        assert float(rows[name]["tokens_per_second"]) > 0 and float(rows[name]["peak_rss_bytes"]) > 0
        assert 0 < float(rows[name]["peak_anon_rss_bytes"]) <= float(rows[name]["peak_rss_bytes"])
        assert 0 < float(rows[name]["step_time_p50_s"]) <= float(rows[name]["step_time_p90_s"])
        assert float(rows[name]["model_load_time_s"]) > 0
        assert 0 < float(rows[name]["goodput"]) < 1 and 0 < float(rows[name]["data_fetch_share"]) < 1
    assert 0 < int(rows["stopped-b4"]["training_steps"]) < 500
    assert int(rows["killed-b8"]["training_steps"]) >= 2  # what the journal held when the run was killed
    assert rows["oom-a8"]["training_steps"] == "2" and "injected by the test" in rows["oom-a8"]["error_message"]
    assert rows["ranks-b2"]["failed_ranks"] == "0 1"

    text = (out / "report.md").read_text()
    table = markdown_rows(text, "Runs")
    assert list(table[0])[:4] == ["run", "model", "batch_size", "status"] and len(table) == len(RUNS)
    killed = next(row for row in table if row["run"] == "killed-b8")
    assert (killed["model"], killed["batch_size"], killed["status"]) == ("b", "8", "killed")
    failures = text.split("## Failures\n", 1)[1]
    assert (
        "- `ranks-b2`: error, gpu_oom on rank 1 at step 2: " in failures
        and "(ranks that reported a failure: 0 1)" in failures
    )
    assert "- `killed-b8`: killed, no error report on any rank" in failures and "ok-a2" not in failures
    for png in outputs[3:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_root_cause_names_the_rank_that_failed_first(runs_dir, bench_report):
    """Rank 0 reports the interruption (or lost peer) that rank 1's OOM caused; the report blames rank 1."""
    files = sorted(path for path in runs_dir.glob("ranks-b2.json*") if path.suffix != ".lock")  # the run's lock
    assert {path.name for path in files} == {"ranks-b2.json", "ranks-b2.json.rank1.error.json"}
    for ordered in (files, files[::-1]):
        (run,) = bench_report.report.load([(path, True) for path in ordered])
        cause = run.root_cause
        assert (cause.category, cause.rank, cause.step) == ("gpu_oom", 1, 2)
        others = [failure.category for failure in run.failures if failure.rank == 0]
        assert others and others[0] in ("communication", "interrupted")


@pytest.mark.slow
def test_a_rebuilt_dump_stands_for_the_killed_run_it_came_from(runs_dir, tmp_path):
    journal = tmp_path / "killed-b8.journal.jsonl"
    shutil.copy(runs_dir / journal.name, journal)
    rebuild(journal)
    assert (tmp_path / "killed-b8.rebuilt.json").exists()
    for _ in ("with its journal", "alone"):
        result = report(str(tmp_path), "--output_dir", str(tmp_path / "out"))
        assert result.returncode == 0, result.stderr
        rows = read_csv(tmp_path / "out" / "report.csv")
        assert list(rows) == ["killed-b8"] and rows["killed-b8"]["status"] == "killed"
        journal.unlink(missing_ok=True)


@pytest.mark.slow
def test_malformed_and_old_inputs_are_skipped_with_a_reason(runs_dir, tmp_path):
    good = runs_dir / "ok-a2.json"
    dump = json.loads(good.read_text())
    bad = {
        "cut.json": (good.read_text()[: len(good.read_text()) // 2], "not valid JSON"),
        "old-version.json": (json.dumps({**dump, "schema_version": 0}), "schema_version 0; this report reads 1"),
        "no-summary.json": (json.dumps({k: v for k, v in dump.items() if k != "summary"}), "missing key 'summary'"),
        "ado.json": (
            json.dumps({"run_hash": "abc", "metrics": [], "hostname": "h", "train_time_start": 1.0}),
            "old-schema dump",
        ),
        "ado_error.json": (json.dumps({"error": "OOM", "exception": "...", "run_hash": None}), "old-schema error"),
        "x.json.rank1.error.json": (json.dumps({"category": "gpu_oom", "rank": 1}), "missing timestamp"),
        "damaged.journal.jsonl": (
            "\n".join(['{"type": "start"}', "garbage", '{"type": "end"}']) + "\n",
            "not a usable journal",
        ),
        "list.json": ("[1, 2]", "not a benchmark dump or error report"),
    }
    for name, (text, _) in bad.items():
        (tmp_path / name).write_text(text)
    result = report(str(good), *(str(tmp_path / name) for name in bad), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    skipped = [line for line in result.stderr.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == len(bad)
    for name, (_, reason) in bad.items():
        line = next(line for line in skipped if line.startswith(f"skipped {tmp_path / name}: "))
        assert reason in line, line
    assert list(read_csv(tmp_path / "out" / "report.csv")) == ["ok-a2"]


@pytest.mark.slow  # starts bench_report
def test_nothing_readable_is_an_error(tmp_path):
    (tmp_path / "cut.json").write_text('{"schema_version": 1, "sta')
    result = report(str(tmp_path / "cut.json"), str(tmp_path / "missing-*.json"), "--output_dir", str(tmp_path))
    assert result.returncode != 0
    assert "skipped" in result.stderr and "no such file, directory or glob match" in result.stderr
    assert "no readable runs" in result.stderr


def test_mfu_energy_and_skew_columns_and_the_mfu_plot_by_batch_size(bench_report, tmp_path, capsys):
    counts = {"frozen_matmul_parameters": 0, "trained_matmul_parameters": 1000, "layers": 1, "attention_width": 4}
    for batch in (1, 2):
        write_dump(
            tmp_path / "runs" / f"b{batch}.json",
            [0.5] * 4,
            {BATCH_SIZE: batch},
            samples=batch,
            flops_counts=counts,
            peak_tflops=1e-6 * batch,
            rank_forward_time_p50=[0.1, 0.2 * batch],
        )
    bench_report.main(str(tmp_path / "runs"), labels=BATCH_SIZE, output_dir=str(tmp_path / "out"))
    rows = read_csv(tmp_path / "out" / "report.csv")
    flops = 6 * 1000 + 12 * 4 * 100  # 100 tokens per sample at batch size 1
    assert float(rows["b1"]["mfu"]) == pytest.approx(200 * flops / 1e12 / 1e-6)  # 200 tokens/s
    assert float(rows["b2"]["rank_skew"]) == pytest.approx(4.0)
    assert rows["b1"]["joules_per_token"] == ""  # no NVML
    (shown, _) = markdown_rows((tmp_path / "out" / "report.md").read_text(), "Runs")
    assert {"mfu", "rank_skew"} <= shown.keys() and "joules_per_token" not in shown
    assert (tmp_path / "out" / "mfu_by_batch_size.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(tmp_path / "out" / "mfu_by_batch_size.png") in capsys.readouterr().out


@pytest.mark.slow  # starts bench_report
def test_an_unknown_flag_is_one_line_and_exit_1_before_any_output(tmp_path):
    (tmp_path / "cut.json").write_text('{"schema_version": 1, "sta')
    result = report(str(tmp_path / "cut.json"), "--ouput_dir", str(tmp_path / "out"), "--bogus", "1")
    assert result.returncode == 1
    assert result.stderr.strip() == "unknown flag --ouput_dir; did you mean --output_dir?"
    assert not (tmp_path / "out").exists() and not (REPO_ROOT / "bench_report").exists()


def test_a_plots_title_fits_its_figure_and_its_axes_are_honest(bench_report):
    """A tick at each point's value and none between, the y axis from zero, units on the axes; a point's runs are
    each a dot, their range a bar, and the caption says so."""
    x = "training.per_device_train_batch_size"  # a dotted metadata key: a long title
    rows = [{"status": "ok", x: size, "peak_gpu_memory_bytes": size * 1e9} for size in (1, 2, 4, 4)]
    rows[-1]["peak_gpu_memory_bytes"] = 6e9  # two runs of batch size 4: 4 and 6 GB
    metric, ylabel = "peak_gpu_memory_bytes", "peak GPU memory reserved (GB)"
    figure = bench_report.report.draw(rows, x, None, metric, ylabel)
    figure.set_dpi(bench_report.report.PLOT_DPI)
    figure.canvas.draw()  # lays the text out, as savefig does
    (axes,) = figure.axes
    title, frame = axes.title.get_window_extent(), figure.bbox
    assert frame.x0 <= title.x0 and title.x1 <= frame.x1 and title.y1 <= frame.y1
    assert axes.title.get_text().replace("\n", " ") == f"{ylabel} by {x}"
    (caption,) = figure.texts
    done = "ok, stopped, converged or not_converged"
    assert caption.get_text() == f"line: each point's median; dots: its runs (ended {done}); bar: their range"
    assert caption.get_window_extent().y1 < axes.get_tightbbox().y0  # below the axis' ticks and label
    assert axes.get_xlabel() == f"{x} (samples per device)"
    assert axes.get_xticks().tolist() == [1, 2, 4]  # no tick at batch size 3
    low, high = axes.get_ylim()
    assert low == 0 and high > 6  # the highest run (6 GB) inside the frame
    ranges = [
        segment.tolist()
        for bars in axes.collections
        if hasattr(bars, "get_segments")
        for segment in bars.get_segments()
    ]
    assert [[4, 4], [4, 6]] in [[[a, b] for a, b in zip(*segment, strict=True)] for segment in ranges]


def test_the_goodput_column_and_its_stacked_bar_per_run(tmp_path, capsys):
    """The column is each dump's productive share of its wall time; goodput.png stacks every run's parts."""
    for name, seconds in (("fast", 0.5), ("slow", 1.0)):
        write_dump(tmp_path / "runs" / f"{name}.json", [seconds] * 4, {"model": name})
    outputs = write_report([str(tmp_path / "runs")], output_dir=str(tmp_path / "out"))
    rows = read_csv(tmp_path / "out" / "report.csv")
    for name in ("fast", "slow"):
        dump = json.loads((tmp_path / "runs" / f"{name}.json").read_text())
        assert float(rows[name]["goodput"]) == pytest.approx(dump["summary"]["goodput"]["productive_fraction"])
    assert tmp_path / "out" / "goodput.png" in outputs
    assert (tmp_path / "out" / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bound_by_the_step_shares_and_a_link_to_each_rank_s_trace(tmp_path, capsys):
    """Each run's row says what its steps wait on, each part's share, and links its ranks' traces from the report."""
    profile = {"steps": [3, 4], "profiled_steps": [3, 4], "top_ops": None, "missing": None}
    profile["traces"] = [
        {"rank": rank, "trace": f"bench.profile/rank{rank}/trace.json.gz", "table": None, "missing": None}
        for rank in (0, 1)
    ]
    shares = {"data": 0.6, "forward": 0.2, "backward": 0.1, "optimizer": 0.05, "rest": 0.05}
    write_dump(tmp_path / "runs" / "slow-data.json", [1.0] * 4, {"model": "a"}, parts=shares, profile=profile)
    write_dump(tmp_path / "runs" / "plain.json", [1.0] * 4, {"model": "b"})
    write_report([str(tmp_path / "runs")], output_dir=str(tmp_path / "out"))
    rows = read_csv(tmp_path / "out" / "report.csv")
    assert rows["slow-data"]["bound_by"] == "data"
    assert rows["slow-data"]["step_parts"] == "data 0.60, forward 0.20, backward 0.10, optimizer 0.05, rest 0.05"
    traces = [f"../runs/bench.profile/rank{rank}/trace.json.gz" for rank in (0, 1)]
    assert rows["slow-data"]["traces"] == " ".join(traces)
    assert rows["plain"]["bound_by"] == rows["plain"]["step_parts"] == rows["plain"]["traces"] == ""
    table = (tmp_path / "out" / "report.md").read_text()
    assert f"[rank0]({traces[0]}) [rank1]({traces[1]})" in table


def write_sweep_with_repeats(root: Path) -> dict[tuple[int, int], dict]:
    """A sweep directory as bench_sweep leaves it, of synthetic dumps: batch sizes 2 and 4, three repeats each, and
    batch size 8, whose one run ran out of memory before writing a dump; → the dumps by (batch size, repeat)."""
    dumps, lines = {}, []
    for batch in (2, 4):
        for repeat in range(3):
            name = f"bs{batch}-repeat{repeat}"
            seconds = [0.1 * batch * (1 + 0.1 * repeat + 0.05 * (step % 2)) for step in range(5)]
            path = root / "points" / f"{name}.json"
            dumps[batch, repeat] = write_dump(path, seconds, {BATCH_SIZE: batch, "repeat": repeat}, samples=batch)
            lines.append(
                {"point": name, "axes": {BATCH_SIZE: batch}, "metrics_path": f"points/{name}.json", "status": "ok"}
            )
    reason = "CUDA out of memory (injected)"
    oom = {"axes": {BATCH_SIZE: 8}, "metrics_path": "points/bs8.json", "status": "error", "category": "gpu_oom"}
    lines.append({"point": "bs8", **oom, "reason": reason})
    (root / "sweep_state.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return dumps


def test_a_sweep_with_repeats_a_row_per_point_its_medians_and_ranges_then_every_run(tmp_path, capsys):
    """The points table: one row per point, the median and range of its runs' figures; the run table with the repeat
    as a column and without the columns no run measured (the CSV keeps them); the failure in a section of its own.
    What is printed is the points table and the failure, in 120 columns."""
    dumps = write_sweep_with_repeats(tmp_path / "sweep")
    outputs = write_report([str(tmp_path / "sweep")], output_dir=str(tmp_path / "out"))
    assert outputs[:3] == [tmp_path / "out" / name for name in ("report.md", "report.csv", "points.csv")]
    text = (tmp_path / "out" / "report.md").read_text()
    points = csv_by(tmp_path / "out" / "points.csv", BATCH_SIZE)
    shown = {row[BATCH_SIZE]: row for row in markdown_rows(text, "Points")}
    assert list(points) == list(shown) == ["2", "4", "8"]
    for batch in (2, 4):
        runs = [dumps[batch, repeat]["summary"] for repeat in range(3)]
        point = points[str(batch)]
        assert (point["runs"], point["done_runs"]) == ("3", "3")
        for column, key in (("tokens_per_second", "tokens_per_second"), ("step_time_p50_s", "step_time_p50")):
            values = [run[key] for run in runs]
            expected = (statistics.median(values), min(values), max(values))
            assert tuple(float(point[f"{column}_{end}"]) for end in ("median", "min", "max")) == expected
        middle, low, high = (float(point[f"tokens_per_second_{end}"]) for end in ("median", "min", "max"))
        assert (
            shown[str(batch)]["runs"] == "3" and shown[str(batch)]["tokens/s"] == f"{middle:.1f} ({low:.1f}–{high:.1f})"
        )
    assert (points["8"]["done_runs"], points["8"]["tokens_per_second_median"], shown["8"]["runs"]) == (
        "0",
        "",
        "0 of 1",
    )
    assert list(shown["2"]) == [BATCH_SIZE, "runs", "tokens/s", "step p50 (s)", "goodput"]
    assert not any(key.startswith("mlperf") for key in points["2"])  # no --target_eval_loss run: no MLPerf score
    assert "- tokens/s: tokens trained per second" in text and "- bound by" not in text  # the legend of what is shown

    runs = markdown_rows(text, "Runs")
    assert [(row[BATCH_SIZE], row["repeat"]) for row in runs[:6]] == [(b, r) for b in "24" for r in "012"]
    assert list(runs[0])[:4] == ["run", BATCH_SIZE, "repeat", "status"] and "error_message" not in runs[0]
    with (tmp_path / "out" / "report.csv").open() as handle:
        every_column = next(csv.reader(handle))
    for empty in ("peak_rss", "mfu", "bound_by"):  # no synthetic dump has these
        assert not any(header.startswith(empty) for header in runs[0]) and any(
            c.startswith(empty) for c in every_column
        )
    not_measured = text.split("## Runs", 1)[1].split("not measured in these runs: ", 1)[1].split("\n\n")[0]
    assert {"mfu", "peak_rss_gb", "bound_by"} <= set(not_measured.replace("\n", " ").split(", "))
    assert not set(NODE_COLUMNS) & set(not_measured.replace("\n", " ").split(", "))  # no run across nodes
    assert "- `bs8`: error, gpu_oom: CUDA out of memory (injected)" in text.split("## Failures", 1)[1]

    printed = capsys.readouterr().out
    assert "## Points" in printed and "## Failures" in printed and "## Runs" not in printed
    assert max(map(len, printed.splitlines())) <= 120


def test_a_point_s_target_runs_are_scored_as_mlperf_scores_them(tmp_path):
    """Four points of --target_eval_loss runs: 10 converged (scored: the fastest and the slowest dropped, the mean of
    the rest); 9 converged, one not and one resumed (the non-converged run is the slowest, dropped; the resumed one
    left out, named); two not converged (invalid); nine runs (too few runs, never scored). points.csv gains the MLPerf
    keys, the points table a column said as bench_compare --mlperf says it, and the legend its line."""
    template = write_dump(tmp_path / "template.json", [0.5] * 4, {})
    times = [30.0 + 0.1 * index for index in range(10)]
    for point, point_times in (
        ("all", times),
        ("one", [*times[:9], None, "resumed"]),
        ("two", [*times[:8], None, None]),
        ("few", times[:9]),
    ):
        mlperf_runs(tmp_path / "runs", template, point, point_times)
    write_report([str(tmp_path / "runs")], output_dir=str(tmp_path / "out"))
    points = csv_by(tmp_path / "out" / "points.csv", "point")
    text = (tmp_path / "out" / "report.md").read_text()
    shown = {row["point"]: row["MLPerf score (s)"] for row in markdown_rows(text, "Points")}

    scored = sum(sorted(times)[1:-1]) / 8
    assert float(points["all"]["mlperf_score"]) == pytest.approx(scored) and shown["all"] == f"{scored:.4g}"
    assert (points["all"]["mlperf_not_converged_runs"], points["all"]["mlperf_verdict"]) == ("0", "")
    one = points["one"]
    assert float(one["mlperf_score"]) == pytest.approx(sum(sorted(times[:9])[1:]) / 8)
    assert one["mlperf_not_converged_runs"] == "1" and one["mlperf_note"].startswith("one-10.json left out: resumed")
    assert shown["one"].startswith(f"{float(one['mlperf_score']):.4g} (1 not converged: the slowest); one-10.json")
    two, few = points["two"], points["few"]
    assert (two["mlperf_score"], two["mlperf_verdict"], two["mlperf_not_converged_runs"]) == ("", "invalid", "2")
    assert shown["two"] == "invalid: 2 of 10 runs did not converge: at most 1 may"
    assert (few["mlperf_score"], few["mlperf_verdict"]) == ("", "too few runs")
    assert shown["few"] == "too few runs: 9 runs, MLPerf scores 10 or more"
    assert "- MLPerf score (s): time to train scored as MLPerf scores a result" in text


def test_a_point_with_every_cpu_figure_fits_120_columns():
    """The demo's case: one label, a run per point, and every figure a CPU run measures (RSS, tensors, the
    estimate's ratio, goodput, bound by): the points table fits a 120-column terminal."""
    rows = [
        {
            "status": "ok",
            "batch_size": size,
            "tokens_per_second": 6966.04 * size + repeat,
            "step_time_p50_s": 0.00651 + repeat / 1000,
            "peak_rss_bytes": 6.08e8 + repeat * 1e7,
            "peak_tensor_bytes": 1.79e7 * size,
            "memory_estimate_ratio": 18.1 + repeat,
            "goodput": 0.234 + repeat / 100,
            "bound_by": "compute",
        }
        for size in (2, 16)
        for repeat in range(1)
    ]
    points = [PointRuns({"batch_size": size}, [r for r in rows if r["batch_size"] == size]) for size in (2, 16)]
    table = points_table(points, rows)
    assert "| estimate / tensors |" in table and "tokens/s" in table and "bound by" in table and "RSS (GB)" in table
    assert max(map(len, table.splitlines())) <= 120, table


def test_runs_across_nodes_show_each_node_s_throughput_and_wait_and_the_slowest_node(tmp_path):
    """Two runs of a 2-node point (node 1 the slowest in one) and a 1-node run: the run table's node columns by node
    rank, and a line under the points table with each node's medians over the point's runs and the slowest node."""
    places = [{"host": f"host-{node}", "node_rank": node, "ray_node_id": None} for node in (0, 1)]
    for name, slow_rank, tokens in (("a", 0, [110.0, 85.0]), ("b", 1, [120.0, 95.0])):
        forward = [0.2 if rank == slow_rank else 0.1 for rank in (0, 1)]
        notes = {"rank_forward_time_p50": forward, "rank_collective_wait_p50": [0.02, 0.04 + 0.02 * slow_rank]}
        notes |= {"rank_tokens_per_second": tokens, "rank_nodes": places}
        write_dump(tmp_path / f"{name}.json", [0.5] * 4, {"nnodes": 2}, **notes)
    write_dump(tmp_path / "one.json", [0.5] * 4, {"nnodes": 1}, rank_forward_time_p50=[0.1])
    pairs = sorted(
        ((row(run, ["nnodes"]), run) for run in load(find_files([str(tmp_path)]))), key=lambda p: p[0]["run"]
    )
    rows = {Path(r["run"]).name: r for r, _ in pairs}
    assert (rows["a"]["slowest_node"], rows["b"]["slowest_node"], rows["one"]["slowest_node"]) == (0, 1, None)
    assert rows["a"]["node_tokens_per_second"] == "0: 110.0, 1: 85.0" and rows["b"]["node_collective_wait_s"] == (
        "0: 0.02, 1: 0.06"
    )
    assert rows["one"]["node_tokens_per_second"] is None
    assert "| slowest_node | node_tokens_per_second" in runs_table([r for r, _ in pairs])
    text = points_table(group_points(pairs, ["nnodes"]), [r for r, _ in pairs])
    line = " ".join(text.split("nnodes=2, per node: ", 1)[1].split("\n\n")[0].split())
    assert line == (
        "node 0 115.0 tokens/s, waited 0.02 s a step in collectives; node 1 90.0 tokens/s, waited 0.05 s a step in "
        "collectives; slowest node 0 (1 of 2 runs), node 1 (1 of 2 runs)"
    )
    assert "nnodes=1, per node" not in text


def test_each_goodput_part_has_a_colour_of_its_own_the_same_in_every_plot(bench_report):
    colours = bench_report.report.GOODPUT_COLOURS
    assert list(colours) == list(GOODPUT_PARTS) and len(set(map(to_rgba, colours.values()))) == len(GOODPUT_PARTS)
    every_part = {"parts": dict.fromkeys(GOODPUT_PARTS, 1.0)}
    resumed = {"parts": {"startup": 1.0, "productive_steps": 3.0, "gaps": 2.0, "leftover": 0.5}}
    for bars in ([("a", every_part)], [("b", resumed), ("c", None)]):
        (legend,) = bench_report.report.draw_goodput(bars).legends
        drawn = {
            text.get_text(): handle.get_facecolor()
            for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=True)
        }
        assert drawn == {part.replace("_", " "): to_rgba(colours[part]) for part in bars[0][1]["parts"]}
