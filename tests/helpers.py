"""What several test files share: the toy run's arguments, launchers, suite files, tiny models and
fixture data. Plain functions and constants; the shared pytest fixtures live in conftest.py. A test
file imports from here, never from another test file."""
import importlib
import json
import math
import os
import runpy
import shutil
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import configurator
import rundir
import runtime
import train
from model import GPT, GPTConfig
from ra_model import RAConfig, RAGPT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 64  # the toy corpus's ids (conftest.py's data_dir); tiny_args sets vocab_size to it


# ----------------------------------------------------------------------------- train.py on the toy corpus

def tiny_args(data_dir, out_dir, *extra):
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--dataset=toy", f"--vocab_size={VOCAB}",
            "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
            "--gradient_accumulation_steps=2", "--dtype=float32", "--eval_iters=2", "--eval_interval=4",
            "--log_interval=1", "--warmup_iters=2", "--learning_rate=1e-2", "--min_lr=1e-3",
            "--max_iters=8", "--lr_decay_iters=8", *extra]


def golden_args(data_dir, out_dir, *extra):
    """The runs tests/golden/train_events.json pins: tiny_args's, kept apart so that the golden never
    changes with those."""
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--dataset=toy", f"--vocab_size={VOCAB}",
            "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
            "--gradient_accumulation_steps=2", "--dtype=float32", "--eval_iters=2", "--eval_interval=4",
            "--log_interval=1", "--warmup_iters=2", "--learning_rate=1e-2", "--min_lr=1e-3",
            "--max_iters=8", "--lr_decay_iters=8", *extra]


def read_log(out_dir):
    return rundir.read_events(out_dir)


def events(out_dir, kind):
    return [r for r in read_log(out_dir) if r["event"] == kind]


def load_ckpt(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu", weights_only=True)


# ----------------------------------------------------------------------------- train.py in a process of its own

ENV = dict(os.environ, OMP_NUM_THREADS="1")
LONG = ("--max_iters=100000", "--lr_decay_iters=50", "--eval_interval=1000")  # runs until stopped


def wait_for_training(out_dir, proc, min_iter=1, timeout=120):
    """Block until out_dir's log shows training iteration min_iter (the run is inside its loop)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        if any(e["event"] == "train" and e["iter"] >= min_iter for e in rundir.read_events(out_dir)):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{out_dir} never reached iteration {min_iter}")


def wait_for(condition, what, timeout=480):  # generous: on CI the workers load every core
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)


def run_script(capsys, script, *argv):
    """(exit status, stderr) of `python script argv` run in this process: the script's own __main__ (its
    error list, its one-line exit), without the ~3 CPU-seconds of a fresh interpreter importing torch."""
    capsys.readouterr()
    saved_argv, sys.argv = sys.argv, [script, *argv]
    try:
        with pytest.raises(SystemExit) as exited:
            runpy.run_path(os.path.join(REPO, script), run_name="__main__")
    finally:
        sys.argv = saved_argv
    return exited.value.code, capsys.readouterr().err


# ----------------------------------------------------------------------------- sweeps and suites

class Finished:
    def __init__(self, code):
        self.returncode = code

    def poll(self):
        return self.returncode


def in_process(calls, fail=()):
    """A launcher that runs train.main here (no subprocess start-up) and records what it ran."""
    def launch(argv, gpu, log_path):
        out_dir = configurator.apply_config(runtime.DEFAULTS, argv)["out_dir"]
        calls.append(os.path.basename(out_dir))
        if calls[-1] in fail:
            rundir.RunLog(dict(runtime.DEFAULTS, out_dir=out_dir), True).event("checklist", "crashed")
            return Finished(1)
        train.main(argv)
        return Finished(0)
    return launch


def toy_args(data_dir, *extra):
    return [a for a in tiny_args(data_dir, "unused", "--max_iters=4", "--lr_decay_iters=4", *extra)
            if not a.startswith(("--out_dir=", "--learning_rate=", "--batch_size="))]  # the sweep sets these


def write_growing_suite(tmp_path, seeds, looks=None):
    path = tmp_path / "suite_grow.py"
    path.write_text(f"variants = {{'base': {{'learning_rate': 1e-3}}, 'other': {{'learning_rate': 2e-3}}}}\n"
                    f"baseline = 'base'\nseeds = {list(seeds)!r}\nmetric = 'val_loss'\nmin_effect = 0.01\n"
                    f"allowed = ['learning_rate']\nsuite_dir = {str(tmp_path / 'out-grow')!r}\n"
                    + (f"looks = {looks!r}\n" if looks else ""))
    return str(path), str(tmp_path / "out-grow")


def write_suite(tmp_path, variants, allowed, seeds=(1, 2, 3), name="suite_toy"):
    path = tmp_path / f"{name}.py"
    path.write_text(f"variants = {variants!r}\nbaseline = 'base'\nseeds = {list(seeds)!r}\n"
                    f"metric = 'val_loss'\nmin_effect = 0.01\nallowed = {allowed!r}\nsuite_dir = {str(tmp_path / ('out-' + name))!r}\n")
    return str(path), str(tmp_path / f"out-{name}")


LR = {"learning_rate": 3e-3, "min_lr": 3e-4}  # 16 steps at 3e-3: a 10x lower rate is clearly worse


def suite_args(data_dir, path):
    """A suite file and the shared toy settings; the variants set the learning rates."""
    return [path, *(a for a in toy_args(data_dir, "--max_iters=16", "--lr_decay_iters=16", "--eval_interval=8")
                    if not a.startswith("--min_lr="))]


def fork_suite(tmp_path, name="suite_fork", seeds=(1, 2), fork_at=6):
    variants = {"base": {"model_type": "ra", **LR}, "learned": {"model_type": "ra", "ra_pattern": "learned", **LR}}
    os.makedirs(tmp_path, exist_ok=True)
    path, suite_dir = write_suite(tmp_path, variants, ["ra_pattern"], seeds=seeds, name=name)
    with open(path, "a") as f:
        f.write(f"fork_at = {fork_at}\nfork_cold_starts = ['learned']\n")
    return path, suite_dir


def synthetic_run(variant, seed, lr, batch, curve, final_tokens, hellaswag_right=None):
    """A run directory's contents as read_run returns them: evaluations every 100 tokens up to
    final_tokens (a time-limited run stops wherever its clock ends), HellaSwag at 200 tokens."""
    events = [dict(event="eval", tokens=t, iter=t // 100, val_loss=curve(t), val_ppl=math.exp(curve(t)),
                   syncs_forward=4, sparsity=0.25)
              for t in range(0, final_tokens + 1, 100)]
    events += [dict(event="train", step_time_ms=10.0 * batch, tokens_per_sec=100.0 / batch, peak_memory_mib=batch)]
    if hellaswag_right is not None:
        events.append(dict(event="hellaswag", tokens=200, n=100, acc=hellaswag_right / 100,
                           acc_norm=hellaswag_right / 100))
    events.append(dict(event="end", tokens=final_tokens, train_time=final_tokens * batch / 100))
    config = dict(seed=seed, out_dir=f"{variant}-seed{seed}", learning_rate=lr, batch_size=batch)
    return dict(out_dir=config["out_dir"], config=config, info=None, events=events)


# ----------------------------------------------------------------------------- HellaSwag

HELLASWAG_VOCAB = 50304  # the fixture is GPT-2 BPE text, so its ids need GPT-2's vocabulary

# (ctx, endings, label); every word of an ending is one GPT-2 token, checked in test_hellaswag's test_fixture_lengths.
FIXTURE = [
    ("A man is sitting on a roof. He",
     ["starts to fix it", "falls down", "waves at people", "climbs down the ladder slowly"], 1),
    ("A woman walks into the kitchen. She",
     ["opens the fridge", "sings a song", "sits on the floor", "takes out a pan and eggs"], 0),
    ("Two dogs play in the park. They",
     ["fly away", "run into the big lake", "chase a ball across the grass", "eat some cake"], 2),
    ("A boy holds a guitar on stage. He",
     ["drops it on purpose", "eats the guitar strings", "paints the stage blue", "plays"], 3),
    ("The chef cuts onions on a board. Then",
     ["she puts them in soup", "nothing happens", "the board sings", "a cat steals them"], 0),
]


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for i, (ctx, endings, label) in enumerate(rows):
            # The upstream fields; hellaswag.py reads ctx, endings and label.
            f.write(json.dumps(dict(ind=i, activity_label="Test", ctx_a=ctx, ctx_b="", ctx=ctx, split="val",
                                    split_type="indomain", label=label, endings=endings,
                                    source_id=f"test~{i}")) + "\n")
    return str(path)


def tiny_gpt(block_size=64, seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=HELLASWAG_VOCAB, n_layer=2, n_head=2, n_embd=16))
    with torch.no_grad():  # spread the logits so that no two endings nearly tie
        model.transformer.wte.weight.mul_(25)
    return model.eval()


# ----------------------------------------------------------------------------- GPT-2's vocabulary

def train_gpt2(data_dir, out, *extra):
    """A tiny GPT-2-vocabulary model trained for four steps (AdamW moves every weight off its init)."""
    train.main(tiny_args(data_dir, out, "--vocab_size=50304", "--n_embd=16", "--max_iters=4", "--lr_decay_iters=4",
                         "--eval_interval=4", *extra))
    return out


def tiny_checkpoint(run, **keys):
    """run/ckpt.pt of an untrained model of the given keys (the refusals need no training)."""
    cfg = {**runtime.DEFAULTS, **dict(n_layer=2, n_head=2, n_embd=16, block_size=16), **keys}
    run.mkdir(parents=True)
    torch.save(dict(model=runtime.build_model(cfg).state_dict(), config=cfg), run / "ckpt.pt")
    return str(run)


# ----------------------------------------------------------------------------- reciprocal attention models

RA_TINY = dict(block_size=12, vocab_size=64, n_layer=4, n_head=2, n_embd=16, dropout=0.0)
MLA = dict(mla=True, mla_latent_dim=6)

# name -> RAConfig overrides: every pattern and mode, windows, learned alphas, MLA and RA+MLA
VARIANTS = {
    "early-swap": dict(ra_pattern="early", ra_mode="swap"),
    "late-mix": dict(ra_pattern="late", ra_mode="mix", ra_alpha=0.7),
    "all-mix-window": dict(ra_pattern="all", ra_mode="mix", ra_window=3),
    "alternate-gate": dict(ra_pattern="alternate", ra_mode="gate", ra_gate_init=0.5),
    "layers-swap-window": dict(ra_pattern="layers", ra_layers=[0, 2], ra_mode="swap", ra_window=4),
    "all-mix-alpha-head": dict(ra_pattern="all", ra_mode="mix", ra_alpha_learn="head", ra_alpha=-0.3),
    "all-mix-alpha-layer": dict(ra_pattern="all", ra_mode="mix", ra_alpha_learn="layer"),
    "learned": dict(ra_pattern="learned", ra_gate_init=-0.4),
    "learned-window": dict(ra_pattern="learned", ra_window=5),
    "mla": dict(**MLA),
    "mla-shared-q-v": dict(**MLA, mla_per_head_q_latent=False, mla_per_head_v_up=False),
    "ra-mla": dict(**MLA, ra_pattern="all", ra_mode="mix", ra_alpha=0.5, ra_window=4),
    "ra-mla-learned": dict(**MLA, mla_per_head_q_latent=False, ra_pattern="learned"),
    "gated-attn": dict(attn_gate=True),
    "gated-attn-late-mix": dict(attn_gate=True, ra_pattern="late", ra_mode="mix"),
    "gated-attn-mla": dict(**MLA, attn_gate=True),
}


def ra_model(seed=0, sharpen=True, **overrides):
    torch.manual_seed(seed)
    model = RAGPT(RAConfig(**{**RA_TINY, **overrides}))
    if sharpen:  # GPT-2's init gives near-zero scores (uniform attention): make them O(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("attn.c_attn.weight", "attn.c_q.weight", "attn.c_kv.weight", "attn.k_up.weight")):
                    p.mul_(15.0)
    return model


def tokens(shape, seed=1):
    return torch.randint(0, RA_TINY["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


def grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


# ----------------------------------------------------------------------------- ranks

def run_ranks(fn, world, tmp_path, *args):
    """fn(rank, world, *args) on `world` forked gloo ranks; an assertion in any rank fails the test."""
    mp.start_processes(_worker, args=(fn, world, str(tmp_path), args), nprocs=world, start_method="fork")


def _worker(rank, fn, world, tmp, args):
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        dist.barrier()  # no rank closes its connections while another still uses them
    finally:
        dist.destroy_process_group()


def tp_args(data_dir, out_dir, *extra):
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--dataset=toy", f"--vocab_size={VOCAB}",
            "--model_type=reduced_sync", "--tp_size=2", "--block_pattern=tp,spd,parallel,parallel",
            "--n_layer=4", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=2",
            "--gradient_accumulation_steps=4", "--dtype=float32", "--eval_iters=2", "--eval_interval=2",
            "--log_interval=1", "--warmup_iters=1", "--learning_rate=1e-2", "--min_lr=1e-3", "--grad_clip=0.5",
            "--max_iters=4", "--lr_decay_iters=4", *extra]


# ----------------------------------------------------------------------------- Slurm

SET_UP = ["bash", os.path.join(REPO, "slurm", "start_test_cluster.sh")]  # the README's test command runs it first


def nodes_up():
    if not shutil.which("sinfo"):
        return False
    nodes = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    return not nodes.returncode and bool({"idle", "mix", "alloc", "comp"} & set(nodes.stdout.split()))


# ----------------------------------------------------------------------------- entry points

SHARED_KEYS = ("tools.bench_ra_variants", "tools.bench_train_step")  # and benchrows.SHARED's


def documented(name, module):
    """The dicts of keys a script's --help lists."""
    if name in SHARED_KEYS:
        return [module.OPTIONS, importlib.import_module("tools.benchrows").SHARED]
    if hasattr(module, "OPTIONS"):
        return [module.OPTIONS]
    return [getattr(module, "DEFAULTS", None) or importlib.import_module("runtime").DEFAULTS]  # train: runtime's


def measured_peak_bytes(cfg):
    """Allocated CPU bytes at the peak of the second training step (Adam's states exist), from the
    profiler's allocation records, plus what lives across steps (weights and optimizer states)."""
    from torch.profiler import ProfilerActivity, profile
    import optim
    torch.manual_seed(0)
    model = runtime.build_model(cfg)
    optimizer = optim.build_optimizer(model, cfg)
    x = torch.randint(0, cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]))

    def step():
        model(x, x)[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):  # an op's own allocations, and frees
        live += event.cpu_memory_usage if event.name == "[memory]" else event.self_cpu_memory_usage
        peak = max(peak, live)
    steady = sum(p.numel() * 4 for p in model.parameters()) + \
        sum(t.numel() * 4 for s in optimizer.state.values() for t in s.values() if t.dim())
    return steady + peak
