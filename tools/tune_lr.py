"""The learning rate of a suite's recipe, tuned: the baseline from scratch on a geometric grid of rates
that brackets the best one, on seeds no comparison uses, then every variant at 0.5x, 1x and 2x of it.

    python tools/tune_lr.py suites/ra_shakespeare.py --seeds=903,904,905 --factors=0.5,1,2 --check_seeds=903,904 \
        --write=config/ra_shakespeare_scratch.py --out=reports/tune_ra_shakespeare_scratch

The baseline's rate (and min_lr in proportion) starts on `factors` times the recipe's own rate; while
the best rate sits at an edge of the grid, the grid grows by one `step` in that direction (at most
`max_points` rates), so the best is never a point whose neighbour on the far side was left untried.
Once bracketed, the grid is refined `refine` times around the best rate (the geometric midpoints on
either side, the step's square root each time), so the chosen rate is not a factor-2 guess. The best
rate is, by default (`rule='one_se'`), the lowest rate whose mean is within one standard error of the
lowest mean (the se of their per-seed differences: every rate trains on the same seeds), Breiman's
one-standard-error rule: where the loss is flat within noise over a range of rates, the chosen one is
the farthest from the divergence above, whose runs are the noisiest. `rule='lowest_mean'` takes the
lowest mean itself. Each
variant then trains at 0.5x, 1x and 2x of that rate on the same seeds: a variant whose own best is
not 1x is named (an idea can move the best rate), and a suite's "same rate" answer may understate it.

--write rewrites the `learning_rate` and `min_lr` lines of the recipe file the suite reads, and
tuning.json / tuning.md (in --out) hold the grid, seeds, every run's value, the best, the date and
commit: a suite that declares `tuning = "<that tuning.json>"` carries it into its report's header.
Runs go to --sweep_dir (finished ones are reused, so a stopped tuning resumes).
"""
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
import rundir  # noqa: E402
import runrecord  # noqa: E402
import runtime  # noqa: E402
from ablation import compare, suites  # noqa: E402

OPTIONS = dict(
    seeds="901,902",  # the tuning seeds: at least 2, none of them a seed a comparison uses
    factors="1,2,4",  # the first grid, as multiples of the recipe's own learning rate
    step=2.0,  # the grid's ratio between neighbouring rates (an edge extends the grid by one step)
    max_points=8,  # the most baseline rates tried before giving up on bracketing
    rule="one_se",  # 'one_se': the lowest rate within one paired standard error of the lowest mean; 'lowest_mean'
    refine=1,  # times the bracketed grid is refined around the best rate (midpoints at the step's square root)
    variants=True,  # also run every variant at 0.5x, 1x and 2x of the baseline's best rate
    check_seeds="",  # the seeds of that check, some of the tuning seeds ('' = all of them; fewer cost fewer runs)
    write="",  # the recipe file whose learning_rate and min_lr lines get the tuned values ('' = none)
    out="",  # where tuning.json and tuning.md go ('' = the sweep directory)
    sweep_dir="",  # the runs ('' = out-tune-<suite>)
    cpu_runs=2,  # runs at a time, each with its share of the cores
)
CHECK_FACTORS = (0.5, 1.0, 2.0)  # each variant around the baseline's best rate


def rate_text(lr):
    return f"{lr:.3g}"


def run_dir(sweep_dir, variant, lr, seed):
    return os.path.join(sweep_dir, f"{variant}-lr{rate_text(lr)}-seed{seed}")


def final_value(out_dir, metric):
    """The metric at a finished run's last evaluation; inf for a diverged run (worse than any rate
    that trained), None while the run is missing or unfinished."""
    events = rundir.read_events(out_dir)
    status = rundir.run_status(events)
    if status == "diverged":
        return math.inf
    if status != "finished":
        return None
    values = compare.metric_by_tokens(dict(events=events), metric)
    return values[max(values)] if values else None


def train_argv(body, lr, ratio, seed, out_dir):
    return [*body["config"], *(f"--{k}={v!r}" for k, v in body.items() if k != "config"),
            f"--learning_rate={lr!r}", f"--min_lr={lr * ratio!r}", f"--seed={seed}", f"--out_dir={out_dir}",
            "--lr_tuning=''", "--wandb_log=False"]


def run_missing(jobs, metric, slots):
    """Train every (argv, out_dir) whose run has no final value yet, `slots` at a time (one thread each
    share of the cores); a run that fails is named and left out, never retried in a loop."""
    todo = [(argv, out) for argv, out in jobs if final_value(out, metric) is None]
    running, failed = [], []
    threads = str(max(1, (os.cpu_count() or 1) // slots))
    while todo or running:
        while todo and len(running) < slots:
            argv, out = todo.pop(0)
            os.makedirs(out, exist_ok=True)
            log = open(os.path.join(out, "console.log"), "a")
            env = dict(os.environ, OMP_NUM_THREADS=threads)
            print(f"start {out}", flush=True)
            running.append((subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *argv], env=env,
                                             stdout=log, stderr=subprocess.STDOUT, cwd=REPO), out, log))
        time.sleep(1)
        for entry in [r for r in running if r[0].poll() is not None]:
            running.remove(entry)
            entry[2].close()
            if entry[0].returncode != 0 or final_value(entry[1], metric) is None:
                failed.append(entry[1])
                print(f"FAILED {entry[1]} (exit {entry[0].returncode}; see its console.log)", flush=True)
    if failed:
        raise configurator.ConfigError(f"{len(failed)} tuning run(s) failed ({', '.join(failed)}): fix the cause and "
                                       f"run the same command again (finished runs are kept)")


def mean_over_seeds(sweep_dir, variant, lr, seeds, metric):
    values = [final_value(run_dir(sweep_dir, variant, lr, s), metric) for s in seeds]
    return sum(values) / len(values), values


def tune_baseline(suite, base_lr, ratio, options, seeds):
    """Rates tried (ascending) with their mean and per-seed values, the best one's index, and whether the
    best is bracketed. Rates are base_lr * step ** exponent."""
    body, name, metric = suite["variants"][suite["baseline"]], suite["baseline"], suite["metric"]
    step = options["step"]

    def rows_at(exponents):
        rates = [base_lr * step ** e for e in sorted(exponents)]
        run_missing([(train_argv(body, lr, ratio, s, run_dir(options["sweep_dir"], name, lr, s)),
                      run_dir(options["sweep_dir"], name, lr, s)) for lr in rates for s in seeds],
                    metric, options["cpu_runs"])
        rows = [(lr, *mean_over_seeds(options["sweep_dir"], name, lr, seeds, metric)) for lr in rates]
        return rows, min(range(len(rows)), key=lambda i: rows[i][1])

    exponents = sorted({round(math.log(f, step), 6) for f in options["factors"]})
    rows, best = rows_at(exponents)
    while best in (0, len(rows) - 1) and len(exponents) < options["max_points"]:
        print(f"best rate {rate_text(rows[best][0])} at the grid's edge: extending the grid", flush=True)
        exponents = [exponents[0] - 1, *exponents] if best == 0 else [*exponents, exponents[-1] + 1]
        rows, best = rows_at(exponents)
    if best in (0, len(rows) - 1):
        return rows, best, False
    for level in range(1, options["refine"] + 1):
        centre = sorted(exponents)[best]
        exponents = sorted({*exponents, centre - 0.5 ** level, centre + 0.5 ** level})
        rows, best = rows_at(exponents)
    return rows, best, True


def chosen_rate(rows, best, rule):
    """The index of the rate the recipe gets: the lowest mean (`best`) or, under 'one_se', the lowest rate
    whose per-seed differences from the best's have a mean within one standard error of 0."""
    if rule == "lowest_mean":
        return best
    for i, (_, mean, values) in enumerate(rows):
        diffs = [v - b for v, b in zip(values, rows[best][2])]
        if i == best or (math.isfinite(mean) and statistics.mean(diffs) <= statistics.stdev(diffs) / math.sqrt(len(diffs))):
            return i


def check_variants(suite, best_lr, ratio, options, seeds):
    """{variant: [(factor, mean, values)]} at CHECK_FACTORS x the baseline's best rate."""
    metric, jobs, out = suite["metric"], [], {}
    for variant, body in suite["variants"].items():
        if variant == suite["baseline"]:
            continue
        for f in CHECK_FACTORS:
            for s in seeds:
                d = run_dir(options["sweep_dir"], variant, best_lr * f, s)
                jobs.append((train_argv(body, best_lr * f, ratio, s, d), d))
    run_missing(jobs, metric, options["cpu_runs"])
    for variant in suite["variants"]:
        if variant != suite["baseline"]:
            out[variant] = [(f, *mean_over_seeds(options["sweep_dir"], variant, best_lr * f, seeds, metric))
                            for f in CHECK_FACTORS]
    return out


def summary(result):
    """The one line a report header quotes: how the recipe's rate was tuned."""
    rates = [r["lr"] for r in result["grid"]]
    refine = result.get("refine", 0) if result["bracketed"] else 0
    lowest = result.get("lowest_mean_lr", result["best_lr"])
    one_se = (f"; the lowest rate within one standard error of the lowest mean, at {rate_text(lowest)}"
              if not math.isclose(lowest, result["best_lr"]) else "")
    refined = f", refined to x{result['step'] ** 0.5 ** refine:.3g} around the best" if refine else ""
    moved = {v: c["best_factor"] for v, c in result["variants"].items() if c["best_factor"] != 1.0}
    checked = ", ".join(map(str, result.get("check_seeds", result["seeds"])))
    shifted = (f"; variants whose best rate differs (0.5x/1x/2x on seeds {checked}): "
               + ", ".join(f"{v} {f:g}x" for v, f in moved.items()) if moved
               else f"; every variant's best of 0.5x/1x/2x (seeds {checked}) is 1x" if result["variants"] else "")
    return (f"tuned by tools/tune_lr.py on {result['date']} at commit {result['commit'][:10]}: {result['baseline']} "
            f"from scratch on {len(rates)} rates {rate_text(rates[0])}..{rate_text(rates[-1])} (x{result['step']:g}"
            f"{refined}), "
            f"seeds {', '.join(map(str, result['seeds']))}, best {rate_text(result['best_lr'])} "
            f"({'bracketed' if result['bracketed'] else 'NOT bracketed: at the edge of max_points rates'}{one_se})"
            f"{shifted}")


def markdown(result):
    metric = result["metric"]
    lines = [f"# Learning-rate tuning: {result['suite']}", "", summary(result) + ".", "",
             f"Baseline `{result['baseline']}` from scratch, the whole budget; {metric} at each run's last "
             f"evaluation, mean over the tuning seeds (min_lr kept at {result['min_lr_ratio']:g} x the rate).", "",
             "| learning rate | mean " + metric + " | " + " | ".join(f"seed {s}" for s in result["seeds"]) + " |",
             "|---|---|" + "---|" * len(result["seeds"])]
    for row in result["grid"]:
        mark = (" **best**" if row["lr"] == result["best_lr"] else "") + (
            " (lowest mean)" if row["lr"] == result.get("lowest_mean_lr") != result["best_lr"] else "")
        lines.append(f"| {rate_text(row['lr'])}{mark} | {row['mean']:.4f} | "
                     + " | ".join(f"{v:.4f}" for v in row["values"]) + " |")
    if result["variants"]:
        check_seeds = result.get("check_seeds", result["seeds"])
        lines += ["", f"Each variant at 0.5x, 1x and 2x of the baseline's best rate ({rate_text(result['best_lr'])}), "
                      f"on seeds {', '.join(map(str, check_seeds))}: mean {metric} (its difference from the baseline "
                      f"at the same rate on those seeds, where the baseline ran at that rate), and its own best factor.",
                  "", "| variant | 0.5x | 1x | 2x | best factor |", "|---|---|---|---|---|"]
        base = {row["lr"]: statistics.mean(v for s, v in zip(result["seeds"], row["values"]) if s in check_seeds)
                for row in result["grid"]}
        for variant, check in result["variants"].items():
            cells = []
            for point in check["points"]:
                ref = next((m for lr, m in base.items() if math.isclose(lr, point["lr"], rel_tol=1e-9)), None)
                cells.append(f"{point['mean']:.4f}" + (f" ({point['mean'] - ref:+.4f})" if ref is not None else ""))
            lines.append(f"| {variant} | " + " | ".join(cells) + f" | {check['best_factor']:g}x |")
        lines += ["", f"With {len(check_seeds)} seeds per point these are a check of where each arm's best rate "
                      f"lies, not a comparison: the suite's own seeds decide the effects."]
    return "\n".join(lines) + "\n"


def write_recipe(path, lr, min_lr, line):
    """Rewrite the recipe file's learning_rate and min_lr assignments (one each, at top level)."""
    text = open(path).read()
    for key, value in (("learning_rate", lr), ("min_lr", min_lr)):
        pattern = re.compile(rf"^{key} = .*$", re.M)
        if len(pattern.findall(text)) != 1:
            raise configurator.ConfigError(f"--write={path}: it must assign {key} exactly once at the start of a line")
        text = pattern.sub(f"{key} = {float(f'{value:.4g}')!r}", text)
    pattern = re.compile(r"^lr_tuning = .*$", re.M)
    assignment = f"lr_tuning = {line!r}"
    text = pattern.sub(lambda _: assignment, text) if pattern.search(text) else text.rstrip("\n") + "\n" + assignment + "\n"
    with rundir.atomic_write(path, "w") as f:
        f.write(text)


def main(argv):
    options, paths = configurator.options_and_paths(argv, OPTIONS, text_keys=("seeds", "factors", "check_seeds"))
    if len(paths) != 1:
        raise configurator.ConfigError("give one suite file (python tools/tune_lr.py --help)")
    seeds = [s.strip() for s in str(options["seeds"]).split(",")]
    if len(seeds) < 2 or not all(s.isdigit() for s in seeds) or len(set(seeds)) != len(seeds):
        raise configurator.ConfigError(f"--seeds={options['seeds']!r}: at least 2 distinct integers >= 0, comma-separated")
    seeds = [int(s) for s in seeds]
    check_seeds = [int(s) for s in str(options["check_seeds"]).split(",")] if options["check_seeds"] != "" else seeds
    if len(check_seeds) < 2 or len(set(check_seeds)) != len(check_seeds) or not set(check_seeds) <= set(seeds):
        raise configurator.ConfigError(f"--check_seeds={options['check_seeds']!r}: at least 2 distinct tuning seeds")
    try:
        options["factors"] = [float(f) for f in str(options["factors"]).split(",")]
    except ValueError:
        raise configurator.ConfigError(f"--factors={options['factors']!r}: positive numbers, comma-separated") from None
    if not all(f > 0 for f in options["factors"]) or options["step"] <= 1 or options["max_points"] < 3 or options["refine"] < 0:
        raise configurator.ConfigError("--factors must be > 0, --step > 1, --max_points >= 3 and --refine >= 0")
    if options["rule"] not in ("one_se", "lowest_mean"):
        raise configurator.ConfigError(f"--rule={options['rule']!r}: use 'one_se' or 'lowest_mean'")
    path = paths[0]
    namespace = {"__file__": os.path.abspath(path)}
    try:
        exec(compile(open(path).read(), path, "exec"), namespace)
        namespace.pop("tuning", None)  # the suite's own tuning is what this writes, not an input
        suite = suites.read_suite(namespace, os.path.splitext(os.path.basename(path))[0],
                                  os.path.dirname(os.path.abspath(path)), runtime.DEFAULTS)
    except (OSError, SyntaxError) as e:
        raise configurator.ConfigError(f"{path}: {e}") from None
    used = sorted(set(seeds) & set(suite["seeds"] + (suite["bridge_seeds"] or [])))
    if used:
        raise configurator.ConfigError(f"--seeds: {used} are seeds the suite compares on: tune on seeds no comparison uses")
    if options["write"] and not os.path.isfile(options["write"]):
        raise configurator.ConfigError(f"--write={options['write']}: not a file (the recipe file the suite reads)")
    body = suite["variants"][suite["baseline"]]
    recipe = configurator.apply_config(runtime.DEFAULTS, [*body["config"], *(f"--{k}={v!r}" for k, v in body.items()
                                                                             if k != "config")])
    base_lr, ratio = recipe["learning_rate"], recipe["min_lr"] / recipe["learning_rate"]
    options["sweep_dir"] = options["sweep_dir"] or f"out-tune-{suite['name']}"
    out = options["out"] or options["sweep_dir"]
    rows, best, bracketed = tune_baseline(suite, base_lr, ratio, options, seeds)
    chosen = chosen_rate(rows, best, options["rule"])
    best_lr = rows[chosen][0]
    checks = check_variants(suite, best_lr, ratio, options, check_seeds) if options["variants"] else {}
    result = dict(suite=suite["name"], baseline=suite["baseline"], metric=suite["metric"], seeds=seeds, check_seeds=check_seeds,
                  step=options["step"], refine=options["refine"], min_lr_ratio=ratio, recipe_lr=base_lr, best_lr=best_lr,
                  lowest_mean_lr=rows[best][0], rule=options["rule"], bracketed=bracketed,
                  grid=[dict(lr=lr, mean=m, values=v) for lr, m, v in rows],
                  variants={v: dict(points=[dict(factor=f, lr=best_lr * f, mean=m, values=vals) for f, m, vals in c],
                                    best_factor=min(c, key=lambda p: p[1])[0]) for v, c in checks.items()},
                  date=datetime.date.today().isoformat(), commit=runrecord.git_state(REPO)[0] or "unknown")
    result["summary"] = summary(result)
    os.makedirs(out, exist_ok=True)
    with rundir.atomic_write(os.path.join(out, "tuning.json"), "w") as f:
        json.dump(result, f, indent=1)
    with rundir.atomic_write(os.path.join(out, "tuning.md"), "w") as f:
        f.write(markdown(result))
    if options["write"]:
        write_recipe(options["write"], best_lr, best_lr * ratio, result["summary"])
    print(markdown(result))
    return 0 if bracketed else 1


if __name__ == "__main__":
    configurator.run_script(main)
