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
import glob
import math
import os
import re

import numpy as np

import rundir

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


def plan_lines(ladder, n_seeds, k):
    """sweep.py --plan for a ladder: its span in e-folds of N, the steps at every size, and the slope it
    can detect at 80% power from the paired-difference sd it declares (ladder['sd'], from a pilot)."""
    from ablation.ladder import non_embedding_params, rule_factor
    params = [non_embedding_params(s) for s in ladder["sizes"].values()]
    x = np.log(params)
    reference = ladder["sizes"][ladder["reference"]]
    steps = {name: rule_factor(ladder["tokens"], s, reference) for name, s in ladder["sizes"].items()}
    level = ladder["alpha"] / max(1, k)
    lines = [f"ladder: {len(params)} sizes spanning {np.ptp(x):.2f} e-folds of N ({min(params):,} to {max(params):,}); "
             + ("the same optimizer steps at every size (tokens fixed: does the effect at this budget change with N?)"
                if all(abs(f - 1) < 1e-12 for f in steps.values()) else
                "steps x " + ", ".join(f"{n} {f:.3g}" for n, f in steps.items()) + " of the recipe's (size confounded "
                "with training length)")
             + f"; interval no further than N = {extrapolation_limit(params):,.0f} (one ladder width past the largest)"]
    sd = ladder.get("sd")
    if sd:
        found = detectable_slope(x, [sd] * len(x), n_seeds, level)
        lines.append(f"  trend test at level {level:.3g} ({ladder['alpha']:g} over {k} variants), {n_seeds} seeds per "
                     f"size, paired-difference sd {sd:g} at every size (declared): 80% power at a slope of "
                     + (f"{found:.3g} nats per e-fold of N ({found * np.ptp(x):.3g} across the ladder), simulated"
                        if found else "none within reach"))
    else:
        lines.append("  no ladder sd declared (ladder['sd'], a pilot's paired-difference sd): no detectable slope to plan")
    return lines


def lr_check(suite_dir, declared):
    """The ladder's learning-rate checks (sweep.py lr_check_points) as found in suite_dir: per checked size
    the metric of each factor's run at its last evaluation, the best factor, and whether the rule's 1x
    holds (not beaten by more than min_effect, or at all without one). None without checks."""
    factors = (declared.get("ladder") or {}).get("lr_check")
    if not factors:
        return None
    from ablation import compare
    event, field, goal = compare.METRICS[declared["metric"]]
    margin = declared.get("min_effect") or 0.0
    sizes = {}
    for size in declared["ladder"]["sizes"]:
        values = {}
        for path in sorted(glob.glob(os.path.join(suite_dir, size, "lrcheck-x*-seed*"))):
            events = rundir.read_events(path)
            evals = [e[field] for e in events if e["event"] == event and field in e]
            if rundir.run_status(events) == "finished" and evals:
                values[re.match(r"lrcheck-x([\d.e+-]+)-seed", os.path.basename(path)).group(1)] = evals[-1]
        if not values:
            continue
        sign = 1 if goal == "lower" else -1
        best = min(values, key=lambda f: sign * values[f])
        one = values.get("1")
        holds = "-" if one is None else "yes" if sign * (one - values[best]) <= margin else (
            f"no: {best}x is better by {abs(one - values[best]):.3g}")
        sizes[size] = dict(values=values, best=f"{best}x", holds=holds)
    return dict(factors=[1.0, *factors], sizes=sizes, margin=margin)


PEAK_FLOPS, MFU = 989e12, 0.4  # an H100's dense bf16 peak; the model-FLOPs utilization the estimate assumes


def compute_lines(run_cfgs, fork_at=None):
    """sweep.py --plan for a ladder: the training compute of its runs, 6 N D with N the non-embedding
    parameters (Kaplan et al. 2020) and D the tokens each run trains (a branch from its fork on, a
    trunk to it), and the GPU-hours that is at MFU of an H100's peak (an assumption, stated)."""
    from ablation.ladder import non_embedding_params
    by_size, total = {}, 0.0
    for cfg in run_cfgs:
        iters = cfg["max_iters"] - (fork_at if cfg.get("fork_from") and fork_at else 0)  # a branch trains from its fork
        flops = 6 * non_embedding_params(cfg) * iters * cfg["tokens_per_iter"]
        key = f"n_layer={cfg['n_layer']}, n_embd={cfg['n_embd']}"
        by_size[key] = by_size.get(key, 0.0) + flops
        total += flops
    hours = lambda f: f / (MFU * PEAK_FLOPS) / 3600
    return [f"compute (6 N D, non-embedding N): {total:.3g} FLOPs, about {hours(total):,.0f} H100 GPU-hours at "
            f"{MFU:.0%} MFU of {PEAK_FLOPS / 1e12:.0f} TFLOP/s (assumed; time a pilot for the real rate): "
            + "; ".join(f"{k}: {hours(f):,.0f} h" for k, f in by_size.items())]
