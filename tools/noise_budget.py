"""The noise budget: where the variance of a paired difference comes from, one finished suite per design.

    python tools/noise_budget.py out-noise-all out-noise-data-fixed out-noise-init-fixed out-suite-ra_shakespeare
    python tools/noise_budget.py out-suite-ra_shakespeare --windows=20,100   # the evaluation windows' share

Each suite directory is one design: runs from scratch with every source of randomness following
the seed, with the data order fixed (data_seed) or the initial weights fixed (init_seed), or forked
from a shared trunk per seed (fork_at). For each design and variant it prints the effect (the mean
paired difference against the suite's baseline) beside the noise (the sd of the paired
differences, with its 95% chi-square interval), and what one seed-hour buys: the effect the
design detects (80% power, paired t at alpha / comparisons) with the seeds its wall time allows
in an hour on the pilot's run slots. Markdown on stdout (docs/ablation.md holds the measured one).

Each sd rests on its seeds - 1 degrees of freedom, so every row after the first also gives its sd as
a ratio to the first row's (same variant), with the 95% F interval of that ratio (valid for rows on
distinct seeds): a row shows that fixing a source changes the noise only when that interval
excludes 1. A row that fixes a source at seed s's value (data_seed=s, init_seed=s) has seed s's runs
in common with a row that fixes nothing: such shared seeds are named under the table.

--windows=20,100 measures the evaluation's own share instead: every run's final checkpoint is
evaluated again on the val windows train.py would use with that many batches, and the paired
differences' sd is given per window count (the rest of the noise is training's).
"""
import math
import os

import numpy as np
import sys
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
import rundir  # noqa: E402
import runtime  # noqa: E402
import tokendata  # noqa: E402
from ablation import compare, plan, render, stats, suites  # noqa: E402

OPTIONS = dict(
    slots=2,  # runs at a time the seed-hour assumes (the cores of the machine that ran the suites)
    hour_s=3600.0,  # the wall-clock budget of the last column, in seconds
    windows="",  # '20,100': re-evaluate the final checkpoints on that many val batches each (the evaluation's share)
)


def sources(runs):
    """What varies from seed to seed in a suite's runs, in words."""
    configs = [r["config"] for r in runs.values() if r["config"]]
    fixed = [f"{source} fixed ({key}={configs[0][key]})" for source, key in
             (("initial weights", "init_seed"), ("data order", "data_seed"))
             if configs and all(c.get(key, -1) >= 0 and c[key] == configs[0][key] for c in configs)]
    return ", ".join(fixed) or "every source follows the seed"


def sd_interval(sd, df, confidence=0.95):
    from scipy import stats as sps
    tail = (1 - confidence) / 2
    return sd * math.sqrt(df / sps.chi2.ppf(1 - tail, df)), sd * math.sqrt(df / sps.chi2.ppf(tail, df))


def ratio_interval(sd, df, first_sd, first_df, confidence=0.95):
    """The 95% interval of sd / first_sd for two independent sd estimates (F distribution)."""
    from scipy import stats as sps
    tail = (1 - confidence) / 2
    ratio = (sd / first_sd) ** 2
    return (math.sqrt(ratio / sps.f.ppf(1 - tail, df, first_df)), math.sqrt(ratio / sps.f.ppf(tail, df, first_df)))


def shared_seeds(designs):
    """Lines naming the seeds whose runs two designs share: a design that fixes data_seed or init_seed
    at v runs seed v exactly as a design that fixes nothing (every source follows the seed)."""
    lines = []
    free = [d for d in designs if not d["fixed"]]
    for d in designs:
        for key, value in d["fixed"].items():
            for other in free:
                if value in d["seeds"] and value in other["seeds"]:
                    lines.append(f"- seed {value} of {d['dir']} ({key}={value}) is the same pair of runs as seed "
                                 f"{value} of {other['dir']}: the rows are not independent there; use seeds other "
                                 f"than the fixed value")
    return lines


def rows(suite_dir, options):
    suite, runs = suites.load_suite_dir(suite_dir)
    report = compare.compare(dict(suite, looks=None), runs)
    k, level = report["comparisons"], report["level"]
    design = render.design_text(report).split(":")[0]
    cost = plan.seed_cost(suite_dir, runs, len(report["variants"]))
    per_hour = int(options["hour_s"] * options["slots"] // cost[0]) if cost else 0
    out, meta = [], []
    for name, v in report["variants"].items():
        diffs = v.get("differences") or []
        if name == report["baseline"] or len(diffs) < 2:
            continue
        sd, n = float(np.std(diffs, ddof=1)), len(diffs)
        low, high = sd_interval(sd, n - 1) if sd else (0.0, 0.0)
        hour = stats.detectable_effect(sd, per_hour, level) if per_hour >= 2 else None
        out.append([f"{design}; {sources(runs)}", name, str(n), f"{np.mean(diffs):+.3g}", f"{sd:.3g}",
                    f"[{low:.3g}, {high:.3g}]", f"{cost[0]:.0f}" if cost else "-",
                    f"{hour:.3g} ({per_hour} seeds)" if hour else "-"])
        meta.append((name, sd, n - 1))
    configs = [r["config"] for r in runs.values() if r["config"]]
    fixed = {key: configs[0][key] for key in ("init_seed", "data_seed")
             if configs and all(c.get(key, -1) >= 0 and c[key] == configs[0][key] for c in configs)}
    seeds = sorted({s for seeds in suite["variants"].values() for s in seeds})
    return out, k, dict(meta=meta, fixed=fixed, seeds=seeds, dir=suite_dir)


@torch.no_grad()
def val_loss(out_dir, batches):
    """A run's final checkpoint on `batches` val batches of train.py's evaluation windows."""
    ckpt = rundir.load_checkpoint_file(os.path.join(out_dir, rundir.CHECKPOINT_FILE))
    cfg = ckpt["config"]
    model = runtime.build_model(cfg, ckpt).eval()
    data_dir, counts = tokendata.check_data(cfg)
    losses = [model(*tokendata.get_batch(data_dir, "val", offsets, cfg["block_size"], "cpu"))[1].item()
              for offsets in tokendata.eval_offsets(cfg, counts["val"], batches)]
    return float(np.mean(losses))


def window_rows(suite_dir, counts):
    """Per variant and window count: the sd of the paired differences of the re-evaluated checkpoints."""
    suite, runs = suites.load_suite_dir(suite_dir)
    out = []
    for variant, seeds in suite["variants"].items():
        if variant == suite["baseline"]:
            continue
        paired = [s for s in seeds if s in suite["variants"][suite["baseline"]]]
        for batches in counts:
            diffs = [val_loss(runs[(variant, s)]["out_dir"], batches) - val_loss(runs[(suite["baseline"], s)]["out_dir"],
                                                                                 batches) for s in paired]
            out.append([variant, str(batches), str(len(diffs)), f"{np.mean(diffs):+.3g}",
                        f"{np.std(diffs, ddof=1):.3g}" if len(diffs) > 1 else "-"])
    return out


def main(argv):
    options, dirs = configurator.options_and_paths(argv, OPTIONS, text_keys=("windows",))
    if not dirs:
        raise configurator.ConfigError("give one finished suite directory per design (python tools/noise_budget.py --help)")
    if options["slots"] < 1 or options["hour_s"] <= 0:
        raise configurator.ConfigError(f"--slots={options['slots']} and --hour_s={options['hour_s']}: runs at a time "
                                       f"(>= 1) and a budget in seconds (> 0)")
    counts = [c.strip() for c in str(options["windows"]).split(",")] if options["windows"] else []
    if not all(c.isdigit() and int(c) >= 1 for c in counts):
        raise configurator.ConfigError(f"--windows={options['windows']!r}: val batch counts >= 1, comma-separated "
                                       f"(e.g. 20,100)")
    for d in dirs:
        try:
            suites.check_suite_dir(d)
        except ValueError as e:
            raise configurator.ConfigError(str(e)) from None
    if counts:
        counts = [int(c) for c in counts]
        header = ["variant", "val batches", "seeds", "effect (mean diff)", "sd of paired diffs"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for d in dirs:
            lines += ["| " + " | ".join(r) + " |" for r in window_rows(d, counts)]
        print("\n".join(lines))
        return 0
    header = ["design", "variant", "seeds", "effect (mean diff)", "sd of paired diffs", "sd 95% interval",
              "sd / first row's (95%)", "wall s per seed",
              f"detectable in {options['hour_s'] / 60:.0f} min on {options['slots']} slots"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    first, designs = {}, []
    for d in dirs:
        try:
            found, _, design = rows(d, options)
        except ValueError as e:
            raise configurator.ConfigError(str(e)) from None
        if not found:
            raise configurator.ConfigError(f"{d}: no variant has two paired seeds that finished against the baseline: "
                                           f"nothing to measure yet (run the suite to its end)")
        designs.append(design)
        for row, (name, sd, df) in zip(found, design["meta"]):
            ratio = "-"
            if name in first and sd and first[name][0]:
                low, high = ratio_interval(sd, df, *first[name])
                ratio = f"{sd / first[name][0]:.2f} [{low:.2f}, {high:.2f}]"
            first.setdefault(name, (sd, df))
            lines.append("| " + " | ".join(row[:6] + [ratio] + row[6:]) + " |")
    shared = shared_seeds(designs)
    print("\n".join(lines + (["", "Seeds shared between rows:", *shared] if shared else [])))
    return 0


if __name__ == "__main__":
    configurator.run_script(main)
