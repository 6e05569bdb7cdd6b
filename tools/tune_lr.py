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
Runs go to --sweep_dir (finished ones are reused, so a stopped tuning resumes; one stopped by a signal
resumes from its checkpoint). The recipe is frozen when the tuning starts: a run in --sweep_dir trained
with another recipe (the recipe edited since, or while the grid ran) is refused in one line, never pooled.
The sweep_dir is locked as sweep.py locks its own: a second tuning on it is refused.
"""
import ctypes
import datetime
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
import parallel  # noqa: E402
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
    cpu_runs=2,  # runs at a time, each with its share of the cores (0 = one per core, as sweep.py's default)
)
CHECK_FACTORS = (0.5, 1.0, 2.0)  # each variant around the baseline's best rate


def rate_text(lr):
    return f"{lr:.3g}"


MIN_RATIO = 1.02  # neighbouring rates at least 2% apart: their 3-digit names (rate_text) never collide


class Interrupted(Exception):
    """Ctrl-C or SIGTERM to the tool: its running runs were told to save and stop, and have."""
    def __init__(self, message, signum):
        super().__init__(message)
        self.exit_code = 128 + signum


def planned_config(options, variant, lr, ratio, seed):
    """The config a run of the frozen recipe trains with (the recipe as read when this tuning started)."""
    cfg = dict(options["frozen"][variant], learning_rate=lr, min_lr=lr * ratio, seed=seed,
               out_dir=run_dir(options["sweep_dir"], variant, lr, seed), lr_tuning="", wandb_log=False)
    return runtime.settle(cfg)


def recipe_problem(out_dir, planned):
    """None when the run in out_dir (if any) trained with `planned`, else the one-line difference."""
    try:
        with open(os.path.join(out_dir, "config.json")) as f:
            ran = json.load(f)
    except (OSError, ValueError):
        return None  # never started (or no config: final_value finds no result to use)
    ran = runtime.settle({**runtime.DEFAULTS, **{k: v for k, v in ran.items() if k in runtime.DEFAULTS}})
    diffs = compare.config_differences(ran, planned, ("lr_tuning", "wandb_log"))
    if ran["seed"] != planned["seed"]:
        diffs["seed"] = (ran["seed"], planned["seed"])
    if not diffs:
        return None
    return ", ".join(f"{k}={a!r} there, {b!r} in the recipe" for k, (a, b) in diffs.items())


def stale_runs_problem(options, suite, ratio):
    """Before any training: every run already in sweep_dir trained with the frozen recipe, or one line.
    (Reusing a 40-step run for an 80-step recipe would tune the new recipe on the old one's results.)"""
    stale = []
    for name in sorted(os.listdir(options["sweep_dir"])) if os.path.isdir(options["sweep_dir"]) else []:
        found = re.fullmatch(r"(.+)-lr(.+)-seed(\d+)", name)
        if not found or found.group(1) not in suite["variants"]:
            continue
        out = os.path.join(options["sweep_dir"], name)
        try:
            with open(os.path.join(out, "config.json")) as f:
                lr = json.load(f)["learning_rate"]
        except (OSError, ValueError, KeyError):
            continue
        planned = dict(planned_config(options, found.group(1), lr, ratio, int(found.group(3))), out_dir=out)
        problem = recipe_problem(out, planned)
        if problem:
            stale.append(f"{name} ({problem})")
    if stale:
        raise configurator.ConfigError(
            f"{len(stale)} run(s) in {options['sweep_dir']} trained with another recipe than the one tuned now: "
            f"{'; '.join(stale[:2])}{' ...' if len(stale) > 2 else ''}: restore the recipe they ran with, or give "
            f"this recipe its own --sweep_dir (runs of two recipes are never pooled)")


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


def die_with_parent():
    """In a training process before it starts: SIGTERM when the tool dies, even by kill -9 (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def train_argv(body, lr, ratio, seed, out_dir):
    return [*body["config"], *(f"--{k}={v!r}" for k, v in body.items() if k != "config"),
            f"--learning_rate={lr!r}", f"--min_lr={lr * ratio!r}", f"--seed={seed}", f"--out_dir={out_dir}",
            "--lr_tuning=''", "--wandb_log=False"]


def run_missing(jobs, metric, slots):
    """Train every (argv, out_dir, planned config) whose run has no final value yet, `slots` at a time (one
    thread each share of the cores); a diverged run is a result (inf), the same on every call. A run that
    fails, or that trained with another recipe than `planned` (the recipe edited while the grid ran), is
    named and left out, never retried in a loop or used. Ctrl-C or SIGTERM to the tool reaches each run
    once (each saves a checkpoint and stops; the same command resumes them), and ends in one line."""
    todo = [job for job in jobs if final_value(job[1], metric) is None]
    running, failed = [], []
    threads = str(max(1, (os.cpu_count() or 1) // slots))

    def stop(signum, frame):
        raise Interrupted("", signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while todo or running:
            while todo and len(running) < slots:
                argv, out, planned = todo.pop(0)
                os.makedirs(out, exist_ok=True)
                if parallel.checkpoint_path(out):  # stopped by a signal after a checkpoint: resume, never restart
                    argv = [*argv, "--init_from=resume"]
                log = open(os.path.join(out, "console.log"), "a")
                env = dict(os.environ, OMP_NUM_THREADS=threads)
                print(f"start {out}", flush=True)
                # a session of its own: a terminal's Ctrl-C reaches the tool only, which forwards one signal
                running.append((subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *argv], env=env,
                                                 stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                                 start_new_session=True, preexec_fn=die_with_parent),
                                out, log, planned))
            time.sleep(1)
            for entry in [r for r in running if r[0].poll() is not None]:
                running.remove(entry)
                entry[2].close()
                problem = recipe_problem(entry[1], entry[3])
                if problem:
                    failed.append(f"{entry[1]} trained with another recipe: {problem}")
                    print(f"FAILED {failed[-1]}", flush=True)
                elif final_value(entry[1], metric) is None:
                    failed.append(entry[1])
                    print(f"FAILED {entry[1]} (exit {entry[0].returncode}; see its console.log)", flush=True)
    except (KeyboardInterrupt, Interrupted) as e:
        signum = getattr(e, "exit_code", 128 + signal.SIGINT) - 128
        for proc, *_ in running:
            proc.send_signal(signal.SIGTERM)  # one signal: each run finishes its step and saves a checkpoint
        for proc, *_ in running:
            proc.wait()
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}: {len(running)} running run(s) saved a "
                          f"checkpoint and stopped; run the same command again to resume them", signum) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:
        raise configurator.ConfigError(f"{len(failed)} tuning run(s) failed ({'; '.join(failed)}): fix the cause "
                                       f"(a recipe edited while the tuning ran: restore it, and remove those runs) and "
                                       f"run the same command again (finished runs are kept)")


def jobs_at(options, variant, body, lr, ratio, seeds):
    return [(train_argv(body, lr, ratio, s, run_dir(options["sweep_dir"], variant, lr, s)),
             run_dir(options["sweep_dir"], variant, lr, s), planned_config(options, variant, lr, ratio, s))
            for s in seeds]


def mean_over_seeds(options, variant, lr, ratio, seeds, metric):
    """Mean and per-seed values; each run checked against the frozen recipe before its value is used."""
    values = []
    for s in seeds:
        out = run_dir(options["sweep_dir"], variant, lr, s)
        problem = recipe_problem(out, planned_config(options, variant, lr, ratio, s))
        if problem:
            raise configurator.ConfigError(f"{out} trained with another recipe than this tuning's ({problem}): "
                                           f"restore the recipe, or give it its own --sweep_dir")
        values.append(final_value(out, metric))
    return sum(values) / len(values), values


def tune_baseline(suite, base_lr, ratio, options, seeds):
    """Rates tried (ascending) with their mean and per-seed values, the best one's index, and whether the
    best is bracketed. Rates are base_lr * step ** exponent."""
    body, name, metric = suite["variants"][suite["baseline"]], suite["baseline"], suite["metric"]
    step = options["step"]

    def rows_at(exponents):
        rates = [base_lr * step ** e for e in sorted(exponents)]
        names = [rate_text(lr) for lr in rates]
        if len(set(names)) != len(names):  # two rates would train into one directory
            raise configurator.ConfigError(f"rates {', '.join(repr(lr) for lr in rates)} share directory names "
                                           f"({', '.join(names)}): use factors and a --step at least {MIN_RATIO}x apart")
        run_missing([job for lr in rates for job in jobs_at(options, name, body, lr, ratio, seeds)],
                    metric, options["cpu_runs"])
        rows = [(lr, *mean_over_seeds(options, name, lr, ratio, seeds, metric)) for lr in rates]
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
    """The index of the rate the recipe gets (suites.chosen_rate: a tuning.json is checked by the same rule)."""
    return suites.chosen_rate(rows, best, rule)


def check_variants(suite, best_lr, ratio, options, seeds):
    """{variant: [(factor, mean, values)]} at CHECK_FACTORS x the baseline's best rate."""
    metric, jobs, out = suite["metric"], [], {}
    for variant, body in suite["variants"].items():
        if variant == suite["baseline"]:
            continue
        for f in CHECK_FACTORS:
            jobs += jobs_at(options, variant, body, best_lr * f, ratio, seeds)
    run_missing(jobs, metric, options["cpu_runs"])
    for variant in suite["variants"]:
        if variant != suite["baseline"]:
            out[variant] = [(f, *mean_over_seeds(options, variant, best_lr * f, ratio, seeds, metric))
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


def check_recipe_file(path):
    """--write's file, checked before any run: it exists and assigns learning_rate and min_lr once each."""
    if not os.path.isfile(path):
        raise configurator.ConfigError(f"--write={path}: not a file (the recipe file the suite reads)")
    text = open(path).read()
    for key in ("learning_rate", "min_lr"):
        if len(re.findall(rf"^{key} = .*$", text, re.M)) != 1:
            raise configurator.ConfigError(f"--write={path}: it must assign {key} exactly once at the start of a line")
    return text


def write_recipe(path, lr, min_lr, line):
    """Rewrite the recipe file's learning_rate and min_lr assignments (one each, at top level)."""
    text = check_recipe_file(path)
    for key, value in (("learning_rate", lr), ("min_lr", min_lr)):
        pattern = re.compile(rf"^{key} = .*$", re.M)
        text = pattern.sub(f"{key} = {float(f'{value:.4g}')!r}", text)
    pattern = re.compile(r"^lr_tuning = .*$", re.M)
    assignment = f"lr_tuning = {line!r}"
    text = pattern.sub(lambda _: assignment, text) if pattern.search(text) else text.rstrip("\n") + "\n" + assignment + "\n"
    with rundir.atomic_write(path, "w") as f:
        f.write(text)


def read_tuned_suite(path):
    """The suite file, checked: a train config (no `variants`) is named as such, not as a misspelled key."""
    namespace = configurator.read_config_file(path)
    if "variants" not in namespace:
        raise configurator.ConfigError(f"{path} is not a suite file (it sets no `variants`; a train config?): give "
                                       f"the suite whose recipe to tune, e.g. suites/ra_shakespeare.py")
    namespace.pop("tuning", None)  # the suite's own tuning is what this writes, not an input
    return suites.read_suite(namespace, os.path.splitext(os.path.basename(path))[0],
                             os.path.dirname(os.path.abspath(path)), runtime.DEFAULTS)


def check_options(options):
    """Every option that needs no suite, in one line each, before anything is read or written."""
    if options["cpu_runs"] < 0:  # a negative count started nothing and waited forever
        raise configurator.ConfigError(f"--cpu_runs={options['cpu_runs']}: runs at once, an integer >= 1 (or 0 = one "
                                       f"per core, as sweep.py)")
    options["cpu_runs"] = options["cpu_runs"] or (os.cpu_count() or 1)
    try:
        options["factors"] = [float(f) for f in str(options["factors"]).split(",")]
    except ValueError:
        raise configurator.ConfigError(f"--factors={options['factors']!r}: positive numbers, comma-separated") from None
    if not all(f > 0 for f in options["factors"]) or options["step"] <= 1 or options["max_points"] < 3 or options["refine"] < 0:
        raise configurator.ConfigError("--factors must be > 0, --step > 1, --max_points >= 3 and --refine >= 0")
    factors = sorted(options["factors"])
    if options["step"] ** 0.5 ** options["refine"] < MIN_RATIO or any(b / a < MIN_RATIO for a, b in zip(factors, factors[1:])):
        raise configurator.ConfigError(
            f"--factors={','.join(f'{f:g}' for f in options['factors'])} --step={options['step']:g} "
            f"--refine={options['refine']}: rates closer than {MIN_RATIO}x share a run directory name (3 digits): "
            f"use factors and a step (its 2**refine-th root) at least {MIN_RATIO}x apart")
    if options["rule"] not in ("one_se", "lowest_mean"):
        raise configurator.ConfigError(f"--rule={options['rule']!r}: use 'one_se' or 'lowest_mean'")
    for key in ("out", "sweep_dir"):
        if options[key] and os.path.exists(options[key]) and not os.path.isdir(options[key]):
            raise configurator.ConfigError(f"--{key}={options[key]}: a file is in the way: give a directory")
    if options["write"]:
        check_recipe_file(options["write"])


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
    check_options(options)
    path = paths[0]
    suite = read_tuned_suite(path)
    used = sorted(set(seeds) & set(suite["seeds"] + (suite["bridge_seeds"] or [])))
    if used:
        raise configurator.ConfigError(f"--seeds: {used} are seeds the suite compares on: tune on seeds no comparison uses")
    # the recipe, frozen: every run is checked against it before its value is used
    options["frozen"] = {v: configurator.apply_config(runtime.DEFAULTS, [*body["config"], *(
        f"--{k}={val!r}" for k, val in body.items() if k != "config")]) for v, body in suite["variants"].items()}
    for variant, cfg in options["frozen"].items():  # what train.py would refuse, refused before the first run
        try:
            runtime.resolve(dict(cfg, out_dir=cfg["out_dir"] or "out"), 1)
        except configurator.ConfigError as e:
            raise configurator.ConfigError(f"variant {variant!r}: {e}") from None
    recipe = options["frozen"][suite["baseline"]]
    base_lr, ratio = recipe["learning_rate"], recipe["min_lr"] / recipe["learning_rate"]
    options["sweep_dir"] = options["sweep_dir"] or f"out-tune-{suite['name']}"
    out = options["out"] or options["sweep_dir"]
    with rundir.out_dir_lock(options["sweep_dir"], holder="sweep"):  # two tunings would train twice into each run
        stale_runs_problem(options, suite, ratio)
        rows, best, bracketed = tune_baseline(suite, base_lr, ratio, options, seeds)
        chosen = chosen_rate(rows, best, options["rule"])
        best_lr = rows[chosen][0]
        checks = check_variants(suite, best_lr, ratio, options, check_seeds) if options["variants"] else {}
    result = dict(suite=suite["name"], baseline=suite["baseline"], metric=suite["metric"], seeds=seeds, check_seeds=check_seeds,
                  step=options["step"], refine=options["refine"], min_lr_ratio=ratio, recipe_lr=base_lr, best_lr=best_lr,
                  lowest_mean_lr=rows[best][0], rule=options["rule"], bracketed=bracketed,
                  recipe_fingerprint=suites.recipe_fingerprint(runtime.settle(recipe)),
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
    valid = bracketed and math.isfinite(rows[chosen][1])
    if options["write"] and valid:
        write_recipe(options["write"], best_lr, best_lr * ratio, result["summary"])
    print(markdown(result))
    if options["write"] and not valid:
        print(f"{options['write']} left unchanged: the best rate is "
              f"{'not finite (every rate diverged)' if not math.isfinite(rows[chosen][1]) else 'not bracketed'}",
              file=sys.stderr)
    return 0 if valid else 1


if __name__ == "__main__":
    try:
        configurator.run_script(main, Interrupted, rundir.RunDirError)
    except KeyboardInterrupt:  # before or after the runs (during them, run_missing stops them first)
        print("error: interrupted before any run started or after the last ended: nothing is running; run the "
              "same command again to go on", file=sys.stderr)
        sys.exit(130)
