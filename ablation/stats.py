"""The statistics of a planned comparison: k variants against one baseline over paired seeds.

A plan fixes, before the runs, the significance level `alpha` of the whole family of k comparisons
and the smallest effect of interest `min_effect` (in the metric's units). Then, per variant:
- the family-wise error is controlled by Holm's step-down adjustment of the paired t-tests' p-values,
  and each better/worse interval is at the level its Holm step tested (alpha / (k - i + 1)), so an
  interval excludes 0 exactly when its comparison is decided. These step-level intervals are not
  simultaneous (docs/ablation.md gives how often one misses), so no claim about the margin rests on them;
- every claim about ±min_effect (equivalent, "negligible", beyond the margin) rests on the
  simultaneous intervals: Bonferroni's 1 - alpha/k Student-t interval for each comparison, which
  cover all k true effects together with probability >= 1 - alpha whatever their correlation
  (tests/test_stats.py simulates a shared baseline); equivalence is that interval inside ±min_effect,
  i.e. two one-sided tests (TOST) each at alpha/(2k);
- what is neither is inconclusive; the seed plan (per variant, from each variant's own upper
  confidence bound of its paired sd, covering the noisiest) says how many seeds would decide min_effect.
The procedures come from scipy and statsmodels; this module puts them together and checks them.
"""
import functools
import math

import numpy as np

POWER = 0.8  # the conventional chance of detecting an effect of the planned size
MIN_SEEDS = 3  # below this a t-test rests on one or two differences: no verdict
MOST_SEEDS = 100_000  # the planner's search stops here and says so
SD_CONFIDENCE = 0.8  # the planner uses this one-sided upper confidence bound of the pilot's sd
# Differences whose spread is within this fraction of the metric's size are deterministic: a few
# float32 ulps (eps 1.2e-7) of a loss is rounding, not seed-to-seed variance.
DETERMINISTIC_RTOL = 1e-6
EXACT_SIGN_FLIP_SEEDS = 16  # up to 2^16 sign patterns are enumerated; above, a Monte Carlo sample
SIGN_FLIP_RESAMPLES = 100_000


def family_level(alpha, k):
    """The per-comparison level that keeps the family-wise error of k comparisons at alpha (Bonferroni)."""
    return alpha / max(1, k)


def holm(p_values, alpha):
    """Holm-adjusted p-values in the given order (None stays None and is not counted): the i-th
    smallest of k times (k - i + 1), kept monotone and at most 1. Written out rather than taken from
    statsmodels' multipletests, which runs gc.collect() on every call (docs/ablation.md: its cost);
    tests/test_stats.py checks it against multipletests."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted, running, k = [None] * len(p_values), 0.0, len(present)
    for step, (p, i) in enumerate(present):
        running = max(running, min(1.0, (k - step) * p))
        adjusted[i] = running
    return adjusted


def holm_levels(p_values, alpha):
    """The level Holm's step-down tested each comparison at (None stays None): the i-th smallest p at
    alpha / (k - i + 1) while every smaller one was rejected; from the first that was not, every later
    one at that step's level. A Student-t interval at 1 - this level then excludes 0 exactly when the
    Holm-adjusted p is below alpha."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    levels, k, stopped = [None] * len(p_values), len(present), None
    for step, (p, i) in enumerate(present):
        level = stopped or alpha / (k - step)
        if p >= level:
            stopped = level
        levels[i] = level
    return levels


def t_power(effect, n, level):
    """Power of the two-sided paired t-test at `level` from n seeds against a standardized effect
    |mean| / sd (scipy's noncentral t). The lower tail is taken as the upper tail of -nc: scipy's
    nct.cdf returns NaN far in its lower tail (e.g. nct.cdf(-8.86, 2, 8.66))."""
    from scipy import stats
    df, nc = n - 1, effect * math.sqrt(n)
    crit = stats.t.isf(level / 2, df)
    power = stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc)
    if not math.isfinite(power):
        raise ArithmeticError("no power from the noncentral t", dict(effect=effect, n=n, level=level))
    return float(power)


@functools.lru_cache(maxsize=None)
def standardized_detectable(n, level, power=POWER):
    """Smallest |mean| / sd that a two-sided paired t-test at `level` detects with `power` from n >= 2
    seeds: the root of t_power, checked by putting it back in (a solver can stop at a wrong root
    without a warning, as statsmodels' solve_power does at 3 seeds). Cached: it depends on n and
    the level only."""
    from scipy.optimize import brentq
    short = lambda effect: t_power(effect, n, level) - power
    high = 1.0
    while short(high) < 0:
        high *= 2
        if high > 1e7:
            raise ArithmeticError("power out of reach", dict(power=power, n=n, level=level))
    effect = brentq(short, 0.0, high, xtol=1e-12, rtol=1e-12)
    if abs(short(effect)) > 1e-6:
        raise ArithmeticError("the solver's root fails its check", dict(
            n=n, level=level, effect=effect, power=t_power(effect, n, level), wanted=power))
    return effect


def detectable_effect(sd, n, level, power=POWER):
    """Smallest |mean paired difference| detectable with `power` from n seeds whose differences
    have standard deviation sd (None with fewer than 2 seeds or no sd)."""
    if n < 2 or not sd:
        return None
    return standardized_detectable(n, level, power) * sd


def seeds_needed(sd, min_effect, level, power=POWER):
    """Fewest paired seeds (at least MIN_SEEDS) that detect min_effect with `power` when the
    differences have sd: power grows with n, so a bisection over n finds it. None when more than
    MOST_SEEDS would be needed (or there is no sd or no min_effect): render.describe_plan says which."""
    if not sd or not min_effect:
        return None
    return fewest_seeds(lambda n: t_power(min_effect / sd, n, level) >= power, MOST_SEEDS)


def fewest_seeds(enough, most):
    """The fewest n in [MIN_SEEDS, most] for which enough(n) holds, enough growing with n: doubling, then a
    bisection. None when even `most` is not enough."""
    if not enough(most):
        return None
    low, high = MIN_SEEDS - 1, MIN_SEEDS
    while not enough(high):
        low, high = high, min(2 * high, most)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def paired_test(diffs, scale=None):
    """One variant's paired differences (variant - baseline, one per seed): n, mean, sd, the raw
    two-sided t-test p-value, and whether they are deterministic (their spread within
    DETERMINISTIC_RTOL of `scale`, the metric's size: no seed-to-seed variance, so no test). A
    difference that is not finite is the caller's to report: here it raises. The t-test is scipy's
    ttest_1samp (tests/test_stats.py) through scipy.special's t distribution: a simulation calls it
    thousands of times, and scipy.stats' wrappers add a fixed cost to each call."""
    from scipy import special
    d = np.asarray(diffs, dtype=np.float64)
    if not np.all(np.isfinite(d)):
        raise ValueError("paired differences not finite", d.tolist())
    out = dict(n=len(d), mean=float(d.mean()) if len(d) else None, sd=None, p=None, deterministic=False,
               diffs=d.tolist())
    if len(d) < 2:
        return out
    out["sd"] = float(d.std(ddof=1))
    if np.ptp(d) <= DETERMINISTIC_RTOL * max(scale or 0.0, float(np.abs(d).max())):
        out["deterministic"] = True
        return out
    out["p"] = float(2 * special.stdtr(len(d) - 1, -abs(out["mean"]) / (out["sd"] / math.sqrt(len(d)))))
    return out


def simultaneous_confidence(alpha, k):
    """The confidence of each interval in a family of k whose intervals cover every true effect
    together with probability >= 1 - alpha (Bonferroni: valid under any correlation, e.g. the
    variants' shared baseline run)."""
    return 1 - alpha / max(1, k)


def half_width(sd, n, confidence):
    """Half the two-sided Student-t interval of a mean of n paired differences with sd; numpy arrays
    broadcast (a simulation computes thousands at once)."""
    from scipy import special
    return special.stdtrit(np.asarray(n) - 1, 0.5 + confidence / 2) * np.asarray(sd) / np.sqrt(n)


def interval(test, confidence):
    """The two-sided Student-t interval of the mean paired difference at `confidence` (scipy's t quantile)."""
    from scipy import special
    n = test["n"]
    half = special.stdtrit(n - 1, 0.5 + confidence / 2) * test["sd"] / math.sqrt(n)
    return [test["mean"] - float(half), test["mean"] + float(half)]


def tost_p(test, min_effect):
    """Two one-sided t-tests against -min_effect and +min_effect (the larger p): below a level exactly
    when the 1 - 2 level interval lies inside the margin. statsmodels' ttost_paired gives the same
    (tests/test_stats.py) at a cost that simulations would pay thousands of times."""
    from scipy import special
    n = test["n"]
    se = test["sd"] / math.sqrt(n)
    return float(max(special.stdtr(n - 1, -(test["mean"] + min_effect) / se),
                     special.stdtr(n - 1, -(min_effect - test["mean"]) / se)))


def sign_flip_test(diffs):
    """Signs of the paired differences and the two-sided sign-flip p-value (scipy's permutation test):
    under "no effect" each difference is as likely negative as positive. Exact over all 2^n sign
    patterns up to EXACT_SIGN_FLIP_SEEDS seeds, in batches; above, SIGN_FLIP_RESAMPLES random
    patterns from a fixed seed, with the Monte Carlo standard error of p. Assumes symmetry, not
    normality; its smallest possible p is 2^(1-n) (0.25 at 3 seeds)."""
    from scipy import stats
    d = np.asarray(diffs, dtype=np.float64)
    out = dict(below=int((d < 0).sum()), above=int((d > 0).sum()), zero=int((d == 0).sum()), p=None)
    if len(d) < 2:
        return out
    exact = len(d) <= EXACT_SIGN_FLIP_SEEDS
    resamples = np.inf if exact else SIGN_FLIP_RESAMPLES
    test = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=resamples,
                                  alternative="two-sided", vectorized=True, axis=-1, batch=8192,
                                  rng=np.random.default_rng(0))
    out["p"] = min(1.0, float(test.pvalue))
    if not exact:
        out.update(resamples=SIGN_FLIP_RESAMPLES,
                   monte_carlo_error=math.sqrt(out["p"] * (1 - out["p"]) / SIGN_FLIP_RESAMPLES))
    return out


def smallest_sign_flip_p(n):
    return 2.0 ** (1 - n)


def judge(tests, alpha, goal, min_effect=None, plan=None):
    """Verdicts for one family of k comparisons. tests: paired_test results, or None for a comparison
    that could not be tested (it counts as p = 1, so the family keeps its planned size k). Per
    comparison: the Holm-adjusted p, the interval at the level its Holm step tested, the 1 - 2 alpha/k
    equivalence interval (with a min_effect), the verdict and its reasons."""
    k = len(tests)
    level = family_level(alpha, k)
    raw = [t["p"] if t is not None and t["p"] is not None else 1.0 for t in tests]
    adjusted, levels = holm(raw, alpha), holm_levels(raw, alpha)
    return [decide(t, a, step, alpha, level, goal, min_effect, plan) if t is not None else None
            for t, a, step in zip(tests, adjusted, levels)]


def decide(test, adjusted_p, step_level, alpha, level, goal, min_effect, plan):
    """One comparison's verdict, interval(s) and reasons (see judge): a verdict code and a list of
    reason dicts, each a `code` and the numbers it rests on (render.py words them)."""
    n = test["n"]
    out = dict(p_holm=adjusted_p if test["p"] is not None else None, interval=None, interval_confidence=None,
               equivalence_interval=None, equivalence_confidence=None, tost_p=None)
    if n < MIN_SEEDS:
        return dict(out, verdict="too few seeds", reasons=[dict(code="too_few_seeds", n=n, needed=MIN_SEEDS)])
    if test["deterministic"]:
        return dict(out, verdict="deterministic", reasons=[dict(code="deterministic", exact=not any(test["diffs"]),
                                                                offset=test["mean"], rtol=DETERMINISTIC_RTOL)])
    out.update(interval=interval(test, 1 - step_level), interval_confidence=1 - step_level)
    together = 1 - level  # simultaneous_confidence(alpha, k): what every claim about the margin rests on
    if min_effect:
        out.update(equivalence_interval=interval(test, together), equivalence_confidence=together,
                   tost_p=tost_p(test, min_effect))
    eq = out["equivalence_interval"]
    inside = bool(min_effect) and -min_effect < eq[0] and eq[1] < min_effect
    step = dict(p_holm=adjusted_p, alpha=alpha, step_level=step_level, interval=out["interval"],
                confidence=1 - step_level)
    margin = dict(interval=eq, confidence=together, min_effect=min_effect)
    within = dict(margin, tost_p=out["tost_p"], tost_level=level / 2)
    floor = [dict(code="sign_flip_floor", n=n, smallest_p=smallest_sign_flip_p(n), level=step_level)] \
        if smallest_sign_flip_p(n) > step_level else []
    return verdict(out, adjusted_p < alpha, test["mean"], goal, inside, min_effect, plan, margin, within,
                   dict(code="holm_rejects", **step), dict(code="holm_holds_zero", **step), floor)


def verdict(out, rejected, mean, goal, inside, min_effect, plan, margin, within, rejects, holds, caveats=()):
    """The verdict and its reasons once a test has spoken, `rejects` and `holds` its reason either way:
    rejected (its interval excludes 0) gives better or worse (negligible inside the margin, else whether it
    lies beyond it, then `caveats`); otherwise equivalent inside the margin, else inconclusive with what the
    seed plan says."""
    bounds = margin["interval"]
    if rejected:
        word = "better" if (mean < 0) == (goal == "lower") else "worse"
        reasons = [rejects]
        if inside:
            word = f"{word}, but negligible"
            reasons.append(dict(code="negligible", **within))
        elif min_effect:
            beyond = bounds[0] >= min_effect or bounds[1] <= -min_effect
            reasons.append(dict(code="beyond_margin" if beyond else "not_beyond_margin", **margin))
        return dict(out, verdict=word, reasons=reasons + list(caveats))
    if inside:
        return dict(out, verdict="equivalent", reasons=[dict(code="equivalent", **within)])
    reasons = [holds]
    if min_effect:
        reasons.append(dict(code="reaches_margin", **margin))
        if plan:
            reasons.append(dict(code="seed_plan", seeds_needed=plan["seeds_needed"], min_effect=min_effect))
    return dict(out, verdict="inconclusive", reasons=reasons)


def sd_upper_bound(sd, df, confidence=SD_CONFIDENCE):
    """One-sided upper confidence bound of a standard deviation estimated with df degrees of freedom
    (chi-square): a 3-seed pilot's sd is itself very uncertain."""
    from scipy import stats
    return sd * math.sqrt(df / stats.chi2.ppf(1 - confidence, df))


def plan_seeds(sd, df, seeds, k, alpha, min_effect):
    """The seed planner, one answer per suite: from the pooled paired-difference sd (df degrees of
    freedom), the effect `seeds` seeds detect with 80% power at the point estimate and at the sd's
    upper confidence bound, and the seeds min_effect needs at that bound."""
    level = family_level(alpha, k)
    upper = sd_upper_bound(sd, df) if sd and df else None
    needed = seeds_needed(upper, min_effect, level)
    return dict(sd=sd, df=df, sd_upper=upper, sd_confidence=SD_CONFIDENCE, seeds=seeds, comparisons=k, alpha=alpha,
                level=level, min_effect=min_effect, detectable_at_sd=detectable_effect(sd, seeds, level),
                detectable=detectable_effect(upper, seeds, level), seeds_needed=needed,
                underpowered=bool(min_effect and upper and (needed is None or needed > seeds)))


def sd_upper_bounds(sds, dfs, confidence=SD_CONFIDENCE):
    """Each variant's own one-sided upper confidence bound of its paired sd from its own n - 1 degrees
    of freedom (numpy: sds (..., k), dfs (k,)). Pooling the variants' variances and summing their
    degrees of freedom would treat them as independent, but they share each seed's baseline run (their
    differences are correlated: docs/ablation.md, Planning seeds) and their sds differ: the pooled bound
    then covers far less often than it says."""
    from scipy import stats
    dfs = np.asarray(dfs, dtype=np.float64)
    return np.asarray(sds) * np.sqrt(dfs / stats.chi2.ppf(1 - confidence, dfs))


def planning_sd(sds, dfs, confidence=SD_CONFIDENCE):
    """The sd a plan covers: the largest of the variants' own upper bounds. It is at least the noisiest
    variant's true sd whenever that variant's own bound covers (probability `confidence`), so the plan
    covers the noisiest planned variant at its nominal level whatever the correlation."""
    return sd_upper_bounds(sds, dfs, confidence).max(axis=-1)


def plan_variants(parts, seeds, k, alpha, min_effect):
    """The seed plan per variant. parts: {variant: (sd of its paired differences, degrees of freedom)},
    None for a variant without two paired seeds (unplanned: named, never guessed). Each variant gets
    its own bound and detectable effect; the plan's seeds cover the noisiest planned variant's bound.
    Keeps plan_seeds' keys for the noisiest, plus per_variant and unplanned."""
    planned = {name: part for name, part in parts.items() if part and part[1] > 0}
    per_variant = {name: plan_seeds(sd, df, seeds, k, alpha, min_effect) for name, (sd, df) in planned.items()}
    if not per_variant:
        return None
    noisiest = max(per_variant, key=lambda name: per_variant[name]["sd_upper"] or 0.0)
    return dict(per_variant[noisiest], noisiest=noisiest, per_variant=per_variant,
                unplanned=sorted(set(parts) - set(planned)))


# ----------------------------------------------------------------------------- the blocked many-to-one analysis
# A suite's whole arms x seeds table (arm 0 the baseline, complete seeds only), seed as block. Each variant's
# contrast d_v = variant - baseline per seed removes the seed effect exactly; its variance is the baseline's
# plus the variant's, each estimated on its own from the block-adjusted residuals of all arms (Shukla's 1972
# stability variances: unbiased when arms differ in noise). The k contrasts share the baseline, so their t
# statistics are correlated, and a Shukla estimate is a difference of correlated residual sums of squares, so
# it varies more than a chi-square. The simultaneous critical value and the single-step adjusted p are the larger
# of two approximations of the largest |t|'s quantile that err on opposite sides (docs/ablation.md, The blocked
# analysis, measures both): a multivariate t on the smallest Welch-Satterthwaite df at the fitted variances
# (liberal at 8 seeds), and a seeded parametric bootstrap, tables of independent normals with each arm's fitted
# variance read by the same estimator (liberal at 3 seeds, where the fitted variances rest on few df). It is
# Dunnett's many-to-one without its equal-variance pooling, which lets the baseline's variance into every comparison.

ANALYSES = ("blocked", "paired")  # a suite's `analysis`; a suite.json from before the key means "paired"
DEFAULT_ANALYSIS = "blocked"
MAX_T_DRAWS = 20_000  # Monte Carlo draws of the largest |t| (fixed seed: the same table gives the same answer)


def arm_variances(table, floor=0.1):
    """Each arm's own residual variance in an arms x seeds table (K >= 3 arms, n >= 2 seeds), the seed effects
    estimated from all arms: W_a = the arm's block-adjusted residual sum of squares / (n - 1) has expectation
    (1 - 2/K) var_a + sum(var) / K^2, solved for var_a (Shukla 1972). A negative estimate (noise) is floored at a
    tenth of the arms' mean (`floor`; None: the unbiased estimate itself, which can be negative)."""
    y = np.asarray(table, dtype=np.float64)
    K, n = y.shape[-2], y.shape[-1]
    r = y - y.mean(-1, keepdims=True)
    r -= r.mean(-2, keepdims=True)  # the block-adjusted residuals in two passes (the bootstrap reads 20,000 tables)
    w = np.einsum("...an,...an->...a", r, r) / (n - 1)
    total = w.sum(-1, keepdims=True) * K / (K - 1)
    var = K / (K - 2) * (w - total / K ** 2)
    return var if floor is None else np.maximum(var, floor * total / K)


def blocked_variances(table):
    """The blocked analysis's variance of each arm in arms x seeds tables (..., K, n), baseline first: Shukla's
    (arm_variances) from K >= 3 arms; two arms cannot be told apart, so the baseline gets 0 and the variant the
    paired differences' variance (the contrast's t is then the paired t)."""
    y = np.asarray(table, dtype=np.float64)
    if y.shape[-2] > 2:
        return arm_variances(y)
    paired = (y[..., 1, :] - y[..., 0, :]).var(axis=-1, ddof=1)
    return np.stack([np.zeros_like(paired), paired], axis=-1)


def contrast_t(table):
    """(means, ses, t) of every contrast variant - baseline in arms x seeds tables (..., K, n), each se from
    blocked_variances: sqrt((var_0 + var_v) / n)."""
    y = np.asarray(table, dtype=np.float64)
    var = blocked_variances(y)
    mean = (y[..., 1:, :] - y[..., :1, :]).mean(axis=-1)
    se = np.sqrt((var[..., :1] + var[..., 1:]) / y.shape[-1])
    return mean, se, mean / se


def satterthwaite_df(var_base, var_variant, df):
    """Welch-Satterthwaite degrees of freedom of var_base + var_variant, each estimated with df."""
    return (var_base + var_variant) ** 2 / ((var_base ** 2 + var_variant ** 2) / df)


@functools.lru_cache(maxsize=4)
def _max_t_draws(k, draws=MAX_T_DRAWS):
    rng = np.random.default_rng(20250806)
    return rng.standard_normal((draws, k)), rng.random(draws)


def max_abs_t(correlation, df, draws=MAX_T_DRAWS):
    """Seeded draws of max_v |T_v| for a k-variate t with this correlation matrix and df (sorted): the planner's
    approximation of the blocked analysis's largest |t| (blocked_design)."""
    from scipy import special
    R = np.asarray(correlation, dtype=np.float64)
    z, u = _max_t_draws(len(R), draws)
    chi = special.chdtri(df, u) / df  # chi-square(df) / df from the fixed uniforms
    t = (z @ np.linalg.cholesky(R).T) / np.sqrt(chi)[:, None]
    return np.sort(np.abs(t).max(axis=1))


@functools.lru_cache(maxsize=4)
def _null_tables(arms, n, draws=MAX_T_DRAWS):
    """Fixed-seed standard normal arms x seeds tables: the bootstrap scales them by the fitted sds."""
    return np.random.default_rng(20261206).standard_normal((draws, arms, n))


def bootstrap_max_t(arm_var, n, absent_var=(), draws=MAX_T_DRAWS):
    """Seeded draws of the blocked analysis's largest |t| (sorted) under the fitted heteroscedastic null: tables
    of independent normals, each arm with its variance arm_var (baseline first; a seed effect cancels in the
    contrasts and in the block-adjusted residuals, so none is drawn), read by the same estimator (contrast_t).
    absent_var: variants not in the table (stopped at an earlier look), drawn as extra rows and read with the
    whole drawn table, as the analysis of all k planned arms would read them; they enter the max."""
    var = np.concatenate([np.asarray(arm_var, dtype=np.float64), np.asarray(absent_var, dtype=np.float64)])
    y = _null_tables(len(var), n, draws) * np.sqrt(var)[:, None]
    present = len(arm_var)
    t = contrast_t(y[:, :present])[2]
    if present < len(var):
        t = np.concatenate([t, contrast_t(y)[2][:, present - 1:]], axis=1)
    return np.sort(np.abs(t).max(axis=1))


def tail(sorted_max, value):
    """P(max |T| >= value) from the sorted draws."""
    return float((len(sorted_max) - np.searchsorted(sorted_max, value, side="left")) / len(sorted_max))


def larger_tail(maxima, value):
    """The larger P(max |T| >= value) of several sorted draws of the largest |t|: below a level exactly when value
    is beyond every one's critical value."""
    return max(tail(m, value) for m in maxima)


def blocked_test(table, alpha, min_effect=None, draws=MAX_T_DRAWS, absent_sds=()):
    """The blocked many-to-one analysis of one arms x seeds table (row 0 the baseline, complete seeds):
    per variant its mean contrast, se, t, Welch-Satterthwaite df, the single-step adjusted p and the simultaneous
    1 - alpha interval, and (with min_effect) the simultaneous TOST p. The critical value is the larger of two
    approximations of the largest |t|'s quantile that err on opposite sides (docs/ablation.md, The blocked
    analysis): the parametric bootstrap at the fitted variances (bootstrap_max_t; liberal at 3 seeds, where the
    fitted variances rest on few df) and the multivariate t on the smallest df (max_abs_t; liberal at 8 seeds,
    where a Shukla estimate varies more than its chi-square). With two arms the arms' variances cannot be told
    apart: the paired t of the one contrast. absent_sds: the own sds of planned variants not in the table
    (stopped at an earlier look): they stay in the family's largest |t|, so its size stays k."""
    y = np.asarray(table, dtype=np.float64)
    K, n = y.shape
    var = blocked_variances(y)
    mean, se, t = contrast_t(y)
    df = satterthwaite_df(var[0], var[1:], n - 1) if K > 2 else np.array([n - 1.0])
    family_df = float(df.min())  # one df for the family: the contrast whose variance is the least certain
    absent_var = np.square(np.asarray(absent_sds, dtype=np.float64))
    family_var = np.concatenate([var[0] + var[1:], var[0] + absent_var])
    R = var[0] / np.sqrt(np.outer(family_var, family_var))
    np.fill_diagonal(R, 1.0)
    maxima = dict(bootstrap=bootstrap_max_t(var, n, absent_var, draws), multivariate_t=max_abs_t(R, family_df, draws))
    criticals = {name: float(np.quantile(m, 1 - alpha)) for name, m in maxima.items()}
    critical = max(criticals.values())
    out = []
    for v in range(K - 1):
        row = dict(mean=float(mean[v]), se=float(se[v]), t=float(t[v]), df=float(df[v]), family_df=family_df,
                   critical=critical, p_adjusted=larger_tail(maxima.values(), abs(t[v])),
                   interval=[float(mean[v] - critical * se[v]), float(mean[v] + critical * se[v])],
                   confidence=1 - alpha, tost_p=None)
        if min_effect:
            row["tost_p"] = larger_tail(maxima.values(), min((min_effect - mean[v]) / se[v],
                                                             (min_effect + mean[v]) / se[v]))
        out.append(row)
    return dict(arms=K, n=n, arm_sd=np.sqrt(var).tolist(), family_df=family_df, critical=critical,
                critical_bootstrap=criticals["bootstrap"], critical_multivariate_t=criticals["multivariate_t"],
                correlation=R[:K - 1, :K - 1].tolist(), contrasts=out)


def blocked_power(effect, sd, n, df, critical):
    """Power of one blocked contrast's two-sided test at the family's critical value: |T| > critical with T a
    noncentral t (df, noncentrality effect * sqrt(n) / sd), sd the per-seed contrast sd."""
    from scipy import stats as st
    nc = effect * math.sqrt(n) / sd
    return float(st.nct.sf(critical, df, nc) + st.nct.sf(critical, df, -nc))


def blocked_design(arm_sds, n, alpha, draws=MAX_T_DRAWS):
    """(per-variant contrast sds, their dfs, the family's df, the critical value) of the blocked analysis at n
    seeds when the arms' sds are arm_sds (baseline first): its df, and the multivariate t's critical value (the
    analysis takes the larger of it and a bootstrap's; the planner's power at it: docs/ablation.md)."""
    var = np.asarray(arm_sds, dtype=np.float64) ** 2
    contrast = var[0] + var[1:]
    df = satterthwaite_df(var[0], var[1:], n - 1) if len(var) > 2 else np.array([n - 1.0])
    R = var[0] / np.sqrt(np.outer(contrast, contrast))
    np.fill_diagonal(R, 1.0)
    critical = float(np.quantile(max_abs_t(R, float(df.min()), draws), 1 - alpha))
    return np.sqrt(contrast), df, float(df.min()), critical


def blocked_detectable(arm_sds, n, alpha, power=POWER):
    """Each variant's smallest |effect| the blocked analysis at n seeds detects with `power` (its family df and
    critical value, not n - 1 per variant): the root of blocked_power, checked by putting it back in."""
    from scipy.optimize import brentq
    sds, _, df, critical = blocked_design(arm_sds, n, alpha)
    found = []
    for sd in sds:
        short = lambda e: blocked_power(e, sd, n, df, critical) - power
        high = sd
        while short(high) < 0:
            high *= 2
        effect = brentq(short, 0.0, high, xtol=1e-12 * sd)
        if abs(short(effect)) > 1e-6:
            raise ArithmeticError("the solver's root fails its check", dict(n=n, effect=effect))
        found.append(effect)
    return found


def blocked_seeds_needed(arm_sds, min_effect, alpha, power=POWER, most=1000):
    """Fewest seeds (at least MIN_SEEDS) at which the blocked analysis detects min_effect in every variant with
    `power`: a bisection over n (None beyond `most`)."""
    if not min_effect:
        return None
    return fewest_seeds(lambda n: max(blocked_detectable(arm_sds, n, alpha, power)) <= min_effect, most)


def plan_blocked(arm_sds, names, n_table, seeds, alpha, min_effect):
    """The seed plan of the blocked analysis: from the table's per-arm sds (baseline first, each from n_table
    seeds), each bounded at its SD_CONFIDENCE upper bound (n_table - 1 df), what `seeds` seeds detect per
    variant with the analysis's own df and critical value, and the seeds min_effect needs at the bounds."""
    if n_table < 2 or len(arm_sds) < 2 or not all(arm_sds):
        return None
    upper = [sd_upper_bound(sd, n_table - 1) for sd in arm_sds]
    at_sd = blocked_detectable(arm_sds, seeds, alpha) if seeds >= 2 else [None] * len(names)
    at_bound = blocked_detectable(upper, seeds, alpha) if seeds >= 2 else [None] * len(names)
    needed = blocked_seeds_needed(upper, min_effect, alpha) if min_effect else None
    _, df, family_df, critical = blocked_design(upper, seeds, alpha) if seeds >= 2 else (None, None, None, None)
    per_variant = {name: dict(sd=arm_sds[i + 1], sd_upper=upper[i + 1], detectable=at_bound[i],
                              detectable_at_sd=at_sd[i]) for i, name in enumerate(names)}
    noisiest = max(per_variant, key=lambda name: per_variant[name]["detectable"] or 0.0)
    return dict(analysis="blocked", baseline_sd=arm_sds[0], baseline_sd_upper=upper[0], df=n_table - 1,
                sd_confidence=SD_CONFIDENCE, seeds=seeds, comparisons=len(names), alpha=alpha, level=alpha,
                family_df=family_df, critical=critical, min_effect=min_effect, seeds_needed=needed,
                per_variant=per_variant, noisiest=noisiest, sd_upper=per_variant[noisiest]["sd_upper"],
                unplanned=[], underpowered=bool(min_effect and (needed is None or needed > seeds)))


def judge_blocked(table, alpha, goal, min_effect=None, plan=None, draws=MAX_T_DRAWS):
    """Verdicts of the blocked analysis for the variants in `table` (row 0 the baseline; complete seeds):
    one simultaneous 1 - alpha interval per variant decides about 0 (it excludes 0 exactly when the adjusted p
    is below alpha) and about the margin (equivalent, negligible, beyond it), so no Holm step is needed."""
    y = np.asarray(table, dtype=np.float64)
    n = y.shape[1]
    if n < MIN_SEEDS:
        return [dict(verdict="too few seeds", p_holm=None, interval=None, reasons=[dict(
            code="too_few_seeds", n=n, needed=MIN_SEEDS)]) for _ in range(len(y) - 1)], None
    scale = float(np.abs(y).max())
    if all(np.ptp(d) <= DETERMINISTIC_RTOL * scale for d in y[1:] - y[0]):  # no variance to test against
        return [dict(verdict="deterministic", p_holm=None, interval=None, reasons=[dict(
            code="deterministic", exact=not np.any(d), offset=float(d[0]), rtol=DETERMINISTIC_RTOL)])
            for d in y[1:] - y[0]], None
    result = blocked_test(y, alpha, min_effect, draws)
    decisions = [decide_blocked(c, d, alpha, goal, min_effect, plan, n, scale)
                 for c, d in zip(result["contrasts"], y[1:] - y[0])]
    return decisions, {k: v for k, v in result.items() if k != "contrasts"}


def decide_blocked(c, diffs, alpha, goal, min_effect, plan, n, scale):
    """One variant's verdict under the blocked analysis (judge_blocked): codes and numbers only."""
    ci = c["interval"]
    out = dict(p_holm=c["p_adjusted"], interval=ci, interval_confidence=c["confidence"], equivalence_interval=ci
               if min_effect else None, equivalence_confidence=c["confidence"] if min_effect else None,
               tost_p=c["tost_p"], contrast=dict(c))
    if np.ptp(diffs) <= DETERMINISTIC_RTOL * scale:
        return dict(out, verdict="deterministic", p_holm=None, reasons=[dict(
            code="deterministic", exact=not np.any(diffs), offset=float(diffs[0]), rtol=DETERMINISTIC_RTOL)])
    step = dict(p_adjusted=c["p_adjusted"], alpha=alpha, interval=ci, confidence=c["confidence"], df=c["df"],
                family_df=c["family_df"], critical=c["critical"])
    inside = bool(min_effect) and -min_effect < ci[0] and ci[1] < min_effect
    margin = dict(interval=ci, confidence=c["confidence"], min_effect=min_effect)
    within = dict(margin, tost_p=c["tost_p"], tost_level=alpha)
    return verdict(out, c["p_adjusted"] < alpha, c["mean"], goal, inside, min_effect, plan, margin, within,
                   dict(code="blocked_rejects", **step), dict(code="blocked_holds_zero", **step))


# ----------------------------------------------------------------------------- the sequential blocked analysis
# A suite that declares `looks` and `stop_decided` runs seed by seed and analyses at each planned look. Look j
# tests at its share of alpha (levels[j], O'Brien-Fleming-type spending: compare.spent_per_look) with the blocked
# analysis of the baseline and the arms still open, on the look's seeds; its critical value is the largest |t|
# over all k planned contrasts (a stopped arm stays in it with its sd at its stop). An arm whose interval decides
# it (inside +-min_effect, or wholly beyond it; without a margin, excluding 0) stops; the open arms and the
# baseline go on. The levels sum to alpha, so by Bonferroni over the looks every interval of every look covers
# its arm's effect together with probability >= 1 - alpha whatever the stopping: each arm's final interval (at
# its last look's level) is such a repeated confidence interval, and the family-wise error of its verdicts holds
# at alpha (tools/calibrate_analysis.py simulates both). For the same reason a suite may ask for resolution too
# (stop_half_width): a decided arm whose interval is wider runs on, since going on past a look never costs coverage.

def stop_code(interval, min_effect, max_half_width=None):
    """Why an interval decides its arm at a look (None: it stays open): inside +-min_effect (within_margin),
    wholly beyond it (beyond_margin); without a margin, excluding 0 (excludes_zero). With max_half_width, an
    interval wider than +-max_half_width stays open whatever it excludes."""
    low, high = interval
    if max_half_width and (high - low) / 2 > max_half_width:
        return None
    if min_effect:
        if -min_effect < low and high < min_effect:
            return "within_margin"
        return "beyond_margin" if low >= min_effect or high <= -min_effect else None
    return "excludes_zero" if low > 0 or high < 0 else None


def sequential_blocked(values, looks, levels, min_effect=None, draws=MAX_T_DRAWS, max_half_width=None):
    """The stopping rule replayed on an arms x seeds table in run order (row 0 the baseline; NaN where no value:
    a run stopped or not yet made). A look is taken when the baseline and every open arm have its seeds; the
    replay ends at the first look not reached. Returns (the looks taken, each dict(number, seeds, level, tested,
    stopped, called, critical, family_df) with arms as row indices; {arm: its last look's contrast, with
    look_number, seeds, level and stop (None while open)})."""
    y = np.asarray(values, dtype=np.float64)
    open_arms, own_sd, final, taken = list(range(1, len(y))), {}, {}, []
    for number, (n, level) in enumerate(zip(looks, levels), start=1):
        rows = [0, *open_arms]
        if not open_arms or n > y.shape[1] or np.isnan(y[rows, :n]).any():
            break
        absent = [own_sd[arm] for arm in range(1, len(y)) if arm not in open_arms]
        result = blocked_test(y[rows, :n], level, min_effect, draws, absent)
        for arm, contrast, sd in zip(open_arms, result["contrasts"], result["arm_sd"][1:]):
            final[arm] = dict(contrast, look_number=number, seeds=n, level=level,
                              stop=stop_code(contrast["interval"], min_effect, max_half_width))
            own_sd[arm] = sd
        stopped = [arm for arm in open_arms if final[arm]["stop"]]
        called = [arm for arm in open_arms if final[arm]["p_adjusted"] < level]  # better or worse at this look
        taken.append(dict(number=number, seeds=n, level=level, tested=list(open_arms), stopped=stopped, called=called,
                          critical=result["critical"], family_df=result["family_df"]))
        open_arms = [arm for arm in open_arms if arm not in stopped]
    return taken, final


def judge_sequential(values, looks, levels, goal, min_effect=None, plan=None, draws=MAX_T_DRAWS, max_half_width=None):
    """Verdicts of the sequential blocked analysis (sequential_blocked) for every variant row: each from its
    last look's contrast at that look's level (decide_blocked), with a last reason saying at which look it stopped,
    decided (stopped_at_look), or that it is still open (open_at_look); None for a variant no look tested."""
    y = np.asarray(values, dtype=np.float64)
    taken, final = sequential_blocked(y, looks, levels, min_effect, draws, max_half_width)
    scale = float(np.nanmax(np.abs(y))) if final else None  # the metric's size (no look: no seeds to size it)
    decisions = []
    for arm in range(1, len(y)):
        last = final.get(arm)
        if last is None:
            decisions.append(None)
            continue
        n = last["seeds"]
        decision = decide_blocked(last, y[arm, :n] - y[0, :n], last["level"], goal, min_effect, plan, n, scale)
        decision["reasons"].append(dict(code="stopped_at_look" if last["stop"] else "open_at_look",
                                        look_number=last["look_number"], looks=len(looks), seeds=n, level=last["level"],
                                        stop=last["stop"]))
        decisions.append(dict(decision, look_number=last["look_number"], seeds_used=n))
    return decisions, taken


def simulate_sequential(y, looks, levels, min_effect, effects=None, draws=MAX_T_DRAWS, max_half_width=None):
    """The sequential analysis on simulated tables (simulate_tables over the last look's seeds): per table
    whether any variant was called better or worse at any look, whether every variant's final interval covers
    its true effect (0 without `effects`), and the seeds each variant ran."""
    truth = np.zeros(y.shape[1] - 1) if effects is None else np.asarray(effects, dtype=np.float64)
    called, covered, seeds = [], [], []
    for table in y:
        taken, final = sequential_blocked(table, looks, levels, min_effect, draws, max_half_width)
        called.append(any(look["called"] for look in taken))
        covered.append(all(final[arm]["interval"][0] <= truth[arm - 1] <= final[arm]["interval"][1] for arm in final))
        seeds.append([final[arm]["seeds"] for arm in sorted(final)])
    return np.array(called), np.array(covered), np.array(seeds)


# ----------------------------------------------------------------------------- calibration (tools/calibrate_analysis.py)

def simulate_tables(arm_sds, seed_sd, n, tables, rng, effects=None):
    """`tables` arms x seeds tables (baseline first): a seed effect shared by every arm of a seed, each arm's own
    noise, and `effects` added to the variants' rows (the null without)."""
    sds = np.asarray(arm_sds, dtype=np.float64)
    y = rng.normal(0.0, seed_sd, (tables, 1, n)) + rng.standard_normal((tables, len(sds), n)) * sds[:, None]
    if effects is not None:
        y[:, 1:] += np.asarray(effects, dtype=np.float64)[:, None]
    return y


def paired_holm_rejects(y, alpha):
    """(tables, k) rejections of the paired analysis: each variant's paired t on n - 1 df, Holm over k."""
    from scipy import special
    d = y[:, 1:] - y[:, :1]
    n = d.shape[-1]
    t = d.mean(-1) / (d.std(-1, ddof=1) / math.sqrt(n))
    p = 2 * special.stdtr(n - 1, -np.abs(t))
    k = p.shape[1]
    order = np.argsort(p, axis=1)
    ranked = np.take_along_axis(p, order, 1) * (k - np.arange(k))
    adjusted = np.minimum(1.0, np.maximum.accumulate(ranked, axis=1))
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, 1)
    return out < alpha


def pooled_dunnett_rejects(y, alpha):
    """(tables, k) rejections of the pooled blocked Dunnett: one residual mean square over all arms ((K - 1)(n - 1)
    df), contrasts' correlation 1/2: it assumes every arm is as noisy as the others."""
    K, n = y.shape[1], y.shape[2]
    r = y - y.mean(2, keepdims=True) - y.mean(1, keepdims=True) + y.mean((1, 2), keepdims=True)
    df = (K - 1) * (n - 1)
    ms = (r ** 2).sum((1, 2)) / df
    t = (y[:, 1:].mean(2) - y[:, :1].mean(2)) / np.sqrt(2 * ms / n)[:, None]
    R = np.full((K - 1, K - 1), 0.5)
    np.fill_diagonal(R, 1.0)
    critical = np.quantile(max_abs_t(R, df), 1 - alpha)
    return np.abs(t) > critical


def blocked_rejects(y, alpha, draws=MAX_T_DRAWS):
    """(tables, k) rejections of the declared blocked analysis (blocked_test on each table)."""
    return np.array([[c["p_adjusted"] < alpha for c in blocked_test(t, alpha, draws=draws)["contrasts"]] for t in y])


def multivariate_t_rejects(y, alpha, draws=MAX_T_DRAWS):
    """(tables, k) rejections of the blocked analysis's earlier form: the same contrasts and variances, the critical
    value of a multivariate t on the smallest Welch-Satterthwaite df at the fitted variances (blocked_design, the
    planner's approximation)."""
    n = y.shape[-1]
    t = contrast_t(y)[2]
    critical = [blocked_design(np.sqrt(var), n, alpha, draws)[3] for var in blocked_variances(y)]
    return np.abs(t) > np.array(critical)[:, None]


def equal_variance_check_rejects(y, alpha, check_level=0.05, draws=MAX_T_DRAWS):
    """(tables, k) rejections of check-then-choose: Bartlett's test on the arms' block-adjusted residuals picks the
    pooled Dunnett when it passes (p >= check_level), the blocked analysis when it fails."""
    from scipy import stats as st
    r = y - y.mean(2, keepdims=True) - y.mean(1, keepdims=True) + y.mean((1, 2), keepdims=True)
    pooled = pooled_dunnett_rejects(y, alpha)
    out = np.empty_like(pooled)
    for i, table in enumerate(y):
        passes = st.bartlett(*r[i]).pvalue >= check_level
        out[i] = pooled[i] if passes else [c["p_adjusted"] < alpha for c in blocked_test(table, alpha, draws=draws)["contrasts"]]
    return out


def family_rate(rejects):
    """(share of tables with any rejection, its Monte Carlo standard error)."""
    rate = float(np.asarray(rejects).any(axis=1).mean())
    return rate, math.sqrt(rate * (1 - rate) / len(rejects))
