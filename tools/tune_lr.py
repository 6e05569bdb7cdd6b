"""The learning rate of a suite's recipe, tuned: the baseline from scratch on a geometric grid of rates
that brackets the best one, on seeds no comparison uses, then every variant on its own grid around it, each
arm's optimum fitted with an interval that says whether the rate the arms share could be its best.

    python tools/tune_lr.py suites/ra_shakespeare.py --seeds=903,904,905 --factors=0.5,1,2 \
        --write=config/ra_shakespeare_scratch.py --out=reports/tune_ra_shakespeare_scratch

At least 3 seeds per rate (--seeds, and --check_seeds for the variants): with 2, a standard error has one
degree of freedom, and on the flagship's twin a x2 grid then read a 1.41x optimum as 1x half the time.
The baseline's rate (and min_lr in proportion) starts on `factors` times the recipe's own rate; while
the best rate sits at an edge of the grid, the grid grows by one `step` in that direction (a span of at
most `max_points` rates), so the best is never a point whose neighbour on the far side was left untried.
Once bracketed, the gaps beside the best are halved until the rates beside it are at most
step ** 0.5 ** refine apart (refused above x1.5: x2 with refine=1 gives x1.41), wherever the best moves
meanwhile. The rate the recipe gets is, by default (`rule='one_se'`), the lowest rate whose mean is within
one standard error of the lowest mean (the se of their per-seed differences: every rate trains on the same
seeds), Breiman's one-standard-error rule: where the loss is flat within noise over a range of rates, the
chosen one is the farthest from the divergence above, whose runs are the noisiest. `rule='lowest_mean'`
takes the lowest mean itself. A one-se rate that the baseline's fitted optimum interval (below) excludes,
while it covers the lowest mean, is not written: there the loss is not flat, and the tool says to take the
lowest mean (every run reused). Each variant then gets its own grid, started one step below, at and one step
above that rate (0.5x, 1x and 2x at step 2)
and grown and refined by the same rules.

Each arm's optimum: a quadratic in log(rate) fitted to the per-seed values within step ** 2 of its lowest
mean (a level per seed), the optimum -b/2c with Fieller's 95% interval; where that curve puts the optimum
past the last rate tried, the grid grows one step that way. A bowl open downwards or an optimum outside the
rates is "not bracketed" (no optimum); an insignificant curvature gives an unbounded interval. The header
says for each arm whether its interval covers the shared rate, and each variant's effect at its own
optimum (its curve's value there minus the baseline's at its own) beside its effect at the shared rate.

--write rewrites the `learning_rate` and `min_lr` lines of the recipe file the suite reads, and
tuning.json / tuning.md (in --out) hold the grids, seeds, every run's value, the fits, the chosen rate, the
date, the tool's commit (of the call that wrote them) and every run's own code version (its run_info.json):
a suite that declares `tuning = "<that tuning.json>"` carries the summary into its report's header.
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

import numpy
import scipy.stats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
import rundir  # noqa: E402
import runrecord  # noqa: E402
import runtime  # noqa: E402
from ablation import compare, suites  # noqa: E402

OPTIONS = dict(
    seeds="901,902,903",  # the tuning seeds: at least 3, none of them a seed a comparison uses
    factors="1,2,4",  # the first grid, as multiples of the recipe's own learning rate
    step=2.0,  # the grid's ratio between neighbouring rates (an edge extends the grid by one step)
    max_points=8,  # the widest grid (in rates one step apart) an arm grows to before giving up on bracketing
    rule="one_se",  # 'one_se': the lowest rate within one paired standard error of the lowest mean; 'lowest_mean'
    refine=1,  # halvings of the step (in log rate) beside the best rate, refined until reached (step ** 0.5 ** refine <= 1.5)
    variants=True,  # also tune every variant on its own grid, started one step below, at and above the baseline's best rate
    check_seeds="",  # the seeds of the variants' grids: at least 3 of the tuning seeds ('' = all of them)
    write="",  # the recipe file whose learning_rate and min_lr lines get the tuned values ('' = none)
    out="",  # where tuning.json and tuning.md go ('' = the sweep directory)
    sweep_dir="",  # the runs ('' = out-tune-<suite>)
    cpu_runs=2,  # runs at a time, each with its share of the cores (0 = one per core, as sweep.py's default)
)


def rate_text(lr):
    return f"{lr:.3g}"


MIN_SEEDS = 3  # per rate: 2 seeds give a 1-df standard error, and a 1.4x optimum is read as 1x half the time
MAX_STEP_AROUND_BEST = 1.5  # the widest ratio between the best rate and its neighbours once refined
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
                if rundir.checkpoint_path(out):  # stopped by a signal after a checkpoint: resume, never restart
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


def tune_grid(options, variant, start_lr, exponents, seeds, metric):
    """Rates tried (ascending) with their mean and per-seed values, the lowest mean's index, and whether it is
    bracketed. Rates are start_lr * step ** exponent: while the lowest mean sits at an edge the grid grows by one
    step that way (its span at most max_points rates); then the gaps beside it are halved until each is at most
    step ** 0.5 ** refine, wherever the lowest mean moves meanwhile; and while the curve fitted near it (as
    fit_optimum fits it) puts the optimum past the grid's last rate, the grid grows by one step that way too."""
    body, step = options["body"][variant], options["step"]
    widest = 0.5 ** options["refine"] + 1e-9  # in steps

    def rows_at(exponents):
        rates = [start_lr * step ** e for e in exponents]
        names = [rate_text(lr) for lr in rates]
        if len(set(names)) != len(names):  # two rates would train into one directory
            raise configurator.ConfigError(f"rates {', '.join(repr(lr) for lr in rates)} share directory names "
                                           f"({', '.join(names)}): use factors and a --step at least {MIN_RATIO}x apart")
        run_missing([job for lr in rates for job in jobs_at(options, variant, body, lr, options["ratio"], seeds)],
                    metric, options["cpu_runs"])
        rows = [(lr, *mean_over_seeds(options, variant, lr, options["ratio"], seeds, metric)) for lr in rates]
        return rows, min(range(len(rows)), key=lambda i: rows[i][1])

    exponents = sorted(exponents)
    while True:
        rows, best = rows_at(exponents)
        if best in (0, len(rows) - 1):
            if exponents[-1] - exponents[0] + 1 >= options["max_points"] - 1e-9:
                return rows, best, False
            print(f"{variant}: best rate {rate_text(rows[best][0])} at the grid's edge: extending the grid", flush=True)
            exponents = [exponents[0] - 1, *exponents] if best == 0 else [*exponents, exponents[-1] + 1]
            continue
        centre, below, above = exponents[best], exponents[best - 1], exponents[best + 1]
        halves = [(centre + side) / 2 for side in (below, above) if abs(centre - side) > widest]
        if halves:
            exponents = sorted({*exponents, *halves})
            continue
        # the curve fitted near the lowest mean puts its optimum past the last rate tried on one side: try the
        # next rate there (a lowest mean between grid points is often one point short of its bowl's far side)
        beyond = fit_optimum(rows, seeds, step ** 2, rows[best][0], seeds).get("beyond")
        edge = {"below": 0, "above": len(rows) - 1}.get(beyond)
        if edge is None or abs(math.log(rows[edge][0] / rows[best][0])) > 2 * math.log(step) + 1e-9 or (
                exponents[-1] - exponents[0] + 1 >= options["max_points"] - 1e-9):
            return rows, best, True
        print(f"{variant}: the fitted optimum lies {beyond} the rates tried: extending the grid", flush=True)
        exponents = [exponents[0] - 1, *exponents] if beyond == "below" else [*exponents, exponents[-1] + 1]


CONFIDENCE = 0.95  # of the interval for each arm's optimum
UNBOUNDED = math.log(1e6)  # an interval reaching a million-fold from the lowest mean's rate is no interval


def fit_optimum(rows, seeds, span, shared_lr, level_seeds):
    """The quadratic in log(rate) fitted to the per-seed values of the rates within a factor `span` of the lowest
    mean (the bowl near the optimum: far rates and diverged runs would bend it; the tool passes step ** 2, since
    a window of one step loses the far side of an optimum between grid points), each seed its own level (every
    seed trains at every rate, so its lasting offset is a block). Returns data: `code` 'fitted' (a bounded
    interval), 'unbounded' (the curvature is not significant: the interval is no interval), 'not_bracketed' (a
    bowl open downwards or an optimum outside the fitted rates: no optimum) or 'too_few_rates'; the optimum and
    its interval as rates, whether the interval covers shared_lr, and the curve's value at the optimum averaged
    over level_seeds' levels (what an effect at the optimum compares).

    The interval is Fieller's: the log rates x where the fitted slope b + 2cx is within t se of 0. Under the
    model's normal errors its coverage is exact, where the delta method's is not when c is poorly known (then
    Fieller's set is honestly unbounded), and "covers the shared rate" is then the test of a zero slope there.
    tests/test_tune_lr.py checks the coverage by simulation at the flagship's curvature and noise."""
    lowest = min(rows, key=lambda row: row[1])[0]
    x0 = math.log(lowest)
    near = [(math.log(lr) - x0, values) for lr, _, values in rows
            if abs(math.log(lr / lowest)) <= math.log(span) + 1e-9]
    obs = [(x, j, v) for x, values in near for j, v in enumerate(values) if math.isfinite(v)]
    blocks = sorted({j for _, j, _ in obs})
    design = numpy.array([[x, x * x, *(float(j == k) for k in blocks)] for x, j, _ in obs])
    df = len(obs) - design.shape[1] if obs else 0
    fit = dict(rates=[math.exp(x0 + x) for x, _ in near], df=df, optimum_lr=None, interval=None, covers_shared=None,
               level=None, level_se=None)
    if len({x for x, _, _ in obs}) < 3 or df < 1:
        return dict(fit, code="too_few_rates")
    y = numpy.array([v for _, _, v in obs])
    beta = numpy.linalg.lstsq(design, y, rcond=None)[0]
    residual = y - design @ beta
    cov = float(residual @ residual) / df * numpy.linalg.inv(design.T @ design)
    b, c = float(beta[0]), float(beta[1])
    xs = [x for x, _ in near]
    if c <= 0 or not min(xs) <= -b / (2 * c) <= max(xs):
        beyond = None if c <= 0 else "below" if -b / (2 * c) < min(xs) else "above"
        return dict(fit, code="not_bracketed", beyond=beyond)
    t = scipy.stats.t.ppf((1 + CONFIDENCE) / 2, df)
    x_opt = -b / (2 * c)
    # (b + 2cx)^2 <= t^2 var(b + 2cx), a quadratic inequality A x^2 + B x + C <= 0
    A, B, C = 4 * (c * c - t * t * cov[1, 1]), 4 * (b * c - t * t * cov[0, 1]), b * b - t * t * cov[0, 0]
    inside = lambda x: A * x * x + B * x + C <= 0
    levels = {j: float(beta[2 + i]) for i, j in enumerate(blocks)}
    own = [levels.get(seeds.index(s)) for s in level_seeds]
    level = statistics.mean(own) + b * x_opt + c * x_opt ** 2 if None not in own else None  # a seed all diverged
    # the level's se at the fitted optimum: its derivative in x_opt is 0 there, so only the coefficients count
    weights = numpy.array([x_opt, x_opt ** 2, *(level_seeds.count(seeds[j]) / len(level_seeds) for j in blocks)])
    fit.update(optimum_lr=math.exp(x0 + x_opt), covers_shared=bool(inside(math.log(shared_lr) - x0)), level=level,
               level_se=math.sqrt(max(0.0, float(weights @ cov @ weights))) if level is not None else None)
    root = math.sqrt(max(0.0, B * B - 4 * A * C)) if A > 0 else 0.0  # the optimum is inside (0: noiseless data)
    ends = [(-B - root) / (2 * A), (-B + root) / (2 * A)] if A > 0 else []
    if A <= 0 or max(map(abs, ends)) > UNBOUNDED:
        return dict(fit, code="unbounded")
    fit["interval"] = [math.exp(x0 + x) for x in ends]
    return dict(fit, code="fitted")


def check_variants(suite, best_lr, options, seeds):
    """{variant: (rows, lowest mean's index, bracketed)}: each variant's own grid, started one step below, at and
    above the baseline's chosen rate and grown and refined as the baseline's was (the first points of all variants
    at once): at step x1.41 the bracket is already as fine as the refinement asks."""
    metric, others = suite["metric"], [v for v in suite["variants"] if v != suite["baseline"]]
    exponents = [-1, 0, 1]
    run_missing([job for v in others for e in exponents
                 for job in jobs_at(options, v, options["body"][v], best_lr * options["step"] ** e, options["ratio"], seeds)],
                metric, options["cpu_runs"])
    return {v: tune_grid(options, v, best_lr, exponents, seeds, metric) for v in others}


def run_commits(runs):
    """{run directory name: the code versions it trained at} from each run's own run_info.json (a resumed run
    lists every version it ran; a run without one, 'unknown')."""
    return {os.path.basename(out): rundir.read_run_info(out).get("code_versions") or ["unknown"] for out in runs}


def arm_numbers(rows, seeds, best, bracketed, shared_lr, step, level_seeds):
    """One arm's grid and fit as data (tuning.json's grid rows or a variant's points, and its fit)."""
    fit = fit_optimum(rows, seeds, step ** 2, shared_lr, level_seeds)
    if not bracketed:  # the lowest mean at the grid's edge: a fit would extrapolate past the rates tried
        fit.update(code="not_bracketed", optimum_lr=None, interval=None, covers_shared=None, level=None, level_se=None)
    return dict(lowest_mean_lr=rows[best][0], bracketed=bracketed, fit=fit)


def effects(result):
    """Each variant's effect (variant minus baseline, on the check seeds) at the shared rate, paired, and at each
    arm's own fitted optimum (the variant's curve at its optimum minus the baseline's at its own)."""
    base_row = next(row for row in result["grid"] if math.isclose(row["lr"], result["best_lr"], rel_tol=1e-9))
    by_seed = dict(zip(result["seeds"], base_row["values"]))
    base_values = [by_seed[s] for s in result["check_seeds"]]  # in the variants' seed order: paired
    out = {}
    for variant, arm in result["variants"].items():
        point = next(p for p in arm["points"] if math.isclose(p["factor"], 1.0, rel_tol=1e-9))
        diffs = [a - b for a, b in zip(point["values"], base_values)]
        finite = all(math.isfinite(d) for d in diffs)
        both = arm["fit"]["level"] is not None and result["fit"]["level"] is not None
        out[variant] = dict(same_rate=statistics.mean(diffs) if finite else None,
                            same_rate_se=statistics.stdev(diffs) / math.sqrt(len(diffs)) if finite else None,
                            own_optimum=arm["fit"]["level"] - result["fit"]["level"] if both else None,
                            # the two fits' residuals are independent (each arm's own runs)
                            own_optimum_se=(math.hypot(arm["fit"]["level_se"], result["fit"]["level_se"])
                                            if both else None))
    return out


def version_text(version):
    commit, _, dirty = version.partition("+")
    return commit[:10] + ("+" + dirty if dirty else "")


def commits_text(runs):
    """Which code the grid's runs trained at: one commit, or each with its runs counted per arm."""
    arms = {}
    for name, versions in runs.items():
        for version in versions:
            arm = re.fullmatch(r"(.+)-lr(.+)-seed(\d+)", name).group(1)
            arms.setdefault(version, {}).setdefault(arm, 0)
            arms[version][arm] += 1
    if len(arms) == 1:
        return f"its {len(runs)} runs at commit {version_text(next(iter(arms)))}"
    return f"its {len(runs)} runs at commits " + ", ".join(
        f"{version_text(v)} ({', '.join(f'{arm} {n}' for arm, n in counts.items())})" for v, counts in arms.items())


def fit_text(fit):
    """An arm's fitted optimum, its interval and whether that covers the shared rate, in words."""
    if fit["code"] == "not_bracketed":
        return "not bracketed (no optimum)"
    if fit["code"] == "too_few_rates":
        return "too few rates for a curve"
    interval = (f"[{rate_text(fit['interval'][0])}, {rate_text(fit['interval'][1])}]" if fit["code"] == "fitted"
                else "(interval unbounded: the curvature is not significant)")
    return f"{rate_text(fit['optimum_lr'])} {interval} {'covers it' if fit['covers_shared'] else 'does NOT cover it'}"


def effect_text(effect):
    signed = lambda x: f"{round(x, 4) + 0.0:+.4f}"  # no "-0.0000"
    same = "n/a" if effect["same_rate"] is None else f"{signed(effect['same_rate'])} (se {effect['same_rate_se']:.4f})"
    own = ("n/a" if effect["own_optimum"] is None
           else f"{signed(effect['own_optimum'])} (se {effect['own_optimum_se']:.4f})")
    return f"effect {own} at its own optimum, {same} at the shared rate"


def summary(result):
    """The one line a report header quotes: how the recipe's rate was tuned, each arm's optimum against the
    shared rate, and the code the runs trained at."""
    rates = [r["lr"] for r in result["grid"]]
    lowest = result.get("lowest_mean_lr", result["best_lr"])
    one_se = (f"; the lowest rate within one standard error of the lowest mean, at {rate_text(lowest)}"
              if not math.isclose(lowest, result["best_lr"]) else "")
    refined = (f", refined to x{result['step_around_best']:.3g} around the best"
               if result["bracketed"] and result["refine"] else "")
    check = ", ".join(map(str, result["check_seeds"]))
    arms = (f"; the optimum of a quadratic in log rate ({result['confidence']:.0%} Fieller interval; variants on "
            f"seeds {check}) against the shared rate {rate_text(result['best_lr'])}: {result['baseline']} "
            f"{fit_text(result['fit'])}" + "".join(f"; {v} {fit_text(arm['fit'])}, {effect_text(result['effects'][v])}"
                                                   for v, arm in result["variants"].items()))
    return (f"tuned by tools/tune_lr.py on {result['date']} at commit {result['commit'][:10]} "
            f"({commits_text(result['runs'])}): {result['baseline']} from scratch on {len(rates)} rates "
            f"{rate_text(rates[0])}..{rate_text(rates[-1])} (x{result['step']:g}{refined}), seeds "
            f"{', '.join(map(str, result['seeds']))} ({len(result['seeds'])} per rate), "
            f"best {rate_text(result['best_lr'])} "
            f"({'bracketed' if result['bracketed'] else 'NOT bracketed: at the edge of max_points rates'}{one_se})"
            f"{arms}")


def grid_table(rows, seeds, metric, marks):
    lines = [f"| learning rate | mean {metric} | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "|---|---|" + "---|" * len(seeds)]
    for row in rows:
        lines.append(f"| {rate_text(row['lr'])}{marks(row)} | {row['mean']:.4f} | "
                     + " | ".join(f"{v:.4f}" for v in row["values"]) + " |")
    return lines


def markdown(result):
    metric, best = result["metric"], result["best_lr"]
    lines = [f"# Learning-rate tuning: {result['suite']}", "", summary(result) + ".", "",
             f"Baseline `{result['baseline']}` from scratch, the whole budget; {metric} at each run's last "
             f"evaluation, mean over the tuning seeds (min_lr kept at {result['min_lr_ratio']:g} x the rate).", ""]
    lines += grid_table(result["grid"], result["seeds"], metric, lambda row: (
        " **best**" if row["lr"] == best else "") + (
        " (lowest mean)" if row["lr"] == result["lowest_mean_lr"] != best else ""))
    if result["variants"]:
        lines += ["", f"Each variant on its own grid, started at {1 / result['step']:.3g}x, 1x and {result['step']:.3g}x of the baseline's chosen rate "
                      f"({rate_text(best)}) and grown and refined as the baseline's, on seeds "
                      f"{', '.join(map(str, result['check_seeds']))}."]
        for variant, arm in result["variants"].items():
            lines += ["", f"`{variant}`: lowest mean at {arm['best_factor']:.3g}x"
                          f"{'' if arm['bracketed'] else ' (NOT bracketed)'}; optimum {fit_text(arm['fit'])}; "
                          f"{effect_text(result['effects'][variant])}.", ""]
            lines += grid_table(arm["points"], result["check_seeds"], metric,
                                lambda row: f" ({row['factor']:.3g}x)")
    lines += ["", f"The optimum: a quadratic in log(rate) fitted to the per-seed values within "
                  f"x{result['step'] ** 2:g} of each arm's lowest mean, a level per seed; its {result['confidence']:.0%} interval is Fieller's (the "
                  f"rates where the fitted slope is not significantly different from 0). An effect at an arm's own "
                  f"optimum is its curve's value there minus the baseline's at its own, on the variants' seeds. "
                  f"These place each arm's best rate; the suite's own seeds decide the effects.",
              "", "Every run and the code it trained at (its run_info.json):", "",
              "| run | code version |", "|---|---|"]
    lines += [f"| {name} | {', '.join(map(version_text, versions))} |" for name, versions in result["runs"].items()]
    return "\n".join(lines) + "\n"


def write_problem(result, chosen_mean):
    """Why the chosen rate is not the recipe's to take (None: it is): every rate diverged, the best is not
    bracketed, or the one-se rule moved off the lowest mean to a rate that the baseline's own fitted optimum
    interval excludes while it covers the lowest mean's (the rule assumes the loss is flat within noise there,
    and the fit says it is not)."""
    if not math.isfinite(chosen_mean):
        return "the best rate is not finite (every rate diverged)"
    if not result["bracketed"]:
        return "the best rate is not bracketed"
    fit = result["fit"]
    lowest = result["lowest_mean_lr"]
    if (result["best_lr"] != lowest and fit["code"] == "fitted" and not fit["covers_shared"]
            and fit["interval"][0] <= lowest <= fit["interval"][1]):
        return (f"the one-se rule's rate {rate_text(result['best_lr'])} lies outside the baseline's fitted optimum "
                f"{rate_text(fit['optimum_lr'])} [{rate_text(fit['interval'][0])}, {rate_text(fit['interval'][1])}], "
                f"so the loss is not flat there: run the same command with --rule=lowest_mean (every run is reused)")
    return None


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
    widest = options["step"] ** 0.5 ** options["refine"]
    if widest > MAX_STEP_AROUND_BEST:
        raise configurator.ConfigError(
            f"--step={options['step']:g} --refine={options['refine']}: the rates beside the best would be x{widest:.3g} "
            f"apart, coarser than x{MAX_STEP_AROUND_BEST:g} (a x2 grid cannot tell 1x from 2x): raise --refine "
            f"(each halves the step in log rate; x2 with --refine=1 gives x1.41)")
    if options["rule"] not in ("one_se", "lowest_mean"):
        raise configurator.ConfigError(f"--rule={options['rule']!r}: use 'one_se' or 'lowest_mean'")
    for key in ("out", "sweep_dir"):
        if options[key] and os.path.exists(options[key]) and not os.path.isdir(options[key]):
            raise configurator.ConfigError(f"--{key}={options[key]}: a file is in the way: give a directory")
    if options["write"]:
        check_recipe_file(options["write"])


def seed_list(key, text, within=None):
    """--seeds or --check_seeds as distinct integers, at least MIN_SEEDS of them (and some of `within`)."""
    seeds = [s.strip() for s in str(text).split(",")]
    if len(seeds) < MIN_SEEDS or not all(s.isdigit() for s in seeds) or len(set(seeds)) != len(seeds) or (
            within is not None and not {int(s) for s in seeds} <= set(within)):
        raise configurator.ConfigError(
            f"--{key}={text!r}: at least {MIN_SEEDS} distinct {'tuning seeds' if within else 'integers >= 0'}, "
            f"comma-separated (with 2, a standard error has 1 degree of freedom and cannot tell 1x from 2x)")
    return [int(s) for s in seeds]


def step_around(rows, best):
    """The widest ratio between the lowest mean's rate and a neighbour (None at the grid's edge)."""
    if best in (0, len(rows) - 1):
        return None
    return max(rows[best][0] / rows[best - 1][0], rows[best + 1][0] / rows[best][0])


def main(argv):
    options, paths = configurator.options_and_paths(argv, OPTIONS, text_keys=("seeds", "factors", "check_seeds"))
    if len(paths) != 1:
        raise configurator.ConfigError("give one suite file (python tools/tune_lr.py --help)")
    seeds = seed_list("seeds", options["seeds"])
    check_seeds = seed_list("check_seeds", options["check_seeds"], seeds) if options["check_seeds"] != "" else seeds
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
    options.update(body=suite["variants"], ratio=ratio, sweep_dir=options["sweep_dir"] or f"out-tune-{suite['name']}")
    out = options["out"] or options["sweep_dir"]
    with rundir.out_dir_lock(options["sweep_dir"], holder="sweep"):  # two tunings would train twice into each run
        stale_runs_problem(options, suite, ratio)
        # to a thousandth of a step: --factors=0.7071,1,1.4142 with --step=1.4142 is the grid it means, not one whose
        # lower gap is 3e-5 steps too wide to count as a step (which got it halved)
        exponents = sorted({round(math.log(f, options["step"]), 3) for f in options["factors"]})
        rows, best, bracketed = tune_grid(options, suite["baseline"], base_lr, exponents, seeds, suite["metric"])
        chosen = suites.chosen_rate(rows, best, options["rule"])
        best_lr = rows[chosen][0]
        checks = check_variants(suite, best_lr, options, check_seeds) if options["variants"] else {}
    runs = [run_dir(options["sweep_dir"], suite["baseline"], lr, s) for lr, _, _ in rows for s in seeds]
    runs += [run_dir(options["sweep_dir"], v, lr, s) for v, (c, _, _) in checks.items() for lr, _, _ in c
             for s in check_seeds]
    result = dict(suite=suite["name"], baseline=suite["baseline"], metric=suite["metric"], seeds=seeds,
                  check_seeds=check_seeds, step=options["step"], refine=options["refine"],
                  step_around_best=step_around(rows, best), min_lr_ratio=ratio, recipe_lr=base_lr, best_lr=best_lr,
                  rule=options["rule"], confidence=CONFIDENCE,
                  recipe_fingerprint=suites.recipe_fingerprint(runtime.settle(recipe)),
                  grid=[dict(lr=lr, mean=m, values=v) for lr, m, v in rows],
                  **arm_numbers(rows, seeds, best, bracketed, best_lr, options["step"], check_seeds),
                  variants={v: dict(points=[dict(factor=lr / best_lr, lr=lr, mean=m, values=vals) for lr, m, vals in c],
                                    best_factor=c[i][0] / best_lr, step_around_best=step_around(c, i),
                                    **arm_numbers(c, check_seeds, i, ok, best_lr, options["step"], check_seeds))
                            for v, (c, i, ok) in checks.items()},
                  runs=run_commits(runs),
                  date=datetime.date.today().isoformat(), commit=runrecord.git_state(REPO)[0] or "unknown")
    result["effects"] = effects(result)
    result["summary"] = summary(result)
    os.makedirs(out, exist_ok=True)
    with rundir.atomic_write(os.path.join(out, "tuning.json"), "w") as f:
        json.dump(result, f, indent=1)
    with rundir.atomic_write(os.path.join(out, "tuning.md"), "w") as f:
        f.write(markdown(result))
    problem = write_problem(result, rows[chosen][1])
    if options["write"] and not problem:
        write_recipe(options["write"], best_lr, best_lr * ratio, result["summary"])
    print(markdown(result))
    if problem:
        print(f"{options['write']} left unchanged: {problem}" if options["write"]
              else f"the chosen rate is not one to train at: {problem}", file=sys.stderr)
    return 1 if problem else 0


if __name__ == "__main__":
    try:
        configurator.run_script(main, Interrupted, rundir.RunDirError)
    except KeyboardInterrupt:  # before or after the runs (during them, run_missing stops them first)
        print("error: interrupted before any run started or after the last ended: nothing is running; run the "
              "same command again to go on", file=sys.stderr)
        sys.exit(130)
