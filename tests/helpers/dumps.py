"""Valid benchmark dumps with known numbers, built through the real journal → dump code path, for tests of readers
(bench_report, bench_compare) that need exact answers rather than real runs."""

import json
import tempfile
from pathlib import Path
from typing import Any

from tuning.benchmarking.dump import STEP_PART_SERIES, STEP_SAMPLES, STEP_TIME, STEP_TOKENS, TOKENS_PER_SECOND
from tuning.benchmarking.journal import Journal
from tuning.benchmarking.record import RunRecord

ENVIRONMENT = {
    **dict.fromkeys(("python", "torch", "transformers", "trl", "peft", "aim", "cuda", "cuda_driver")),
    "gpus": [],
}


def write_dump(
    path: Path,
    step_seconds: list[float],
    metadata: dict[str, Any],
    warmup: int = 1,
    tokens: int = 100,
    samples: int = 4,
    losses: list[float] | None = None,
    parts: dict[str, float] | None = None,
    **notes: Any,
) -> dict[str, Any]:
    """Write at ``path`` the dump of a 1-rank run whose steps took ``step_seconds`` with ``tokens`` and ``samples``
    each (and the throughput series the callback records), a training loss per step (``losses``; default 2/step,
    the same in every run; [] for none), ``warmup`` steps of warmup, ``metadata`` and callback ``notes``; return it.
    ``parts``: each step's anatomy as shares of its time (``{"data": 0.5, ...}``). Its journal is thrown away."""
    losses = [2.0 / step for step in range(1, len(step_seconds) + 1)] if losses is None else losses
    with tempfile.TemporaryDirectory() as scratch:
        header = {"experiment": None, "host": "h", "rank": 0, "world_size": 1, "environment": ENVIRONMENT}
        record = RunRecord(Journal(str(Path(scratch) / "run.journal.jsonl"), sync_interval=0.0), header)
        record.note(metadata=metadata, train_start=1000.0, **notes)
        for step, seconds in enumerate(step_seconds, start=1):
            record.record_many([(STEP_TIME, seconds, step, None), (STEP_TOKENS, tokens, step, None)])
            record.record_many([(STEP_SAMPLES, samples, step, None), (TOKENS_PER_SECOND, tokens / seconds, step, None)])
            if parts:
                record.record_many(
                    [(STEP_PART_SERIES[part], share * seconds, step, None) for part, share in parts.items()]
                )
            if step <= len(losses):
                record.record("loss", losses[step - 1], step=step)
            if step == warmup:
                record.note(warmup_steps=warmup, warmup_seconds=sum(step_seconds[:warmup]))
        dump = record.finish("ok", training_steps=len(step_seconds))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dump))
    return dump


def mlperf_runs(directory: Path, template: dict[str, Any], point: str, times: list[float | str | None]) -> None:
    """A --target_eval_loss run per entry of ``times`` (seconds to train; None: it never converged), ``template``'s
    dump otherwise, as ``directory/POINT-INDEX.json`` with metadata ``point`` and ``repeat``; ``"resumed"``:
    converged, but resumed from a checkpoint, so without a time."""
    directory.mkdir(parents=True, exist_ok=True)
    for index, seconds in enumerate(times):
        dump = json.loads(json.dumps(template))
        dump["metadata"] = {"point": point, "repeat": index}
        converged = seconds is not None
        dump["status"] = "converged" if converged else "not_converged"
        resumed = seconds == "resumed"
        note = "resumed from a checkpoint: its segments are not one MLPerf run" if resumed else None
        summary = {"target_eval_loss": 0.925, "converged": converged, "time_to_train_note": note}
        dump["summary"].update(summary, time_to_train=None if resumed else seconds)
        (directory / f"{point}-{index}.json").write_text(json.dumps(dump))
