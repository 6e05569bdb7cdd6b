"""Every number train.py logs, pinned: a few tiny CPU runs (plain GPT with evaluations and log lines at
intervals that do not divide each other, RA, gradient accumulation with AdamW-SPAM and pruning, a
resume from a mid-run checkpoint, a fork) compared field by field, bit for bit, with the committed
tests/golden/train_events.json. A refactoring of the training loop cannot move a loss, a learning
rate, a gradient norm or an iteration unnoticed. Wall-clock and machine fields are left out (TIMED).

Exact equality holds on one machine; another CPU (other SIMD kernels) may round differently, which is
why the file can be re-pinned after an intended change or on a new machine:

    WRITE_GOLDEN=1 python -m pytest tests/test_train_golden.py
"""
import json
import math
import os

import rundir
import train
from conftest import VOCAB

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "train_events.json")
# Fields that measure the machine or the clock, not the training: left out of the comparison
TIMED = {"step_time_ms", "tokens_per_sec", "mfu", "mfu_peak_gflops", "load_average", "train_time", "peak_memory_mib",
         "memory_ratio", "matmul_peak_gflops", "cpu_count", "mfu_against", "time", "elapsed"}
EVENTS = ("train", "eval", "fork", "pruning", "end")  # the checklist's numbers are the config's and the machine's


def args(data_dir, out_dir, *extra):
    """tests/test_train.py's tiny_args (kept apart so that this file's runs never change with those)."""
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--dataset=toy", f"--vocab_size={VOCAB}",
            "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
            "--gradient_accumulation_steps=2", "--dtype=float32", "--eval_iters=2", "--eval_interval=4",
            "--log_interval=1", "--warmup_iters=2", "--learning_rate=1e-2", "--min_lr=1e-3",
            "--max_iters=8", "--lr_decay_iters=8", *extra]


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


def same(a, b):
    """Bit for bit: equal values, NaNs in the same places."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b and type(a) is type(b)


def test_every_logged_number_is_the_golden_one(data_dir, tmp_path):
    got = json.loads(json.dumps(run_all(data_dir, str(tmp_path))))  # as the file holds them
    if os.environ.get("WRITE_GOLDEN"):
        with open(GOLDEN, "w") as f:
            json.dump(got, f, indent=0)
            f.write("\n")
    golden = json.load(open(GOLDEN))
    assert set(got) == set(golden)
    for name in golden:
        assert [e for e, _ in got[name]] == [e for e, _ in golden[name]], name
        for (event, fields), (_, pinned) in zip(got[name], golden[name]):
            assert set(fields) == set(pinned), (name, event)
            differ = {k: (fields[k], pinned[k]) for k in pinned if not same(fields[k], pinned[k])}
            assert not differ, (name, event, fields.get("iter"), differ)
