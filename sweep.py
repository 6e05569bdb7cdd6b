"""Expand a base config over a grid, or an ablation suite over its variants x seeds, into
train.py runs; run them; tabulate a grid, report a suite.

    python sweep.py config/train_wikitext2.py --grid="learning_rate=[3e-4,6e-4] batch_size=[8,16]"
    python sweep.py suites/ra_shakespeare.py                        # an ablation suite (README)
    python sweep.py config/sweep_pruning_matrix.py                  # the pruning / MLA study's matrix
    python sweep.py config/sweep_pruning_matrix.py config/small_shakespeare.py   # its CPU version
    python sweep.py config/sweep_wikitext2_optimizers.py --max_iters=500 --dry_run=True
    python sweep.py suites/ra.py --launcher=slurm --slurm_partition=gpu --slurm_gpus_per_node=8   # docs/slurm.md
    python sweep.py suites/ra.py --status                           # each run's state, progress, time left

Arguments: sweep files (Python, defining `grid` and optionally `base`, `overrides`, `sweep_dir`),
train config files, `--key=value` overrides for every run, and the sweep's own options:
--grid (added to the file's grid), --sweep_dir, --gpus ('' = every visible GPU when there are
several, else one run at a time; or '0,1,3'), --cpu_runs=N (on a CPU: N runs at once, each with
its share of the cores; by default one run per nproc cores with one thread per rank, as a Slurm
job's rank gets), --allow_confounds=True (see below), --dry_run=True (print the runs only).

`grid` is a dict {key: [values]} (the product of all values), or a list of such dicts (their
union, e.g. each optimizer with learning rates of its own regime). The grid key `config` takes
config files. A run's arguments are, in order: the sweep file's base configs, the grid's config
file, the command line's config files, the fixed overrides, the grid's other keys.

Tokens per step: set tokens_per_iter (in `overrides` or --tokens_per_iter=N) and every run
derives its accumulation from it (gradient_accumulation_steps=0); train.py refuses a batch size
that cannot meet it exactly. Each run gets its own out_dir under sweep_dir and a W&B name; a run
whose log has an `end` event is skipped, an unfinished one with a checkpoint resumes. The table
(summary.md, summary.csv in sweep_dir) has the best val loss and perplexity of every run.

A suite file (suites/*.py) assigns `variants` ({name: {"config": file(s), key: value, ...}}),
`baseline`, `seeds`, `metric` (compare.METRICS) and `allowed` (the keys a variant may change),
optionally `nproc` (torchrun ranks per run), `base` and `overrides` as above. Each variant runs
once per seed as `<variant>-seed<seed>` under suite_dir. Before any run starts, every resolved
config is compared with the baseline's: a difference in a key that is not allowed refuses the
suite (--allow_confounds=True runs it anyway; the report still calls it not comparable). The
metric is frozen in suite_dir/suite.json by the first run; runs added later and every report (a
look) go into suite_dir/suite_record.jsonl (docs/ablation.md: a suite may declare `looks`, the seed
counts of its planned reports; with `stop_decided = True` it runs look by look and an arm decided at a
look runs no more seeds). A suite that declares `equal_flops_runs = True` also runs each variant
that costs other model FLOPs per token than the baseline as `<variant>-flops-seed<seed>`, its budget and
cosine ending where it has spent the baseline's FLOPs; the report's equal-FLOPs view reads their final
evaluation. The runs share a W&B group; at the end ablation/render.py writes report.md, report.json
and plots to suite_dir (python report.py rebuilds them).
A suite that declares a `ladder` (ablation/ladder.py) runs every variant x seed at every size, as
`<size>/<variant>-seed<seed>` with the size's shape, token budget and learning rate in its arguments;
each size directory is a suite of its own, and the report adds the effect's trend across sizes.
A forked suite (fork_at) may declare `bridge_seeds`: every variant also from scratch on those seeds as
`scratch-<variant>-seed<seed>`, apart from the branches (ablation/bridge.py); a ladder may declare
`lr_check`: the baseline at multiples of the rule's learning rate at its ends as `<size>/lrcheck-x<f>-seed<s>`.
"""
import csv
import ctypes
import functools
import itertools
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import configurator
import devices
import forking
import optim
import parallel
import rundir
import runrecord
import runtime
import tokendata
from ablation import compare, ladder, plan, render, suites
from slurm import jobs as slurm_jobs

OPTIONS = dict(
    grid="",  # "key=[v1,v2] key2=[...]": added to a sweep file's grid
    sweep_dir="",  # where the runs go ('' = the file's sweep_dir/suite_dir, or out-sweep-<name>)
    gpus="",  # '' = every visible GPU when there are several, else one run at a time; or '0,1,3'
    dry_run=False,  # print the runs (and check them) without starting any
    allow_confounds=False,  # run a suite whose variants differ in undeclared keys (the report still says so)
    cpu_runs=0,  # on a CPU: this many runs at once, each with its share of the cores (0 = one per nproc cores)
    seeds="",  # a suite: run these seeds ('1,2') instead of the file's, e.g. a pilot in its own --sweep_dir
    plan=False,  # a suite: print the seed plan (detectable effect, seeds needed, run count, time) and stop
    pilot="",  # with --plan: finished suite directories (comma-separated, one per design) whose paired differences and run times inform the plan
    budget="",  # with --plan: the wall-clock budget ('30m', '2h', '900s') that chooses the seed count
    measure_step=True,  # with --plan and nothing finished to time from: time a few steps of each variant's model for the suite's time
    launcher="local",  # 'local' (this machine) or 'slurm' (one job array per submission; docs/slurm.md)
    status=False,  # show where each run stands (and build the report once all have finished), start nothing
    # --launcher=slurm: each run's resources; a suite may set them as slurm = dict(partition=..., time=...)
    slurm_partition="",  # '' = the cluster's default partition
    slurm_time="",  # each run's time limit, e.g. '04:00:00' ('' = the partition's); a requeued run gets it anew
    slurm_nodes=1,  # nodes per run; the run's ranks (a suite's nproc) are split evenly over them
    slurm_gpus_per_node=0,  # GPUs per node (0 = ask for none)
    slurm_cpus_per_task=0,  # CPUs per node; 0 = one per rank
    slurm_account="",  # --account ('' = your default)
    slurm_qos="",  # --qos ('' = the default)
    slurm_sbatch="",  # more sbatch options, ';'-separated: "--constraint=a100;--mem=200G"
    slurm_max_running=0,  # runs at once (the array's %N); 0 = as many as the cluster gives
    slurm_signal_s=300,  # SIGTERM this many seconds before the time limit: the last step and the save must fit
)


def parse_args(argv):
    """(sweep spec, options): the spec merges the sweep files, command-line configs and overrides."""
    spec = dict(base=[], grid=[], configs=[], overrides={}, sweep_dir="", suite=None, slurm={})
    options = dict(OPTIONS)
    if any(arg in configurator.HELP_FLAGS for arg in argv):
        raise configurator.HelpRequested(OPTIONS)  # the keys of each run: python train.py --help
    for arg in argv:
        key, raw = configurator.split_arg(arg, {**runtime.DEFAULTS, **OPTIONS})
        if key is not None:
            if key in ("gpus", "seeds", "budget", "pilot"):
                options[key] = raw  # '0' or '0,1,3' (seeds '1,2', budget '30'), never a number
            elif key in OPTIONS:
                options[key] = configurator.check_type(key, configurator.parse_value(raw), OPTIONS[key], arg)
            else:
                spec["overrides"][key] = configurator.parse_value(raw)
        elif (namespace := sweep_file_keys(arg)) is not None:
            read_sweep_file(arg, namespace, spec)
        else:
            spec["configs"].append(arg)
    if options["launcher"] not in ("local", "slurm"):
        raise configurator.ConfigError(f"--launcher={options['launcher']!r}: use 'local' or 'slurm'")
    if options["cpu_runs"] < 0:  # a negative count made no slots: nothing started and the sweep waited forever
        raise configurator.ConfigError(f"--cpu_runs={options['cpu_runs']}: runs at once, an integer >= 1 "
                                       f"(or 0 = one per nproc cores)")
    if options["grid"]:
        spec["grid"].append(parse_grid(options["grid"]))
    spec["allow_confounds"] = options["allow_confounds"]
    if options["sweep_dir"]:
        spec["sweep_dir"] = options["sweep_dir"]
    elif spec["sweep_dir"] and spec["configs"]:  # e.g. the small version of a sweep: its own directory
        spec["sweep_dir"] += "".join("-" + os.path.splitext(os.path.basename(c))[0] for c in spec["configs"])
    if spec["suite"] and spec["grid"]:
        raise configurator.ConfigError("a suite runs its variants x seeds: drop --grid (or the grid file)")
    if options["seeds"]:
        seeds = [s.strip() for s in str(options["seeds"]).split(",")]
        if not spec["suite"] or not all(re.fullmatch(r"\d+", s) for s in seeds) or len(set(seeds)) != len(seeds):
            raise configurator.ConfigError(f"--seeds={options['seeds']!r}: distinct integers >= 0, comma-separated, "
                                           f"for a suite file")
        spec["suite"]["seeds"] = [int(s) for s in seeds]
    if not spec["grid"] and not spec["suite"]:
        raise configurator.ConfigError("no grid: pass --grid=\"key=[v1,v2] ...\", a sweep file defining grid, "
                                       "or a suite file defining variants")
    return spec, options


def sweep_file_keys(path):
    """The top-level names of a sweep file (it sets `grid`) or a suite file (`variants`), even those set
    through exec; None for a train config. The file runs as a config file does: a syntax error or a
    failing line is one line naming file:line, never "no grid"."""
    namespace = configurator.read_config_file(path)
    return namespace if {"grid", "variants"} & set(namespace) else None


def read_sweep_file(path, namespace, spec):
    stem = os.path.splitext(os.path.basename(path))[0]
    if "variants" in namespace:
        spec["suite"] = suites.read_suite(namespace, stem, os.path.dirname(os.path.abspath(path)), runtime.DEFAULTS)  # base too: relative to it
    else:
        grid = namespace["grid"]
        spec["grid"].extend(grid if isinstance(grid, list) else [grid])
    here = os.path.dirname(os.path.abspath(path))
    spec["base"].extend(os.path.normpath(os.path.join(here, b)) if spec["suite"] else b for b in namespace.get("base", []))
    spec["overrides"].update(namespace.get("overrides", {}))
    spec["slurm"].update(namespace.get("slurm", {}))  # each run's Slurm resources: slurm_jobs.resources
    default_dir = f"out-suite-{stem}" if spec["suite"] else "out-sweep-" + stem.removeprefix("sweep_")
    spec["sweep_dir"] = namespace.get("suite_dir", namespace.get("sweep_dir", "")) or spec["sweep_dir"] or default_dir


def parse_grid(text):
    """'learning_rate=[3e-4,6e-4] optimizer=[sgd,adam]' -> {key: [values]} (bare words are strings)."""
    grid = {}
    for key, body in re.findall(r"(\w+)=\[([^\]]*)\]", text):
        grid[key] = [configurator.parse_value(v.strip()) for v in body.split(",") if v.strip()]
    if not grid or re.sub(r"(\w+)=\[([^\]]*)\]", "", text).strip():
        raise configurator.ConfigError(f"--grid={text!r}: write key=[v1,v2] pairs separated by spaces")
    return grid


def expand(grid):
    """Every combination of one grid dict, as a list of {key: value}."""
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def run_name(point):
    parts = []
    for key, value in point.items():
        if key == "config":
            parts.append(os.path.splitext(os.path.basename(value))[0].removeprefix("train_"))
        else:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            parts.append(f"{key}-{text}")
    return re.sub(r"[^\w.+-]", "_", "_".join(parts))


def plan_runs(spec):
    """[(name, point, train.py argv)]: one per grid point (or suite variant x seed), each argv
    checked by the configurator."""
    if not spec["sweep_dir"]:
        spec["sweep_dir"] = "out-sweep"
    overrides = dict(spec["overrides"])
    if {"out_dir", "wandb_run_name", "wandb_group"} & set(overrides):
        raise configurator.ConfigError("the sweep names every run's out_dir, wandb_run_name and wandb_group itself: "
                                       "set --sweep_dir instead")
    if overrides.get("tokens_per_iter"):  # constant tokens per step: each run derives its accumulation
        overrides["gradient_accumulation_steps"] = 0
    suite = spec["suite"]
    points = suite_points(suite) + bridge_points(suite) if suite else [p for grid in spec["grid"] for p in expand(grid)]
    if suite and suite["ladder"]:
        points = ladder_points(spec, overrides, points)
    sweep = os.path.basename(os.path.normpath(spec["sweep_dir"])).removeprefix("out-")
    runs, names = [], set()
    for point in points:
        scaled = ladder.RULE_KEYS if "size" in point else ()  # a ladder's rules scale these from the overrides
        clash = set(point) & set(overrides) - {"config", *scaled}
        if clash:
            raise configurator.ConfigError(f"{sorted(clash)} are both swept and fixed: drop the fixed value")
        name = suite_run_name(point) if suite else run_name(point)
        if name in names:
            raise configurator.ConfigError(planned_twice(name, suite))
        names.add(name)
        out_dir = os.path.join(spec["sweep_dir"], name)
        configs = point.get("config", [])
        argv = [*spec["base"], *([configs] if isinstance(configs, str) else configs), *spec["configs"],
                *(f"--{k}={v!r}" for k, v in overrides.items() if k not in point),
                *(f"--{k}={v!r}" for k, v in point.items() if k not in ("config", "variant", "size", "bridge",
                                                                        "lr_check")),
                f"--out_dir={out_dir}", f"--wandb_run_name={sweep}-{name.replace('/', '-')}"]
        if suite:
            argv.append(f"--wandb_group={sweep}")
        runs.append((name, point, argv))
    resolved = {name: resolve(argv, suite["nproc"] if suite else 1, name) for name, _, argv in runs}
    scratch = [r for r in runs if r[1].get("bridge")]  # a bridge: from scratch, checked and paired on its own
    checks = [r for r in runs if "lr_check" in r[1]]  # a ladder's learning-rate checks: from scratch, apart
    runs = [r for r in runs if not r[1].get("bridge") and "lr_check" not in r[1]]
    if suite:
        check_confounds(suite, runs, resolved, spec)
        reference = (suite["ladder"] or {}).get("reference")  # a ladder tunes its reference size; the rule scales the rest
        suites.check_tuning(suite.get("tuning"), next(resolved[n] for n, p, _ in runs if p["variant"] == suite["baseline"]
                                                      and p.get("size") == reference))
        if scratch:
            check_confounds(suite, scratch, resolved, spec)
        checks += schedule_end_runs(suite, runs, resolved, spec["sweep_dir"])  # apart from the family, like the checks
    if suite and suite["fork_at"]:
        runs = fork_plan(suite, runs, resolved, spec["sweep_dir"])
    return runs + scratch + checks


def planned_twice(name, suite):
    """The one line for a run name planned twice: in a suite, a variant named like a run the sweep makes
    itself (a fork's trunk would wait for itself: the sweep would loop forever)."""
    if not suite:
        return f"the grid holds the run {name!r} twice"
    return (f"the run {name!r} would be planned twice: a variant may not take a name the sweep gives its own runs "
            f"(trunk-seed<s>: a fork's trunk, scratch-<variant>-seed<s>: a bridge run, lrcheck-x<f>-seed<s>, "
            f"<variant>-flops-seed<s>: a run that ends at the baseline's FLOPs): "
            f"rename the variant")


def schedule_end_runs(suite, runs, resolved, sweep_dir):
    """equal_flops_runs: for each variant that costs other model FLOPs per token than the baseline, one more run
    per seed, '<variant>-flops-seed<s>', whose budget (max_iters, and the decay with it; warmup and min_lr kept)
    ends where it has spent the baseline's FLOPs of the whole budget (compare.equal_flops_tokens), so its cosine
    completes there: the report compares its final evaluation with the baseline's, never a value read
    mid-schedule, where the learning rate is still high. FLOPs per token are known before the runs."""
    if not suite.get("equal_flops_runs"):
        return []
    base = {(p.get("size"), p["seed"]): resolved[name] for name, p, _ in runs if p["variant"] == suite["baseline"]}
    flops = functools.lru_cache(maxsize=None)(lambda key: runtime.flops_per_token(json.loads(key)))
    per_token = lambda cfg: flops(json.dumps({k: v for k, v in cfg.items() if k not in compare.BOOKKEEPING},
                                             sort_keys=True))
    names, out = {name for name, _, _ in runs}, []
    for name, point, argv in runs:
        cfg, ref = resolved[name], base[(point.get("size"), point["seed"])]
        own, theirs, tpi = per_token(cfg), per_token(ref), cfg["tokens_per_iter"]
        if own == theirs:
            continue
        if cfg["max_time"] or ref["max_time"]:
            raise configurator.ConfigError("equal_flops_runs with max_time: a time budget ends runs at unpredictable "
                                           "iterations; give the runs an iteration or token budget")
        budget = runtime.last_iter(ref) * tpi
        matched = compare.equal_flops_tokens(budget, 0, theirs, own)
        at = round(matched / tpi)
        if own * abs(at * tpi - matched) > compare.MATCHED_TOLERANCE * theirs * budget:  # the report would not read it
            raise configurator.ConfigError(
                f"equal_flops_runs: {point['variant']} matches the baseline's FLOPs at {matched / tpi:.2f} iterations, "
                f"more than {compare.MATCHED_TOLERANCE:.0%} from a whole one: give the suite a longer budget")
        flops_point = dict(point, flops=True)
        flops_name = suite_run_name(flops_point)
        if flops_name in names:
            raise configurator.ConfigError(planned_twice(flops_name, suite))
        names.add(flops_name)
        decay = round(runtime.decay_iters(cfg) * at / runtime.last_iter(cfg))  # the same shape, ending at `at`
        flops_argv = [a for a in argv if not a.startswith(("--out_dir=", "--wandb_run_name=", "--max_iters=",
                                                           "--max_tokens=", "--lr_decay_iters="))] + [
            f"--max_iters={at}", "--max_tokens=0", f"--lr_decay_iters={decay}",
            f"--out_dir={os.path.join(sweep_dir, flops_name)}",
            f"--wandb_run_name={os.path.basename(os.path.normpath(sweep_dir)).removeprefix('out-')}-"
            f"{flops_name.replace('/', '-')}"]
        resolved[flops_name] = resolve(flops_argv, suite["nproc"], flops_name)
        out.append((flops_name, flops_point, flops_argv))
    return out


def fork_plan(suite, runs, resolved, sweep_dir):
    """A fork suite's runs: first one trunk per seed (per size on a ladder), the baseline's recipe
    stopped at fork_at on the schedule of the whole budget, then every variant, the baseline
    included, as a branch of its seed's trunk (forking.py). A branch whose recipe its trunk cannot
    continue is refused here, before anything runs."""
    trunks, branches = {}, []
    # On a ladder fork_at counts the reference size's iterations: every size forks at the same fraction
    # of its own budget (the same step would be 67% of a small size's budget and 17% of a large one's).
    reference = {p["seed"]: runtime.last_iter(resolved[n]) for n, p, _ in runs if p["variant"] == suite["baseline"]
                 and p.get("size") == (suite["ladder"] or {}).get("reference")}
    for name, point, argv in runs:
        if point["variant"] != suite["baseline"]:
            continue
        cfg = resolved[name]
        if cfg["max_time"]:
            raise configurator.ConfigError("fork_at with max_time: a time budget ends runs at unpredictable "
                                           "iterations; give the runs an iteration or token budget")
        fork_at = max(1, round(suite["fork_at"] * runtime.last_iter(cfg) / reference[point["seed"]])) \
            if suite["ladder"] else suite["fork_at"]
        if not fork_at < runtime.last_iter(cfg):
            where = f" (size {point['size']}'s share of fork_at={suite['fork_at']})" if suite["ladder"] else ""
            raise configurator.ConfigError(f"fork_at={fork_at}{where} is not before the runs' last iteration "
                                           f"({runtime.last_iter(cfg)}): fork earlier")
        trunk = name[:-len(f"{point['variant']}-seed{point['seed']}")] + f"trunk-seed{point['seed']}"
        if any(trunk == other for other, _, _ in runs):
            raise configurator.ConfigError(planned_twice(trunk, suite))
        out_dir = os.path.join(sweep_dir, trunk)
        trunk_argv = [a for a in argv if not a.startswith(("--out_dir=", "--wandb_run_name="))] + [
            f"--max_iters={fork_at}", "--max_tokens=0", f"--lr_decay_iters={runtime.decay_iters(cfg)}",
            "--final_eval_iters=0", f"--out_dir={out_dir}",
            f"--wandb_run_name={os.path.basename(os.path.normpath(sweep_dir)).removeprefix('out-')}-{trunk.replace('/', '-')}"]
        trunks[(point.get("size"), point["seed"])] = (trunk, dict(point, trunk=True), trunk_argv)
    nproc, checked, random_trunks = suite["nproc"], set(), {}  # forking.starts_as_trunk's, one at a time
    for name, point, argv in runs:
        trunk, _, trunk_argv = trunks[(point.get("size"), point["seed"])]
        branch_argv = [*argv, f"--fork_from={os.path.join(sweep_dir, trunk)}"]
        branch_cfg, trunk_cfg = resolve(branch_argv, nproc), resolve(trunk_argv, nproc)
        diffs = forking.recipe_differences(branch_cfg, trunk_cfg)
        if diffs:
            raise configurator.ConfigError(
                f"fork_at: {point['variant']} cannot continue the baseline's trunk, its training recipe differs "
                f"({', '.join(f'{k}: {a!r} vs {b!r}' for k, (a, b) in diffs.items())}); a fork suite compares "
                f"models only: run this suite without fork_at")
        forking.check_models_fork(branch_cfg, trunk_cfg, f"fork_at: {name}")  # tensors, as recipes: before any run
        check_fork_start(suite, point, branch_cfg, trunk_cfg, checked, random_trunks)
        branches.append((name, dict(point, after=trunk), branch_argv))
    return list(trunks.values()) + branches


def check_fork_start(suite, point, branch_cfg, trunk_cfg, checked, random_trunks):
    """The design chosen by what carries: a variant whose branch does not start as its trunk computes
    (forking.starts_as_trunk) is not forked, unless the suite asks the fork's question on purpose
    (fork_cold_starts); checked once per variant and size, before any run, each size's random trunk built
    once for its variants (random_trunks)."""
    key = (point["variant"], point.get("size"))
    if key in checked or point["variant"] == suite["baseline"]:
        return
    checked.add(key)
    why = forking.starts_as_trunk(branch_cfg, trunk_cfg, random_trunks)
    if why and point["variant"] not in suite["fork_cold_starts"]:
        raise configurator.ConfigError(
            f"fork_at: {point['variant']} has no function-preserving start ({why}), so a forked verdict would "
            f"measure the loss jump at the fork, not the idea: run it from scratch (a suite without fork_at), or "
            f"list it in fork_cold_starts to ask the fork's question on purpose")
    if why:
        print(f"note: {point['variant']} forks without a function-preserving start ({why}): fork_cold_starts asks "
              f"the fork's question, not \"does it help?\"")


def resolve(argv, nproc, name=None):
    """The config a run will really use (accumulation derived), or the error that stops the sweep
    before any run starts (naming the run, e.g. a ladder size whose n_head does not divide n_embd)."""
    cfg = configurator.apply_config(runtime.DEFAULTS, argv)
    try:
        return runtime.resolve(dict(cfg, init_from="scratch"), nproc if nproc % cfg["tp_size"] == 0 else 1)
    except configurator.ConfigError as e:
        if name is None:
            raise
        raise configurator.ConfigError(f"run {name}: {e}") from None


def suite_points(suite):
    """One point per variant x seed: the variant's config files and keys, and the seed."""
    return [{**body, "variant": variant, "seed": seed} for variant, body in suite["variants"].items()
            for seed in suite["seeds"]]


def bridge_points(suite):
    """A forked suite's bridge (bridge_seeds, ablation/bridge.py): every variant also from scratch on
    those seeds, run as 'scratch-<variant>-seed<seed>', never forked and never pooled with the branches."""
    return [{**body, "variant": variant, "seed": seed, "bridge": True} for variant, body in suite["variants"].items()
            for seed in suite.get("bridge_seeds") or []]


def suite_run_name(point):
    """'<variant>-seed<seed>', in the size's subdirectory for a ladder ('w64/baseline-seed1'); a
    bridge's from-scratch run 'scratch-<variant>-seed<seed>'."""
    name = f"{'scratch-' if point.get('bridge') else ''}{point['variant']}-{'flops-' if point.get('flops') else ''}seed{point['seed']}"
    if "lr_check" in point:
        name = f"lrcheck-x{point['lr_check']:g}-seed{point['seed']}"
    return f"{point['size']}/{name}" if "size" in point else name


def ladder_points(spec, overrides, points):
    """A ladder suite's points: every variant x seed at every size, size by size, each with
    the keys ladder.size_keys derives from that variant's own recipe (the shape, the token budget
    and the learning rate), so every run's arguments, and its config.json, record them."""
    sized = {}
    for point in points:
        recipe = configurator.apply_config(runtime.DEFAULTS, [*spec["base"], *point.get("config", []), *spec["configs"],
                                                              *(f"--{k}={v!r}" for k, v in overrides.items())])
        try:
            suites.check_ladder_recipe(spec["suite"]["ladder"], recipe)
            sizes = ladder.size_keys(spec["suite"]["ladder"], recipe)
        except ValueError as e:
            raise configurator.ConfigError(f"variant {point['variant']!r}: {e}") from None
        for size, keys in sizes.items():
            sized.setdefault(size, []).append(dict(point, size=size, **keys))
    return [p for size_points in sized.values() for p in size_points] + lr_check_points(spec["suite"], sized)


def lr_check_points(suite, sized):
    """A ladder's lr_check (ablation/ladder.py): at its smallest and largest size the baseline of
    the first seed from scratch, the whole budget, at 1x and each factor of the rule's learning rate,
    as '<size>/lrcheck-x<factor>-seed<seed>': runs apart from the size's family, never compared in it."""
    ladder_, out = suite["ladder"], []
    if not ladder_.get("lr_check"):
        return out
    by_n = sorted(ladder_["sizes"], key=lambda n: ladder.non_embedding_params(ladder_["sizes"][n]))
    for size in dict.fromkeys([by_n[0], by_n[-1]]):
        base = next(p for p in sized[size] if p["variant"] == suite["baseline"] and p["seed"] == suite["seeds"][0])
        for factor in [1.0, *ladder_["lr_check"]]:
            out.append(dict(base, lr_check=factor, learning_rate=float(f"{base['learning_rate'] * factor:.4g}"),
                            min_lr=float(f"{base['min_lr'] * factor:.4g}")))
    return out


def check_confounds(suite, runs, resolved, spec):
    """Every difference between a variant's resolved config and the baseline's (same seed) must be
    a declared key; otherwise the suite is refused before any run starts."""
    base = {(p.get("size"), p["seed"]): resolved[name] for name, p, _ in runs if p["variant"] == suite["baseline"]}
    problems = []
    for name, point, _ in runs:
        paired = base[(point.get("size"), point["seed"])]  # a ladder's runs are paired within their size
        for key, (value, theirs) in compare.config_differences(resolved[name], paired, suite["allowed"]).items():
            where = f" at size {point['size']}" if "size" in point else ""
            problems.append(f"{point['variant']}{where}: {key} = {value!r} vs baseline {theirs!r}")
    if suite["ladder"]:  # across sizes only the ladder's keys may differ (within a size, as above, none)
        seed = suite["seeds"][0]
        problems += [f"size {size}: {key} = {value!r} vs size {suite['ladder']['reference']} {theirs!r}"
                     for size, key, value, theirs in ladder.across_size_problems(
                         {size: base[(size, seed)] for size in suite["ladder"]["sizes"]}, suite["ladder"])]
    problems = list(dict.fromkeys(problems))
    if problems and not spec["allow_confounds"]:
        raise configurator.ConfigError(
            f"suite {suite['name']!r} is not comparable: {'; '.join(problems)}. Declare the key in `allowed` if "
            f"it is the idea under test, fix the variant, or pass --allow_confounds=True to run it anyway")
    for problem in problems:
        print(f"warning: not comparable: {problem}")


def launch_subprocess(argv, gpus, log_path, nproc=1):
    """Start one run of train.py (under torchrun with nproc > 1) on the GPUs of its slot; its
    console output goes to log_path."""
    env = dict(os.environ)
    if str(gpus).startswith("cpu"):  # one of several CPU slots: its share of the cores
        env["OMP_NUM_THREADS"] = gpus.split(":")[1].split("#")[0]
    elif gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpus)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] \
        if nproc > 1 else [sys.executable]
    out = open(log_path, "a")
    return subprocess.Popen([*launcher, os.path.join(runtime.REPO_DIR, "train.py"), *argv], env=env,
                            stdout=out, stderr=subprocess.STDOUT, cwd=runtime.REPO_DIR, preexec_fn=die_with_parent)


def die_with_parent():
    """In a training process before it starts: the kernel sends it SIGTERM when the sweep dies,
    even by kill -9, so a dead sweep leaves no orphan run holding a GPU (train.py then saves a
    checkpoint and stops, and the next sweep resumes it). Linux only; elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def default_gpus(option, nproc=1, cpu_runs=0):
    """Run slots, one run per slot at a time: groups of nproc GPUs ('0,1') from --gpus or every
    visible GPU, [None] with one GPU; on a machine without a GPU (or with cpu_runs set) CPU slots
    that share the cores ('cpu:<threads>#<slot>'), by default one per nproc cores with one thread
    per rank: the thread count of a Slurm job's rank, so both launchers compute the same numbers."""
    import torch
    if option:
        gpus = [g.strip() for g in str(option).split(",") if g.strip()]
    elif not cpu_runs and torch.cuda.is_available():
        gpus = [str(i) for i in range(torch.cuda.device_count())]
        gpus = gpus if len(gpus) > 1 else []
    else:
        cores = os.cpu_count() or 1
        runs = cpu_runs or max(1, cores // nproc)
        return [f"cpu:{max(1, cores // (runs * nproc))}#{i}" for i in range(runs)]
    slots = [",".join(gpus[i:i + nproc]) for i in range(0, len(gpus) - nproc + 1, nproc)]
    return slots or [None]


EXIT_PAUSED = 3  # train.py's exit code after a first signal: the step finished and a checkpoint was written


def trunk_problem(trunk_dir):
    """Why a branch cannot start, from its trunk's state, with what to do (one line)."""
    state = rundir.run_status(rundir.read_events(trunk_dir)) if os.path.isdir(trunk_dir) else "missing"
    if state == "missing":
        return f"its trunk {trunk_dir} is missing (deleted?): run the same command again to retrain it"
    if state == "diverged":
        return (f"its trunk {trunk_dir} diverged and would diverge again on every rerun: change the recipe (e.g. a "
                f"lower learning_rate) and run it in a new sweep_dir")
    if state == "preempted":
        return f"its trunk {trunk_dir} was paused by a signal: run the same command again to resume it"
    return f"its trunk {trunk_dir} did not finish (see its console.txt), run the same command again to retry it"


class SweepInterrupted(Exception):
    exit_code = 130  # the shell's code for Ctrl-C


def family_order(runs):
    """The runs seed by seed: each seed's family (a fork's trunk, then every variant of that seed) before the
    next seed's, a bridge's from-scratch runs and a ladder's learning-rate checks after the suite's own, each
    seed by seed too; within a seed the plan's order. A suite stopped at any point then holds complete pairs
    (a grid, without seeds, keeps its order)."""
    return sorted(runs, key=lambda run: (bool(run[1].get("bridge")), "lr_check" in run[1], run[1].get("seed", 0)))


def run_all(runs, sweep_dir, gpus, launch=launch_subprocess):
    """Run the unfinished runs, one per GPU slot at a time, seed by seed (family_order), a fork's branches
    once their trunk has finished; returns {name: return code}."""
    todo, after = [], {name: point.get("after") for name, point, _ in runs}
    trunk_finished = lambda name: rundir.run_status(rundir.read_events(os.path.join(sweep_dir, after[name]))) \
        == "finished" if after[name] else True
    for name, point, argv in family_order(runs):
        out_dir = os.path.join(sweep_dir, name)
        state = rundir.run_status(rundir.read_events(out_dir))
        if state in ("finished", "diverged"):  # a diverged run would only diverge again
            print(f"skip {name}: {'finished' if state == 'finished' else 'diverged (reported, not rerun)'}")
            continue
        if rundir.checkpoint_path(out_dir):  # ckpt.pt or, written by sharded ranks, dcp/latest
            argv = [*argv, "--init_from=resume"]
            print(f"resume {name} from its checkpoint")
        todo.append((name, argv))
    codes, active = {}, {}  # gpu slot -> (name, process)
    while todo or active:
        pending = {n for n, _ in todo} | {n for n, *_ in active.values()}
        for name, _ in [t for t in todo if after[t[0]] and after[t[0]] not in pending and not trunk_finished(t[0])]:
            codes[name] = codes.get(after[name]) or 1
            print(f"FAILED {name}: {trunk_problem(os.path.join(sweep_dir, after[name]))}", flush=True)
        todo = [t for t in todo if t[0] not in codes]
        for slot in gpus:
            ready = next((t for t in todo if trunk_finished(t[0])), None)
            if slot not in active and ready:
                todo.remove(ready)
                name, argv = ready
                os.makedirs(os.path.join(sweep_dir, name), exist_ok=True)
                where = "" if slot is None else f" on GPU {slot}" if not slot.startswith("cpu") \
                    else f" ({slot.split('#')[0].removeprefix('cpu:')} threads)"
                print(f"start {name}{where}", flush=True)
                started = time.time()
                active[slot] = (name, launch(argv, slot, os.path.join(sweep_dir, name, "console.txt")), started)
        for slot, (name, proc, started) in list(active.items()):
            if proc.poll() is not None:
                codes[name] = proc.returncode
                word = {0: "done", EXIT_PAUSED: "paused"}.get(proc.returncode, "FAILED")
                why = " (stopped by a signal after writing a checkpoint: run the same command to resume it)" \
                    if proc.returncode == EXIT_PAUSED else f" (exit {proc.returncode})"
                print(f"{word} {name}{why}", flush=True)
                del active[slot]
                with open(os.path.join(sweep_dir, suites.LAUNCHES), "a") as f:  # what --plan times a seed by
                    f.write(json.dumps(dict(run=name, start=started, end=time.time(), exit=proc.returncode)) + "\n")
                here = lambda names: [os.path.join(sweep_dir, n) for n in names]
                print(slurm_jobs.progress_line(here(n for n, _, _ in runs), here(n for n, *_ in active.values()),
                                                 here(n for n, _ in todo), len(gpus)), flush=True)
        if active:
            try:
                time.sleep(0.5)
            except KeyboardInterrupt:  # Ctrl-C reached the runs too: each finishes its step and saves
                for name, proc, _ in active.values():
                    proc.wait()
                raise SweepInterrupted(f"interrupted: {len(active)} running run(s) saved a checkpoint and "
                                       f"stopped; run the same command again to resume them") from None
    return codes


def run_by_looks(runs, suite, sweep_dir, gpus, launch=launch_subprocess):
    """A suite that stops decided arms (stop_decided): its runs look by look, the seeds up to each planned look of
    the baseline and the arms still open, then the look (suites.take_look) before later seeds start. A decided
    arm's later seeds never run; the baseline goes on while any arm is open. Re-run, the finished runs are skipped
    and the looks taken again from them. A failed or paused run ends it before its look; returns {name: code}."""
    seeds, codes, stopped = sorted(suite["seeds"]), {}, set()
    own = [r for r in runs if not r[1].get("bridge") and "lr_check" not in r[1]]
    for n in [n for n in suite["looks"] if n < len(seeds)] + [len(seeds)]:
        codes.update(run_all([r for r in own if r[1]["seed"] in seeds[:n] and r[1]["variant"] not in stopped],
                             sweep_dir, gpus, launch))
        if any(code != 0 for code in codes.values()):
            return codes
        if n in suite["looks"]:
            stopped = suites.take_look(sweep_dir, n) or stopped  # None: nothing could be tested, nothing stops
            print(f"look at {n} seeds: stopped (decided) {', '.join(sorted(stopped)) or 'none'}", flush=True)
        if stopped >= set(suite["variants"]) - {suite["baseline"]}:
            break  # every arm decided: the baseline stops too
    return {**codes, **run_all([r for r in runs if r not in own], sweep_dir, gpus, launch)}


SUMMARY_COLUMNS = ("run", "status", "iters", "tokens", "best_val_loss", "best_val_ppl", "final_val_loss",
                   "sparsity", "memory_ratio", "train_time_s")


def summarize(runs, sweep_dir):
    """One row per run from its log.jsonl; written as summary.csv and summary.md."""
    keys = sorted({k for _, point, _ in runs for k in point})
    rows = []
    for name, point, _ in runs:
        events = rundir.read_events(os.path.join(sweep_dir, name))
        evals = [e for e in events if e["event"] == "eval"]
        end = rundir.finished(events)
        status = rundir.run_status(events)
        best = min((e["val_loss"] for e in evals), default=None)
        values = {k: os.path.basename(v) if k == "config" else v for k, v in point.items()}
        row = {"run": name, **{k: values.get(k, "") for k in keys},
               "status": status,
               "iters": evals[-1]["iter"] if evals else "", "tokens": evals[-1]["tokens"] if evals else "",
               "best_val_loss": best, "best_val_ppl": math.exp(best) if best is not None else None,
               "final_val_loss": evals[-1]["val_loss"] if evals else None,
               "sparsity": evals[-1].get("sparsity", "") if evals else "",
               "memory_ratio": evals[-1].get("memory_ratio", "") if evals else "",
               "train_time_s": end[-1]["train_time"] if end else ""}
        rows.append(row)
    columns = ["run", *keys, *SUMMARY_COLUMNS[1:]]
    os.makedirs(sweep_dir, exist_ok=True)
    with open(os.path.join(sweep_dir, "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    cell = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    with open(os.path.join(sweep_dir, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return rows


def main(argv, launch=launch_subprocess, step_timer=None):
    spec, options = parse_args(argv)
    runs = plan_runs(spec)
    sweep_dir, suite = spec["sweep_dir"], spec["suite"]
    nproc = suite["nproc"] if suite else 1
    if options["status"]:
        return show_status(still_planned(runs, suite, sweep_dir, say=True), suite, sweep_dir)
    if suite and suite.get("stop_decided") and options["launcher"] == "slurm":  # an array submits every seed at once
        raise configurator.ConfigError("stop_decided runs look by look on the local launcher; a Slurm array would "
                                       "submit every seed at once: drop --launcher=slurm, or stop_decided")
    slurm = slurm_jobs.resources(options, spec["slurm"], nproc, OPTIONS) if options["launcher"] == "slurm" else None
    print(f"{len(runs)} runs in {sweep_dir}:")
    for name, _, run_argv in family_order(runs):  # the order run_all launches them in
        print(f"  {name}: {'torchrun --nproc_per_node=%d' % nproc if nproc > 1 else 'python'} train.py "
              f"{' '.join(run_argv)}")
    if options["plan"]:
        if not suite:
            raise configurator.ConfigError("--plan needs a suite file (variants x seeds)")
        pilots = [p.strip() for p in options["pilot"].split(",") if p.strip()]
        slots_of = default_gpus(options["gpus"], nproc, options["cpu_runs"])
        budget, slots = parse_budget(options["budget"]), len(slots_of)
        for pilot in pilots:  # a pilot that is not what this suite needs is named, never read as "no pilot"
            if suite["ladder"] and not suites.is_ladder_dir(pilot):
                raise configurator.ConfigError(f"--pilot={pilot}: a ladder is planned from a finished ladder directory "
                                               f"(each size its own family), and {pilot} is none")
            if not suite["ladder"]:
                try:
                    suites.check_suite_dir(pilot)
                except ValueError as e:
                    raise configurator.ConfigError(f"--pilot: {e}") from None
        problem = data_problem(runs, nproc)
        if problem:  # a plan made before the data is prepared is fine; its runs would stop at start-up
            print(render.data_missing_line(problem))
        if suite["ladder"]:
            print("\n".join(plan.ladder_plan_text(suite, len(runs), d, budget, slots) for d in pilots or [sweep_dir]))
        else:
            print(plan.seed_plan_text(suite, len(runs), pilots or [sweep_dir], budget, slots, own_dir=sweep_dir))
            if options["measure_step"] and not pilots and not plan.timed_by_own_runs(sweep_dir):
                print(render.measured_time_line(measured_plan_time(runs, nproc, slots_of, step_timer
                                                                   or measure_step_seconds)))
        if suite["ladder"]:  # what the ladder costs in GPU-hours (ablation/ladder.py)
            compute = ladder.training_compute([resolve(argv, nproc) for _, _, argv in runs], suite["fork_at"])
            print("\n".join(render.compute_lines(compute)))
        return runs
    if options["dry_run"]:
        return runs
    check_data(runs, nproc)
    if suite:
        suites.check_declaration(suite, sweep_dir)  # a changed declaration is named as such, before the runs' recipes
    check_runs_on_disk(runs, sweep_dir, nproc)
    if suite:
        for line in other_code_lines(runs, sweep_dir):
            print(line)
    mark_stale(still_planned(runs, suite, sweep_dir), suite, sweep_dir)  # a stopped arm's seeds were never there
    if slurm:
        with rundir.out_dir_lock(sweep_dir, holder="sweep"):  # two submissions would both submit the same runs
            if suite:
                suites.freeze_suite(suite, runs, sweep_dir)
            slurm_jobs.submit(family_order(runs), sweep_dir, nproc, slurm,  # array tasks start in order: seed by seed
                                [sys.executable, os.path.join(runtime.REPO_DIR, "sweep.py"), *argv, "--status=True"])
        return runs
    if launch is launch_subprocess:
        launch = functools.partial(launch_subprocess, nproc=nproc)
    with rundir.out_dir_lock(sweep_dir, holder="sweep"):  # two sweeps on one directory would race for its runs
        if suite:
            suites.freeze_suite(suite, runs, sweep_dir)
        gpus = default_gpus(options["gpus"], nproc, options["cpu_runs"])
        codes = run_by_looks(runs, suite, sweep_dir, gpus, launch) if suite and suite.get("stop_decided") \
            else run_all(runs, sweep_dir, gpus, launch)
    if suite:
        print(open(suites.report_suite_dir(sweep_dir)).read())
    else:
        summarize(runs, sweep_dir)
        print(open(os.path.join(sweep_dir, "summary.md")).read())
    failed = [name for name, code in codes.items() if code not in (0, EXIT_PAUSED)]
    paused = [name for name, code in codes.items() if code == EXIT_PAUSED]
    if failed or paused:
        raise RuntimeError("; ".join(([f"{len(failed)} runs failed: {', '.join(failed)} (see their console.txt)"]
                                      if failed else []) + ([f"{len(paused)} runs paused by a signal with a checkpoint: "
                                                             f"{', '.join(paused)} (run the same command to resume them)"]
                                                            if paused else [])))
    return runs


def parse_budget(text):
    """'30m', '2h', '900s' (or '') -> seconds (or None)."""
    if not text:
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not found:
        raise configurator.ConfigError(f"--budget={text!r}: a wall-clock time such as 30m, 2h or 900s")
    if not found.group(2):
        raise configurator.ConfigError(f"--budget={text!r} has no unit: write {text}s, {text}m or {text}h")
    seconds = float(found.group(1)) * {"s": 1, "m": 60, "h": 3600}[found.group(2)]
    if not math.isfinite(seconds):  # 320 nines: a float's infinity, whose seed count would be NaN
        raise configurator.ConfigError(f"--budget={text[:12]}...: too large to be a time; write one such as 30m or 2h")
    if seconds <= 0:
        raise configurator.ConfigError(f"--budget={text!r}: a budget must be longer than 0")
    return seconds


def check_data(runs, nproc):
    """Every run's data, checked as train.py checks it, before any run starts or any job is
    submitted: a missing dataset is one line, not one doomed run (or Slurm job) per variant x seed."""
    problem = data_problem(runs, nproc)
    if problem:
        raise configurator.ConfigError(problem)


def data_problem(runs, nproc):
    """The first run whose data train.py would refuse, as one line naming the run and the fix; None when all pass."""
    for name, _, argv in runs:
        try:
            tokendata.check_data(resolve(argv, nproc))
        except (FileNotFoundError, configurator.ConfigError) as e:
            return f"run {name}: {e}"
    return None


def measure_step_seconds(cfg, threads, steps=3):
    """Seconds of one training step of cfg's fresh model on its device, on random tokens: one micro-batch's
    forward and backward x gradient_accumulation_steps, then clipping and the optimizer's step, each the
    median of `steps` after a warm-up (so a large model costs a few micro-batches, not a few whole steps),
    with `threads` CPU threads (None: as they are). Eager, so a compiled run's speed-up is not counted;
    head_loss 'auto' as chunked on a CPU and full on a GPU, attn_impl 'auto' as sdpa (neither measured here)."""
    import torch
    device = parallel.pick_device(cfg["device"])
    head = cfg["head_loss"] if cfg["head_loss"] != "auto" else "full" if device.startswith("cuda") else "chunked"
    cfg = dict(cfg, head_loss=head, attn_impl="sdpa" if cfg["attn_impl"] == "auto" else cfg["attn_impl"])
    _, autocast = devices.precision(cfg["dtype"], device)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        model = runtime.build_model(cfg).to(device)
        optimizer = optim.build_optimizer(model, cfg)
        tokens = torch.randint(0, cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), device=device)
        micro_s, update_s = [], []
        for _ in range(1 + steps):
            devices.synchronize(device)
            began = time.perf_counter()
            with autocast:
                loss = model(tokens, tokens)[1]
            loss.backward()
            devices.synchronize(device)
            middle = time.perf_counter()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"] or float("inf"))
            optimizer.step(**optim.step_kwargs(optimizer, grad_norm))
            optimizer.zero_grad(set_to_none=True)
            devices.synchronize(device)
            micro_s.append(middle - began)
            update_s.append(time.perf_counter() - middle)
    finally:
        torch.set_num_threads(before)
    return cfg["gradient_accumulation_steps"] * statistics.median(micro_s[1:]) + statistics.median(update_s[1:])


# A CPU micro-batch of more training FLOPs than this is not timed at --plan: a minute or more on a core
# (the CPU twin's is 7e9 FLOPs, under a second on a loaded core; GPT-2 124M's 1.4e13, 2000x that).
CPU_MEASURE_FLOPS = 1e11


def measured_plan_time(runs, nproc, slots, step_timer=measure_step_seconds):
    """--plan's time without a pilot, for render.measured_time_line: each variant's step timed once
    (step_timer(cfg, threads), with the threads a CPU slot gives a run), each run its training iterations
    of it (a branch from its trunk's end), the suite that sum over the run slots. Not measured (its code
    says why) for runs of several processes, which one process cannot time, nor for a model too large to
    time on a CPU (CPU_MEASURE_FLOPS)."""
    if nproc > 1:
        return dict(code="several_processes", nproc=nproc)
    threads = int(slots[0].split(":")[1].split("#")[0]) if str(slots[0]).startswith("cpu") else None
    resolved = {name: resolve(argv, nproc) for name, _, argv in runs}
    for name, cfg in resolved.items():
        flops = runtime.flops_per_token(cfg) * cfg["batch_size"] * cfg["block_size"]
        if parallel.pick_device(cfg["device"]) == "cpu" and flops > CPU_MEASURE_FLOPS:
            return dict(code="too_large_for_cpu", run=name, flops=flops, limit=CPU_MEASURE_FLOPS)
    step_s, train_s = {}, 0.0
    for name, point, _ in runs:
        variant = point.get("variant", name) + (f" at {point['size']}" if point.get("size") else "")
        if variant not in step_s:
            step_s[variant] = step_timer(resolved[name], threads)
        cfg = resolved[name]
        iters = runtime.last_iter(cfg) - (runtime.last_iter(resolved[point["after"]]) if point.get("after") else 0)
        run_s = iters * step_s[variant]
        train_s += min(run_s, cfg["max_time"]) if cfg["max_time"] else run_s
    return dict(code="measured", runs=len(runs), slots=len(slots), threads=threads, step_s=step_s, train_s=train_s,
                wall_s=train_s / len(slots))


BUDGET_KEYS = ("max_iters", "max_tokens", "max_time")


def check_runs_on_disk(runs, sweep_dir, nproc):
    """Runs already in sweep_dir (finished, or to be resumed) started with the recipe the sweep plans
    now, or the sweep is refused before anything runs: a changed recipe would otherwise skip the old
    finished runs, train only the new seeds on the new one and pool them (and a stale trunk would
    fail its branches)."""
    stale = []
    for name, _, argv in runs:
        path = os.path.join(sweep_dir, name, "config.json")
        try:
            with open(path) as f:
                ran = runtime.settle({**runtime.DEFAULTS, **{k: v for k, v in json.load(f).items()
                                                             if k in runtime.DEFAULTS}})
        except (OSError, ValueError):
            continue  # never started, or its config is damaged (the report names that)
        planned = resolve(argv, nproc)
        done = rundir.run_status(rundir.read_events(os.path.join(sweep_dir, name))) == "finished"
        # an unfinished run may resume to a longer budget (train.py allows it) on the same schedule
        diffs = compare.config_differences(ran, planned, () if done else BUDGET_KEYS)
        if not done and runtime.decay_iters(ran) != runtime.decay_iters(planned):
            diffs["lr_decay_iters (resolved)"] = (runtime.decay_iters(ran), runtime.decay_iters(planned))
        if diffs:
            stale.append(f"{name} ({', '.join(f'{k}={a!r} there, {b!r} now' for k, (a, b) in diffs.items())})")
    if stale:
        raise configurator.ConfigError(
            f"{len(stale)} run(s) in {sweep_dir} were started with another recipe than this sweep plans: "
            f"{'; '.join(stale[:3])}{' ...' if len(stale) > 3 else ''}. Restore the recipe they ran with, or give "
            f"the new recipe its own --sweep_dir (runs of two recipes are never pooled)")


def other_code_lines(runs, sweep_dir):
    """A line per code version other than this checkout's that runs already in sweep_dir trained at (run_info.json's
    code versions), with their seeds. Seeds at two versions are pooled, but a report refuses a pair whose two runs
    differ in it: a seed with runs there and runs still to make here is named, with how to finish it."""
    ran, to_make = {}, set()
    for name, point, _ in runs:
        out_dir = os.path.join(sweep_dir, name)
        if rundir.run_status(rundir.read_events(out_dir)) != "finished":
            to_make.add(point.get("seed"))
        try:
            versions = rundir.read_run_info(out_dir).get("code_versions", [])
        except rundir.RunDirError:
            continue  # a damaged record: the report names it
        for version in versions:
            ran.setdefault(version, []).append((name, point.get("seed")))
    if not ran:  # nothing recorded yet: no git calls
        return []
    here = runrecord.code_version(*runrecord.git_state(runtime.REPO_DIR)) or "unknown"
    lines = []
    for version, named in sorted((v, named) for v, named in ran.items() if v != here):
        seeds = sorted({s for _, s in named if s is not None})
        split = [s for s in seeds if s in to_make]
        lines.append(f"note: {len(named)} run(s) in {sweep_dir} trained at code version {version}"
                     + (f" (seeds {render.seed_ranges(seeds)})" if seeds else f" (e.g. {named[0][0]})")
                     + f", this checkout is {here}: runs made here pool with them across seeds, and the report names "
                     f"each version's seeds; a pair across two versions is refused"
                     + (f". Seed{'s' if len(split) > 1 else ''} {render.seed_ranges(split)} also "
                        f"ha{'ve' if len(split) > 1 else 's'} runs still to make, which would pair across "
                        f"versions: finish them at {version} (git worktree add DIR {version.split('+')[0]}, the run "
                        f"records copied in), or delete their runs there to make the seed again here" if split else ""))
    return lines


def mark_stale(runs, suite, sweep_dir):
    """A report (or a grid's table) older than what it was built from (a run directory deleted, a
    run started again since): its first line says so until it is rebuilt."""
    path = os.path.join(sweep_dir, "report.md" if suite else "summary.md")
    if not os.path.exists(path):
        return
    built = os.path.getmtime(path)
    log = lambda name: os.path.join(sweep_dir, name, "log.jsonl")
    changed = [name for name, _, _ in runs if not os.path.isdir(os.path.join(sweep_dir, name))
               or os.path.exists(log(name)) and os.path.getmtime(log(name)) > built]
    if not changed:
        return
    text = open(path).read()
    notice = (f"> **Stale**: {', '.join(changed)} changed or {'was' if len(changed) == 1 else 'were'} deleted since "
              f"this was built; it is rebuilt when every run has finished.\n\n")
    with rundir.atomic_write(path, "w") as f:
        f.write(notice + (text.split("\n\n", 1)[1] if text.startswith("> **Stale**") else text))
    print(f"{path} is stale: {len(changed)} of its runs changed or were deleted since it was built")


def still_planned(runs, suite, sweep_dir, say=False):
    """The runs a suite still plans: a stop_decided suite's record names the arms a look decided, whose later
    seeds never run (with `say`, printed as such, never listed as not run)."""
    stopped = suites.stopped_arms(suites.read_suite_record(sweep_dir)) if suite and suite.get("stop_decided") else {}
    seeds = sorted(suite["seeds"]) if suite else []
    never = lambda point: point.get("variant") in stopped and not point.get("bridge") and "lr_check" not in point \
        and seeds.index(point["seed"]) >= stopped[point["variant"]]["seeds"]
    for variant, stop in stopped.items() if say else ():
        print(f"{variant}: stopped at look {stop['look_number']} ({stop['seeds']} seeds), decided: its later seeds "
              f"never run")
    return [run for run in runs if not never(run[1])]


def show_status(runs, suite, sweep_dir):
    """Where each run stands (sweep.py --status); once every run has finished, the report (a suite)
    or the table (a grid) is built."""
    states = slurm_jobs.run_states(runs, sweep_dir)
    if slurm_jobs.out_dir_busy(sweep_dir):  # a local sweep runs: the runs it has not started wait in its queue
        for s in states:
            s["state"] = "queued" if s["state"] == "not run" else s["state"]
    print(slurm_jobs.status_text(states, sweep_dir))
    waiting = {s["name"] for s in states if s["state"] not in slurm_jobs.DONE}
    for trunk in dict.fromkeys(p["after"] for name, p, _ in runs if p.get("after") and name in waiting):
        if rundir.run_status(rundir.read_events(os.path.join(sweep_dir, trunk))) == "diverged":  # never "submit again"
            print(f"its branches cannot start: {trunk_problem(os.path.join(sweep_dir, trunk))}")
    try:
        mark_stale(runs, suite, sweep_dir)
        if all(s["state"] in slurm_jobs.DONE for s in states):
            if suite:
                path = suites.report_suite_dir(sweep_dir)
            else:
                summarize(runs, sweep_dir)
                path = os.path.join(sweep_dir, "summary.md")
            print(f"every run has finished: {path}")
    except OSError as e:
        raise rundir.RunDirError(rundir.describe_write_error(e, e.filename or sweep_dir, "the status above is complete "
                                 "but the report was not written: make the directory writable, or build the report "
                                 "elsewhere with python report.py SUITE_DIR --out=DIR")) from None
    return runs


if __name__ == "__main__":
    configurator.run_script(main, RuntimeError, SweepInterrupted, rundir.RunDirError)
