"""Calibrate a suite's declared analysis by simulation: family-wise false positives under heteroscedastic
nulls, and the detectable effect at several seed counts.

    python tools/calibrate_analysis.py                      # docs/ablation.md holds its output
    python tools/calibrate_analysis.py --tables=1000 --power_tables=300   # quicker, rougher

Each simulated table is one from-scratch suite: 5 arms (the baseline first) x n seeds (--seeds, 3, 5 and 8), a
seed effect shared by
the arms of a seed (sd 0.0048) and each arm's own noise. The arms' sds are the flagship's measured ones
(reports/ra_shakespeare: baseline 0.0124, variants 0.0073-0.0105), then the baseline twice as noisy as the
variants, then all equal. Under each null it prints the share of tables in which any variant is called better
or worse (family-wise rate, with its Monte Carlo standard error) for:
- paired-Holm: each variant's paired t on n - 1 df, Holm over the 4 (the analysis of suites declared before
  the `analysis` key);
- pooled Dunnett: the blocked table's residual pooled over all arms ((K - 1)(n - 1) df), correlation 1/2;
- check-then-choose: Bartlett on the block-adjusted residuals, pooled Dunnett when it passes, else blocked;
- blocked, multivariate t: the blocked analysis's earlier form, its critical value from a multivariate t on the
  smallest Welch-Satterthwaite df at the fitted variances alone (stats.multivariate_t_rejects);
- blocked (declared): ablation/stats.blocked_test, the default `analysis` of a new suite (the larger of that
  critical value and a parametric bootstrap's at the fitted variances).
Then, at the flagship's sds, the effect each analysis detects with 80% power at 5, 8, 10 and 18 seeds (the
planner's answers: paired-Holm at Holm's first step alpha/k on the noisiest variant's paired sd; pooled Dunnett
on the pooled sd with (K - 1)(n - 1) df; blocked from stats.blocked_detectable, its own df and critical value),
and the blocked analysis's simulated power at its planned effect (placed in the noisiest variant).

Then the sequential blocked analysis (a suite's `stop_decided`, ablation/stats.py), over --looks with O'Brien-Fleming
-type spending and min_effect 0.01: under the flagship's null and the baseline-doubled one, the share of tables in
which any variant is called better or worse at any look (beside the fixed blocked analysis at the last look's seeds,
on the same tables), and under a non-null with arms decided early, the share in which every variant's final
interval covers its true effect, with the seeds each variant ran. --sequential_only=True prints only this part;
--stop_half_width=W stops a decided arm only when its interval is at most ±W wide (a suite's stop_half_width).

    python tools/calibrate_analysis.py --sequential_only=True      # docs/ablation.md, Sequential seeds
    python tools/calibrate_analysis.py --sequential_only=True --looks=8,16,32 --stop_half_width=0.01  # the long suite
"""
import math
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
from ablation import compare, stats  # noqa: E402

OPTIONS = dict(
    tables=3000,  # simulated tables per null
    power_tables=1000,  # simulated tables per seed count for the power check
    seeds="3,5,8",  # seeds per table under the nulls, one row per count
    alpha=0.05,  # family-wise level
    seed=2026,  # the simulation's random seed
    looks="3,5,8",  # the sequential analysis's planned looks (seed counts)
    sequential_tables=2000,  # simulated tables per row of the sequential analysis
    draws=5000,  # Monte Carlo draws of the largest |t| per blocked analysis (a suite's report uses 20,000)
    sequential_only=False,  # print only the sequential analysis's calibration
    stop_half_width=0.0,  # the sequential analysis's stop_half_width (0: a decided arm stops however wide)
)
SEQUENTIAL_MIN_EFFECT = 0.01  # the flagship's margin
EARLY_EFFECTS = [0.06, 0.03, 0.005, 0.0]  # a non-null: the first arms decided early, the last two run on
FLAGSHIP = [0.0124, 0.0073, 0.0085, 0.0095, 0.0105]  # reports/ra_shakespeare: each arm's seed-to-seed sd
SEED_SD = 0.0048  # the flagship's seed effect
VARIANT_MEAN = float(np.mean(FLAGSHIP[1:]))
NULLS = {"flagship sds": FLAGSHIP, "baseline sd twice the variants'": [2 * VARIANT_MEAN] + [VARIANT_MEAN] * 4,
         "equal sds": [float(np.sqrt(np.mean(np.square(FLAGSHIP))))] * 5}
ANALYSES = {"paired-Holm": stats.paired_holm_rejects, "pooled Dunnett": stats.pooled_dunnett_rejects,
            "check-then-choose": stats.equal_variance_check_rejects,
            "blocked, multivariate t": stats.multivariate_t_rejects, "blocked (declared)": stats.blocked_rejects}
DRAWN = ("check-then-choose", "blocked, multivariate t", "blocked (declared)")  # take --draws
SEED_COUNTS = (5, 8, 10, 18)


def null_rows(options, seed_counts, rng):
    rows = []
    for null, sds in NULLS.items():
        for n in seed_counts:
            y = stats.simulate_tables(sds, SEED_SD, n, options["tables"], rng)
            rates = [stats.family_rate(reject(y, options["alpha"], draws=options["draws"]) if name in DRAWN
                                       else reject(y, options["alpha"])) for name, reject in ANALYSES.items()]
            rows.append(f"| {null} ({', '.join(f'{s:.4g}' for s in sds)}) | {n} | "
                        + " | ".join(f"{100 * r:.1f}% ± {100 * e:.1f}" for r, e in rates) + " |")
    return rows


def pooled_detectable(sds, n, alpha):
    """The pooled Dunnett's detectable effect when its pooled sd is the arms' root mean square (its own view)."""
    from scipy import stats as st
    from scipy.optimize import brentq
    K, df = len(sds), (len(sds) - 1) * (n - 1)
    R = np.full((K - 1, K - 1), 0.5)
    np.fill_diagonal(R, 1.0)
    critical = float(np.quantile(stats.max_abs_t(R, df), 1 - alpha))
    sd = math.sqrt(2 * np.mean(np.square(sds)))
    power = lambda e: st.nct.sf(critical, df, e * math.sqrt(n) / sd) + st.nct.sf(critical, df, -e * math.sqrt(n) / sd)
    return brentq(lambda e: power(e) - stats.POWER, 0.0, 10 * sd)


def power_rows(options, rng):
    rows = []
    k, alpha = len(FLAGSHIP) - 1, options["alpha"]
    paired_sd = math.sqrt(FLAGSHIP[0] ** 2 + max(FLAGSHIP[1:]) ** 2)
    for n in SEED_COUNTS:
        blocked = stats.blocked_detectable(FLAGSHIP, n, alpha)
        _, _, df, critical = stats.blocked_design(FLAGSHIP, n, alpha)
        effects = np.zeros(k)
        effects[int(np.argmax(blocked))] = max(blocked)
        y = stats.simulate_tables(FLAGSHIP, SEED_SD, n, options["power_tables"], rng, effects)
        found = stats.blocked_rejects(y, alpha, options["draws"])[:, int(np.argmax(blocked))]
        power = float(found.mean())
        rows.append(f"| {n} | {stats.detectable_effect(paired_sd, n, alpha / k):.4f} | "
                    f"{pooled_detectable(FLAGSHIP, n, alpha):.4f} | {min(blocked):.4f}-{max(blocked):.4f} | "
                    f"{df:.3g}, {critical:.3f} | {100 * power:.1f}% ± {100 * math.sqrt(power * (1 - power) / len(y)):.1f} |")
    return rows


def sequential_rows(options, looks, rng):
    """Rows of the sequential analysis's calibration: per scenario its rates with their Monte Carlo se."""
    alpha, tables, draws = options["alpha"], options["sequential_tables"], options["draws"]
    levels = compare.spent_per_look(looks, alpha)
    se = lambda rate: math.sqrt(rate * (1 - rate) / tables)
    cell = lambda rate: f"{100 * rate:.1f}% ± {100 * se(rate):.1f}"
    rows = []
    for null, effects in [("flagship sds, null", None), ("baseline sd twice the variants', null", None),
                          (f"flagship sds, effects {EARLY_EFFECTS}", EARLY_EFFECTS)]:
        sds = NULLS["baseline sd twice the variants'"] if "twice" in null else FLAGSHIP
        y = stats.simulate_tables(sds, SEED_SD, looks[-1], tables, rng, effects)
        called, covered, seeds = stats.simulate_sequential(y, looks, levels, SEQUENTIAL_MIN_EFFECT, effects, draws,
                                                           options["stop_half_width"] or None)
        fixed = cell(stats.family_rate(stats.blocked_rejects(y, alpha, draws))[0]) if effects is None else "-"
        rows.append(f"| {null} | {fixed} | {cell(float(called.mean())) if effects is None else '-'} | "
                    f"{cell(float(covered.mean()))} | {', '.join(f'{m:.2f}' for m in seeds.mean(axis=0))} |")
    return rows


def sequential_lines(options, looks, rng):
    levels = compare.spent_per_look(looks, options["alpha"])
    return [f"Sequential blocked analysis (stop_decided), looks at {looks} seeds, alpha spent per look "
            f"{', '.join(f'{a:.4g}' for a in levels)} (O'Brien-Fleming type), min_effect {SEQUENTIAL_MIN_EFFECT}, "
            + (f"stop_half_width {options['stop_half_width']:g}, " if options["stop_half_width"] else "") +
            f"{options['sequential_tables']} tables per row, {options['draws']} draws of the largest |t| "
            f"per look (± one Monte Carlo se):", "",
            f"| arm sds, truth | fixed blocked at {looks[-1]} seeds: any called | sequential: any called at any look "
            f"| every final interval covers | seeds run per variant (mean) |", "|---|---|---|---|---|",
            *sequential_rows(options, looks, rng)]


def seed_list(options, key):
    """The increasing seed counts of a comma-separated option (--looks, --seeds)."""
    counts = [int(n) for n in options[key].split(",") if n.strip().isdigit()]
    if len(counts) != len(options[key].split(",")) or counts != sorted(set(counts)) or counts[0] < stats.MIN_SEEDS:
        raise configurator.ConfigError(f"--{key}={options[key]!r}: increasing seed counts >= {stats.MIN_SEEDS}, "
                                       f"comma-separated, e.g. 3,5,8")
    return counts


def main(argv):
    options, paths = configurator.options_and_paths(argv, OPTIONS, text_keys=("looks", "seeds"))
    looks, seed_counts = seed_list(options, "looks"), seed_list(options, "seeds")
    if paths or options["tables"] < 100 or options["power_tables"] < 100 or not 0 < options["alpha"] < 1 \
            or options["sequential_tables"] < 100 or options["draws"] < 1000 or options["stop_half_width"] < 0:
        raise configurator.ConfigError("--tables, --power_tables and --sequential_tables >= 100, --draws >= 1000, "
                                       "--alpha in (0, 1), --stop_half_width >= 0; no paths "
                                       "(python tools/calibrate_analysis.py --help)")
    rng, start = np.random.default_rng(options["seed"]), time.time()
    if options["sequential_only"]:
        print("\n".join([*sequential_lines(options, looks, rng), "", f"({time.time() - start:.0f} s; seed "
                                                                       f"{options['seed']})"]))
        return
    lines = [f"Family-wise false-positive rate under the null, 5 arms x {seed_counts} seeds, seed effect sd {SEED_SD}, "
             f"alpha {options['alpha']:g}, {options['tables']} tables per null and seed count, {options['draws']} draws "
             f"of the largest |t| per blocked analysis (± one Monte Carlo se):", "",
             "| null (arm sds, baseline first) | seeds | " + " | ".join(ANALYSES) + " |",
             "|---" * (len(ANALYSES) + 2) + "|", *null_rows(options, seed_counts, rng), "",
             f"Detectable effect (80% power, family-wise alpha {options['alpha']:g}) at the flagship's sds, and the "
             f"blocked analysis's simulated power at its planned effect in the noisiest variant "
             f"({options['power_tables']} tables per row):", "",
             "| seeds | paired-Holm | pooled Dunnett (pooled sd) | blocked (declared), per variant | blocked df, critical |t| "
             "| blocked power at its planned effect |", "|---|---|---|---|---|---|", *power_rows(options, rng), "",
             *sequential_lines(options, looks, rng), "", f"({time.time() - start:.0f} s; seed {options['seed']})"]
    print("\n".join(lines))


if __name__ == "__main__":
    configurator.run_script(main)
