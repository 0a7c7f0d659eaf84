"""A finished job stays finished: rerunning it with resume on (the default; every Kubernetes restart of a completed
job) trains nothing, says so in one line and exits 0, through main(), train() and bench_train; a resume never trains
past --max_steps."""

import json

import pytest

from tests.helpers.bench import bench_args, csv_by, read_dump
from tests.helpers.training import BENCH_TRAIN, REPO_ROOT, cli_args, load_script, logged_steps, make_args, run_main
from tuning.benchmarking import compare, report
from tuning.sft_trainer import train
from tuning.utils.checkpoints import COMPLETED_FILE


def test_a_rerun_of_a_finished_job_trains_nothing_and_never_past_max_steps(
    tiny_model, sample_train, tmp_path, monkeypatch, capfd, caplog
):
    """main(): the rerun finds the checkpoint of its final step (transformers would train step 3 from it, write
    checkpoint-3 and replace the final model); train(): a smaller --max_steps than the checkpoint's step."""
    output_dir, final = tmp_path / "out", tmp_path / "final"
    args = cli_args(
        tiny_model, str(output_dir), max_steps=2, save_strategy="steps", save_steps=2, save_model_dir=str(final)
    )
    exit_code, stderr = run_main(args, monkeypatch, capfd)
    assert exit_code == 0, stderr[-3000:]
    saved = {path.name: path.stat().st_mtime_ns for path in final.iterdir()}

    exit_code, stderr = run_main(args, monkeypatch, capfd)
    assert exit_code == 0, stderr[-3000:]
    assert f"already complete: {output_dir} holds checkpoint-2 at step 2, at or past --max_steps 2" in caplog.text
    assert sorted(path.name for path in output_dir.glob("checkpoint-*")) == ["checkpoint-2"]
    assert logged_steps(output_dir / "training_logs.jsonl") == [1, 2]
    assert {path.name: path.stat().st_mtime_ns for path in final.iterdir()} == saved  # the final model untouched

    model_args, data_args, train_args = make_args(tiny_model, str(output_dir), sample_train, max_steps=1)
    trainer, info, _ = train(model_args, data_args, train_args)
    assert (trainer, info["already_complete"], info["resumed_from_step"]) == (None, True, 2)


def test_the_completed_mark_keeps_a_job_without_checkpoints_finished(tiny_model, sample_train, tmp_path):
    """--save_strategy no leaves no checkpoint: the mark written at the end says the job is done; asking for more
    steps trains again (from the start: there is nothing to resume), and --resume_from_checkpoint false too."""
    model_args, data_args, train_args = make_args(tiny_model, str(tmp_path), sample_train, max_steps=1)
    trainer, info, _ = train(model_args, data_args, train_args)
    assert (trainer.state.global_step, info["already_complete"]) == (1, False)
    assert json.loads((tmp_path / COMPLETED_FILE).read_text())["global_step"] == 1
    assert train(model_args, data_args, train_args)[1]["already_complete"] is True
    train_args.resume_from_checkpoint = "false"
    assert train(model_args, data_args, train_args)[0].state.global_step == 1
    assert logged_steps(tmp_path / "training_logs.jsonl") == [1, 1]


def test_bench_train_rerun_of_a_finished_job_dumps_already_complete(tiny_model, tmp_path, capfd):
    """bench_train with resume: the dump says already_complete with the step the job had reached, keeps the first
    run's segment (its journal continues) and is no measurement for bench_report."""
    args = bench_args(tiny_model, tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    bench_train = load_script(BENCH_TRAIN)
    assert bench_train.main(args) == 0, capfd.readouterr().err[-3000:]
    assert bench_train.main([*args, "--resume_from_checkpoint", "true"]) == 0, capfd.readouterr().err[-3000:]
    dump = read_dump(tmp_path / "bench.json")
    assert (dump["status"], dump["training_steps"]) == ("already_complete", 2)
    assert [(s["status"], s["steps"]) for s in dump["segments"]] == [("ok", 2), ("already_complete", 0)]
    assert logged_steps(tmp_path / "training_logs.jsonl") == [1, 2]
    assert not (tmp_path / "checkpoint-3").exists()
    runs = report.load(report.find_files([str(tmp_path / "bench.json")]))
    assert [run.status for run in runs] == ["already_complete"]
    assert "already_complete" not in report.DONE_STATUSES and "already_complete" in report.FINISHED_STATUSES
    load_script(REPO_ROOT / "wrappers" / "bench_report.py").main(str(tmp_path), output_dir=str(tmp_path / "report"))
    assert csv_by(tmp_path / "report" / "report.csv", "run")["bench"]["status"] == "already_complete"
    assert "## Failures" not in (tmp_path / "report" / "report.md").read_text()  # it failed nothing either
    done = "ok, stopped, converged or not_converged"  # already_complete: no measurement, and no failure
    with pytest.raises(SystemExit, match=f"no benchmark dumps that ended {done}"):
        compare.read_side(str(tmp_path))
    assert "bench: already_complete (a rerun of a finished job: it measured nothing)" in capfd.readouterr().out
