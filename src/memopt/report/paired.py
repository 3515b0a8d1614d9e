"""Paired quality verdicts: seed k of every function starts from the same initialization and sees
the same batches (memopt.runtime.step.prepare), so a function is compared with the reference seed
by seed. The differences d_k = loss(function, k) - loss(reference, k) give a mean, a 95% interval
(Student's t, n - 1 degrees of freedom) and a verdict against a declared equivalence margin m
(nats, `quality.margin`):

- *equivalent*: the interval lies inside (-m, +m) (two one-sided tests at 2.5% each);
- *worse*: the interval lies above 0 and is not inside (-m, +m);
- *better*: the interval lies below 0 and is not inside (-m, +m);
- *inconclusive*: otherwise (it holds 0 and reaches past a margin), or one seed only.

The minimum detectable difference is the true difference the seeds run would call worse (or
better) with 80% power at the observed spread: (t(0.975) + t(0.80)) * sd / sqrt(n).
Torch-free and scipy-free (the t quantiles come from the regularized incomplete beta function)."""

from __future__ import annotations

import functools
import math
import statistics

VERDICTS = ("equivalent", "worse", "better", "inconclusive")
LEVEL = 0.95
POWER = 0.80


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))  # fmt: skip
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p (bisection on t_cdf; p in (0, 1))."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def paired_verdict(diffs: list[float], margin: float, level: float = LEVEL) -> dict:
    """The verdict of paired differences (function minus reference, per seed) against `margin`:
    {n, mean, sd, lo, hi, verdict, mdd} (lo, hi: the interval at `level`, 95% unless a family of
    comparisons asks for more; mdd: the minimum detectable difference at 80% power; None where
    one difference gives no spread)."""
    if margin <= 0:
        raise ValueError(f"quality.margin must be > 0 nats, got {margin}")
    n = len(diffs)
    out = {"n": n, "mean": statistics.fmean(diffs) if diffs else None, "sd": None, "lo": None,
           "hi": None, "mdd": None, "margin": margin, "verdict": "inconclusive"}  # fmt: skip
    if n < 2:
        return out
    sd = statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    t = t_quantile(0.5 + level / 2, n - 1)
    lo, hi = out["mean"] - t * se, out["mean"] + t * se
    out.update(sd=sd, lo=lo, hi=hi, mdd=(t + t_quantile(POWER, n - 1)) * se)
    if -margin < lo and hi < margin:
        out["verdict"] = "equivalent"
    elif lo > 0:
        out["verdict"] = "worse"
    elif hi < 0:
        out["verdict"] = "better"
    return out


def paired_differences(runs: list[dict], function: str, reference: str) -> list[float]:
    """loss(function, seed) - loss(reference, seed) over the seeds both finished (status ok),
    in seed order: only paired seeds count."""

    def losses(f):
        return {
            r["seed"]: r["val_loss"] for r in runs if r["function"] == f and r["status"] == "ok"
        }

    mine, ref = losses(function), losses(reference)
    return [mine[s] - ref[s] for s in sorted(mine.keys() & ref.keys())]
