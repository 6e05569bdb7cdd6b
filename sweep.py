"""Expand a base config over a grid into train.py runs, run them, and tabulate the results.

    python sweep.py config/train_wikitext2.py --grid="learning_rate=[3e-4,6e-4] batch_size=[8,16]"
    python sweep.py config/sweep_pruning_matrix.py                  # the notes' pruning matrix
    python sweep.py config/sweep_pruning_matrix.py config/small_shakespeare.py   # its CPU version
    python sweep.py config/sweep_wikitext2_optimizers.py --max_iters=500 --dry_run=True

Arguments: sweep files (Python, defining `grid` and optionally `base`, `overrides`, `sweep_dir`),
train config files, `--key=value` overrides for every run, and the sweep's own options:
--grid (added to the file's grid), --sweep_dir, --gpus ('' = every visible GPU when there are
several, else one run at a time; or '0,1,3'), --dry_run=True (print the runs only).

`grid` is a dict {key: [values]} (the product of all values), or a list of such dicts (their
union, e.g. each optimizer with learning rates of its own regime). The grid key `config` takes
config files. A run's arguments are, in order: the sweep file's base configs, the grid's config
file, the command line's config files, the fixed overrides, the grid's other keys.

Tokens per step: set tokens_per_iter (in `overrides` or --tokens_per_iter=N) and every run
derives its accumulation from it (gradient_accumulation_steps=0); train.py refuses a batch size
that cannot meet it exactly. Each run gets its own out_dir under sweep_dir and a W&B name; a run
whose log has an `end` event is skipped, an unfinished one with a checkpoint resumes. The table
(summary.md, summary.csv in sweep_dir) has the best val loss and perplexity of every run.
"""
import ast
import csv
import ctypes
import itertools
import math
import os
import re
import signal
import subprocess
import sys
import time

import configurator
import rundir
import runtime

REPO_DIR = os.path.dirname(os.path.abspath(__file__))
OPTIONS = dict(grid="", sweep_dir="", gpus="", dry_run=False)


def parse_args(argv):
    """(sweep spec, options): the spec merges the sweep files, command-line configs and overrides."""
    spec = dict(base=[], grid=[], configs=[], overrides={}, sweep_dir="")
    options = dict(OPTIONS)
    for arg in argv:
        if arg.startswith("--"):
            key, sep, raw = arg[2:].partition("=")
            if not sep:
                raise configurator.ConfigError(f"{arg!r} needs a value: write --{key}=VALUE")
            if key == "gpus":
                options[key] = raw  # '0' or '0,1,3', never a number
            elif key in OPTIONS:
                options[key] = configurator.check_type(key, configurator.parse_value(raw), OPTIONS[key], arg)
            else:
                spec["overrides"][key] = configurator.parse_value(raw)
        elif is_sweep_file(arg):
            read_sweep_file(arg, spec)
        else:
            spec["configs"].append(arg)
    if options["grid"]:
        spec["grid"].append(parse_grid(options["grid"]))
    if options["sweep_dir"]:
        spec["sweep_dir"] = options["sweep_dir"]
    elif spec["sweep_dir"] and spec["configs"]:  # e.g. the small version of a sweep: its own directory
        spec["sweep_dir"] += "".join("-" + os.path.splitext(os.path.basename(c))[0] for c in spec["configs"])
    if not spec["grid"]:
        raise configurator.ConfigError("no grid: pass --grid=\"key=[v1,v2] ...\" or a sweep file defining grid")
    return spec, options


def is_sweep_file(path):
    """A file that assigns `grid` at top level describes a sweep; any other is a train config."""
    try:
        body = ast.parse(open(path).read()).body
    except (OSError, SyntaxError):
        return False
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "grid" for t in node.targets)
               for node in body)


def read_sweep_file(path, spec):
    namespace = {"__file__": os.path.abspath(path)}
    exec(compile(open(path).read(), path, "exec"), namespace)
    grid = namespace["grid"]
    spec["grid"].extend(grid if isinstance(grid, list) else [grid])
    spec["base"].extend(namespace.get("base", []))
    spec["overrides"].update(namespace.get("overrides", {}))
    spec["sweep_dir"] = namespace.get("sweep_dir", "") or spec["sweep_dir"] or \
        "out-sweep-" + os.path.splitext(os.path.basename(path))[0].removeprefix("sweep_")


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


def plan(spec):
    """[(name, point, train.py argv)]: one per grid point, each argv checked by the configurator."""
    if not spec["sweep_dir"]:
        spec["sweep_dir"] = "out-sweep"
    overrides = dict(spec["overrides"])
    if "out_dir" in overrides or "wandb_run_name" in overrides:
        raise configurator.ConfigError("the sweep names every run's out_dir and wandb_run_name itself: "
                                       "set --sweep_dir instead")
    if overrides.get("tokens_per_iter"):  # constant tokens per step: each run derives its accumulation
        overrides["gradient_accumulation_steps"] = 0
    runs, names = [], set()
    for point in (p for grid in spec["grid"] for p in expand(grid)):
        clash = set(point) & set(overrides)
        if clash:
            raise configurator.ConfigError(f"{sorted(clash)} are both swept and fixed: drop the fixed value")
        name = run_name(point)
        if name in names:
            raise configurator.ConfigError(f"the grid holds the run {name!r} twice")
        names.add(name)
        out_dir = os.path.join(spec["sweep_dir"], name)
        sweep = os.path.basename(os.path.normpath(spec["sweep_dir"])).removeprefix("out-")
        argv = [*spec["base"], *([point["config"]] if "config" in point else []), *spec["configs"],
                *(f"--{k}={v!r}" for k, v in overrides.items()),
                *(f"--{k}={v!r}" for k, v in point.items() if k != "config"),
                f"--out_dir={out_dir}", f"--wandb_run_name={sweep}-{name}"]
        cfg = configurator.apply_config(runtime.DEFAULTS, argv)
        runtime.validate(dict(cfg, init_from="scratch"), 1)  # a bad point fails before any run starts
        runs.append((name, point, argv))
    return runs


def is_finished(out_dir):
    return bool(rundir.finished(rundir.read_events(out_dir)))


def launch_subprocess(argv, gpu, log_path):
    """Start one run of train.py; its console output goes to log_path."""
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    out = open(log_path, "a")
    return subprocess.Popen([sys.executable, os.path.join(REPO_DIR, "train.py"), *argv], env=env,
                            stdout=out, stderr=subprocess.STDOUT, cwd=REPO_DIR, preexec_fn=die_with_parent)


def die_with_parent():
    """In a training process before it starts: the kernel sends it SIGTERM when the sweep dies,
    even by kill -9, so a dead sweep leaves no orphan run holding a GPU (train.py then saves a
    checkpoint and stops, and the next sweep resumes it). Linux only; elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def default_gpus(option):
    if option:
        return [g.strip() for g in str(option).split(",") if g.strip()]
    import torch
    n = torch.cuda.device_count()
    return [str(i) for i in range(n)] if n > 1 else [None]


def run_all(runs, sweep_dir, gpus, launch=launch_subprocess):
    """Run the unfinished runs, one per GPU slot at a time; returns {name: return code}."""
    todo = []
    for name, point, argv in runs:
        out_dir = os.path.join(sweep_dir, name)
        if is_finished(out_dir):
            print(f"skip {name}: finished")
            continue
        if os.path.exists(os.path.join(out_dir, "ckpt.pt")):
            argv = [*argv, "--init_from=resume"]
            print(f"resume {name} from its checkpoint")
        todo.append((name, argv))
    codes, active = {}, {}  # gpu slot -> (name, process)
    while todo or active:
        for slot in gpus:
            if slot not in active and todo:
                name, argv = todo.pop(0)
                os.makedirs(os.path.join(sweep_dir, name), exist_ok=True)
                print(f"start {name}" + (f" on GPU {slot}" if slot is not None else ""), flush=True)
                active[slot] = (name, launch(argv, slot, os.path.join(sweep_dir, name, "console.txt")))
        for slot, (name, proc) in list(active.items()):
            if proc.poll() is not None:
                codes[name] = proc.returncode
                print(f"{'done' if proc.returncode == 0 else 'FAILED'} {name} (exit {proc.returncode})", flush=True)
                del active[slot]
        if active:
            time.sleep(0.5)
    return codes


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
        best = min((e["val_loss"] for e in evals), default=None)
        values = {k: os.path.basename(v) if k == "config" else v for k, v in point.items()}
        row = {"run": name, **{k: values.get(k, "") for k in keys},
               "status": "finished" if end else ("failed" if events else "not run"),
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


def main(argv, launch=launch_subprocess):
    spec, options = parse_args(argv)
    runs = plan(spec)
    sweep_dir = spec["sweep_dir"]
    print(f"{len(runs)} runs in {sweep_dir}:")
    for name, _, run_argv in runs:
        print(f"  {name}: python train.py {' '.join(run_argv)}")
    if options["dry_run"]:
        return runs
    os.makedirs(sweep_dir, exist_ok=True)
    codes = run_all(runs, sweep_dir, default_gpus(options["gpus"]), launch)
    summarize(runs, sweep_dir)
    print(open(os.path.join(sweep_dir, "summary.md")).read())
    failed = [name for name, code in codes.items() if code != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} runs failed: {', '.join(failed)} (see their console.txt)")
    return runs


if __name__ == "__main__":
    configurator.run_script(main, RuntimeError)
