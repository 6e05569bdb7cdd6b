"""Every shipped config and every run of every suite resolves to the config pinned in
tests/golden/resolved_configs.json, so reorganizing config/ and suites/ cannot change an experiment.

A config is pinned as what it changes from runtime.DEFAULTS (resolved as sweep.py resolves a run),
so adding a key with a default leaves the pins alone. A file that was folded into a GPU config plus
an overlay is looked up under its old name in REPLACED and must resolve exactly as it did. Regenerate the golden file only for a deliberate
change of an experiment: python tests/test_configs.py --write
"""
import glob
import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, when run as a script

import configurator
import runtime
import sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden", "resolved_configs.json")

# The suites' documented CPU twins that are a GPU suite plus command-line configs and overrides.
SUITE_COMMANDS = [
    ["suites/attn_impl.py", "config/small_shakespeare.py"],
    ["suites/ln_warmup.py", "config/small_shakespeare.py"],
    ["suites/lr_batch.py", "config/small_shakespeare.py", "--max_tokens=1048576"],
    ["suites/optimizers.py", "config/small_shakespeare.py"],
    ["suites/pruning.py", "config/small_shakespeare.py"],
    ["config/sweep_pruning_matrix.py", "config/small_shakespeare.py"],
]

# A CPU twin that was only its GPU config shrunk -> that config plus its family's overlay. The
# overlay names one out_dir for its family, so a twin's own out_dir is passed as the docs say.
RA_TWINS = {"ra_baseline": "ra-baseline", "ra_early": "ra-early", "ra_late": "ra-late", "ra_all": "ra-all",
            "ra_learn": "ra-learn", "mla": "mla", "ra_mla": "ra-mla", "gated_attn": "gated-attn"}
SYNC_TWINS = {"gpt2_24comm": "24comm", "gpt2_18comm": "18comm", "gpt2_16comm": "16comm", "gpt2_12comm": "12comm",
              "gpt2_8comm": "8comm", "gpt2_6comm": "6comm", "spd_12sync": "spd-12sync", "selective_9sync": "selective-9sync",
              **{f"grouped_{n}sync": f"grouped-{n}sync" for n in (2, 3, 4, 6)}}
REPLACED = {
    **{f"config/train_{name}_shakespeare.py": [f"config/train_{name}.py", "config/ra_shakespeare.py",
                                                f"--out_dir=out-{out}-shakespeare"] for name, out in RA_TWINS.items()},
    **{f"config/train_{name}_shakespeare.py": [f"config/train_{name}.py", "config/reduced_sync_shakespeare.py",
                                                f"--out_dir=out-shakespeare-{out}"] for name, out in SYNC_TWINS.items()},
    # the shared halves of the old twins, now the overlays
    "config/_ra_shakespeare.py": ["config/ra_shakespeare.py", "--out_dir=out-shakespeare"],
    "config/_reduced_sync_shakespeare.py": ["config/reduced_sync_shakespeare.py", "--out_dir=out"],
}

# Files that only make sense on top of another config (pinned through the configs they complete).
OVERLAYS = {"config/ra_shakespeare.py", "config/ra_shakespeare_scratch.py", "config/reduced_sync_shakespeare.py"}


def resolve_config(args):
    return configurator.apply_config(runtime.DEFAULTS, [os.path.join(REPO, a) if not a.startswith("--") else a
                                                        for a in args])


def resolve_sweep(args):
    """{run name: resolved config} of a sweep or suite, as sweep.py plans and resolves its runs."""
    spec, _ = sweep.parse_args([os.path.join(REPO, a) if not a.startswith("--") else a for a in args])
    nproc = spec["suite"]["nproc"] if spec["suite"] else 1
    return {name: sweep.resolve(argv, nproc) for name, _, argv in sweep.plan_runs(spec)}


def resolve(key):
    args = REPLACED.get(key, key.split(" "))
    return resolve_sweep(args) if sweep.sweep_file_keys(os.path.join(REPO, args[0])) is not None else resolve_config(args)


def shipped():
    """The key of every shipped config, sweep and suite (relative paths; a command joins them by spaces)."""
    files = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "config", "*.py"))
                   + glob.glob(os.path.join(REPO, "suites", "*.py")))
    return [f for f in files if f not in OVERLAYS] + [" ".join(c) for c in SUITE_COMMANDS]


def pinned_form(resolved):
    """What a config changes from train.py's defaults (so a new key with a default leaves the pins
    alone), as JSON; a suite or sweep maps each run name to that."""
    if "out_dir" not in resolved:
        return {name: pinned_form(cfg) for name, cfg in resolved.items()}
    # compile's default (None) is settled by the device: unsettled, or settled as on a CPU, it is the default
    settled = dict(runtime.DEFAULTS, compile=runtime.compile_default("cpu"))
    changed = {k: v for k, v in resolved.items()
               if k not in runtime.DEFAULTS or (v != runtime.DEFAULTS[k] and v != settled[k])}
    return json.loads(json.dumps(changed, sort_keys=True, default=repr))


def golden():
    if not os.path.exists(GOLDEN):  # only while --write creates it; the test then fails on every key
        return {}
    with open(GOLDEN) as f:
        return json.load(f)


@pytest.mark.parametrize("key", sorted(set(golden()) | set(shipped())))
def test_resolved_config_is_pinned(key):
    pinned = golden()
    assert key in pinned, f"{key} is new: pin it with python tests/test_configs.py --write"
    assert pinned_form(resolve(key)) == pinned[key]


def test_every_pinned_name_still_runs():
    """A pinned name that is gone from config/ or suites/ is listed in REPLACED, never just dropped,
    and a replaced twin file does not come back beside its overlay form."""
    for key in golden():
        there = os.path.exists(os.path.join(REPO, key.split(" ")[0]))
        assert there != (key in REPLACED), f"{key}: {'back beside its replacement' if there else 'vanished'}"


# ----------------------------------------------------------------------------- world sizes

DOCUMENTED = ["README.md", "train.py", *sorted(glob.glob("docs/*.md", root_dir=REPO)),
              *sorted(glob.glob("config/*.py", root_dir=REPO))]
GPU_RECIPE_BASES = ("train_gpt2.py", "_ra_common.py", "_reduced_sync_common.py")


def documented_train_commands():
    """(file, world size, LOCAL_WORLD_SIZE, train.py's arguments) of every `torchrun ... train.py` and
    `python train.py` command that README.md, train.py, docs/ and the config files print."""
    commands = []
    for name in DOCUMENTED:
        with open(os.path.join(REPO, name)) as f:
            text = f.read().replace("\\\n", " ")
        for line in text.splitlines():
            for command in line.lstrip("# ").split("&&"):
                words = command.split()
                if "train.py" not in words or not words or words[0] not in ("torchrun", "python"):
                    continue
                args = []
                for word in words[words.index("train.py") + 1:]:
                    if word.startswith(("#", "(", "`")) or word == "...":
                        break
                    args.append(word)
                if not args or any("resume" in a or a == "--help" for a in args):  # resume needs a run directory
                    continue
                options = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--") and "=" in w)
                per_node = int(options.get("nproc_per_node", 1)) if words[0] == "torchrun" else 1
                commands.append((name, int(options.get("nnodes", 1)) * per_node, per_node, args))
    return commands


def sbatch_commands():
    """slurm/train_multinode.sbatch's train.py arguments at its 4 nodes x 8 GPUs, and at 8 nodes with
    the TRAIN_ARGS its comment gives for 64 ranks."""
    with open(os.path.join(REPO, "slurm", "train_multinode.sbatch")) as f:
        text = f.read().replace("\\\n", " ")
    nodes = int(re.search(r"#SBATCH --nodes=(\d+)", text).group(1))
    per_node = int(re.search(r"NPROC_PER_NODE:-(\d+)", text).group(1))
    config = re.search(r"CONFIG=\$\{CONFIG:-(\S+)\}", text).group(1)
    exec_line = next(line for line in text.splitlines() if line.startswith("exec ") and "train_job.sh" in line)
    args = [config] + [w for w in exec_line.split() if w.startswith("--") and not w.startswith("--out_dir")]
    for_64 = re.search(r'64 ranks\) pass TRAIN_ARGS="([^"]+)"', text).group(1).split()
    return [(nodes * per_node, per_node, args), (64, per_node, args + for_64)]


def gpu_recipes():
    """The config files built on the GPT-2 recipes (train_gpt2.py, the RA and reduced-sync commons),
    which the README runs on 1 to 8 GPUs."""
    def bases(path):
        with open(os.path.join(REPO, path)) as f:
            named = re.findall(r'"(_?\w+\.py)"', f.read())
        return set(named) | {b for n in named if os.path.exists(os.path.join(REPO, "config", n))
                             for b in bases(os.path.join("config", n))}
    return [p for p in sorted(glob.glob("config/train_*.py", root_dir=REPO))
            if os.path.basename(p) in GPU_RECIPE_BASES or bases(p) & set(GPU_RECIPE_BASES)]


def resolve_at(args, world_size, per_node, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))  # hsdp's default shard group: one node
    return runtime.resolve(resolve_config(args), world_size)


def test_the_readme_runs_train_gpt2_on_8_gpus():
    assert ("README.md", 8, 8, ["config/train_gpt2.py"]) in documented_train_commands()
    assert "config/train_gpt2.py" in gpu_recipes() and "config/train_ra_late.py" in gpu_recipes()


@pytest.mark.parametrize("name,world_size,per_node,args", documented_train_commands(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_documented_command_resolves_at_its_world_size(name, world_size, per_node, args, monkeypatch):
    resolve_at(args, world_size, per_node, monkeypatch)


@pytest.mark.parametrize("world_size,per_node,args", sbatch_commands())
def test_multinode_sbatch_resolves_at_its_world_size(world_size, per_node, args, monkeypatch):
    cfg = resolve_at(args, world_size, per_node, monkeypatch)
    assert cfg["batch_size"] * cfg["gradient_accumulation_steps"] == 128  # the one-node step


@pytest.mark.parametrize("path", gpu_recipes())
@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_gpu_recipe_resolves_on_1_to_8_gpus(path, world_size, monkeypatch):
    resolve_at([path], world_size, world_size, monkeypatch)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_configs.py --write   (re-pins every resolved config)")
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    # Entries of replaced files stay: they pin what their replacement must still resolve to.
    pinned = {**golden(), **{key: pinned_form(resolve(key)) for key in shipped()}}
    with open(GOLDEN, "w") as f:
        json.dump(pinned, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"pinned {len(pinned)} configs and suites in {GOLDEN}")
