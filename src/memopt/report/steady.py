"""Is a cell's timing steady? The median step time with a distribution-free 95% interval, and the
signs that the mean of the timed steps is not a fair summary of them. Torch-free.

The timed steps of a cell near its memory limit need not be steady: in the first H100 study
flash's first eight timed steps at its maximum batch ran ~35% slower than the rest, and
flash_gradcp's step times fell into several modes. The median resists both; a cell is flagged
when its first tenth of steps runs at another speed than the rest (still warming up) or when
its steps spread widely (several modes, or a slow path such as allocator retries).
"""

from __future__ import annotations

import math
import statistics

# Flag thresholds: the mean of the first tenth of the timed steps (at least 3) off the rest's
# median by more than this share; the 10th-90th percentile spread wider than this share of the
# median. On the H100 studies steady cells stayed within 1% and 2%; the cells named above were
# 10-27% and 7-28%.
WARMING = 0.05
SPREAD = 0.05


def median_interval(times: list[float]) -> tuple[float | None, float | None]:
    """A 95% confidence interval of the median from order statistics (no normality assumed):
    the j-th and k-th smallest of n with j, k = n/2 -+ 1.96 sqrt(n)/2 (rounded outwards). None
    for fewer than 6 steps, where no such interval reaches 95%."""
    n = len(times)
    if n < 6:
        return None, None
    s = sorted(times)
    half = 1.96 * math.sqrt(n) / 2
    j = max(1, math.floor(n / 2 - half))
    k = min(n, math.ceil(1 + n / 2 + half))
    return s[j - 1], s[k - 1]


def instability(times: list[float]) -> str | None:
    """Why the mean of these step times misleads, or None when they look steady."""
    if len(times) < 8:
        return None
    median = statistics.median(times)
    q = max(3, len(times) // 10)
    head, rest = statistics.fmean(times[:q]), statistics.median(times[q:])
    reasons = []
    if abs(head - rest) > WARMING * rest:
        reasons.append(f"first {q} timed steps {100 * (head / rest - 1):+.0f}% off the rest")
    s = sorted(times)
    p10, p90 = s[round(0.1 * (len(s) - 1))], s[round(0.9 * (len(s) - 1))]
    if p90 - p10 > SPREAD * median:
        reasons.append(
            f"10th-90th percentile spread {100 * (p90 - p10) / median:.0f}% of the median"
        )
    return "; ".join(reasons) or None
