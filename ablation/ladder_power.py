"""What a ladder (ablation/ladder.py) can see, and how far its line may be carried.

- The slope it could have detected: the smallest slope per e-fold of N that the ladder's own trend
  test (ladder.fit_trend: weighted least squares on ln N, weights 1/se^2, Knapp-Hartung widening,
  Student t with min(seeds) - 1 degrees of freedom, at the ladder's Bonferroni level) rejects in 80%
  of ladders. The test's weights come from the same few seeds as the effects, so no closed form holds;
  it is simulated (vectorized, a fixed random seed, common random numbers across slopes so the
  bisection is monotone): per size the paired differences are normal with that size's sd, the slope
  is true, and each simulated ladder is fitted exactly as the report fits it. tests/test_transfer.py
  checks that this test keeps its level on a flat truth and has the power claimed here.
- The extrapolation bound: a line fitted over ln N in [a, b] is given an interval no further than
  one ladder width past the largest size (ln N <= b + (b - a)); beyond that the report states the
  line's value as an unsupported line, without an interval.

Numbers only; render.py words them.
"""
import math

import numpy as np

POWER = 0.8
DRAWS = 4000


def slope_rejects(x, means, ses, n, level):
    """ladder.fit_trend's slope test on many ladders at once. x: (m,) ln N; means, ses: (draws, m);
    n: seeds per size. Returns (slope, rejected) arrays of length draws."""
    from scipy import special
    w = 1.0 / ses ** 2
    sw = w.sum(axis=1)
    xbar = (w * x).sum(axis=1) / sw
    ybar = (w * means).sum(axis=1) / sw
    sxx = (w * (x - xbar[:, None]) ** 2).sum(axis=1)
    slope = (w * (x - xbar[:, None]) * (means - ybar[:, None])).sum(axis=1) / sxx
    resid = means - (ybar[:, None] + slope[:, None] * (x - xbar[:, None]))
    m = len(x)
    scale = np.maximum(1.0, (w * resid ** 2).sum(axis=1) / (m - 2)) if m > 2 else np.ones(len(slope))
    se = np.sqrt(scale / sxx)
    df = n - 1
    p = 2 * special.stdtr(df, -np.abs(slope) / se)
    return slope, p < level


def simulate(x, sds, n, level, slope, draws=DRAWS, seed=0):
    """The fraction of simulated ladders whose slope test rejects, at a true slope (per e-fold of N,
    centred on the ladder: the effect is slope * (ln N - mean ln N)). sds: the paired-difference sd at
    each size; n seeds at each."""
    x = np.asarray(x, dtype=np.float64)
    sds = np.asarray(sds, dtype=np.float64)
    z = np.random.default_rng(seed).standard_normal((draws, len(x), n))
    d = slope * (x - x.mean())[None, :, None] + sds[None, :, None] * z
    means = d.mean(axis=2)
    ses = d.std(axis=2, ddof=1) / math.sqrt(n)
    return float(slope_rejects(x, means, ses, n, level)[1].mean())


def detectable_slope(x, sds, n, level, power=POWER, draws=DRAWS, seed=0):
    """The smallest slope per e-fold of N rejected in `power` of simulated ladders (bisection with
    common random numbers); None when even 100x the largest sd per e-fold is not."""
    hi = 100 * max(sds) / max(1e-12, np.ptp(x))
    if simulate(x, sds, n, level, hi, draws, seed) < power:
        return None
    lo = 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if simulate(x, sds, n, level, mid, draws, seed) < power else (lo, mid)
    return hi


def ladder_detectable(effects, level):
    """The slope the ladder could have detected, from its measured per-size standard errors (sd =
    se x sqrt(seeds)); None when a size has no se."""
    if any(not e.get("se") or e.get("n", 0) < 2 for e in effects):
        return None
    n = min(e["n"] for e in effects)
    x = np.log([e["params"] for e in effects])
    return detectable_slope(x, [e["se"] * math.sqrt(e["n"]) for e in effects], n, level)


def extrapolation_limit(params):
    """The largest N an interval may be given at: one ladder width (in ln N) past the largest size."""
    lo, hi = math.log(min(params)), math.log(max(params))
    return math.exp(hi + (hi - lo))


def bound_extrapolation(fitted_point, params):
    """ladder.fitted's point at a target N, kept with its interval inside the bound, else stated as an
    unsupported line (the value on the line, no interval)."""
    limit = extrapolation_limit(params)
    if fitted_point["params"] <= limit:
        return dict(fitted_point, supported=True, limit=limit)
    return dict(params=fitted_point["params"], effect=fitted_point["effect"], interval=None, supported=False,
                limit=limit, widths=(math.log(fitted_point["params"]) - math.log(max(params)))
                / (math.log(max(params)) - math.log(min(params))))
