"""How big the run record grows and how long its dump takes: ``--points`` points recorded as bench_train records
them (ten series per step, ``RunRecord.record_many`` once per step) and journaled, then ``RunRecord.finish`` (the
dump built) and ``write_dump``. Targets: at most 16 bytes of memory per point, a 1 M-point dump built in at most 3 s.

    python benchmarks/record_size.py                 # 1,000,000 points
    python benchmarks/record_size.py --points 4000000
"""

import argparse
import os
import tempfile
import time
import tracemalloc

from tuning.benchmarking.dump import STEP_SAMPLES, STEP_TIME, STEP_TOKENS, TOKENS_PER_SECOND, write_dump
from tuning.benchmarking.journal import Journal
from tuning.benchmarking.record import RunRecord

SERIES = (  # bench_train's own per-step series, then the trainer's logs
    *(STEP_TIME, STEP_TOKENS, STEP_SAMPLES, TOKENS_PER_SECOND),
    *("loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "epoch"),
)
BYTES_PER_POINT_TARGET = 16
BUILD_TARGET_S = 3.0
HEADER = {"experiment": "record_size", "host": "h", "rank": 0, "world_size": 1, "environment": {}}


def measure(points: int, workdir: str) -> dict[str, float]:
    journal = os.path.join(workdir, "run.journal.jsonl")
    record = RunRecord(Journal(journal), HEADER)
    record.note(train_start=time.time(), warmup_steps=5)
    steps = -(-points // len(SERIES))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for step in range(1, steps + 1):
        count = min(len(SERIES), points - (step - 1) * len(SERIES))
        record.record_many([(name, step * 0.5, step, None) for name in SERIES[:count]])
    record.journal.close(timeout=3600)  # every point written: what stays is the record's, not the journal's queue
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    start = time.perf_counter()
    dump = record.finish("ok", training_steps=steps, peak_rss_bytes=1)
    built = time.perf_counter()
    path = os.path.join(workdir, "run.json")
    write_dump(path, dump)
    written = time.perf_counter()
    return {
        "points": points,
        "bytes_per_point": held / points,
        "build_s": built - start,
        "write_s": written - built,
        "dump_mb": os.path.getsize(path) / 1e6,
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000, help="points to record (%(default)s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="record-size-") as workdir:
        result = measure(args.points, workdir)
    ok_memory = "✓" if result["bytes_per_point"] <= BYTES_PER_POINT_TARGET else "✗"
    ok_build = "✓" if result["build_s"] <= BUILD_TARGET_S else "✗"
    print(
        f"{result['points']:,} points: {result['bytes_per_point']:.1f} bytes/point in memory {ok_memory} (≤ "
        f"{BYTES_PER_POINT_TARGET}), dump built in {result['build_s']:.2f} s {ok_build} (≤ {BUILD_TARGET_S:g}), "
        f"written in {result['write_s']:.2f} s, {result['dump_mb']:.0f} MB"
    )
    return result


if __name__ == "__main__":
    main()
