"""What large data costs a short CLI run on the tiny model: wall and CPU time, peak RSS and anonymous memory, TRL's
passes.

Generates ``--rows`` JSON lines of about 350 bytes (the shape of a 300 MB, 754k-row file: about 400), then runs
``tuning/sft_trainer.py`` for ``--max_steps`` steps on them and prints one Markdown table row. RSS and anonymous
memory (``RssAnon`` of ``/proc/PID/status``, Linux) are sampled from outside every 0.1 s over the whole process.
CPU seconds (user + system, all threads) hold better than wall time on a machine that other work shares.

    python benchmarks/prepared_data.py --rows 50000 --workdir /tmp/prepared-data
    python benchmarks/prepared_data.py --rows 50000 --data_config   # the same data through a data config

``--data_config`` runs the same file through ``--data_config_path`` with v3.1.0's ``apply_custom_jinja_template``
handler (``datasets``' ``map`` over the Arrow copy the line-numbered reader writes), the general path, instead of the
plain flags' streaming formatter.
"""

import argparse
import json
import os
import random
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


def status_bytes(pid: int, *fields: str) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/PID/status`` in bytes; empty once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
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


def run(model: str, data: Path, output_dir: Path, max_steps: int, data_config: Path | None = None) -> dict:
    source = ("--data_config_path", str(data_config)) if data_config else ("--training_data_path", str(data))
    command = [
        sys.executable,
        str(REPO_ROOT / "tuning" / "sft_trainer.py"),
        *("--model_name_or_path", model, *source, "--output_dir", str(output_dir)),
        *("--dataset_text_field", "output", "--response_template", "\n### Response:", "--max_seq_length", "128"),
        *("--max_steps", str(max_steps), "--per_device_train_batch_size", "4", "--save_strategy", "no"),
        *("--torch_dtype", "float32", "--use_flash_attn", "False"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    stderr_path = output_dir / "stderr.txt"
    output_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(stderr_path, "w", encoding="utf-8") as stderr:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        peaks = {"VmRSS": 0, "RssAnon": 0}
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            for name, value in status_bytes(process.pid, *peaks).items():
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
        "trl_passes": any(name in log for name in TRL_PASSES),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--max_steps", type=int, default=5)
    parser.add_argument("--workdir", default="/tmp/prepared-data")
    parser.add_argument("--data_config", action="store_true", help="through --data_config_path and a handler")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = workdir / "tiny-model"
    if not model.exists():
        subprocess.run([sys.executable, "-m", "tuning.utils.tiny_model", str(model)], cwd=REPO_ROOT, check=True)
    data = workdir / f"data-{args.rows}.jsonl"
    if not data.exists():
        write_data(data, args.rows)
    data_config = None
    if args.data_config:
        data_config = workdir / f"data-{args.rows}.json"
        write_data_config(data_config, data)
    result = run(str(model), data, workdir / "out", args.max_steps, data_config)
    megabytes = data.stat().st_size / 1e6
    print("| rows | file MB | wall s | CPU s | peak RSS MB | peak anonymous MB | TRL passes |")
    print(
        f"| {args.rows} | {megabytes:.0f} | {result['seconds']:.1f} | {result['cpu_seconds']:.1f} "
        f"| {result['peak_rss'] / 1e6:.0f} "
        f"| {result['peak_anon'] / 1e6:.0f} | {'yes' if result['trl_passes'] else 'no'} |"
    )


if __name__ == "__main__":
    main()
