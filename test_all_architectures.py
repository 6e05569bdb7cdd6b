"""Smoke check of every architecture a user can pick: build a tiny model, run forward + backward on
random tokens, and require a finite loss and a finite gradient for every parameter.

    python test_all_architectures.py                         # all of them
    python test_all_architectures.py --only=post             # names containing 'post'
    python test_all_architectures.py --only=comm --ranks=2   # reduced-sync models really on 2 gloo ranks
    python test_all_architectures.py --only=fsdp             # the FSDP/HSDP layouts alone
    python test_all_architectures.py --help                  # this text and the keys

Reduced-sync entries also require the counted all-reduces (forward and backward) to equal their
schedule's, and every reduced-sync experiment config (REDUCED_SYNC_CONFIGS) must load, keep GPT-2
124M's parameter count within 1% (counted on the meta device, reported) and promise in its name the
syncs it schedules. With --ranks=N they run sharded on N gloo ranks, compared with the simulation.
The GPT-2 Medium/Large/XL configs must keep the published parameter counts within 0.5%.

FSDP_LAYOUTS run a model family under sharding.shard_model (FSDP2) on forked gloo ranks, each rank
with its own batch, against the unsharded model on every rank's batch: the same losses and the same
averaged gradient for every parameter (FSDP on 2 ranks, HSDP on 2 x 2; a reduced-sync model with
tp_size 2 on 4 ranks: 2 data-parallel replicas of 2 real tensor-parallel ranks, each rank's gradient
the slice of the unsharded model's that its tensor-parallel position holds).

A new architecture is one entry in ARCHITECTURES (and, for a new model family, one build function
in BUILDERS); every idea registered in ra_model.IDEAS is checked alone from its example keys, and every idea an
RA model runs must change its output (check_every_idea_counts: compositions judged by outputs). Exit
code 1 when any architecture fails. tests/test_model.py runs this script.
"""
import itertools
import json
import math
import os
import sys
import time

import torch

from model import GPT, GPTConfig
from ra_model import IDEAS, RAConfig, RAGPT
import configurator
import devices
import runtime
from reduced_sync_model import REDUCED_SYNC_CONFIGS, SYNC_KEYS, ReducedSyncConfig, ReducedSyncGPT, expected_syncs

OPTIONS = dict(
    only="",  # run only the architectures (and configs, layouts) whose name contains this
    ranks=0,  # >0: run the reduced-sync entries sharded on this many gloo ranks (CPU processes)
)

if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)  # tiny models: thread start-up costs more than it saves

# Shared by every entry; an entry's kwargs override these.
TINY = dict(block_size=32, vocab_size=128, n_layer=2, n_head=2, n_embd=32, dropout=0.0)


def build_gpt(**kwargs):
    return GPT(GPTConfig(**kwargs))


# model family -> function(**GPTConfig kwargs) -> model
BUILDERS = {"gpt2": build_gpt, "ra": lambda **kwargs: RAGPT(RAConfig(**kwargs)),
            "reduced_sync": lambda tp_group=None, **kwargs: ReducedSyncGPT(ReducedSyncConfig(**kwargs), tp_group)}

# name -> (family, kwargs on top of TINY)
ARCHITECTURES = {
    f"gpt2-{ln}-{attn}" + ("-ckpt" if ckpt else ""):
        ("gpt2", dict(ln_placement=ln, attn_impl=attn, activation_checkpointing=ckpt))
    for ln, attn, ckpt in itertools.product(("pre", "post"), ("sdpa", "manual"), (False, True))
}
ARCHITECTURES["gpt2-pre-sdpa-attn-recompute"] = ("gpt2", dict(attn_recompute=True))
# Reciprocal attention (ra_model.py): every pattern x mode, windows, learned alphas; MLA, RA+MLA.
ARCHITECTURES.update({
    f"ra-{pattern}-{mode}": ("ra", dict(ra_pattern=pattern, ra_mode=mode))
    for pattern, mode in itertools.product(("early", "late", "all", "alternate"), ("swap", "mix", "gate"))
})
ARCHITECTURES.update({
    "ra-none": ("ra", dict(ra_pattern="none")),
    "ra-layers-mix": ("ra", dict(ra_pattern="layers", ra_layers=[1], ra_mode="mix")),
    "ra-learned": ("ra", dict(ra_pattern="learned")),
    "ra-learned-window": ("ra", dict(ra_pattern="learned", ra_window=8)),
    "ra-learned-manual-ckpt": ("ra", dict(ra_pattern="learned", attn_impl="manual", activation_checkpointing=True)),
    "ra-all-swap-window": ("ra", dict(ra_pattern="all", ra_mode="swap", ra_window=8)),
    "ra-all-mix-window": ("ra", dict(ra_pattern="all", ra_mode="mix", ra_window=8)),
    "ra-all-mix-window-manual": ("ra", dict(ra_pattern="all", ra_mode="mix", ra_window=8, attn_impl="manual")),
    "ra-late-mix-window-auto": ("ra", dict(ra_pattern="late", ra_mode="mix", ra_window=8, attn_impl="auto")),
    "ra-all-mix-alpha-layer": ("ra", dict(ra_pattern="all", ra_mode="mix", ra_alpha_learn="layer")),
    "ra-all-mix-alpha-head-post": ("ra", dict(ra_pattern="all", ra_mode="mix", ra_alpha_learn="head",
                                              ln_placement="post")),
    "mla": ("ra", dict(mla=True, mla_latent_dim=8)),
    "mla-shared-q-v": ("ra", dict(mla=True, mla_latent_dim=8, mla_per_head_q_latent=False,
                                  mla_per_head_v_up=False)),
    "ra-mla": ("ra", dict(mla=True, mla_latent_dim=8, ra_pattern="all", ra_mode="mix", ra_alpha=0.5)),
    "ra-mla-window-manual": ("ra", dict(mla=True, mla_latent_dim=8, ra_pattern="all", ra_mode="mix",
                                        ra_window=8, attn_impl="manual")),
    "ra-mla-learned": ("ra", dict(mla=True, mla_latent_dim=8, ra_pattern="learned")),
    "ra-mla-window-recompute": ("ra", dict(mla=True, mla_latent_dim=8, ra_pattern="all", ra_mode="mix",
                                           ra_window=8, attn_recompute=True)),
    # gated attention (attn_gate): alone, with reciprocal layers, with MLA, and post-LN + recompute
    "gated-attn": ("ra", dict(attn_gate=True)),
    "gated-attn-ra-late-mix": ("ra", dict(attn_gate=True, ra_pattern="late", ra_mode="mix")),
    "gated-attn-mla": ("ra", dict(attn_gate=True, mla=True, mla_latent_dim=8)),
    "gated-attn-post-recompute": ("ra", dict(attn_gate=True, ln_placement="post", attn_recompute=True)),
    # logit soft-capping (a scores step: manual attention) and value residual (cross-layer), composed
    "softcap-ra-late-mix": ("ra", dict(attn_softcap=1.0, attn_impl="manual", ra_pattern="late", ra_mode="mix")),
    "softcap-ra-all-gate-window": ("ra", dict(attn_softcap=1.0, attn_impl="manual", ra_pattern="all", ra_mode="gate",
                                              ra_window=8)),
    "softcap-gated-attn-qk-norm": ("ra", dict(attn_softcap=1.0, attn_impl="manual", attn_gate=True, qk_norm=True)),
    "softcap-mla-ra-all-mix": ("ra", dict(attn_softcap=1.0, attn_impl="manual", mla=True, mla_latent_dim=8,
                                          ra_pattern="all", ra_mode="mix")),
    "value-residual-ra-late-mix": ("ra", dict(value_residual=True, ra_pattern="late", ra_mode="mix")),
    "value-residual-ra-all-mix": ("ra", dict(value_residual=True, ra_pattern="all", ra_mode="mix")),  # layer 0 mixes
    "value-residual-gated-attn": ("ra", dict(value_residual=True, attn_gate=True)),
    "value-residual-mla": ("ra", dict(value_residual=True, mla=True, mla_latent_dim=8)),
    "value-residual-softcap": ("ra", dict(value_residual=True, attn_softcap=1.0, attn_impl="manual")),
    "value-residual-recompute": ("ra", dict(value_residual=True, attn_recompute=True)),
    "value-residual-ckpt": ("ra", dict(value_residual=True, ra_pattern="late", activation_checkpointing=True)),
})
# Every registered idea of the RA model (ra_model.IDEAS) alone, from its own example keys.
ARCHITECTURES.update({"idea-" + name.lower().replace(" ", "-"): ("ra", idea.example) for name, idea in IDEAS.items()})

# name -> (family, kwargs on top of TINY, data_parallel, ranks, dtype)
FSDP_LAYOUTS = {
    "fsdp-gpt2-pre-sdpa": ("gpt2", {}, "fsdp", 2, "float32"),
    "fsdp-gpt2-postln-manual-ckpt": ("gpt2", dict(ln_placement="post", attn_impl="manual", activation_checkpointing=True),
                                     "fsdp", 2, "float32"),
    "fsdp-gpt2-bf16": ("gpt2", {}, "fsdp", 2, "bfloat16"),
    "fsdp-ra-learned": ("ra", dict(ra_pattern="learned"), "fsdp", 2, "float32"),
    "fsdp-ra-mla-gated": ("ra", dict(mla=True, mla_latent_dim=8, ra_pattern="all", attn_gate=True), "fsdp", 2, "float32"),
    "fsdp-rs-tp-spd-parallel": ("reduced_sync", dict(n_layer=3, block_pattern="tp,spd,parallel"), "fsdp", 2, "float32"),
    "hsdp-gpt2-pre-sdpa-2x2": ("gpt2", {}, "hsdp", 4, "float32"),
    "fsdp-rs-tp2-x-dp2": ("reduced_sync", dict(n_layer=3, block_pattern="tp,spd,parallel", tp_size=2), "fsdp", 4,
                          "float32"),
}
# GPT-2 Medium, Large and XL: config file -> the published parameter count
GPT2_SIZE_CONFIGS = {"train_gpt2_350m": 355e6, "train_gpt2_774m": 774e6, "train_gpt2_1558m": 1558e6}

# Reduced-synchronization experiments (reduced_sync_model.REDUCED_SYNC_CONFIGS): each config's schedule.


def load_config(name):
    return configurator.apply_config(runtime.DEFAULTS, [os.path.join(runtime.REPO_DIR, "config", f"{name}.py")])


# Each config's block schedule on a tiny 12-layer model (its tp_size shards, simulated unless --ranks).
ARCHITECTURES.update({
    "rs-" + name.removeprefix("train_"): ("reduced_sync", dict(n_layer=12, **{k: load_config(name)[k] for k in SYNC_KEYS}))
    for name in REDUCED_SYNC_CONFIGS
})


def check_config(name):
    """The full-size config: it loads, its name's sync count is its schedule's, and its parameter
    count stays within 1% of GPT-2 124M's (built on the meta device: no memory, no time)."""
    cfg = load_config(name)
    with torch.device("meta"):
        n = runtime.build_model(cfg).get_num_params()
        baseline = GPT(GPTConfig(**{k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "block_size",
                                                         "vocab_size", "bias")})).get_num_params()
    syncs = expected_syncs(runtime.model_config(cfg))
    if syncs != REDUCED_SYNC_CONFIGS[name]:
        raise AssertionError(f"schedules {syncs} syncs per forward pass, its name says {REDUCED_SYNC_CONFIGS[name]}")
    if abs(n - 124e6) > 0.01 * 124e6 or abs(n - baseline) > 0.01 * baseline:
        raise AssertionError(f"{n:,} parameters: more than 1% from 124M or the baseline's {baseline:,}")
    return f"{n:,} params ({100 * (n - baseline) / baseline:+.2f}% vs GPT-2 baseline {baseline:,}, " \
           f"{100 * (n - 124e6) / 124e6:+.2f}% vs 124M), {syncs} syncs per forward pass, tp_size {cfg['tp_size']}"


def check_size_config(name):
    """GPT-2's published count includes position embeddings and the 50257-token vocabulary."""
    cfg = load_config(name)
    with torch.device("meta"):
        n = runtime.build_model(dict(cfg, vocab_size=50257)).get_num_params(non_embedding=False)
    published = GPT2_SIZE_CONFIGS[name]
    if abs(n - published) > 0.005 * published:
        raise AssertionError(f"{n:,} parameters: more than 0.5% from the published {published / 1e6:.0f}M")
    return f"{n:,} params ({100 * (n - published) / published:+.2f}% vs the published {published / 1e6:.0f}M), " \
           f"data_parallel={cfg['data_parallel']!r}"


def check_sharded(family, kwargs, data_parallel, world, dtype, seed=0):
    """On this gloo rank: the sharded model's loss on this rank's batch and its averaged gradients
    against the unsharded model run on every rank's batch, under the same autocast. float32 agrees to
    rounding; bfloat16 (weights gathered in bf16, as autocast would cast them, but also the embeddings
    and norms) to a few bf16 roundings (~2% here, 5% allowed). Returns the largest relative gradient
    difference."""
    import sharding
    from parallel import ParallelLayout
    from reduced_sync_model import shard_tensor
    from torch.distributed.tensor import DTensor
    rank, tp = torch.distributed.get_rank(), kwargs.get("tp_size", 1)
    layout = ParallelLayout(data_parallel, world, tp, shard=world // tp if data_parallel == "fsdp" else 2)
    layout.distributed, layout.rank = True, rank  # these forked ranks joined their process group already
    layout.build_mesh()
    models = []
    for real in (False, True):
        torch.manual_seed(seed)  # a real tensor-parallel rank's weights are slices of the whole model's
        group = dict(tp_group=layout.tp_group) if real and layout.tp_group is not None else {}
        models.append(BUILDERS[family](**{**TINY, **kwargs}, **group).train())
    reference, model = models
    sharding.shard_model(model, layout.shard_mesh, dtype, "float32")
    _, autocast = devices.precision(dtype, "cpu")
    tolerance = 1e-5 if dtype == "float32" else 5e-2
    replicas, replica, position = world // tp, rank // tp, rank % tp  # a replica's tp ranks are consecutive
    batches = torch.randint(0, TINY["vocab_size"], (replicas, 2, 2, TINY["block_size"]),
                            generator=torch.Generator().manual_seed(seed))  # (replica, idx/targets, batch, time)
    with autocast:
        _, loss = model(batches[replica][0], batches[replica][1])
        loss.backward()
        for idx, targets in batches:
            (reference(idx, targets)[1] / replicas).backward()
        _, own_loss = reference(batches[replica][0], batches[replica][1])
    if not torch.allclose(loss.float(), own_loss.float(), atol=0, rtol=tolerance):
        raise AssertionError(f"loss {loss.item()} sharded, {own_loss.item()} unsharded")
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        expected = shard_tensor(name, q.grad, position, tp) if tp > 1 else q.grad
        if grad.dtype != torch.float32:
            raise AssertionError(f"{name}: a {grad.dtype} gradient (reductions are float32)")
        difference = ((grad - expected).norm() / expected.norm().clamp_min(1e-12)).item()
        worst = max(worst, difference)
        if difference > tolerance:
            raise AssertionError(f"{name}: gradients differ by {difference:.2e} of their norm")
    return worst


def sharp_ra_model(kwargs, seed):
    """An RA model whose attention projections are scaled up: GPT-2's init gives near-zero scores, where a
    soft-cap or a reciprocal term changes the logits by less than rounding."""
    torch.manual_seed(seed)
    model = BUILDERS["ra"](**{**TINY, **kwargs}).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("attn.c_attn.weight", "attn.c_q.weight", "attn.c_kv.weight", "attn.k_up.weight")):
                p.mul_(15.0)
    return model


def check_every_idea_counts(kwargs, idx, seed):
    """Each idea the model runs changes its output, judged by outputs, not classes: a composition that skips an
    idea's step (a mixin computing attention without super(), a path ignoring the scores step) gives the
    logits of the same model without that idea (its keys at their defaults, same seed and weights)."""
    with torch.no_grad():
        logits = sharp_ra_model(kwargs, seed)(idx)[0]
        for name, idea in IDEAS.items():
            if not list(idea.layers(RAConfig(**{**TINY, **kwargs}))):
                continue
            without = sharp_ra_model({k: v for k, v in kwargs.items() if k not in idea.keys}, seed)(idx)[0]
            if torch.allclose(without, logits, rtol=1e-4, atol=1e-6):
                raise AssertionError(f"the idea {name!r} changes nothing in this composition: some path skips its step")


def check(family, kwargs, batch_size=2, seed=0):
    """Forward + backward once; returns the parameter count or raises with the reason."""
    torch.manual_seed(seed)
    model = BUILDERS[family](**{**TINY, **kwargs}).train()
    cfg = model.config
    idx = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size))
    targets = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size))
    with torch.no_grad():
        logits, _ = model(idx)
    if logits.shape != (batch_size, cfg.block_size, cfg.vocab_size):
        raise AssertionError(f"logits shape {tuple(logits.shape)}")
    _, loss = model(idx, targets)  # a training forward: the chunked head builds no logits
    if not math.isfinite(loss.item()):
        raise AssertionError(f"loss is {loss.item()}")
    loss.backward()
    for name, p in model.named_parameters():
        if p.grad is None:
            raise AssertionError(f"{name} got no gradient")
        if not torch.isfinite(p.grad).all():
            raise AssertionError(f"{name} has a non-finite gradient")
    if family == "ra":
        check_every_idea_counts(kwargs, idx, seed)
    counts = model.metrics()
    if "syncs_expected" in counts and not counts["syncs_forward"] == counts["syncs_backward"] == counts["syncs_expected"]:
        raise AssertionError(f"counted {counts['syncs_forward']} all-reduces forward, {counts['syncs_backward']} "
                             f"backward; the schedule has {counts['syncs_expected']}")
    return sum(p.numel() for p in model.parameters())


def check_real(kwargs, world, seed=0):
    """One reduced-sync model sharded on this process's gloo rank against its simulation: the same
    logits, and every rank counts exactly the scheduled all-reduces."""
    config = ReducedSyncConfig(**{**TINY, **kwargs, "tp_size": world, "n_head": max(TINY["n_head"], world),
                                  "head_loss": "full"})  # the training forward's logits are compared
    models = []
    for group in (None, torch.distributed.group.WORLD):
        torch.manual_seed(seed)
        models.append(ReducedSyncGPT(config, tp_group=group))
    idx = torch.randint(0, config.vocab_size, (2, config.block_size), generator=torch.Generator().manual_seed(seed))
    (a, _), (b, loss) = models[0](idx), models[1](idx, idx)
    loss.backward()
    if not torch.allclose(a, b, atol=1e-5, rtol=0):
        raise AssertionError(f"real and simulated logits differ by {(a - b).abs().max().item():.2e}")
    counts, expected = models[1].metrics(), expected_syncs(config)
    if not counts["syncs_forward"] == counts["syncs_backward"] == expected:
        raise AssertionError(f"counted {counts['syncs_forward']} all-reduces forward, {counts['syncs_backward']} "
                             f"backward on rank {torch.distributed.get_rank()}; the schedule has {expected}")
    return expected


def _rank_worker(rank, names, world, tmp):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
    results = {}
    try:
        for name in names:
            start = time.perf_counter()
            try:
                if name in FSDP_LAYOUTS:
                    family, kwargs, data_parallel, _, dtype = FSDP_LAYOUTS[name]
                    worst = check_sharded(family, kwargs, data_parallel, world, dtype)
                    results[name] = f"PASS {name} ({data_parallel} on {world} ranks, {dtype}, gradients within " \
                                    f"{worst:.1e} of the unsharded model's (relative), " \
                                    f"{1000 * (time.perf_counter() - start):.0f} ms)"
                    continue
                syncs = check_real(ARCHITECTURES[name][1], world)
                results[name] = f"PASS {name} (real on {world} ranks, {syncs} all-reduces forward and backward, " \
                                f"{1000 * (time.perf_counter() - start):.0f} ms)"
            except Exception as e:
                results[name] = f"FAIL {name}: {type(e).__name__}: {e}"
        torch.distributed.barrier()  # no rank closes its connections while another still uses them
    finally:
        torch.distributed.destroy_process_group()
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)


def main_ranks(names, world, what="reduced-sync architectures"):
    """The reduced-sync entries (or FSDP layouts) among `names`, on `world` forked gloo ranks."""
    import tempfile
    import torch.multiprocessing as mp
    names = [n for n in names if n in FSDP_LAYOUTS or ARCHITECTURES[n][0] == "reduced_sync"]
    sys.stdout.flush()  # forked ranks would print the parent's buffered lines again
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank_worker, args=(names, world, tmp), nprocs=world, start_method="fork")
        results = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(world)]
    failed = [n for n in names if any(not res[n].startswith("PASS") for res in results)]
    for n in names:
        print(next((res[n] for res in results if not res[n].startswith("PASS")), results[0][n]))
    print(f"{len(names) - len(failed)}/{len(names)} {what} passed on {world} ranks"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv):
    options, extra = configurator.options_and_paths(argv, OPTIONS, text_keys=("only",))
    if extra:
        raise configurator.ConfigError(f"{extra[0]!r}: test_all_architectures.py takes only --key=value options, "
                                       "e.g. --only=post (--help)")
    if options["ranks"] < 0:
        raise configurator.ConfigError(f"--ranks={options['ranks']}: use 0 (simulated) or a number of ranks >= 1")
    only = options["only"]
    names = [name for name in ARCHITECTURES if only in name]
    layouts = [name for name in FSDP_LAYOUTS if only in name]
    if not names and not layouts:
        raise configurator.ConfigError(f"--only={only}: no architecture name contains it; known: "
                                       f"{', '.join([*ARCHITECTURES, *FSDP_LAYOUTS])}")
    if options["ranks"]:
        return main_ranks(names, options["ranks"])
    failed = []
    for name in names:
        family, kwargs = ARCHITECTURES[name]
        start = time.perf_counter()
        try:
            n_params = check(family, kwargs)
        except Exception as e:  # report every architecture, then fail at the end
            failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}")
        else:
            print(f"PASS {name} ({n_params:,} params, {1000 * (time.perf_counter() - start):.0f} ms)")
    if names:
        print(f"{len(names) - len(failed)}/{len(names)} architectures passed"
              + (f"; failed: {', '.join(failed)}" if failed else ""))
    for name in REDUCED_SYNC_CONFIGS:
        if only in "rs-" + name.removeprefix("train_"):
            try:
                print(f"CONFIG config/{name}.py: {check_config(name)}")
            except Exception as e:
                failed.append(name)
                print(f"FAIL config/{name}.py: {type(e).__name__}: {e}")
    for name in GPT2_SIZE_CONFIGS:
        if only in name:
            try:
                print(f"CONFIG config/{name}.py: {check_size_config(name)}")
            except Exception as e:
                failed.append(name)
                print(f"FAIL config/{name}.py: {type(e).__name__}: {e}")
    for world in sorted({FSDP_LAYOUTS[name][3] for name in layouts}):
        group = [name for name in layouts if FSDP_LAYOUTS[name][3] == world]
        if main_ranks(group, world, what="FSDP layouts"):
            failed += group
    return 1 if failed else 0


if __name__ == "__main__":
    configurator.run_script(main)
