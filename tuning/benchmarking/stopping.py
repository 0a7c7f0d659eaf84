"""When a benchmark may end before ``max_steps``: a time budget from the start of training, or, after the warmup,
step times that have settled (auto-stop: docs/benchmarking.md). A run whose step times never settle trains to its
natural end."""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tuning.utils.error_logging import UserInputError

STOP_REASONS = ("stop_after_seconds", "auto_stop")  # a dump's stop_reason: what StopRule.reason returns


@dataclass(frozen=True)
class StopRule:
    stop_after_seconds: float | None = None
    auto_stop: bool = False
    min_steps: int = 10
    min_seconds: float = 60.0
    tolerance: float = 0.1

    def __post_init__(self):
        if self.stop_after_seconds is not None and self.stop_after_seconds <= 0:
            raise UserInputError(f"--stop_after_seconds must be positive, got {self.stop_after_seconds}")
        if self.min_steps < 2:
            raise UserInputError(f"--auto_stop_min_steps must be at least 2, got {self.min_steps}")
        if self.min_seconds < 0 or self.tolerance < 0:
            raise UserInputError("--auto_stop_min_seconds and --auto_stop_tolerance must not be negative")

    @property
    def active(self) -> bool:
        return self.stop_after_seconds is not None or self.auto_stop

    def reason(
        self, elapsed: float, measured_steps: int, measured_seconds: float, recent: Sequence[float]
    ) -> str | None:
        """Why training should stop now (one of ``STOP_REASONS``), or None. ``measured_*`` count the steps after
        the warmup; ``recent`` holds the last ``min_steps`` step times."""
        if self.stop_after_seconds is not None and elapsed >= self.stop_after_seconds:
            return STOP_REASONS[0]
        if self.auto_stop and measured_steps >= self.min_steps and measured_seconds >= self.min_seconds:
            mean = statistics.fmean(recent)
            if mean > 0 and statistics.pstdev(recent) / mean <= self.tolerance:
                return STOP_REASONS[1]
        return None
