"""What large data costs a short CLI run on the tiny model: wall and CPU time, peak RSS and anonymous memory, TRL's
passes.

Generates ``--rows`` JSON lines of about 350 bytes (the shape of a 300 MB, 754k-row file: about 400), then runs
``tuning/sft_trainer.py`` for ``--max_steps`` steps on them, once per arm and round, the arms alternating (each round
starts one arm later), and prints one Markdown table row per run. RSS and anonymous memory (``RssAnon`` of
``/proc/PID/status``, Linux) are sampled from outside every 0.1 s over the whole process. CPU seconds (user + system,
all threads) hold better than wall time on a machine that other work shares.

    python benchmarks/prepared_data.py --rows 50000 --workdir /tmp/prepared-data
    python benchmarks/prepared_data.py --rows 1000000 --arms before,plain,data_config --before /tmp/old-checkout

Arms: ``plain`` runs the plain flags (``--training_data_path``, ``--dataset_text_field``); ``data_config`` runs the
same file through ``--data_config_path`` with v3.1.0's ``apply_custom_jinja_template`` handler (``datasets``' ``map``
over the Arrow copy the line-numbered reader writes), the general path; ``before`` runs the plain flags with the
``tuning/sft_trainer.py`` of another checkout (``--before``, e.g. a ``git worktree`` of an older commit), in this
Python environment, with that checkout's defaults; ``before_plain`` the same with the flags of ``plain`` (a checkout
that has ``--data_cache_dir`` and ``--dataset_num_proc``).
``processes_2`` runs the plain flags tokenising on two processes (``--dataset_num_proc 2``).
``cache_miss`` fills an emptied processed-data cache (``--data_cache_dir WORKDIR/cache``) on one tokenising process,
``cache_miss_2`` the same on two, and ``cache_hit`` reads the entry the last miss left (both misses make the same
entry: the number of processes is not part of the key). The other arms run with the cache off and one tokenising
process. RSS and anonymous memory are the training process's; PSS (shared pages divided among their sharers) is
summed over it and its children, the tokenising workers, whose RSS would count the pages they share with it again.

With ``--rounds`` above 1 a summary follows the rows: per arm the median data preparation time and the largest
peaks, and the ratios the processed-data cache is judged by (``cache_hit`` over ``cache_miss``; ``cache_miss``
over ``cache_miss_2``, per round, as the arms alternate). The figures of docs/performance.md come from

    OMP_NUM_THREADS=1 python benchmarks/prepared_data.py --rows 1000000 \\
        --arms cache_miss,cache_hit,cache_miss_2,before_plain --before /tmp/old-checkout --rounds 3
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
WORDS = [
    "the",
    "a",
    "model",
    "learns",
    "answer",
    "question",
    "short",
    "long",
    "river",
    "stone",
    "green",
    "quiet",
    "number",
    "seven",
    "plus",
    "minus",
]
TRL_PASSES = ("Truncating train dataset", "Dropping fully masked examples")


def write_data(path: Path, rows: int) -> None:
    generator = random.Random(0)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(rows):
            question = " ".join(generator.choices(WORDS, k=generator.randint(10, 40)))
            answer = " ".join(generator.choices(WORDS, k=generator.randint(10, 40)))
            record = {"output": f"### Input: {question}\n\n### Response: {answer}"}
            handle.write(json.dumps(record) + "\n")


def status_bytes(pid: int, *fields: str, name: str = "status") -> dict[str, int]:
    """The ``kB`` fields of ``/proc/PID/status`` (or of another file there, ``name``: ``smaps_rollup``'s ``Pss`` and
    ``Pss_Anon`` divide shared pages among their sharers) in bytes; empty once the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}", encoding="ascii") as handle:
            lines = [line.split() for line in handle]
    except OSError:
        return {}
    return {parts[0].rstrip(":"): int(parts[1]) * 1024 for parts in lines if parts and parts[0].rstrip(":") in fields}


def write_data_config(path: Path, data: Path) -> None:
    """A data config of ``data`` with the handler the plain ``--dataset_text_field output`` flags stand for."""
    handler = {
        "name": "apply_custom_jinja_template",
        "arguments": {
            "remove_columns": "all",
            "fn_kwargs": {"formatted_text_column_name": "output", "template": "{{ element['output'] }}{{ eos_token }}"},
        },
    }
    config = {"datasets": [{"name": "generated", "data_paths": [str(data)], "data_handlers": [handler]}]}
    path.write_text(json.dumps(config), encoding="utf-8")


def tree_memory(pid: int) -> dict[str, int]:
    """Rank 0's ``VmRSS`` and ``RssAnon``, and ``Pss``/``Pss_Anon`` summed over the process and its children (the
    tokenising workers of ``--dataset_num_proc``, forked: their RSS counts the pages they share with it again)."""
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
            pids += [int(child) for child in handle.read().split()]
    except OSError:
        pass
    total = {"VmRSS": 0, "RssAnon": 0, "Pss": 0, "Pss_Anon": 0, **status_bytes(pid, "VmRSS", "RssAnon")}
    for one in pids:
        for name, value in status_bytes(one, "Pss", "Pss_Anon", name="smaps_rollup").items():
            total[name] += value
    return total


def cache_entries(cache: Path) -> list[str]:
    """The keys of the published entries of a processed-data cache."""
    return sorted(meta.parent.name for meta in cache.glob("*/meta.json"))


def data_preparation_seconds(output_dir: Path) -> float | None:
    """The run's ``data_preparation_time`` from its ``training_logs.jsonl`` (None before the field existed)."""
    try:
        lines = (output_dir / "training_logs.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    values = [json.loads(line)["data"]["value"] for line in lines if '"data_preparation_time"' in line]
    return values[-1] if values else None


def run(
    checkout: Path,
    model: str,
    data: Path,
    output_dir: Path,
    max_steps: int,
    data_config: Path | None = None,
    extra: tuple[str, ...] = (),
) -> dict:
    """One ``sft_trainer.py`` process of ``checkout`` on ``data`` (through ``data_config`` when given, with the
    ``extra`` flags), measured."""
    source = ("--data_config_path", str(data_config)) if data_config else ("--training_data_path", str(data))
    command = [
        sys.executable,
        str(checkout / "tuning" / "sft_trainer.py"),
        *("--model_name_or_path", model, *source, "--output_dir", str(output_dir)),
        *("--dataset_text_field", "output", "--response_template", "\n### Response:", "--max_seq_length", "128"),
        *("--max_steps", str(max_steps), "--per_device_train_batch_size", "4", "--save_strategy", "no"),
        *("--torch_dtype", "float32", "--use_flash_attn", "False", *extra),
    ]
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    stderr_path = output_dir / "stderr.txt"
    shutil.rmtree(output_dir, ignore_errors=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(stderr_path, "w", encoding="utf-8") as stderr:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        peaks = {"VmRSS": 0, "RssAnon": 0, "Pss": 0, "Pss_Anon": 0}
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            for name, value in tree_memory(process.pid).items():
                peaks[name] = max(peaks[name], value)
            time.sleep(0.1)
    seconds = time.monotonic() - start
    log = stderr_path.read_text(encoding="utf-8", errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the run failed ({os.waitstatus_to_exitcode(status)}):\n{log[-3000:]}")
    return {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss": peaks["VmRSS"],
        "peak_anon": peaks["RssAnon"],
        "peak_pss": peaks["Pss"],
        "peak_pss_anon": peaks["Pss_Anon"],
        "trl_passes": any(name in log for name in TRL_PASSES),
        "data_seconds": data_preparation_seconds(output_dir),
    }


ARMS = ("before", "before_plain", "plain", "data_config", "processes_2", "cache_miss", "cache_miss_2", "cache_hit")
CACHE_MISSES = ("cache_miss", "cache_miss_2")
# Our arms' flags: the processed-data cache off and one tokenising process unless the arm is about them.
ARM_FLAGS = {
    "plain": ("--data_cache_dir", "none", "--dataset_num_proc", "1"),
    "before_plain": ("--data_cache_dir", "none", "--dataset_num_proc", "1"),  # a checkout that has both flags
    "data_config": ("--data_cache_dir", "none", "--dataset_num_proc", "1"),
    "processes_2": ("--data_cache_dir", "none", "--dataset_num_proc", "2"),
    "cache_miss": ("--dataset_num_proc", "1"),  # + --data_cache_dir WORKDIR/cache, emptied first
    "cache_miss_2": ("--dataset_num_proc", "2"),  # the same, on two processes
    "cache_hit": ("--dataset_num_proc", "1"),  # + the same cache, as cache_miss left it
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--max_steps", type=int, default=5)
    parser.add_argument("--workdir", default="/tmp/prepared-data")
    parser.add_argument("--arms", default="plain", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--before", type=Path, help="the checkout the 'before' arm runs")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if unknown := sorted(set(arms) - set(ARMS)):
        parser.error(f"unknown arms {unknown}: choose from {', '.join(ARMS)}")
    before = args.before and (args.before / "tuning" / "sft_trainer.py").is_file()
    if {"before", "before_plain"} & set(arms) and not before:
        parser.error("the 'before' arm needs --before, a checkout with tuning/sft_trainer.py")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = workdir / "tiny-model"
    if not model.exists():
        subprocess.run([sys.executable, "-m", "tuning.utils.tiny_model", str(model)], cwd=REPO_ROOT, check=True)
    data = workdir / f"data-{args.rows}.jsonl"
    if not data.exists():
        write_data(data, args.rows)
    data_config = workdir / f"data-{args.rows}.json"
    write_data_config(data_config, data)
    megabytes = data.stat().st_size / 1e6
    print(
        "| rows | file MB | round | arm | data preparation s | wall s | CPU s | peak RSS MB | peak anonymous MB "
        "| peak PSS MB, with workers | peak anonymous PSS MB, with workers | TRL passes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    cache = workdir / "cache"
    results: dict[str, list[dict]] = {}
    for round_index in range(args.rounds):
        for arm in arms[round_index % len(arms) :] + arms[: round_index % len(arms)]:
            checkout = args.before if arm.startswith("before") else REPO_ROOT
            config = data_config if arm == "data_config" else None
            extra = ARM_FLAGS.get(arm, ())
            if arm.startswith("cache_"):
                if arm in CACHE_MISSES:
                    shutil.rmtree(cache, ignore_errors=True)
                extra = (*extra, "--data_cache_dir", str(cache))
            entries = cache_entries(cache)
            if arm == "cache_hit" and len(entries) != 1:
                raise SystemExit(
                    f"cache_hit reads the entry a miss left: run cache_miss or cache_miss_2 before it ({arms})"
                )
            result = run(checkout, str(model), data, workdir / "out", args.max_steps, config, extra)
            after = cache_entries(cache)
            if arm.startswith("cache_") and (len(after) != 1 or arm == "cache_hit" and after != entries):
                raise SystemExit(f"{arm} left {after} in {cache}, not the one entry expected")
            results.setdefault(arm, []).append(result)
            prepared = "" if result["data_seconds"] is None else f"{result['data_seconds']:.2f}"
            print(
                f"| {args.rows} | {megabytes:.0f} | {round_index + 1} | {arm} | {prepared} | {result['seconds']:.1f} "
                f"| {result['cpu_seconds']:.1f} | {result['peak_rss'] / 1e6:.0f} | {result['peak_anon'] / 1e6:.0f} "
                f"| {result['peak_pss'] / 1e6:.0f} | {result['peak_pss_anon'] / 1e6:.0f} "
                f"| {'yes' if result['trl_passes'] else 'no'} |",
                flush=True,
            )
    if args.rounds > 1:
        print_summary(results, args.rows)


def _ratio(numerators: list[dict], denominators: list[dict]) -> str:
    """The median of the rounds' data preparation time ratios, and each round's."""
    ratios = [
        top["data_seconds"] / bottom["data_seconds"] for top, bottom in zip(numerators, denominators, strict=True)
    ]
    return f"{statistics.median(ratios):.3f} (rounds: {', '.join(f'{ratio:.3f}' for ratio in ratios)})"


def print_summary(results: dict[str, list[dict]], rows: int) -> None:
    """Per arm the median data preparation time and the largest peaks over the rounds; the cache's ratios."""
    print(
        f"\n| {rows} rows, {len(next(iter(results.values())))} rounds | median data preparation s | median CPU s "
        "| largest peak RSS MB | largest peak anonymous MB | largest peak PSS MB, with workers |"
    )
    print("|---|---|---|---|---|---|")
    for arm, runs in results.items():
        prepared = [run["data_seconds"] for run in runs if run["data_seconds"] is not None]
        median = f"{statistics.median(prepared):.2f}" if prepared else ""
        print(
            f"| {arm} | {median} | {statistics.median(run['cpu_seconds'] for run in runs):.1f} "
            f"| {max(run['peak_rss'] for run in runs) / 1e6:.0f} | {max(run['peak_anon'] for run in runs) / 1e6:.0f} "
            f"| {max(run['peak_pss'] for run in runs) / 1e6:.0f} |"
        )
    if "cache_hit" in results and "cache_miss" in results:
        print(f"\ncache_hit / cache_miss data preparation time: {_ratio(results['cache_hit'], results['cache_miss'])}")
    if "before_plain" in results and "cache_miss" in results:
        print(
            "before_plain / cache_miss (how much faster one process prepares than the --before checkout's one): "
            f"{_ratio(results['before_plain'], results['cache_miss'])}"
        )
    if "cache_miss" in results and "cache_miss_2" in results:
        print(
            "cache_miss / cache_miss_2 (how much faster two processes prepare): "
            f"{_ratio(results['cache_miss'], results['cache_miss_2'])}"
        )


if __name__ == "__main__":
    main()
