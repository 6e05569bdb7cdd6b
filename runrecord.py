"""What a run directory records about itself, and how to read it back.

`run_info.json`, written by train.py when a run starts (and extended on every resume), holds:
- provenance: git commit (and `git_diff.patch` beside it when the tree was dirty), package
  versions, device name, world size, and the one command that repeats the run;
- measured facts that decide whether two runs may be compared: a fingerprint of the dataset
  files, of the evaluation windows and of the first iterations' data order, a digest of every
  initial weight, the model and optimizer classes, dtype, device type, a CPU op's thread count,
  torch and code versions.

sweep.py and report.py (through ablation/compare.py) read run directories with `read_run`, so a report
can be rebuilt from the directories alone, whoever produced them.
"""
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import numpy as np
import torch

import configurator
import rundir
import runtime
import sharding
import tokendata

PACKAGES = ("torch", "numpy", "triton", "tiktoken", "scipy", "matplotlib", "wandb")
DATA_ORDER_ITERS = 3  # the data order fingerprint covers this many optimizer steps


def digest(*chunks):
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk if isinstance(chunk, bytes) else str(chunk).encode())
    return h.hexdigest()[:16]


def tensor_digest(t):
    t = t.detach().cpu().contiguous()
    return digest(str(t.dtype), str(tuple(t.shape)), t.view(-1).view(torch.uint8).numpy().tobytes())


def weights_digests(state_dict):
    """{name: [shape, digest]} of a model's weights: paired runs must start from equal shared weights."""
    return {name: [list(t.shape), tensor_digest(t)] for name, t in state_dict.items()}


def file_digest(path, edge_bytes=None):
    """sha256 of a file; with edge_bytes, of its size and its first and last edge_bytes (a
    multi-GB train split is fingerprinted in milliseconds)."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if edge_bytes is None or size <= 2 * edge_bytes:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        else:
            h.update(str(size).encode())
            h.update(f.read(edge_bytes))
            f.seek(size - edge_bytes)
            h.update(f.read(edge_bytes))
    return h.hexdigest()[:16]


def dataset_fingerprint(data_dir):
    """val.bin in full, train.bin by size and edges, and what meta.json says of the data (not its token-id
    cache, keyed by the files' modification times, which a copy or a fresh prepare of the same bytes
    changes): a re-prepared or different dataset behind the same name changes it, the same data elsewhere does not."""
    parts = [file_digest(os.path.join(data_dir, "val.bin")),
             file_digest(os.path.join(data_dir, "train.bin"), edge_bytes=1 << 20)]
    meta = {k: v for k, v in tokendata.read_meta(data_dir).items() if k != tokendata.MAX_TOKEN_CACHE}
    if meta:
        parts.append(json.dumps(meta, sort_keys=True))
    return digest(*parts)


RECORD_DIRS = ("runs", "reports")  # committed run records and reports: what runs write, never what they read


def git_state(repo_dir):
    """(commit, diff against it) of the code, or (None, '') outside a git checkout. The diff holds the
    tracked files' changes and every untracked Python file that git does not ignore (a new config,
    suite or module a run reads) as a new file, so the code version a suite compares covers them and
    `git apply` of the patch restores them. RECORD_DIRS are left out: a suite going on in a checkout
    that commits its records appends to them as it runs, and that is no new code."""
    def git(*args):
        return subprocess.run(["git", "-C", repo_dir, *args], capture_output=True, text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None, ""
    if head.returncode != 0:
        return None, ""
    code = ["--", ".", *(f":(top,exclude){d}" for d in RECORD_DIRS)]
    untracked = [p for p in git("ls-files", "--others", "--exclude-standard", "-z", *code).stdout.split("\0")
                 if p.endswith(".py")]
    new_files = [git("diff", "--no-index", "--binary", "/dev/null", p).stdout for p in sorted(untracked)]
    return head.stdout.strip(), git("diff", "HEAD", "--binary", *code).stdout + "".join(new_files)


def package_versions():
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_name(device):
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def launch_command(argv):
    """The command that started this process: torchrun's layout is read back from its environment."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if "TORCHELASTIC_RUN_ID" not in os.environ and world == 1:
        return shlex.join([os.path.basename(sys.executable), *argv])
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    layout = ["--standalone"] if per_node == world else [f"--nnodes={world // per_node}"]
    return shlex.join(["torchrun", *layout, f"--nproc_per_node={per_node}", *argv])


def load_average():
    """The machine's 1, 5 and 15-minute load averages (None where the OS keeps none): a timing taken
    while other processes competed for the cores is not a measure of the code."""
    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


def code_version(commit, diff):
    """The code a run trains with (git_state's commit and diff): the commit, and a digest of the diff when there is one."""
    return None if commit is None else commit + (f"+dirty-{digest(diff)}" if diff else "")


def provenance(repo_dir, argv, device, world_size):
    commit, diff = git_state(repo_dir)
    start = dict(time=time.time(), commit=commit, code_version=code_version(commit, diff), dirty=bool(diff), diff=diff,
                packages=package_versions(), device_name=device_name(device), world_size=world_size,
                intra_op_threads=intra_op_threads(device),
                deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
                host=platform.node(), cwd=os.getcwd(), command=launch_command(argv), load_average=load_average())
    return portable_start(start, repo_dir)


def portable_start(start, repo_dir):
    """start with its working directory relative to the repository at repo_dir and each path in its command
    inside it (a config file, `--key=path`) relative to that directory, when it lies inside: the record names no
    directory of the machine that ran it, and `cd <cwd> && <command>` repeats from the root of any checkout."""
    cwd = start["cwd"]
    if rundir.in_repository(cwd, repo_dir) == cwd:
        return start
    relative = lambda text: rundir.in_repository(text, repo_dir, cwd)
    word = lambda a: f"{a.split('=', 1)[0]}={relative(a.split('=', 1)[1])}" if a.startswith("--") and "=" in a \
        else relative(a)
    return dict(start, cwd=rundir.in_repository(cwd, repo_dir),
                command=shlex.join(word(a) for a in shlex.split(start["command"])))


def repeat_command(out_dir, start):
    """One shell line, from the repository's root, that checks the code out as it was and runs the same command
    again (paths inside the repository are relative to it, so the line names no directory of this machine)."""
    steps = [] if start["commit"] is None else [f"git checkout {start['commit']}"]
    if start["dirty"]:
        steps.append(f"git apply {shlex.quote(rundir.in_repository(os.path.join(os.path.abspath(out_dir), 'git_diff.patch')))}")
    if start["cwd"] != ".":
        steps.append(f"cd {shlex.quote(start['cwd'])}")
    return " && ".join([*steps, start["command"]])


def write_run_info(out_dir, start, facts, resumed):
    """run_info.json: a fresh run writes its start and facts; a resumed run keeps the first start's
    facts (its initial weights are long gone) and appends its own start, so a code change between
    the two shows."""
    path = os.path.join(out_dir, "run_info.json")
    diff = start.pop("diff")
    if resumed and os.path.exists(path):
        with open(path) as f:
            info = json.load(f)
        info["resumes"].append(start)
        info["code_versions"] = sorted({*info["code_versions"], start["code_version"] or "unknown"})
    else:
        if diff:
            with open(os.path.join(out_dir, "git_diff.patch"), "w") as f:
                f.write(diff)
        info = dict(start=start, resumes=[], facts=facts, code_versions=[start["code_version"] or "unknown"],
                    repeat=repeat_command(out_dir, start))
    with rundir.atomic_write(path, "w") as f:
        json.dump(info, f, indent=1)
    return info


def offsets_digest(batches):
    return digest(*(np.asarray(b, dtype=np.int64).tobytes() for b in batches))


def check_gpt2_tokens(out_dir, what):
    """Refuse, in one line, a run whose data run_info.json records as tokenized other than with GPT-2's BPE:
    `what` feeds GPT-2 BPE ids, which would mean other tokens to that model."""
    tokenizer = rundir.read_run_info(out_dir).get("facts", {}).get("tokenizer")
    if tokenizer not in (None, "gpt2"):
        raise configurator.ConfigError(f"{out_dir} was trained on {tokenizer!r} tokens but {what} uses GPT-2's BPE: "
                                       f"only runs on GPT-2-tokenized data apply")


# ----------------------------------------------------------------------------- what train.py records at start-up

def startup_checklist(cfg, layout, model, counts, data_dir, dtype):
    """The run's shape at a glance: the console's first lines and log.jsonl's checklist event."""
    accum = cfg["gradient_accumulation_steps"]
    return {
        "dataset": cfg["dataset"], "data_dir": rundir.in_repository(data_dir),
        "train_tokens": counts["train"], "val_tokens": counts["val"],
        "model_class": type(model).__name__, "parameters": model.get_num_params(),
        "flops_per_token": model.flops_per_token(),
        "block_size": cfg["block_size"], "micro_batch": cfg["batch_size"],
        "grad_accum_steps": accum, "grad_accum_per_rank": accum // layout.dp,
        "world_size": layout.world_size,
        "effective_batch_sequences": cfg["batch_size"] * accum,
        "tokens_per_iter": cfg["tokens_per_iter"], "token_budget": runtime.last_iter(cfg) * cfg["tokens_per_iter"],
        "max_iters": cfg["max_iters"], "max_time": cfg["max_time"], "max_tokens": cfg["max_tokens"],
        "dtype": dtype, "compile": cfg["compile"], "attn_impl": cfg["attn_impl"],
        "ln_placement": cfg["ln_placement"], "optimizer": cfg["optimizer"], "device": layout.device,
        "recompute_in_backward": "whole blocks" if cfg["activation_checkpointing"]
        else "attention core" if cfg["attn_recompute"] else "nothing",
    }


def eval_windows_fingerprint(cfg, dataset, counts):
    windows = [offsets_digest(tokendata.eval_offsets(cfg, counts[split])) for split in ("train", "val")]
    if cfg.get("final_eval_iters"):  # the end of the budget's evaluation reads more val windows
        windows.append(offsets_digest(tokendata.eval_offsets(cfg, counts["val"], cfg["final_eval_iters"])))
    return digest(dataset, *windows)


def data_changes_since_start(cfg, data_dir, counts):
    """On resume: the dataset, evaluation-window and data-order fingerprints this run recorded when it
    started, against today's. A change is refused in one line (training and evaluation would silently
    move to other data or another batch order), unless allow_data_change=True: the change is then
    returned for the run record."""
    path = os.path.join(cfg["out_dir"], "run_info.json")
    try:
        with open(path) as f:
            recorded = json.load(f).get("facts") or {}
    except (OSError, ValueError):
        return None  # a run from before run records: nothing to compare against
    now = dict(dataset_fingerprint=dataset_fingerprint(data_dir))
    now["eval_windows"] = eval_windows_fingerprint(cfg, now["dataset_fingerprint"], counts)
    now["data_order"] = data_order_fingerprint(cfg, counts)  # the steps after the resume draw from it
    changed = {k: [recorded[k], v] for k, v in now.items() if recorded.get(k) and recorded[k] != v}
    if set(changed) == {"data_order"} and not cfg["allow_data_change"]:
        raise configurator.ConfigError(
            f"{cfg['out_dir']} started on another batch order than this resume would draw (the data order recorded "
            f"in {path} differs{order_keys_changed(cfg)}): resume with the keys it started with, start a new out_dir, "
            f"or pass --allow_data_change=True (the run record then says so)")
    if changed and not cfg["allow_data_change"]:
        what = " and ".join(k.replace("_", " ") for k in changed)
        raise configurator.ConfigError(
            f"{data_dir} is not the data this run started on ({what} changed since {path} was written): resume on "
            f"the original data, start a new out_dir, or pass --allow_data_change=True (the run record then says so)")
    return changed or None


ORDER_KEYS = ("data_order", "data_seed", "seed", "batch_size", "gradient_accumulation_steps")  # what draws the batches


def order_keys_changed(cfg):
    """': data_order=0 there, 1 now' for the batch-order keys this resume changes against the run's
    config.json ('' when none is found there)."""
    try:
        with open(os.path.join(cfg["out_dir"], "config.json")) as f:
            started = json.load(f)
    except (OSError, ValueError):
        return ""
    changed = [f"{k}={started[k]!r} there, {cfg[k]!r} now" for k in ORDER_KEYS if k in started and started[k] != cfg[k]]
    return ": " + ", ".join(changed) if changed else ""


def data_order_fingerprint(cfg, counts):
    """The training batches of the first DATA_ORDER_ITERS steps: recorded when a run starts, checked on resume."""
    return offsets_digest([tokendata.train_offsets(cfg, counts["train"], it, micro)
                           for it in range(DATA_ORDER_ITERS) for micro in range(cfg["gradient_accumulation_steps"])])


def run_facts(cfg, layout, model, optimizer, data_dir, counts, dtype):
    """What was measured at the start of a fresh run, for comparing runs: the data, the evaluation
    windows, the data order of the first steps and every initial weight (a sharded or real
    tensor-parallel model gathers its pieces: every rank calls this)."""
    weights = sharding.full_model_state(model) if layout.sharded else model.state_dict()
    if layout.tp_group is not None:
        weights = model.full_state_dict(weights)
    if not layout.master:  # the others took part in the gathers; the master alone hashes and records
        return None
    meta = tokendata.read_meta(data_dir)
    dataset = dataset_fingerprint(data_dir)
    return dict(dataset_fingerprint=dataset, tokenizer=meta.get("tokenizer"),
                eval_windows=eval_windows_fingerprint(cfg, dataset, counts),
                data_order=data_order_fingerprint(cfg, counts), init_weights=weights_digests(weights),
                model_class=type(model).__name__, optimizer=type(optimizer).__name__, dtype=dtype,
                device_type=layout.device.split(":")[0], torch_version=torch.__version__,
                world_size=layout.world_size, tokens_per_iter=cfg["tokens_per_iter"],
                intra_op_threads=intra_op_threads(layout.device))


def intra_op_threads(device):
    """The CPU threads of one op (OMP_NUM_THREADS): on a CPU they change how sums are split, and so
    the last bits of every result. On a GPU the math does not run on them: None."""
    return torch.get_num_threads() if device.startswith("cpu") else None
