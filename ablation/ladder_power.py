"""What a ladder (ablation/ladder.py) can see, and how far its line may be carried.

- The trend test, on many ladders at once (slope_rejects): per seed the least-squares slope of that
  seed's paired differences on ln N, then a one-sample t over the seeds' slopes (df = seeds - 1),
  exactly as ladder.fit_trend tests a report's ladder (tests/test_transfer.py checks they agree).
- The slope it could have detected: the smallest slope per e-fold of N that this test rejects in 80%
  of simulated ladders at the ladder's level (Bonferroni over the variants). Simulated with a fixed
  random seed and common random numbers across slopes, so the bisection is monotone: the paired
  differences are normal with one sd at every size (the plan's declared sd, or the report's pooled
  over the ladder's sizes), the sizes independent. Independence is the conservative case for what
  every size of a seed shares (its data order): a seed effect common to all sizes shifts that seed's
  line without tilting it (a slope's weights sum to 0) and so only narrows the slopes' spread. A
  seed whose difference drifts with N (a seed-by-size interaction) spreads the slopes wider than this
  sd implies; the report's interval, from the slopes' own spread, covers that, its detectable slope
  does not.
- The extrapolation bound: a line fitted over ln N in [a, b] is given an interval no further than
  one ladder width past the largest size (ln N <= b + (b - a)); beyond that the report states the
  line's value as an unsupported line, without an interval.

Numbers only; render.py words them.
"""
import math

import numpy as np

POWER = 0.8
DRAWS = 4000


def seed_slopes(x, diffs):
    """Each seed's least-squares slope of its differences on ln N. x: (m,) ln N; diffs: (..., m, seeds)."""
    centred = x - x.mean()
    return np.einsum("i,...is->...s", centred, diffs) / (centred @ centred)


def slope_rejects(x, diffs, level):
    """ladder.fit_trend's slope test on many ladders at once. x: (m,) ln N; diffs: (draws, m, seeds),
    each seed's paired difference at each size. Returns (mean slope, rejected) arrays of length draws."""
    from scipy import stats
    slopes = seed_slopes(np.asarray(x, dtype=np.float64), diffs)
    return slopes.mean(axis=1), stats.ttest_1samp(slopes, 0.0, axis=1).pvalue < level


def simulate(x, sd, n, level, slope, draws=DRAWS, seed=0):
    """The fraction of simulated ladders whose slope test rejects, at a true slope per e-fold of N
    (the effect is slope * (ln N - mean ln N)): n seeds, paired differences with this sd at every
    size, sizes independent (the module docstring says why that is the conservative case)."""
    x = np.asarray(x, dtype=np.float64)
    z = np.random.default_rng(seed).standard_normal((draws, len(x), n))
    return float(slope_rejects(x, slope * (x - x.mean())[None, :, None] + sd * z, level)[1].mean())


def detectable_slope(x, sd, n, level, power=POWER, draws=DRAWS, seed=0):
    """The smallest slope per e-fold of N rejected in `power` of simulated ladders (bisection with
    common random numbers); None when even 100 sd per e-fold is not."""
    hi = 100 * sd / max(1e-12, np.ptp(x))
    if simulate(x, sd, n, level, hi, draws, seed) < power:
        return None
    lo = 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if simulate(x, sd, n, level, mid, draws, seed) < power else (lo, mid)
    return hi


def pooled_sd(effects):
    """(sd, df): the paired-difference sd pooled over the ladder's sizes (each size's variance weighted
    by its seeds - 1): one sd for the whole ladder instead of each size's own, which at 3 seeds rests
    on 2 df. The df count the sizes as independent; sizes share seeds, so the pooled sd is less certain
    than its df say (at worst, with perfectly correlated sizes, as certain as one size's)."""
    groups = [list(e["differences"].values()) for e in effects if len(e["differences"]) > 1]
    df = sum(len(g) - 1 for g in groups)
    if not df:
        return None, 0
    return math.sqrt(sum((len(g) - 1) * np.var(g, ddof=1) for g in groups) / df), df


def ladder_detectable(effects, seeds, level):
    """The slope the ladder could have detected with its `seeds` (those with a difference at every
    size), from the paired-difference sd pooled over its sizes: dict(slope, sd, df); slope None when
    no slope within reach, the whole dict None without an sd (one seed per size, or no spread)."""
    sd, df = pooled_sd(effects)
    if not sd or seeds < 2:
        return None
    x = np.log([e["params"] for e in effects])
    found = detectable_slope(x, sd, seeds, level)
    return dict(slope=float(found) if found else None, sd=sd, df=df)


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
