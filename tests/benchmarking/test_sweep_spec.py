"""tuning.benchmarking.sweep.spec in process: each repeat of a point its own seed (MLPerf's runs differ by seed)."""

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
