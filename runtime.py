"""A run's keys and its model: DEFAULTS (every key of train.py, with its meaning), the derived keys
settled once (settle) and every key checked once (validate; resolve is the pair train.py and sweep.py
call), the model registry (MODEL_TYPES), and building a model from a config or a checkpoint.

The device and its precision: devices.py; the data's checks and batch windows: tokendata.py; process
groups and the parallel layout: parallel.py. The scripts import this module; it imports the models,
the optimizer's checks and those modules, never a script.
"""
import dataclasses
import functools
import json
import os

import torch

import configurator
import devices
import optim
import parallel
import rundir
import tokendata
from kernels.linear_cross_entropy import check_head_loss_trains
from model import GPT, GPTConfig, model_config_fields, unwrap_state_dict
from ra_model import IDEAS, RAConfig, RAGPT, check_ideas
from reduced_sync_model import ReducedSyncConfig, ReducedSyncGPT

REPO_DIR = rundir.REPO_DIR  # the repository: data/, config/, the scripts

# The keys of a training run (train.py), each with its default and meaning. Config files and
# --key=value overrides set them (configurator.py); sweep.py expands them over grids.
DEFAULTS = dict(
    # run directory, evaluation and checkpoints
    out_dir="out",  # the run directory: config.json, log.jsonl, log.txt, ckpt.pt
    init_from="scratch",  # 'scratch', 'resume' (from out_dir/ckpt.pt), or a local HF GPT-2 directory
    fork_from="",  # a finished trunk run's out_dir: start from its final checkpoint with this run's model (forking.py)
    fork_optimizer="carry",  # fork_from: 'carry' the shared parameters' optimizer state, or start it 'fresh'
    fork_start="own",  # fork_from: the branch's new parameters start at its own seeded init ('own') or so that the forked model computes what the trunk computed ('preserve', forking.preserve_start)
    allow_data_change=False,  # resume although the dataset, evaluation windows or batch order changed since the run started (recorded)
    eval_interval=500,  # also where checkpoints are written
    eval_at=[],  # more evaluations at these iterations, on final_eval_iters batches (sweep.py: each variant's equal-FLOPs point)
    eval_iters=20,  # fixed batches per split per evaluation: the same windows in every run
    final_eval_iters=0,  # >0: the evaluation at the end of the budget reads this many val batches (a steadier verdict)
    log_interval=10,  # a train log line every this many iterations
    save_checkpoint=True,  # write out_dir/ckpt.pt at evaluations
    sample_tokens=0,  # >0: print a sample of this many tokens at the end of the run
    hellaswag_interval=0,  # >0: HellaSwag accuracy at evaluations on multiples of this and at the end
    hellaswag_limit=0,  # the first N validation examples only (0: all 10,042)
    hellaswag_input="",  # a local hellaswag_val.jsonl; '' downloads it once into data/hellaswag/
    # data
    dataset="shakespeare",  # reads data/<dataset>/train.bin and val.bin
    data_dir="",  # default: data/<dataset> next to this file
    batch_size=12,  # micro-batch per process, in sequences
    block_size=1024,  # context length in tokens
    gradient_accumulation_steps=40,  # micro-steps per optimizer step, summed over all processes
    tokens_per_iter=0,  # >0: the tokens per optimizer step; gradient_accumulation_steps=0 derives from it
    # model
    model_type="gpt",  # 'gpt', 'ra', 'reduced_sync' (MODEL_TYPES)
    n_layer=12,  # transformer blocks
    n_head=12,  # attention heads per block
    n_embd=768,  # width of the residual stream
    vocab_size=50304,  # GPT-2's 50257 padded to a multiple of 64
    dropout=0.0,  # on embeddings, attention weights and residual branches (0: off)
    bias=True,  # biases in Linear layers and LayerNorms
    ln_placement="pre",  # 'pre' (GPT-2) or 'post' (original Transformer)
    attn_impl="sdpa",  # 'sdpa', 'manual' (materializes the scores); model_type='ra' also 'triton' (fused kernels) and 'auto' (the faster of sdpa and triton, measured per call shape before training; the checklist's attn_auto)
    activation_checkpointing=False,  # recompute each whole block in backward
    attn_recompute=False,  # recompute only the attention core in backward (model.attention_core)
    tie_weights=True,  # the head shares the token embedding matrix, as in GPT-2
    head_loss="auto",  # training loss of the head: 'auto' (a GPU's full head where the memory estimate fits, else chunked; the checklist says which), 'chunked' (no logits), 'full', 'liger', 'cce' (CUDA packages)
    # reciprocal attention and MLA (model_type='ra'; see ra_model.py for the meaning of each)
    ra_pattern="none",  # 'none', 'early', 'late', 'all', 'alternate', 'learned', 'layers'
    ra_layers=[],  # ra_pattern='layers': the reciprocal layers' indices
    ra_mode="mix",  # 'swap', 'mix', 'gate'
    ra_alpha=0.5,  # mix: weight of S^T (initial value when learned)
    ra_alpha_learn="none",  # 'none', 'layer', 'head'
    ra_gate_init=0.0,  # gate: initial logit of p
    ra_window=0,  # >0: the reciprocal term only within this many positions
    mla=False,  # multi-head latent attention in every layer
    mla_latent_dim=128,  # size of the shared K/V latent
    mla_per_head_q_latent=True,  # each head scores its query in the latent (else a key up-projection)
    mla_per_head_v_up=True,  # one value up-projection per head (else one shared)
    attn_gate=False,  # gated attention: sigmoid(W x) scales each head's output (arXiv 2505.06708)
    qk_norm=False,  # QK-norm: each head's q and k RMS-normalized before the scores
    attn_softcap=0.0,  # logit soft-capping: > 0 caps the scores at c*tanh(s/c) (Gemma 2; attn_impl='manual'); 0: off
    value_residual=False,  # value residual: each layer after the first mixes its values with layer 0's (ResFormer)
    # reduced-synchronization tensor parallelism (model_type='reduced_sync'; see reduced_sync_model.py)
    block_pattern="tp",  # repeating unit of block types 'tp', 'spd', 'parallel', e.g. 'tp,spd' or 'spd,parallel,parallel'
    block_types=[],  # one block type per layer; overrides block_pattern
    tp_size=1,  # ranks per model replica under torchrun (world = tp_size x data-parallel replicas); one process simulates them
    sync_every=0,  # >0: parallel runs also sync every this many layers (grouped)
    sync_layers=[],  # parallel runs also sync after these layers (selective)
    # data parallelism across ranks (sharding.py)
    data_parallel="ddp",  # 'ddp' (replicate), 'fsdp' (shard all, FSDP2), 'hsdp' (shard in a node, replicate across)
    hsdp_shard_size=0,  # hsdp: data-parallel ranks per shard group; 0 means one node's (LOCAL_WORLD_SIZE / tp_size)
    fsdp_reduce_dtype="float32",  # fsdp/hsdp: gradient reductions in 'float32' or 'bfloat16' (weights follow dtype)
    # optimizer
    optimizer="adamw",  # 'adamw', 'adam', 'sgd', 'adamw_spam' (optim.py)
    optimizer_impl="fused",  # torch optimizers: 'fused' (CUDA and CPU), 'foreach', 'for_loop', '' (torch's choice); adamw_spam has its own
    learning_rate=6e-4,  # peak learning rate
    weight_decay=0.1,  # never on biases or norms
    beta1=0.9,  # adam, adamw, adamw_spam
    beta2=0.95,  # adam, adamw, adamw_spam
    momentum=0.9,  # sgd only
    nesterov=False,  # sgd only
    grad_clip=1.0,  # 0 disables clipping; the gradient norm is logged either way
    # optimizer extras and pruning (optim.py; formulas in docs/experiments.md)
    spam_theta=50.0,  # adamw_spam: clip gradient entries with g^2 > theta * v_hat
    spam_spike_z=2.0,  # adamw_spam: a spike when the gradient norm's z-score exceeds this (m *= 0.5, v *= 0.9)
    spam_window=100,  # adamw_spam: the z-score is against the last this many gradient norms
    spam_interval=1000,  # adamw_spam: reset m and v every this many steps (0: never)
    spam_warmup=1000,  # adamw_spam: after a reset the lr re-warms with a cosine over this many steps
    pruning="none",  # 'none', 'magnitude', 'state' (scored by prune_score from Adam's states)
    prune_score="bitter7",  # pruning='state': 'bitter0' ... 'bitter7'
    target_sparsity=0.5,  # fraction of the pruned Linear weights that are zero at prune_ramp_end
    prune_start=100,  # the sparsity ramp starts after this many steps
    prune_ramp_end=0,  # ... and reaches target_sparsity here; 0 means the run's last iteration
    prune_interval=50,  # masks are recomputed every this many steps
    prune_ramp="cubic",  # 'cubic': s(t) = target * p^3, 'linear': target * p
    prune_threshold="exact",  # 'exact' global k-th value, or 'sampled' (a quantile of prune_sample scores)
    prune_sample=1_000_000,  # prune_threshold='sampled': scores drawn for the quantile
    # learning-rate schedule
    lr_schedule="cosine",  # 'cosine', 'constant', 'wsd' (warmup-stable-decay)
    warmup_iters=2000,  # linear warmup from 0 to learning_rate
    lr_decay_iters=0,  # where cosine reaches min_lr; 0 means max_iters
    min_lr=6e-5,  # the learning rate at the end of the decay
    wsd_decay_frac=0.2,  # wsd: the last fraction of lr_decay_iters decays linearly to min_lr
    lr_tuning="",  # how learning_rate was tuned, as tools/tune_lr.py writes it into a recipe ('' = untuned)
    # budgets: the run ends at whichever comes first (0 disables max_time / max_tokens)
    max_iters=600000,  # optimizer steps
    max_time=0.0,  # seconds spent in training steps (evaluation and checkpointing excluded)
    max_tokens=0,  # training tokens (a whole number of tokens_per_iter)
    # system
    device="",  # '' picks cuda when available, else cpu
    dist_timeout=600.0,  # seconds a rank waits in a collective for the others before the job ends (a frozen rank)
    dtype="",  # 'bfloat16', 'float16', 'float32'; '' picks bfloat16 where supported
    compile=None,  # torch.compile the model (a cold compile takes 20-35 s); None: on where a CUDA device trains, else off
    deterministic=False,  # PyTorch's deterministic algorithms and cuBLAS's fixed workspace: a GPU run repeats bit for bit, slower
    seed=1337,  # initial weights, training batches and dropout (the one seed users set)
    init_seed=-1,  # >= 0: the initial weights from this seed instead (a noise budget varies each source alone)
    data_seed=-1,  # >= 0: the training batches from this seed instead
    data_order=0,  # >= 1: another independent batch order of the same data seed (a branch set apart from its trunk: a forked true null)
    # logging
    log_act_norm_layers=[0, -1],  # blocks whose output RMS is logged (negative counts from the end)
    wandb_log=False,  # also log to Weights & Biases
    wandb_project="gpt2-ablations",  # the W&B project
    wandb_run_name="",  # default: the name of out_dir
    wandb_group="",  # runs of one ablation suite share a group (sweep.py sets it)
    wandb_mode="",  # 'online', 'offline', 'disabled'; '' is online with an API key, else offline
)

# model_type -> (model class, its config dataclass). Every field of a config dataclass is a key of
# DEFAULTS, so each model's options are set like any other key.
MODEL_TYPES = {"gpt": (GPT, GPTConfig), "ra": (RAGPT, RAConfig), "reduced_sync": (ReducedSyncGPT, ReducedSyncConfig)}
# The keys that switch a model type's ideas on (check_model_keys_apply): for 'ra', each idea's first key.
MODEL_SWITCHES = {"ra": tuple(idea.keys[0] for idea in IDEAS.values() if idea.keys),  # (no keys: check_ideas)
                  "reduced_sync": ("block_pattern", "block_types", "sync_every", "sync_layers")}
LR_SCHEDULES = ("cosine", "constant", "wsd")
FORK_STARTS = ("own", "preserve")  # forking.preserve_start


# ----------------------------------------------------------------------------- the run configuration

def resolve(cfg, world_size):
    """settle, then validate: the run config train.py uses, for a launch of world_size processes.
    sweep.py checks its runs with the same pair, so its pre-flight refuses what train.py would."""
    cfg = settle(cfg)
    validate(cfg, world_size)
    return cfg


def settle(cfg):
    """A copy of cfg with the derived keys filled in, computed here only: a pretrained init_from's model
    keys (pretrained_model_keys), gradient_accumulation_steps from tokens_per_iter where it is 0, and
    tokens_per_iter from it (validate checks that they agree), and compile=None as the device's default
    (compile_default)."""
    cfg = dict(cfg, **pretrained_model_keys(cfg))
    cfg["compile"] = compile_default(cfg["device"]) if cfg["compile"] is None else cfg["compile"]
    sequence_tokens = cfg["batch_size"] * cfg["block_size"]
    accum = cfg["gradient_accumulation_steps"] or (cfg["tokens_per_iter"] // sequence_tokens if sequence_tokens > 0 else 0)
    return dict(cfg, gradient_accumulation_steps=accum, tokens_per_iter=cfg["tokens_per_iter"] or accum * sequence_tokens)


def compile_default(device):
    """compile=None: True where a CUDA device trains (device 'cuda', 'cuda:N', or '' with a GPU visible, the
    device parallel.pick_device picks), False on CPUs and MPS, where a cold compile costs more than it saves
    in a short run. config.json records the settled value."""
    return (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")


# GPT.from_pretrained's overrides: the keys a run with init_from=<HF directory> sets itself
PRETRAINED_OVERRIDES = ("dropout", "attn_impl", "activation_checkpointing", "attn_recompute", "head_loss")


def pretrained_model_keys(cfg):
    """init_from=<a Hugging Face GPT-2 directory>: the model keys of the model GPT.from_pretrained builds
    there (its config.json's shape, GPT-2's biases and tying, GPTConfig's defaults for the rest, the
    run's own PRETRAINED_OVERRIDES), so that the config is settled before anything is built and read
    as the model runs; {} otherwise (validate names a directory that is missing or not GPT-2's)."""
    path = cfg.get("init_from", "scratch")
    if path in ("scratch", "resume") or not os.path.isfile(os.path.join(path, "config.json")):
        return {}
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    shape = dict(n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"], block_size=hf["n_positions"],
                 vocab_size=hf["vocab_size"], bias=True, tie_weights=hf.get("tie_word_embeddings", True))
    defaults = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
    return {**defaults, **shape, **{k: cfg[k] for k in PRETRAINED_OVERRIDES}}


def validate(cfg, world_size):
    """Every check of a settled cfg that can fail before a process group, data or weights exist, each
    key checked once, for a launch of world_size processes; errors name keys and fixes. Pure."""
    err = configurator.ConfigError
    if not cfg["out_dir"]:
        raise err("out_dir is empty: name the run directory (--out_dir=out-NAME)")
    check_model_registries()
    model_config(cfg)  # shape checks (n_embd divisible by n_head, ...), head_loss's name
    if not isinstance(cfg["compile"], bool):
        raise err(f"compile={cfg['compile']!r}: use True, False, or leave it unset (None: True on a CUDA device)")
    device = parallel.pick_device(cfg["device"])
    check_head_loss_trains(cfg["head_loss"], device.split(":")[0], cfg["dtype"])
    devices.check_dtype(cfg["dtype"], device)
    layout = parallel.ParallelLayout.plan(cfg, world_size)  # every degree: tp, data-parallel, shard
    check_model_keys_apply(cfg)
    positive = ("batch_size", "block_size", "max_iters", "eval_interval", "eval_iters", "log_interval", "dist_timeout")
    for key in positive:
        if cfg[key] < 1:
            raise err(f"{key} must be >= 1, got {cfg[key]}")
    if not all(isinstance(i, int) and 1 <= i <= last_iter(cfg) for i in cfg["eval_at"]):
        raise err(f"eval_at={cfg['eval_at']!r}: iterations to evaluate at, integers from 1 to the run's last "
                  f"({last_iter(cfg)})")
    if cfg["final_eval_iters"] < 0:
        raise err(f"final_eval_iters must be >= 0 (0: eval_iters), got {cfg['final_eval_iters']}")
    if cfg["seed"] < 0:
        raise err(f"seed must be >= 0 (numpy's generators take no negative seed), got {cfg['seed']}")
    for key in ("init_seed", "data_seed"):
        if cfg[key] < -1:
            raise err(f"{key} must be >= 0, or -1 to follow seed, got {cfg[key]}")
    if not isinstance(cfg["data_order"], int) or cfg["data_order"] < 0:
        raise err(f"data_order must be an integer >= 0 (0: the data seed's own order), got {cfg['data_order']!r}")
    for key in ("gradient_accumulation_steps", "tokens_per_iter", "max_time", "max_tokens", "warmup_iters", "lr_decay_iters", "sample_tokens",
                "hellaswag_interval", "hellaswag_limit", "learning_rate", "min_lr", "weight_decay", "grad_clip"):
        if cfg[key] < 0:
            raise err(f"{key} must be >= 0, got {cfg[key]}")
    check_batch(cfg, layout.dp)
    optim.validate(cfg, last_iter(cfg))
    if cfg["lr_schedule"] not in LR_SCHEDULES:
        raise err(f"lr_schedule={cfg['lr_schedule']!r}: use one of {LR_SCHEDULES}")
    if cfg["lr_schedule"] != "constant" and cfg["warmup_iters"] > decay_iters(cfg):
        raise err(f"warmup_iters={cfg['warmup_iters']} exceeds lr_decay_iters={decay_iters(cfg)} (by default the "
                  f"iterations in max_iters or max_tokens): shorten warmup or lengthen the decay")
    if cfg["min_lr"] > cfg["learning_rate"]:
        raise err(f"min_lr={cfg['min_lr']} exceeds learning_rate={cfg['learning_rate']}")
    if not 0.0 < cfg["wsd_decay_frac"] <= 1.0:
        raise err(f"wsd_decay_frac must be in (0, 1], got {cfg['wsd_decay_frac']}")
    for layer in cfg["log_act_norm_layers"]:
        if not -cfg["n_layer"] <= layer < cfg["n_layer"]:
            raise err(f"log_act_norm_layers contains {layer}, but the model has {cfg['n_layer']} layers")
    if cfg["init_from"] not in ("scratch", "resume") and cfg["model_type"] != "gpt":
        raise err(f"init_from a Hugging Face GPT-2 needs model_type='gpt', not {cfg['model_type']!r}")
    if cfg["init_from"] not in ("scratch", "resume") and not os.path.isdir(cfg["init_from"]):
        raise err(f"init_from={cfg['init_from']!r} is neither 'scratch', 'resume' nor a directory "
                  f"holding a Hugging Face GPT-2 checkpoint")
    if cfg["hellaswag_interval"] and cfg["vocab_size"] < tokendata.GPT2_VOCAB_SIZE:
        raise err(f"HellaSwag is tokenized with GPT-2's BPE, which needs vocab_size >= {tokendata.GPT2_VOCAB_SIZE}, "
                  f"not {cfg['vocab_size']}: set hellaswag_interval=0")
    if cfg["init_from"] == "resume":
        parallel.check_resumable(cfg["out_dir"], cfg["data_parallel"])
    if cfg["fork_optimizer"] not in ("carry", "fresh"):
        raise err(f"fork_optimizer={cfg['fork_optimizer']!r}: use 'carry' or 'fresh'")
    if cfg["fork_start"] not in FORK_STARTS:
        raise err(f"fork_start={cfg['fork_start']!r}: use one of {FORK_STARTS} (a from-scratch run ignores it)")
    if cfg["fork_from"]:
        if cfg["init_from"] not in ("scratch", "resume"):
            raise err(f"fork_from starts from a trunk's weights; init_from={cfg['init_from']!r} would too: set one")
        if layout.sharded or layout.tp > 1 or cfg["pruning"] != "none":
            raise err("fork_from needs a whole-model checkpoint and no pruning: data_parallel='ddp', tp_size=1, "
                      "pruning='none'")


def check_model_keys_apply(cfg):
    """A key that switches on another model type's idea would be silently ignored (attn_gate=True on
    model_type='gpt' would train the baseline): refuse it. Settings that only shape an idea that is
    off (a shared recipe's mla_latent_dim) may stay; tp_size is ParallelLayout.plan's."""
    for model_type, keys in MODEL_SWITCHES.items():
        for key in keys if model_type != cfg["model_type"] else ():
            if cfg[key] != DEFAULTS[key]:
                raise configurator.ConfigError(f"{key}={cfg[key]!r} applies to model_type={model_type!r} only, not "
                                               f"{cfg['model_type']!r}: set model_type={model_type!r} or leave {key} "
                                               f"at {DEFAULTS[key]!r}")


def check_batch(cfg, dp_size):
    """gradient_accumulation_steps and tokens_per_iter (settled) against the batch shape and the
    data-parallel ranks. Our studies compare runs at equal tokens per step and equal token budgets, so a
    budget that the batch shape cannot meet exactly is refused rather than rounded."""
    err = configurator.ConfigError
    sequence_tokens = cfg["batch_size"] * cfg["block_size"]
    accum, tokens = cfg["gradient_accumulation_steps"], cfg["tokens_per_iter"]
    if tokens % sequence_tokens:
        raise err(f"tokens_per_iter={tokens} is not a multiple of batch_size {cfg['batch_size']} x block_size "
                  f"{cfg['block_size']} x world size {dp_size} = {sequence_tokens * dp_size}: change "
                  f"tokens_per_iter or batch_size")
    if not accum:
        raise err("gradient_accumulation_steps=0 means 'derive it from tokens_per_iter', which is 0 too: set one")
    if accum * sequence_tokens != tokens:
        raise err(f"gradient_accumulation_steps={accum} and tokens_per_iter={tokens} disagree (batch_size x "
                  f"block_size = {sequence_tokens}): set gradient_accumulation_steps=0 to derive it")
    if accum % dp_size:
        raise err(f"gradient_accumulation_steps={accum} is the total over all processes and must be divisible "
                  f"by the world size {dp_size} (tokens_per_iter a multiple of batch_size x block_size x "
                  f"world size = {sequence_tokens * dp_size}): change it, tokens_per_iter or batch_size")
    if cfg["max_tokens"] % tokens:
        whole = cfg["max_tokens"] // tokens * tokens
        raise err(f"max_tokens={cfg['max_tokens']} is not a whole number of iterations of tokens_per_iter="
                  f"{tokens}: use {whole} or {whole + tokens}")


def last_iter(cfg):
    """The run's last iteration: max_iters, or earlier where max_tokens ends the run (tokens_per_iter
    settled by settle). Everything that ends with the run asks here: the learning-rate decay,
    the pruning ramp, the start-up checklist's token budget. (max_time ends a run unpredictably.)"""
    if cfg["max_tokens"]:
        return min(cfg["max_iters"], cfg["max_tokens"] // cfg["tokens_per_iter"])
    return cfg["max_iters"]


def decay_iters(cfg):
    """Where the schedule reaches min_lr: lr_decay_iters, else the run's last iteration."""
    return cfg["lr_decay_iters"] or last_iter(cfg)


# ----------------------------------------------------------------------------- models

def model_classes(cfg):
    model_type = cfg.get("model_type", "gpt")  # checkpoints written before model_type existed
    if model_type not in MODEL_TYPES:
        raise configurator.ConfigError(f"model_type={model_type!r}: use one of {tuple(MODEL_TYPES)}")
    return MODEL_TYPES[model_type]


def check_model_registries():
    """Every model type's registrations, whatever the run's type: each config field a key of DEFAULTS
    (a key left out would end every run in a KeyError while the keys are checked) and ra_model.IDEAS
    whole (check_ideas: an idea no longer registered would let its key on model_type='gpt' pass unread,
    the baseline trained under the variant's name)."""
    for _, config_cls in MODEL_TYPES.values():
        check_fields_are_keys(config_cls)
    check_ideas(MODEL_TYPES["ra"][1])


def check_fields_are_keys(config_cls):
    unknown = [k for k in model_config_fields(config_cls) if k not in DEFAULTS]
    if unknown:  # a config file could not set it, and a run would silently build its default
        raise configurator.ConfigError(f"{config_cls.__name__} has the fields {unknown}, which are no keys of "
                                       f"runtime.DEFAULTS: add each with its default and meaning")


def model_config(cfg):
    """The model's config dataclass filled from a run config (or a checkpoint's)."""
    _, config_cls = model_classes(cfg)
    check_fields_are_keys(config_cls)
    # A checkpoint written before a field existed gets its default. The dataclass checks itself
    # and raises ConfigError, like every other key's check.
    return config_cls(**{k: cfg[k] for k in model_config_fields(config_cls) if k in cfg})


def build_model(cfg, checkpoint=None, tp_group=None):
    """A fresh model, a checkpoint's (built from the checkpoint's own config), or HF GPT-2 weights.
    With a tp_group, a reduced_sync model keeps only this rank's shards (checkpoints hold full weights)."""
    if checkpoint is not None:
        cfg = checkpoint["config"]
    if checkpoint is not None or cfg["init_from"] in ("scratch", "resume"):
        model_cls, _ = model_classes(cfg)
        model = model_cls(model_config(cfg), **({} if tp_group is None else dict(tp_group=tp_group)))
        # a sharded checkpoint's weights are read once the model is sharded (sharding.load)
        if checkpoint is not None and "model" in checkpoint:
            getattr(model, "load_full_state_dict", model.load_state_dict)(unwrap_state_dict(checkpoint["model"]))
        return model
    return GPT.from_pretrained(cfg["init_from"], **{k: cfg[k] for k in PRETRAINED_OVERRIDES})


# Model keys that change how the weights are trained, not what they are: a resumed run may change
# them (e.g. turn recomputation on after running out of memory) and the model is built with the new ones.
RESUMABLE_MODEL_KEYS = ("dropout", "activation_checkpointing", "attn_recompute", "head_loss")


def load_checkpoint(cfg, checkpointer):
    """The checkpoint to resume from (the parallel.Checkpointer knows where it lives and reads it),
    with the model keys a resume may change taken from cfg; a different model shape is refused."""
    ckpt = checkpointer.read()
    saved = ckpt["config"]
    keys = ["model_type"] + model_config_fields(model_classes(saved)[1])
    conflicts = {k: (saved.get(k, DEFAULTS[k]), cfg[k]) for k in keys
                 if k not in RESUMABLE_MODEL_KEYS and saved.get(k, DEFAULTS[k]) != cfg[k]}
    if conflicts:
        details = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in conflicts.items())
        raise configurator.ConfigError(f"resuming with a different model shape ({details}): "
                                       f"use the run's own config or a new out_dir")
    ckpt["config"] = {**saved, **{k: cfg[k] for k in RESUMABLE_MODEL_KEYS}}
    return ckpt


def load_model(cfg, device):
    """The model to evaluate or sample from: out_dir/ckpt.pt when init_from='resume' (built from the
    checkpoint's own config), else a local Hugging Face GPT-2 directory."""
    if cfg["init_from"] == "resume":
        if not cfg["out_dir"]:
            raise configurator.ConfigError("out_dir is empty: name the run directory to read (--out_dir=out-NAME)")
        path = rundir.checkpoint_path(cfg["out_dir"], sharded=False)
        if path is None and rundir.checkpoint_path(cfg["out_dir"], sharded=True):
            raise FileNotFoundError(f"{os.path.join(cfg['out_dir'], rundir.CHECKPOINT_FILE)} not found but {cfg['out_dir']}/dcp "
                                    f"holds a sharded checkpoint: write one file first with `python "
                                    f"export_checkpoint.py --out_dir={cfg['out_dir']}`")
        if path is None:
            raise FileNotFoundError(f"{os.path.join(cfg['out_dir'], rundir.CHECKPOINT_FILE)} not found: train first, or pass "
                                    f"--init_from=<HF GPT-2 directory>")
        ckpt = rundir.load_checkpoint_file(path)
        model = build_model(ckpt["config"], ckpt)
    else:
        model = GPT.from_pretrained(cfg["init_from"])
    return model.to(device)


def meta_model(cfg):
    """The run's model on the meta device: shapes only, no memory, no weights. Built once per model
    config and model type: a suite's runs share a handful of models, and initializing even a tiny one
    on the meta device takes milliseconds per weight (the resolved-config goldens build thousands)."""
    return _meta_model(*model_key(cfg))


def model_key(cfg):
    """(model type, model config as JSON): what of a run config decides its model, weights' shapes and init."""
    return cfg.get("model_type", "gpt"), json.dumps(dataclasses.asdict(model_config(cfg)), sort_keys=True)


@functools.lru_cache(maxsize=256)
def _meta_model(model_type, config_json):
    import torch  # the models import it anyway
    model_cls, config_cls = MODEL_TYPES[model_type]
    with torch.device("meta"):
        return model_cls(config_cls(**json.loads(config_json)))


def flops_per_token(cfg):
    """Training FLOPs per token as the model counts them (the start-up checklist's number), from the
    model on the meta device: known before any run (sweep.py schedules each variant's equal-FLOPs
    evaluation by it)."""
    return meta_model(cfg).flops_per_token()


def count_params(cfg):
    """The model's parameter count (the whole model's, tensor-parallel shards together), by formula."""
    model_cls, _ = model_classes(cfg)
    return model_cls.count_params(model_config(cfg))
