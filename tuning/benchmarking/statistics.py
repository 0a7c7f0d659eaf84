"""Two-sample comparison of a benchmark metric, candidate against baseline: the statistics behind bench_compare.

A sample is one value per whole run (or, asked for explicitly, per post-warmup step of a single run). Per point:
the Hodges–Lehmann estimate of the candidate/baseline ratio (the median of all pairwise ratios, taken on log values),
a percentile bootstrap interval for it over the samples, and the two-sided Mann–Whitney U p-value (exact without
ties, else the normal approximation with tie and continuity corrections); Holm's step-down correction across the
points of one comparison. ``verdict`` turns these into faster / slower / same / inconclusive against a relative noise
band. The distributions, the test and the bootstrap are scipy.stats' (imported when first needed); what is ours is
how they are put together. docs/benchmarking.md ("Comparing two sweeps") states the rules.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # a fixed seed: the same dumps give the same interval every time
MAX_PAIRS = 2500  # pairwise differences per bootstrap resample; beyond (over 50 x 50 samples), a random subset
EXACT_LIMIT = 50  # exact U distribution up to this many samples a side (no ties); normal approximation beyond
MAX_RUNS_NEEDED = 1000  # "more than this" when the noise is too large for any practical number of repeats
POWER = 0.8  # of the repeats-needed figure

FASTER, SLOWER, SAME, INCONCLUSIVE, IDENTICAL = "faster", "slower", "same", "inconclusive", "identical"
OLYMPIC_MIN_RUNS = 5  # MLPerf's olympic scoring drops a side's fastest and slowest run: from 5 runs, 3 are left


def olympic(values: Sequence[float]) -> list[float]:
    """``values`` without their lowest and highest one (MLPerf's olympic scoring); ``ValueError`` below
    ``OLYMPIC_MIN_RUNS`` values."""
    if len(values) < OLYMPIC_MIN_RUNS:
        raise ValueError(f"olympic scoring needs {OLYMPIC_MIN_RUNS} runs a side, got {len(values)}")
    return sorted(values)[1:-1]


MLPERF_MIN_RUNS = 10  # MLPerf Training's runs for LLM fine-tuning


@dataclass(frozen=True)
class MlperfScore:
    """A point's side scored as MLPerf scores a benchmark result: ``score`` (None unless ``verdict`` is empty), the
    times it is the mean of, and why it is not scored (``invalid``, ``too few runs``) with a note."""

    score: float | None
    kept: list[float]
    not_converged: int
    verdict: str = ""
    note: str = ""


def mlperf_score(times: Sequence[float | None], min_runs: int = MLPERF_MIN_RUNS) -> MlperfScore:
    """``times`` to train, None for a run that did not converge: the fastest and the slowest dropped and the mean
    of the rest; one non-converged run counts as the slowest (the one dropped), two or more make the result
    ``invalid``; fewer than ``min_runs`` runs are ``too few runs``, never scored (mlcommons/training_policies,
    "Benchmark Results")."""
    converged = sorted(time for time in times if time is not None)
    short = len(times) - len(converged)
    if len(times) < min_runs:
        return MlperfScore(None, [], short, "too few runs", f"{len(times)} runs, MLPerf scores {min_runs} or more")
    if short > 1:
        return MlperfScore(None, [], short, "invalid", f"{short} of {len(times)} runs did not converge: at most 1 may")
    kept = converged[1:] if short else converged[1:-1]
    return MlperfScore(sum(kept) / len(kept), kept, short)


@dataclass(frozen=True)
class Result:
    """One point's comparison. ``ratio`` and the interval are candidate/baseline; ``better``/``worse`` stand for
    faster/slower when the caller names them so (memory: better/worse)."""

    ratio: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_adjusted: float | None
    verdict: str
    min_runs: int  # samples a side at which the test can reach significance after the correction
    runs_needed: int | None  # samples a side that would likely decide an inconclusive point
    note: str


def hodges_lehmann_ratio(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """exp(median over all pairs of log(candidate_j) - log(baseline_i)): the shift estimate that goes with the
    Mann–Whitney test, on log values so that it is a ratio. Values must be positive."""
    differences = np.subtract.outer(np.log(candidate), np.log(baseline))
    return float(np.exp(np.median(differences)))


def bootstrap_interval(
    baseline: Sequence[float],
    candidate: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``hodges_lehmann_ratio`` (scipy.stats.bootstrap): each side resampled with
    replacement on its own, ``resamples`` times (a resample's estimate from ``MAX_PAIRS`` of its pairs when it has
    more, as many steps do)."""
    from scipy import stats

    log_b, log_c = np.log(np.asarray(baseline, float)), np.log(np.asarray(candidate, float))
    pairs = min(len(log_b) * len(log_c), MAX_PAIRS)
    generator = np.random.default_rng(seed)  # the resamples', and the pairs picked from each: one stream

    def log_ratio(b: np.ndarray, c: np.ndarray, axis: int = -1) -> Any:
        """The log Hodges–Lehmann estimate of each resample (the last axis holds a resample's values; the samples
        themselves, one axis, get the estimate from all their pairs)."""
        if pairs == b.shape[-1] * c.shape[-1] or b.ndim == 1:
            differences = c[..., :, None] - b[..., None, :]
            return np.median(differences.reshape(*differences.shape[:-2], -1), axis=-1)
        # many steps: the median of MAX_PAIRS pairs drawn from each resample stands for that of all its pairs
        c_picks = np.take_along_axis(c, generator.integers(0, c.shape[-1], (*c.shape[:-1], pairs)), axis=-1)
        b_picks = np.take_along_axis(b, generator.integers(0, b.shape[-1], (*b.shape[:-1], pairs)), axis=-1)
        return np.median(c_picks - b_picks, axis=-1)

    interval = stats.bootstrap(
        (log_b, log_c),
        log_ratio,
        n_resamples=resamples,
        batch=max(1, 2_000_000 // pairs),  # pairwise differences held at once
        vectorized=True,
        confidence_level=confidence,
        method="percentile",
        random_state=generator,
    ).confidence_interval
    return float(np.exp(interval.low)), float(np.exp(interval.high))


def mann_whitney_u(baseline: Sequence[float], candidate: Sequence[float]) -> tuple[float, float]:
    """(U of the candidate, two-sided p-value), scipy.stats.mannwhitneyu's: exact when there are no ties and at most
    ``EXACT_LIMIT`` values a side; otherwise the normal approximation with the tie correction of the variance and a
    continuity correction of 0.5. Every value the same: p is 1."""
    from scipy import stats

    pooled = [*baseline, *candidate]
    if len(set(pooled)) == 1:
        return len(baseline) * len(candidate) / 2, 1.0
    exact = len(set(pooled)) == len(pooled) and max(len(baseline), len(candidate)) <= EXACT_LIMIT
    result = stats.mannwhitneyu(candidate, baseline, alternative="two-sided", method="exact" if exact else "asymptotic")
    return float(result.statistic), min(1.0, float(result.pvalue))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None, and is not counted as a test): the k-th smallest of m
    times (m - k + 1), made monotone, capped at 1."""
    tested = sorted((p, index) for index, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[index] = running
    return adjusted


def min_runs_a_side(tests: int, alpha: float = ALPHA) -> int:
    """The fewest samples a side (equal sides, no ties) with which an exact two-sided Mann–Whitney test can reach
    ``alpha`` after Holm's correction over ``tests`` points: the smallest p it can give, 2 / C(2n, n), must be at
    most alpha / tests. 4 for one point, 5 for 2 to 6 points, 6 for 7 to 23."""
    n = 1
    while not can_decide(n, n, tests, alpha):
        n += 1
    return n


def can_decide(n_baseline: int, n_candidate: int, tests: int, alpha: float = ALPHA) -> bool:
    """Whether the smallest p-value of an exact two-sided Mann–Whitney test with these sizes, 2 / C(n_b + n_c, n_b),
    can pass Holm's first step over ``tests`` points (alpha / tests)."""
    return 2 / math.comb(n_baseline + n_candidate, n_baseline) <= alpha / max(tests, 1)


def runs_needed(
    baseline: Sequence[float], candidate: Sequence[float], threshold: float, tests: int, alpha: float = ALPHA
) -> int:
    """Samples a side that would likely (80 % power, normal approximation on log values, the pooled spread of the
    samples at hand) put the interval clear of the band's nearer edge: n = 2 ((z_{1-α/2m} + z_0.8) s / d)², where
    d is the distance of the log estimate from the band's edge; at least ``min_runs_a_side``."""
    floor = min_runs_a_side(tests, alpha)
    log_b, log_c = np.log(baseline), np.log(candidate)
    if len(log_b) < 2 or len(log_c) < 2:
        return floor
    spread = math.sqrt(
        ((len(log_b) - 1) * np.var(log_b, ddof=1) + (len(log_c) - 1) * np.var(log_c, ddof=1))
        / (len(log_b) + len(log_c) - 2)
    )
    distance = abs(abs(math.log(hodges_lehmann_ratio(baseline, candidate))) - math.log(1 + threshold))
    if spread == 0:
        return floor
    if distance == 0:
        return MAX_RUNS_NEEDED + 1
    from scipy import stats

    z = stats.norm.ppf(1 - alpha / (2 * max(tests, 1))) + stats.norm.ppf(POWER)
    return max(floor, min(MAX_RUNS_NEEDED + 1, math.ceil(2 * (z * spread / distance) ** 2)))


def verdict(
    ratio: float,
    low: float,
    high: float,
    p_adjusted: float,
    threshold: float,
    higher_is_better: bool,
    alpha: float = ALPHA,
) -> str:
    """faster / slower: significant (Holm-adjusted p below ``alpha``) and the estimate beyond the band
    [1/(1+threshold), 1+threshold] on that side; same: the whole interval inside the band (equivalence shown);
    else inconclusive. Faster means better: a higher ratio when ``higher_is_better``, a lower one otherwise."""
    band_low, band_high = 1 / (1 + threshold), 1 + threshold
    if p_adjusted < alpha and not band_low <= ratio <= band_high:
        return FASTER if (ratio > band_high) == higher_is_better else SLOWER
    if band_low <= low and high <= band_high:
        return SAME
    return INCONCLUSIVE


def compare_points(
    points: Sequence[tuple[Sequence[float], Sequence[float]]],
    threshold: float,
    higher_is_better: bool,
    alpha: float = ALPHA,
) -> list[Result]:
    """One ``Result`` per (baseline values, candidate values) pair, every value positive and finite (the caller
    names those that are not), the p-values Holm-corrected across all pairs. With too few samples for the test to
    reach significance (``can_decide``), one sample on a side included (not counted as a test), the verdict is
    inconclusive; when neither side has any spread there is no
    interval: identical values are ``identical``, others inconclusive."""
    testable = [min(len(base), len(cand)) > 1 for base, cand in points]
    tests = sum(testable)
    floor = min_runs_a_side(tests, alpha)
    tested = [mann_whitney_u(*point)[1] if ok else None for point, ok in zip(points, testable, strict=True)]
    adjusted = holm(tested)
    results = []
    for (base, cand), p, p_holm in zip(points, tested, adjusted, strict=True):
        ratio = hodges_lehmann_ratio(base, cand)
        sizes = f"n={len(base)}/{len(cand)}"
        if p is None or p_holm is None:
            note = f"one sample on a side ({sizes}): no spread to measure, no interval"
            results.append(Result(ratio, None, None, None, None, INCONCLUSIVE, floor, floor, note))
            continue
        if len(set(base)) == 1 and len(set(cand)) == 1:
            identical = base[0] == cand[0]
            note = (
                f"identical values ({sizes}): no spread was measured"
                if identical
                else (f"no spread within either side ({sizes}): an interval would have zero width")
            )
            results.append(
                Result(ratio, None, None, p, p_holm, IDENTICAL if identical else INCONCLUSIVE, floor, None, note)
            )
            continue
        low, high = bootstrap_interval(base, cand)
        if not can_decide(len(base), len(cand), tests, alpha):
            decided, note = INCONCLUSIVE, f"too few samples ({sizes}): the test needs {floor} a side to decide"
        else:
            decided = verdict(ratio, low, high, p_holm, threshold, higher_is_better, alpha)
            note = ""
        needed = runs_needed(base, cand, threshold, tests, alpha) if decided == INCONCLUSIVE else None
        if needed is not None and not note:
            note = "too much noise for the band"
        results.append(Result(ratio, low, high, p, p_holm, decided, floor, needed, note))
    return results
