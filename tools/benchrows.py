"""What tools/bench_ra_variants.py and tools/bench_train_step.py share: their common keys (SHARED:
the model's shape over a preset, device, warmup, steps, repeats, json, the child's row), every row
(a model variant, a step option) measured in a fresh process so that one row's allocations cannot
raise another's peak, the rows cycled through `repeats` times so that a slow spell of a shared
machine hits them all, each row's fastest repeat kept; the peak of live tensor bytes on CPU;
ratios to the first row; the JSON file."""
import json
import subprocess
import sys
import types

import configurator

SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch_size")

# Each tool's own OPTIONS come first in its --help, then these.
SHARED = dict(
    # the model's shape: each key left at 0 takes the preset's value
    n_layer=0,  # transformer blocks
    n_head=0,  # attention heads (must divide n_embd)
    n_embd=0,  # width of the residual stream
    block_size=0,  # tokens per sequence (T)
    vocab_size=0,  # rows of the embedding and the head
    batch_size=0,  # sequences per step
    # how rows are measured
    device="",  # '' picks cuda when available
    warmup=2,  # untimed steps first (compile happens here)
    steps=5,  # timed steps per row (the median is reported)
    repeats=1,  # cycles through all rows; each row's fastest repeat counts
    json="",  # also write the results to this file
    child="",  # set by the tool itself: the one row a fresh process measures (prints it as JSON)
)


def parse(argv, options, presets, text_keys=()):
    """The tool's keys (`options`: its own, with 'preset' naming one of `presets` and 'dtype') and
    SHARED's from argv, as attributes; shape keys left at 0 take the preset's values. Every mistake
    is a ConfigError, raised before any row runs."""
    values, extra = configurator.options_and_paths(argv, options, SHARED, text_keys=("device", "json", *text_keys))
    if extra:
        raise configurator.ConfigError(f"{extra[0]!r}: this tool takes only --key=value options (--help lists them)")
    if values["preset"] not in presets:
        raise configurator.ConfigError(f"--preset={values['preset']!r}: use one of {', '.join(presets)}")
    for key, value in presets[values["preset"]].items():
        values[key] = values[key] or value
    for key in (*SHAPE_KEYS, "steps", "repeats"):
        if values[key] < 1:
            raise configurator.ConfigError(f"--{key}={values[key]}: use a whole number >= 1"
                                           + (" (0 takes the preset's)" if key in SHAPE_KEYS else ""))
    if values["warmup"] < 0:
        raise configurator.ConfigError(f"--warmup={values['warmup']}: use 0 or more untimed steps")
    if values["n_embd"] % values["n_head"]:
        raise configurator.ConfigError(f"--n_head={values['n_head']} must divide --n_embd={values['n_embd']}")
    import devices  # torch, once the keys are read: --help answers without it
    import parallel
    # a GPU asked for but absent, or float16 on a CPU, is refused here rather than in every row
    devices.check_dtype(values["dtype"], parallel.pick_device(values["device"]))
    return types.SimpleNamespace(**values)


def split_names(text, known, first, what):
    """The rows a comma list names ('' all of `known`), `first` always first; unknown names refused."""
    names = [first] + [n for n in (text.split(",") if text else known) if n != first]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise configurator.ConfigError(f"unknown {what} {unknown}: use a comma list of {', '.join(known)}")
    return names


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


def timed_steps(step, device, steps):
    """Seconds of device time of each of `steps` calls of step(), the device's peak memory reset first."""
    import devices
    devices.reset_peak_memory(device)
    times, timer = [], devices.DeviceTimer(device)
    for _ in range(steps):
        timer.start()
        step()
        times.append(timer.elapsed())
    return times


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
