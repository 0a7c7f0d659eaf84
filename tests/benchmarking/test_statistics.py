"""tuning.benchmarking.statistics against scipy on fixed samples: the Mann–Whitney U p-values (exact without ties,
asymptotic with them), the bootstrap interval of the Hodges–Lehmann ratio, and the rules built on them (Holm, the
fewest runs a side that can decide, the verdicts)."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from tuning.benchmarking import statistics

# Throughputs of five and six runs (tokens/s), no ties; and two samples with ties.
BASELINE = [201.3, 198.7, 204.9, 199.8, 196.2]
CANDIDATE = [190.4, 193.8, 188.1, 195.0, 191.7, 186.9]
TIED_BASELINE = [1.0, 2.0, 2.0, 3.0, 4.0, 5.0]
TIED_CANDIDATE = [2.0, 3.0, 3.0, 5.0, 6.0, 7.0, 7.0]


@pytest.mark.parametrize(
    ("baseline", "candidate", "method"),
    [
        (BASELINE, CANDIDATE, "exact"),
        (BASELINE[:3], CANDIDATE[:3], "exact"),
        (CANDIDATE, BASELINE[:4], "exact"),
        (list(range(1, 31)), [value + 4.5 for value in range(1, 31)], "exact"),
        (TIED_BASELINE, TIED_CANDIDATE, "asymptotic"),
    ],
)
def test_mann_whitney_u_matches_scipy(baseline, candidate, method):
    u, p = statistics.mann_whitney_u(baseline, candidate)
    expected = scipy_stats.mannwhitneyu(candidate, baseline, alternative="two-sided", method=method)
    assert u == expected.statistic
    assert p == pytest.approx(expected.pvalue, rel=1e-9)


def test_the_smallest_exact_p_values_the_issue_quotes():
    """Complete separation, n a side: 2 / C(2n, n): 0.10 with 3, 0.029 with 4, 0.008 with 5."""
    for n, smallest in ((3, 0.1), (4, 2 / 70), (5, 2 / 252)):
        assert statistics.mann_whitney_u(list(range(n)), list(range(10, 10 + n)))[1] == pytest.approx(smallest)
    assert [statistics.min_runs_a_side(points) for points in (1, 2, 6, 7, 8, 23, 24)] == [4, 5, 5, 6, 6, 6, 7]


def test_hodges_lehmann_and_its_bootstrap_interval_match_scipy():
    def hodges_lehmann(baseline, candidate, axis=-1):
        differences = np.log(candidate)[..., :, None] - np.log(baseline)[..., None, :]
        return np.exp(np.median(differences.reshape(*differences.shape[:-2], -1), axis=-1))

    ratio = statistics.hodges_lehmann_ratio(BASELINE, CANDIDATE)
    pairwise = sorted(math.log(c / b) for b in BASELINE for c in CANDIDATE)
    assert ratio == pytest.approx(math.exp((pairwise[14] + pairwise[15]) / 2))  # the median of 30
    low, high = statistics.bootstrap_interval(BASELINE, CANDIDATE)
    expected = scipy_stats.bootstrap(
        (BASELINE, CANDIDATE), hodges_lehmann, method="percentile", n_resamples=10_000, random_state=0, vectorized=True
    ).confidence_interval
    # Different random streams: the two Monte Carlo intervals agree to their resampling error.
    assert low == pytest.approx(expected.low, rel=3e-3) and high == pytest.approx(expected.high, rel=3e-3)
    assert low < ratio < high
    assert statistics.bootstrap_interval(BASELINE, CANDIDATE) == (low, high)  # fixed seed: reproducible


def test_holm_steps_down_and_stays_monotone():
    assert statistics.holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx([0.03, 0.06, 0.06, None, 0.02])
    assert statistics.holm([0.5, 0.9]) == [1.0, 1.0]


def test_verdicts_need_significance_and_the_band():
    """5 % slower with 5 and 6 runs of little noise: slower; the same data within a 10 % band: same (the interval
    is inside it); a 3-run side: inconclusive, with the runs that can decide; one point of eight at 5 a side is
    inconclusive after Holm, at 6 it is decided."""
    (result,) = statistics.compare_points([(BASELINE, CANDIDATE)], 0.02, higher_is_better=True)
    assert result.verdict == statistics.SLOWER and result.p_adjusted < 0.05 and result.ci_high < 1 / 1.02
    (result,) = statistics.compare_points([(BASELINE, CANDIDATE)], 0.10, higher_is_better=True)
    assert result.verdict == statistics.SAME
    (result,) = statistics.compare_points([(BASELINE, CANDIDATE)], 0.02, higher_is_better=False)
    assert result.verdict == statistics.FASTER  # lower is better: a step time 5 % shorter
    (result,) = statistics.compare_points([(BASELINE[:3], CANDIDATE[:3])], 0.02, higher_is_better=True)
    assert result.verdict == statistics.INCONCLUSIVE and result.min_runs == 4 and result.runs_needed >= 4
    assert "needs 4 a side" in result.note
    separated = [(BASELINE[:5], [value * 0.8 for value in BASELINE[:5]])] * 8
    assert {r.verdict for r in statistics.compare_points(separated, 0.02, True)} == {statistics.INCONCLUSIVE}
    six = [(BASELINE + [200.0], [value * 0.8 for value in BASELINE + [200.0]])] * 8
    assert {r.verdict for r in statistics.compare_points(six, 0.02, True)} == {statistics.SLOWER}


def test_identical_values_and_one_sample_a_side_give_no_interval():
    (identical, constant, single) = statistics.compare_points(
        [([5.0] * 4, [5.0] * 4), ([5.0] * 4, [4.0] * 4), ([5.0], [4.0])], 0.02, True
    )
    assert identical.verdict == statistics.IDENTICAL and "n=4/4" in identical.note and identical.ci_low is None
    assert constant.verdict == statistics.INCONCLUSIVE and constant.ci_low is None and "zero width" in constant.note
    assert single.verdict == statistics.INCONCLUSIVE and single.p_value is None and single.ci_low is None


def test_with_many_steps_a_subset_of_pairs_gives_the_same_interval():
    """80 steps a side: 6400 pairs, more than MAX_PAIRS: the interval from random pairs agrees with scipy's bootstrap
    of the full estimate."""

    def hodges_lehmann(baseline, candidate, axis=-1):
        differences = np.log(candidate)[..., :, None] - np.log(baseline)[..., None, :]
        return np.exp(np.median(differences.reshape(*differences.shape[:-2], -1), axis=-1))

    generator = np.random.default_rng(7)
    baseline, candidate = generator.normal(100, 5, 80), generator.normal(101, 5, 80)
    assert len(baseline) * len(candidate) > statistics.MAX_PAIRS
    low, high = statistics.bootstrap_interval(baseline, candidate, resamples=2000)  # as many as the reference's
    expected = scipy_stats.bootstrap(
        (baseline, candidate), hodges_lehmann, method="percentile", n_resamples=2000, random_state=0, batch=50
    ).confidence_interval
    assert low == pytest.approx(expected.low, rel=3e-3) and high == pytest.approx(expected.high, rel=3e-3)
