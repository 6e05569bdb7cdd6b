"""Every number train.py logs, pinned: a few tiny CPU runs (plain GPT with evaluations and log lines at
intervals that do not divide each other, RA, gradient accumulation with AdamW-SPAM and pruning, a
resume from a mid-run checkpoint, a fork) compared field by field, bit for bit, with the committed
tests/golden/train_events.json. A refactoring of the training loop cannot move a loss, a learning
rate, a gradient norm or an iteration unnoticed. Wall-clock and machine fields are left out (TIMED).

Exact equality holds on the CPU that wrote the file (its model and torch's SIMD level are pinned with it);
another CPU runs other matmul kernels and rounds differently, so there every number must agree to a
relative 1e-4 instead (a moved loss or learning rate still fails; see same). Re-pin after an intended change:

    WRITE_GOLDEN=1 python -m pytest tests/test_train_golden.py
"""
import json
import math
import os

import torch

import rundir
import train
from helpers import golden_args as args

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "train_events.json")
# Fields that measure the machine or the clock, not the training: left out of the comparison
TIMED = {"step_time_ms", "tokens_per_sec", "mfu", "mfu_peak_gflops", "load_average", "train_time", "peak_memory_mib",
         "memory_ratio", "matmul_peak_gflops", "cpu_count", "mfu_against", "time", "elapsed"}
EVENTS = ("train", "eval", "fork", "pruning", "end")  # the checklist's numbers are the config's and the machine's


def numbers(record):
    """{field: value} of a record's numbers (and the strings that name a stop or a choice), timing left out."""
    return {k: v for k, v in sorted(record.items()) if k not in TIMED and k != "event"
            and (isinstance(v, (int, float, str)) or v is None) and not (isinstance(v, str) and os.sep in v)}


def run_all(data_dir, work):
    """{run name: [(event, numbers)]} of every pinned run."""
    out = lambda name: os.path.join(work, name)
    runs = {
        "gpt": ("--max_iters=10", "--lr_decay_iters=10", "--log_interval=3", "--eval_at=[6]", "--dropout=0.1"),
        "ra": ("--model_type=ra", "--dropout=0.1", "--max_iters=6", "--log_interval=2"),
        "accum_spam_prune": ("--gradient_accumulation_steps=4", "--optimizer=adamw_spam", "--spam_interval=4",
                             "--spam_warmup=2", "--pruning=state", "--prune_score=bitter3", "--prune_start=2",
                             "--prune_interval=2", "--log_interval=2"),
    }
    for name, extra in runs.items():
        train.main(args(data_dir, out(name), *extra))
    resumed = ("--dropout=0.1", "--log_interval=3")
    train.main(args(data_dir, out("resumed"), *resumed, "--max_iters=4"))  # a finished trunk, too
    train.main(args(data_dir, out("branch"), *resumed, f"--fork_from={out('resumed')}", "--eval_interval=3"))
    train.main(args(data_dir, out("resumed"), *resumed, "--init_from=resume"))
    return {name: [[e["event"], numbers(e)] for e in rundir.read_events(out(name)) if e["event"] in EVENTS]
            for name in (*runs, "resumed", "branch")}


def this_cpu():
    """What decides the float rounding of a CPU run: the processor model and torch's SIMD level."""
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    return f"{model} ({torch.backends.cpu.get_cpu_capability()})"


def same(a, b, exact):
    """Bit for bit where exact (NaNs in the same places). Elsewhere floats within a relative 1e-4, and
    counts within 1e-3 (AdamW-SPAM's clipped entries sit at a threshold that rounding moves by a few)."""
    if isinstance(a, float) and isinstance(b, float) and (math.isnan(a) or math.isnan(b)):
        return math.isnan(a) and math.isnan(b)
    if exact or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        return a == b and type(a) is type(b)
    return math.isclose(a, b, rel_tol=1e-3 if isinstance(a, int) else 1e-4, abs_tol=1e-7)


def test_every_logged_number_is_the_golden_one(data_dir, tmp_path):
    got = json.loads(json.dumps(run_all(data_dir, str(tmp_path))))  # as the file holds them
    if os.environ.get("WRITE_GOLDEN"):
        with open(GOLDEN, "w") as f:
            json.dump(dict(cpu=this_cpu(), runs=got), f, indent=0)
            f.write("\n")
    pinned_file = json.load(open(GOLDEN))
    golden, exact = pinned_file["runs"], pinned_file["cpu"] == this_cpu()
    assert set(got) == set(golden)
    for name in golden:
        assert [e for e, _ in got[name]] == [e for e, _ in golden[name]], name
        for (event, fields), (_, pinned) in zip(got[name], golden[name]):
            assert set(fields) == set(pinned), (name, event)
            differ = {k: (fields[k], pinned[k]) for k in pinned if not same(fields[k], pinned[k], exact)}
            assert not differ, (name, event, fields.get("iter"), differ)
