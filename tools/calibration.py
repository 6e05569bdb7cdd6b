"""Calibration of the verdicts on real runs: a finished true-null suite (suites/calibration_shakespeare.py).

    python tools/calibration.py out-suite-calibration_shakespeare            # markdown on stdout, qq.png beside it
    python tools/calibration.py out-suite-calibration_shakespeare --pilot_seeds=3 --out=docs/img

A true null (a variant equal to the baseline in distribution, not run for run) with many seeds
shows what simulation cannot: whether the real paired differences are normal enough for the
paired t (Shapiro-Wilk, and a QQ plot against the normal), whether the sd of a small pilot
predicts the sd the whole suite finds (the planner plans with the pilot's 80% upper bound, so
that bound should cover the observed sd about 80% of the time), and how often the report's own
verdict engine calls a sub-suite of pilot_seeds seeds better or worse (at most alpha).
Every sub-suite of that size is evaluated (random ones when there are more than max_subsets).
"""
import itertools
import math
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
from ablation import compare, stats, suites  # noqa: E402

OPTIONS = dict(
    pilot_seeds=3,  # the seeds of each sub-suite (a pilot)
    max_subsets=20000,  # more sub-suites than this: a random sample of them (seeded)
    out="",  # where qq.png goes ('' = the suite directory)
)


def subsets(n, size, limit):
    combos = math.comb(n, size)
    if combos <= limit:
        return [list(c) for c in itertools.combinations(range(n), size)]
    rng = np.random.default_rng(0)
    return [sorted(rng.choice(n, size, replace=False).tolist()) for _ in range(limit)]


def calibrate(diffs, alpha, min_effect, pilot_seeds, limit):
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
    return dict(n=len(d), mean=float(d.mean()), sd=observed, shapiro_w=float(w), shapiro_p=float(p_normal),
                subsets=len(picks), pilot_seeds=pilot_seeds,
                pilot_sd_ratio=[float(np.percentile(pilot_sd / observed, q)) for q in (10, 50, 90)],
                upper_covers=float(np.mean(upper >= observed)), sd_confidence=stats.SD_CONFIDENCE,
                called=called, called_rate=called / len(picks),
                called_interval=compare.binomial_interval(called, len(picks)), alpha=alpha)


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
    low, high = c["called_interval"]
    return "\n".join([
        f"True null `{variant}` against the baseline, {c['n']} paired seeds ({name}): mean difference "
        f"{c['mean']:+.4f}, sd {c['sd']:.4f}.", "",
        f"- Normality: Shapiro-Wilk W = {c['shapiro_w']:.3f}, p = {c['shapiro_p']:.3g} "
        + ("(no evidence against normality)" if c["shapiro_p"] >= 0.05 else "(**the differences are not normal**)")
        + f"; QQ plot: `{plot}`.",
        f"- A {c['pilot_seeds']}-seed pilot's sd against the {c['n']}-seed sd, over {c['subsets']} pilots: ratio "
        f"{c['pilot_sd_ratio'][1]:.2f} at the median (10th-90th percentile {c['pilot_sd_ratio'][0]:.2f}-"
        f"{c['pilot_sd_ratio'][2]:.2f}); the planner's {stats.pct(c['sd_confidence'])} upper bound covers the "
        f"observed sd in {100 * c['upper_covers']:.1f}% of them (nominal {100 * c['sd_confidence']:.0f}%).",
        f"- Verdicts of {c['pilot_seeds']}-seed sub-suites (the report's engine, alpha {c['alpha']:g}): "
        f"{c['called']} of {c['subsets']} called better or worse, {100 * c['called_rate']:.2f}% "
        f"[{100 * low:.2f}, {100 * high:.2f}] (95%; sub-suites share seeds, so the interval is optimistic), "
        f"against alpha {100 * c['alpha']:.0f}%."])


def main(argv):
    options, dirs = configurator.options_and_paths(argv, OPTIONS)
    if len(dirs) != 1:
        raise configurator.ConfigError("give one finished true-null suite directory (python tools/calibration.py --help)")
    if options["pilot_seeds"] < 2:
        raise configurator.ConfigError(f"--pilot_seeds={options['pilot_seeds']}: a pilot needs at least 2 seeds")
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
    report = compare.compare(dict(suite, looks=None), runs)
    others = [n for n in report["variants"] if n != report["baseline"]]
    if len(others) != 1 or len(report["variants"][others[0]].get("differences") or []) <= options["pilot_seeds"]:
        raise configurator.ConfigError(f"{dirs[0]}: a calibration needs one variant against the baseline with more "
                                       f"paired seeds than --pilot_seeds={options['pilot_seeds']}")
    diffs = report["variants"][others[0]]["differences"]
    c = calibrate(diffs, report["alpha"], report["min_effect"], options["pilot_seeds"], options["max_subsets"])
    os.makedirs(out, exist_ok=True)
    plot = os.path.join(out, "qq.png")
    qq_plot(diffs, plot, f"{others[0]} - {report['baseline']}, {len(diffs)} seeds")
    print(markdown(c, suite["name"], others[0], plot))
    return 0


if __name__ == "__main__":
    configurator.run_script(main)
