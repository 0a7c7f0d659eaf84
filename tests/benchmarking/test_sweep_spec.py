"""tuning.benchmarking.sweep.spec in process: each repeat of a point its own seed (MLPerf's runs differ by seed)."""

from tests.helpers.bench import sweep_point_flags
from tests.helpers.training import BENCH_TRAIN
from tuning.benchmarking.sweep import grid
from tuning.benchmarking.sweep.spec import spec_problems


def seeds(spec: dict) -> list[tuple[str, object]]:
    return [(point.label, point.flags.get("seed")) for point in grid({"metadata": {}, "repeats": 1, **spec})]


def test_each_repeat_trains_with_its_own_seed_unless_seed_is_an_axis():
    rates = {"learning_rate": [0.1, 0.2]}
    assert seeds({"base": {}, "axes": rates, "repeats": 2}) == [
        ("learning_rate=0.1", 42),  # transformers' default seed, as a single run
        ("learning_rate=0.1", 43),
        ("learning_rate=0.2", 42),
        ("learning_rate=0.2", 43),
    ]
    assert [seed for _, seed in seeds({"base": {"seed": 7}, "axes": rates, "repeats": 3})] == [7, 8, 9] * 2
    assert [seed for _, seed in seeds({"base": {}, "axes": rates})] == [None, None]  # one run: the flags as given
    assert [seed for _, seed in seeds({"base": {}, "axes": {"seed": [1, 5]}, "repeats": 2})] == [1, 1, 5, 5]
    problem = next(spec_problems({"base": {"seed": "x"}, "axes": rates, "repeats": 2}))
    assert problem == "base seed must be a non-negative integer (each repeat adds its index), got 'x'"


def test_repeats_of_a_point_share_one_memory_estimate(tiny_model, monkeypatch):
    """Three repeats (seeds 42-44) of two batch sizes: two estimates, each repeat ending predicted_oom with its
    configuration's figures, against a budget nothing fits."""
    from tuning.benchmarking import memory
    from tuning.benchmarking.sweep import predicted_ooms

    estimated = []

    def counted(args, devices):
        estimated.append((args.training_args.per_device_train_batch_size, args.training_args.seed))
        return estimate_memory(args, devices=devices)

    estimate_memory = memory.estimate_memory
    monkeypatch.setattr(memory, "estimate_memory", counted)
    base = sweep_point_flags(tiny_model, max_seq_length=64)
    points = grid({"base": base, "axes": {"per_device_train_batch_size": [1, 4]}, "metadata": {}, "repeats": 3})
    outcomes = predicted_ooms(points, 1e-6, BENCH_TRAIN)
    assert estimated == [(1, 42), (4, 42)]
    assert set(outcomes) == {point.id for point in points}
    peaks = [outcomes[point.id]["estimate"]["peak_bytes_per_device"] for point in points]
    assert peaks[:3] == [peaks[0]] * 3 and peaks[3:] == [peaks[3]] * 3 and peaks[3] > peaks[0]
