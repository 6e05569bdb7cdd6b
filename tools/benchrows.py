"""What tools/bench_ra_variants.py and tools/bench_train_step.py share: every row (a model variant, a step option) measured in a
fresh process so that one row's allocations cannot raise another's peak, the rows cycled through
`repeats` times so that a slow spell of a shared machine hits them all, each row's fastest repeat
kept; the peak of live tensor bytes on CPU; ratios to the first row; the JSON file."""
import argparse
import json
import subprocess
import sys

SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch_size")


def parser_with_shape(doc, presets, default):
    """An argument parser with --preset, a flag for each shape key that overrides the preset's value,
    and the options both benchmarks share (device, warmup, repeats, json, the hidden --child)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--preset", choices=presets, default=default, help="model shape; flags below override it")
    for key in SHAPE_KEYS:
        p.add_argument(f"--{key}", type=int, default=None)
    p.add_argument("--device", default="", help="'' picks cuda when available")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile happens here)")
    p.add_argument("--json", default="", help="also write the results to this file")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    return p


def parse_shape(p, presets, argv):
    """Parse argv; shape keys not given on the command line take the preset's values."""
    args = p.parse_args(argv)
    for key, value in presets[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def run_rows(script, argv, names, repeats, measure_here=None):
    """{name: [result of each repeat]} from `python script *argv --child=name` (its last stdout line
    is the result as JSON), or None after printing a failed row's error; measure_here(name)
    measures in this process instead (tests)."""
    runs = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            if measure_here is not None:
                runs[name].append(measure_here(name))
                continue
            proc = subprocess.run([sys.executable, script, *argv, f"--child={name}"], capture_output=True, text=True)
            if proc.returncode:
                print(f"{name}: failed\n{proc.stderr[-2000:]}")
                return None
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


def fastest_with_ratios(runs):
    """Each row's least disturbed repeat (the shortest step; memory-only rows have none) with its
    highest peak, and time_ratio / memory_ratio to the first row."""
    results = []
    for repeats in runs.values():
        row = dict(min(repeats, key=lambda run: run.get("step_ms", 0)))
        row["peak_mib"] = max(run["peak_mib"] for run in repeats)
        results.append(row)
    base = results[0]
    for row in results:
        row["memory_ratio"] = row["peak_mib"] / base["peak_mib"]
        if "step_ms" in base:
            row["time_ratio"] = row["step_ms"] / base["step_ms"]
    return results


def peak_live_tensor_mib(step, *tracked):
    """Peak live tensor bytes over one call of step(), counted by torch's MemTracker
    (torch.distributed._tools, private: None where it is missing). On CPU the allocator keeps no
    statistics and tracemalloc cannot see torch's allocations."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:
        return None
    tracker = MemTracker()
    tracker.track_external(*tracked)
    with tracker:
        step()
    return sum(by_device["Total"] for by_device in tracker.get_tracker_snapshot("peak").values()) / 2**20


def write_json(path, args, results):
    with open(path, "w") as f:
        json.dump(dict(args={k: v for k, v in vars(args).items() if k != "child"}, results=results), f, indent=2)
