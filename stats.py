"""The statistics of a planned comparison: k variants against one baseline over paired seeds.

A plan fixes, before the runs, the significance level `alpha` of the whole family of k comparisons
and the smallest effect of interest `min_effect` (in the metric's units). Then, per variant:
- the family-wise error is controlled by Holm's step-down adjustment of the paired t-tests' p-values,
  and each interval is a simultaneous one at the matching Bonferroni level 1 - alpha/k;
- equivalence within ±min_effect is shown only by two one-sided tests (TOST) at level alpha/k;
- what is neither is inconclusive, with the smallest effect these seeds could detect with 80% power
  and the seeds that min_effect would need.
The procedures come from scipy and statsmodels; this module only puts them together.
"""
import functools

import numpy as np

POWER = 0.8  # the conventional chance of detecting an effect of the planned size
MIN_SEEDS = 3  # below this a t-test rests on one or two differences: no verdict


def family_level(alpha, k):
    """The per-comparison level that keeps the family-wise error of k comparisons at alpha (Bonferroni)."""
    return alpha / max(1, k)


def holm(p_values, alpha):
    """Holm-adjusted p-values (statsmodels), in the given order; None stays None and is not counted."""
    from statsmodels.stats.multitest import multipletests
    present = [i for i, p in enumerate(p_values) if p is not None]
    adjusted = [None] * len(p_values)
    if present:
        _, padj, _, _ = multipletests([p_values[i] for i in present], alpha=alpha, method="holm")
        for i, p in zip(present, padj):
            adjusted[i] = float(p)
    return adjusted


@functools.lru_cache(maxsize=None)
def standardized_detectable(n, level, power=POWER):
    """Smallest |mean| / sd a two-sided paired t-test at `level` detects with `power` from n seeds
    (statsmodels' t-test power; it depends on n and the level only, so it is cached)."""
    from statsmodels.stats.power import TTestPower
    effect = TTestPower().solve_power(effect_size=None, nobs=n, alpha=level, power=power, alternative="two-sided")
    return float(np.ravel(effect)[0])  # the solver returns a scalar or a one-element array


def detectable_effect(sd, n, level, power=POWER):
    """Smallest |mean paired difference| detectable with `power` from n seeds whose differences
    have standard deviation sd."""
    if n < 2 or not sd:
        return None
    return standardized_detectable(n, level, power) * sd


def seeds_needed(sd, min_effect, level, power=POWER, most=100_000):
    """Fewest paired seeds (at least MIN_SEEDS) whose detectable effect is within min_effect: the
    detectable effect falls as seeds are added, so a bisection over n finds it."""
    if not sd or not min_effect:
        return None
    target = min_effect / sd
    if standardized_detectable(MIN_SEEDS, level, power) <= target:
        return MIN_SEEDS
    low, high = MIN_SEEDS, most
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if standardized_detectable(mid, level, power) <= target else (mid, high)
    return high


def paired_test(diffs, level, min_effect=None):
    """One variant's paired differences (variant - baseline, one per seed): mean, sd, the raw
    two-sided t-test p-value, the interval at 1 - level, the TOST p-value against ±min_effect, and
    whether the differences are deterministic (all equal: no variance, so no test at all)."""
    from scipy import stats
    from statsmodels.stats.weightstats import ttost_paired
    d = np.asarray(diffs, dtype=np.float64)
    out = dict(n=len(d), mean=float(d.mean()) if len(d) else None, sd=None, p=None, ci=None, tost_p=None,
               deterministic=False)
    if len(d) < 2:
        return out
    out["sd"] = float(d.std(ddof=1))
    if np.all(d == d[0]):  # bitwise-equal runs or a constant offset: a p-value would claim certainty
        out["deterministic"] = True
        return out
    test = stats.ttest_1samp(d, 0.0)
    ci = test.confidence_interval(1 - level)
    out.update(p=float(test.pvalue), ci=[float(ci.low), float(ci.high)])
    if min_effect:
        out["tost_p"] = float(ttost_paired(d, np.zeros_like(d), -min_effect, min_effect)[0])
    return out


def verdict(test, adjusted_p, alpha, level, goal, min_effect):
    """(word, sentence) for one comparison whose inputs were comparable and complete."""
    n = test["n"]
    if n < MIN_SEEDS:
        return "too few seeds", f"{n} paired seed{'s' if n != 1 else ''}: at least {MIN_SEEDS} are needed for a verdict"
    if test["deterministic"]:
        kind = "exactly equal runs" if test["mean"] == 0 else f"a constant offset of {test['mean']:+.4g} in every seed"
        return "deterministic", f"{kind}: no seed-to-seed variance, so no test applies; compare the code paths"
    low, high = test["ci"]
    interval = f"the {100 * (1 - level):.4g}% simultaneous interval [{low:+.4g}, {high:+.4g}]"
    if adjusted_p < alpha:
        helps = (test["mean"] < 0) == (goal == "lower")
        beyond = ""
        if min_effect:
            beyond = (f"; it also excludes ±{min_effect:g}" if min(abs(low), abs(high)) >= min_effect and low * high > 0
                      else f"; it does not exclude effects smaller than {min_effect:g}")
        return ("better" if helps else "worse"), f"Holm-adjusted p = {adjusted_p:.3g} < {alpha:g}; {interval}{beyond}"
    if min_effect and test["tost_p"] is not None and test["tost_p"] < level:
        return "equivalent", (f"equivalent within ±{min_effect:g}: TOST p = {test['tost_p']:.3g} < {level:.3g}; "
                              f"{interval}")
    mde = detectable_effect(test["sd"], n, level)
    needed = seeds_needed(test["sd"], min_effect, level)
    plan = f"; {needed} seeds would detect {min_effect:g}" if needed else ""
    return "inconclusive", (f"Holm-adjusted p = {adjusted_p:.3g}; {interval} holds 0"
                            f"{' and reaches beyond ±%g' % min_effect if min_effect else ''}; "
                            f"{n} seeds detect only effects of about {mde:.3g} or more (80% power){plan}")


def plan_seeds(sd, seeds, k, alpha, min_effect):
    """The seed planner: for paired-difference sd, the planned seeds and k comparisons, the smallest
    effect detectable with 80% power, the seeds that min_effect needs, and whether the plan falls short."""
    level = family_level(alpha, k)
    mde = detectable_effect(sd, seeds, level)
    needed = seeds_needed(sd, min_effect, level)
    return dict(sd=sd, seeds=seeds, comparisons=k, alpha=alpha, level=level, min_effect=min_effect,
                detectable=mde, seeds_needed=needed, underpowered=bool(needed and needed > seeds))


def describe_plan(plan):
    lines = [f"paired-difference sd {plan['sd']:.4g}, {plan['comparisons']} comparison(s) at family-wise "
             f"alpha {plan['alpha']:g} (each at {plan['level']:.3g}), 80% power:",
             f"  {plan['seeds']} seeds detect effects of about {plan['detectable']:.3g} or more"
             if plan["detectable"] else f"  {plan['seeds']} seeds: too few to detect anything"]
    if plan["min_effect"]:
        lines.append(f"  detecting min_effect {plan['min_effect']:g} needs {plan['seeds_needed']} seeds")
    if plan["underpowered"]:
        lines.append(f"warning: underpowered: {plan['seeds']} planned seeds cannot reliably detect "
                     f"{plan['min_effect']:g}; plan {plan['seeds_needed']} or declare a larger min_effect")
    return "\n".join(lines)
