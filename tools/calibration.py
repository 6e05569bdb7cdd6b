"""Calibration of the verdicts on real runs: a finished true-null suite (suites/calibration_shakespeare.py,
from scratch, one null; suites/calibration_forked_shakespeare.py, forked, a family of four nulls).

    python tools/calibration.py out-suite-calibration_shakespeare --null_keys=ra_pattern,ra_mode   # qq.png beside it
    python tools/calibration.py out-suite-calibration_shakespeare --null_keys=ra_pattern,ra_mode --out=docs/img
    python tools/calibration.py out-suite-calibration_forked_shakespeare --pilot_seeds=8   # sub-suites of 8 seeds

A true null (a variant equal to the baseline in distribution, not run for run) with many seeds
shows what simulation cannot: whether the real paired differences are normal enough for the
paired t (Shapiro-Wilk, and a QQ plot against the normal), whether the sd of a small pilot
predicts the sd the whole suite finds (the planner plans with the pilot's 80% upper bound, so
that bound should cover the observed sd about 80% of the time), and how often the report's own
verdict engine calls a sub-suite of pilot_seeds seeds better or worse (at most alpha).
Every sub-suite of that size is evaluated (random ones when there are more than max_subsets).
A suite whose variants differ from the baseline in anything but the seed and the batch order (data_order)
is refused: its real effects would count as false positives. A difference known to be a null in
distribution (swap_all, a relabelling of W_q and W_k) is named with --null_keys.

The calibration states its own uncertainty. Sub-suites of one suite share seeds, so their verdicts
are not independent trials and a binomial interval over them is several times too narrow: the
rate over all sub-suites is given with the range it takes when the same procedure runs on an
exactly normal null of the same size (null_draws simulated suites: what a correct t-test's rate
does across suites), and beside it the disjoint sub-suites, which are independent but few. At
n = 20, Shapiro-Wilk rarely rejects heavy-tailed data (its pass rate on Student-t(5) samples of the
suite's size is printed): "no evidence against normality" is not evidence of normality.

With several null variants against one baseline (a family, as a report tests k variants), each is
calibrated alone and the family too: the share of sub-suites in which the report's engine (Holm over
the k comparisons) calls any of them, the family-wise false-positive rate, at most alpha if the
statistics are right. Its range on an exactly normal null is simulated with the covariance the
suite's differences show (the shared baseline correlates them), and the disjoint sub-suites give an
independent, exact (Clopper-Pearson) interval.
"""
import itertools
import math
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
from ablation import compare, render, stats, suites  # noqa: E402

OPTIONS = dict(
    pilot_seeds=3,  # the seeds of each sub-suite (a pilot; for a family, the suite size whose rate is asked)
    max_subsets=20000,  # more sub-suites than this: a random sample of them (seeded)
    null_draws=400,  # simulated normal-null suites that give the range of the rate over overlapping sub-suites
    out="",  # where qq.png goes ('' = the suite directory)
    null_keys="",  # 'ra_pattern,ra_mode': keys whose difference is a null in distribution (swap_all: a relabelling)
)
NULL_KEYS = ("data_order",)  # besides the seed: another batch order of the same data is a true null by construction


def subsets(n, size, limit):
    combos = math.comb(n, size)
    if combos <= limit:
        return [list(c) for c in itertools.combinations(range(n), size)]
    rng = np.random.default_rng(0)
    return [sorted(rng.choice(n, size, replace=False).tolist()) for _ in range(limit)]


def called_rates(d, picks, alpha):
    """For each suite in d (..., n): the share of sub-suites (index rows of picks) whose paired t-test
    has p < alpha, the verdict engine's better/worse rule for one comparison; vectorized."""
    from scipy import special
    sub = d[..., np.asarray(picks)]
    m = sub.shape[-1]
    t = sub.mean(-1) / (sub.std(-1, ddof=1) / math.sqrt(m))
    return (2 * special.stdtr(m - 1, -np.abs(t)) < alpha).mean(-1)


def covers(d, picks, pilot_seeds):
    """For each suite in d (..., n): the share of sub-suites whose 80% upper sd bound covers the suite's sd."""
    sub = d[..., np.asarray(picks)]
    upper = stats.sd_upper_bounds(sub.std(-1, ddof=1), [pilot_seeds - 1])
    return (upper >= d.std(-1, ddof=1)[..., None]).mean(-1)


def reading(observed, simulated):
    """Where an observed rate of called sub-suites falls among a correct procedure's rates on simulated
    null suites: their 2.5-97.5 percentile range, and the share calling at least as often (the one-sided
    p of "more false positives than alpha"; the direction the calibration guards against)."""
    simulated = np.asarray(simulated)
    return dict(called_range=[float(np.percentile(simulated, q)) for q in (2.5, 97.5)],
                called_sd=float(simulated.std(ddof=1)), called_share_as_often=float(np.mean(simulated >= observed)))


def placement(c, what):
    """The calibration's sentence on its rate: above the range (too many false positives), below it
    (conservative on this suite), or consistent, with the share of correct suites calling as often."""
    low, high = c["called_range"]
    share = f"{100 * c['called_share_as_often']:.1f}% of the simulated suites call at least as often"
    if c["called_rate"] > high:
        return f"**above** what {what} gives at alpha {100 * c['alpha']:.0f}% ({share}): more false positives than alpha"
    if c["called_rate"] < low:
        return (f"below the range of {what} ({share}): conservative on this suite, not more false positives than "
                f"alpha {100 * c['alpha']:.0f}%")
    return f"consistent with alpha {100 * c['alpha']:.0f}% ({share})"


def null_ranges(n, picks, pilot_seeds, alpha, draws, observed_rate):
    """Where observed_rate falls among the rates of called sub-suites over `draws` exactly normal null
    suites of n seeds (fixed seed), and the 2.5-97.5 percentile range (and sd) of the bound's coverage:
    the uncertainty of a calibration whose sub-suites overlap."""
    from scipy import stats as sps
    rng = np.random.default_rng(0)
    d = rng.normal(size=(draws, n))
    rate, cover = called_rates(d, picks, alpha), covers(d, picks, pilot_seeds)
    heavy = rng.standard_t(5, size=(2000, n))
    passes = float(np.mean([sps.shapiro(x)[1] >= 0.05 for x in heavy]))
    return dict(null_draws=draws, **reading(observed_rate, rate),
                cover_range=[float(np.percentile(cover, q)) for q in (2.5, 97.5)], cover_sd=float(cover.std(ddof=1)),
                shapiro_passes_t5=passes)


def calibrate(diffs, alpha, min_effect, pilot_seeds, limit, draws=400):
    """The numbers of the calibration, from the paired differences of one true-null comparison."""
    from scipy import stats as sps
    d = np.asarray(diffs, dtype=np.float64)
    observed = float(d.std(ddof=1))
    w, p_normal = sps.shapiro(d)
    picks = subsets(len(d), pilot_seeds, limit)
    pilot_sd = np.array([d[i].std(ddof=1) for i in picks])
    upper = np.array([stats.sd_upper_bound(s, pilot_seeds - 1) for s in pilot_sd])
    verdicts = [stats.judge([stats.paired_test(d[i])], alpha, "lower", min_effect)[0]["verdict"] for i in picks]
    called = sum(v.startswith(("better", "worse")) for v in verdicts)
    order = np.random.default_rng(0).permutation(len(d))
    disjoint = [order[i:i + pilot_seeds] for i in range(0, len(d) - pilot_seeds + 1, pilot_seeds)]
    disjoint_called = sum(stats.judge([stats.paired_test(d[i])], alpha, "lower", min_effect)[0]["verdict"]
                          .startswith(("better", "worse")) for i in disjoint)
    return dict(n=len(d), mean=float(d.mean()), sd=observed, shapiro_w=float(w), shapiro_p=float(p_normal),
                subsets=len(picks), pilot_seeds=pilot_seeds,
                pilot_sd_ratio=[float(np.percentile(pilot_sd / observed, q)) for q in (10, 50, 90)],
                upper_covers=float(np.mean(upper >= observed)), sd_confidence=stats.SD_CONFIDENCE,
                called=called, called_rate=called / len(picks), alpha=alpha,
                disjoint=len(disjoint), disjoint_called=disjoint_called,
                disjoint_interval=compare.binomial_interval(disjoint_called, len(disjoint)),
                **null_ranges(len(d), picks, pilot_seeds, alpha, draws, called / len(picks)))


def family_called(d, picks, alpha):
    """For each suite in d (..., k, n): the share of sub-suites in which Holm calls any of the k null
    comparisons (the family rejects anything exactly when its smallest p is below alpha / k); vectorized."""
    from scipy import special
    sub = d[..., np.asarray(picks)]
    m = sub.shape[-1]
    t = sub.mean(-1) / (sub.std(-1, ddof=1) / math.sqrt(m))
    return ((2 * special.stdtr(m - 1, -np.abs(t))).min(-2) < alpha / d.shape[-2]).mean(-1)


def family_calibrate(diffs, alpha, min_effect, sub_seeds, limit, draws=400):
    """The family-wise false-positive rate of k null comparisons against one baseline (diffs: k x n paired
    differences), from the report's engine, with its range on normal nulls of the measured covariance."""
    d = np.asarray(diffs, dtype=np.float64)
    k, n = d.shape
    picks = subsets(n, sub_seeds, limit)
    called = sum(any(v["verdict"].startswith(("better", "worse")) for v in
                     stats.judge([stats.paired_test(row[i]) for row in d], alpha, "lower", min_effect)) for i in picks)
    order = np.random.default_rng(0).permutation(n)
    disjoint = [order[i:i + sub_seeds] for i in range(0, n - sub_seeds + 1, sub_seeds)]
    disjoint_called = sum(any(v["verdict"].startswith(("better", "worse")) for v in
                              stats.judge([stats.paired_test(row[i]) for row in d], alpha, "lower", min_effect))
                          for i in disjoint)
    covariance = np.cov(d)
    null = np.random.default_rng(0).multivariate_normal(np.zeros(k), covariance, size=(draws, n)).transpose(0, 2, 1)
    rate = family_called(null, picks, alpha)
    sd = np.sqrt(np.diag(covariance))
    correlation = covariance / np.outer(sd, sd)
    return dict(k=k, n=n, sub_seeds=sub_seeds, subsets=len(picks), called=called, called_rate=called / len(picks),
                alpha=alpha, null_draws=draws, **reading(called / len(picks), rate), mean_correlation=float(correlation[np.triu_indices(k, 1)].mean()),
                disjoint=len(disjoint), disjoint_called=disjoint_called,
                disjoint_interval=compare.binomial_interval(disjoint_called, len(disjoint)))


def family_markdown(f, name, variants):
    low, high = f["disjoint_interval"]
    pct = lambda x: f"{100 * x:.1f}%"
    return (f"Family of {f['k']} true nulls ({', '.join(f'`{v}`' for v in variants)}) against one baseline, "
            f"{f['n']} paired seeds ({name}); their differences correlate {f['mean_correlation']:.2f} on average "
            f"(the shared baseline). Sub-suites of {f['sub_seeds']} seeds, Holm over the {f['k']} comparisons at "
            f"family-wise alpha {f['alpha']:g} (the report's engine): {f['called']} of {f['subsets']} call at least one "
            f"better or worse, {100 * f['called_rate']:.2f}%. The sub-suites overlap; on exactly normal nulls with "
            f"this covariance the rate of a correct procedure lies in {pct(f['called_range'][0])}-"
            f"{pct(f['called_range'][1])} (95% of {f['null_draws']} simulated suites, sd {100 * f['called_sd']:.1f} "
            f"points), so the rate is " + placement(f, "a correct procedure") + f". The {f['disjoint']} disjoint sub-suites (independent): "
            f"{f['disjoint_called']} called, Clopper-Pearson 95% [{100 * low:.1f}, {100 * high:.1f}]%.")


def qq_plot(diffs, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats as sps
    (theory, ordered), (slope, intercept, _) = sps.probplot(diffs, dist="norm")
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.plot(theory, ordered, "o", label="paired differences")
    ax.plot(theory, slope * np.asarray(theory) + intercept, "-", label="normal fit")
    ax.set(xlabel="normal quantile", ylabel="variant - baseline", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(c, name, variant, plot):
    low, high = c["disjoint_interval"]
    pct = lambda x: f"{100 * x:.1f}%"
    return "\n".join([
        f"True null `{variant}` against the baseline, {c['n']} paired seeds ({name}): mean difference "
        f"{c['mean']:+.4f}, sd {c['sd']:.4f}.", "",
        f"- Normality: Shapiro-Wilk W = {c['shapiro_w']:.3f}, p = {c['shapiro_p']:.3g} "
        + ("(no evidence against normality, which at this size is weak: Shapiro-Wilk passes Student-t(5) "
           f"samples of {c['n']} in {pct(c['shapiro_passes_t5'])} of draws, so it does not show the paired t "
           f"justified; the false-positive rate below is the check that matters)"
           if c["shapiro_p"] >= 0.05 else "(**the differences are not normal**)")
        + f"; QQ plot: `{plot}`.",
        f"- A {c['pilot_seeds']}-seed pilot's sd against the {c['n']}-seed sd, over {c['subsets']} pilots: ratio "
        f"{c['pilot_sd_ratio'][1]:.2f} at the median (10th-90th percentile {c['pilot_sd_ratio'][0]:.2f}-"
        f"{c['pilot_sd_ratio'][2]:.2f}); the planner's {render.pct(c['sd_confidence'])} upper bound covers the "
        f"observed sd in {pct(c['upper_covers'])} of them (nominal {100 * c['sd_confidence']:.0f}%; the pilots "
        f"overlap, so on an exactly normal null this share ranges {pct(c['cover_range'][0])}-"
        f"{pct(c['cover_range'][1])}, sd {100 * c['cover_sd']:.1f} points).",
        f"- Verdicts of {c['pilot_seeds']}-seed sub-suites (the report's engine, alpha {c['alpha']:g}): "
        f"{c['called']} of {c['subsets']} called better or worse, {100 * c['called_rate']:.2f}%. The sub-suites "
        f"share seeds, so this is not {c['subsets']} trials: a correct test on an exactly normal null of "
        f"{c['n']} seeds gives a rate between {pct(c['called_range'][0])} and {pct(c['called_range'][1])} "
        f"(95% of {c['null_draws']} simulated suites, sd {100 * c['called_sd']:.1f} points), so the rate is "
        + placement(c, "a correct test") + f". The {c['disjoint']} disjoint sub-suites (independent): "
        f"{c['disjoint_called']} called, Clopper-Pearson 95% [{100 * low:.1f}, {100 * high:.1f}]%: one suite of "
        f"{c['n']} seeds cannot pin the false-positive rate more finely."])


def real_differences(runs, baseline, vouched):
    """{variant: {key: (value, baseline value)}} of the configs that differ from the baseline's (same seed)
    in more than the seed, the batch order (data_order) and the vouched keys: a variant that is no true null."""
    found = {}
    for (variant, seed), run in runs.items():
        base = runs.get((baseline, seed))
        if variant == baseline or base is None or run["config"] is None or base["config"] is None:
            continue
        diffs = compare.config_differences(run["config"], base["config"], [*NULL_KEYS, *vouched])
        if diffs:
            found.setdefault(variant, {}).update(diffs)
    return found


def main(argv):
    options, dirs = configurator.options_and_paths(argv, OPTIONS, text_keys=("null_keys",))
    if len(dirs) != 1:
        raise configurator.ConfigError("give one finished true-null suite directory (python tools/calibration.py --help)")
    if options["pilot_seeds"] < 2:
        raise configurator.ConfigError(f"--pilot_seeds={options['pilot_seeds']}: a pilot needs at least 2 seeds")
    if options["null_draws"] < 2:
        raise configurator.ConfigError(f"--null_draws={options['null_draws']}: the simulated null suites, >= 2")
    if options["max_subsets"] < 1:
        raise configurator.ConfigError(f"--max_subsets={options['max_subsets']}: the sub-suites to draw, >= 1")
    try:
        suites.check_suite_dir(dirs[0])
    except ValueError as e:
        raise configurator.ConfigError(str(e)) from None
    out = options["out"] or dirs[0]
    if os.path.exists(out) and not os.path.isdir(out):
        raise configurator.ConfigError(f"--out={out} is a file: name a directory for qq.png")
    try:
        suite, runs = suites.load_suite_dir(dirs[0])
    except (ValueError, FileNotFoundError) as e:
        raise configurator.ConfigError(str(e)) from None
    vouched = [k.strip() for k in options["null_keys"].split(",") if k.strip()]
    real = real_differences(runs, suite["baseline"], vouched)
    if real:  # its real effect would be counted as false positives
        variant, diffs = next(iter(real.items()))
        keys = sorted({k for d in real.values() for k in d})
        raise configurator.ConfigError(
            f"{dirs[0]}: {variant} differs from the baseline in "
            f"{', '.join(f'{k}={a!r} (baseline {b!r})' for k, (a, b) in diffs.items())}, not only in batch order "
            f"(data_order) or seed, so it is no true null: calibrate a true-null suite (suites/calibration_*.py), or, "
            f"if that difference is a null in distribution (swap_all's relabelling), pass "
            f"--null_keys={','.join(vouched + keys)}")
    report = compare.compare(dict(suite, looks=None), runs)
    nulls = [n for n in report["variants"] if n != report["baseline"]]
    diffs = {v: report["variants"][v].get("differences") or [] for v in nulls}
    if not nulls or min(len(d) for d in diffs.values()) <= options["pilot_seeds"]:
        raise configurator.ConfigError(f"{dirs[0]}: a calibration needs null variants against the baseline with more "
                                       f"paired seeds than --pilot_seeds={options['pilot_seeds']}")
    if len({len(d) for d in diffs.values()}) != 1:
        raise configurator.ConfigError(f"{dirs[0]}: the null variants have different paired seeds "
                                       f"({', '.join(f'{v} {len(d)}' for v, d in diffs.items())}): finish the suite first")
    os.makedirs(out, exist_ok=True)
    parts = []
    for variant in nulls:
        c = calibrate(diffs[variant], report["alpha"], report["min_effect"], options["pilot_seeds"],
                      options["max_subsets"], options["null_draws"])
        plot = os.path.join(out, "qq.png" if len(nulls) == 1 else f"qq_{variant}.png")
        qq_plot(diffs[variant], plot, f"{variant} - {report['baseline']}, {len(diffs[variant])} seeds")
        parts.append(markdown(c, suite["name"], variant, plot))
    if len(nulls) > 1:
        f = family_calibrate([diffs[v] for v in nulls], report["alpha"], report["min_effect"], options["pilot_seeds"],
                             options["max_subsets"], options["null_draws"])
        parts.append(family_markdown(f, suite["name"], nulls))
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    configurator.run_script(main)
