"""Reduced-synchronization tensor parallelism: real execution on gloo ranks equals the simulation,
tp blocks equal GPT-2, f and g have the right backward rules, and every config counts its syncs."""
import datetime
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import configurator
import evaluation
import rundir
import runtime
import sharding
import train
from helpers import run_ranks, tp_args
from model import GPT, GPTConfig
from parallel import ParallelLayout
from reduced_sync_model import (ReducedSyncConfig, ReducedSyncGPT, _SumBackward, _SumForward, expected_syncs,
                                new_record, schedule, shard_tensor)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# head_loss='full': these tests compare the logits of training forwards (the chunked head builds none)
TINY = dict(block_size=8, vocab_size=32, n_layer=6, n_head=4, n_embd=16, head_loss="full")

# pattern name -> (ReducedSyncConfig kwargs, syncs per forward pass at n_layer=6)
PATTERNS = {
    "tp": (dict(block_pattern="tp"), 12),
    "spd": (dict(block_pattern="spd"), 6),
    "parallel": (dict(block_pattern="parallel"), 1),
    "tp,spd": (dict(block_pattern="tp,spd"), 9),
    "tp,spd,spd": (dict(block_pattern="tp,spd,spd"), 8),
    "spd,parallel (lone parallel blocks between syncs)": (dict(block_pattern="spd,parallel"), 6),
    "spd,parallel,parallel": (dict(block_pattern="spd,parallel,parallel"), 4),
    "grouped sync_every=2": (dict(block_pattern="parallel", sync_every=2), 3),
    "selective": (dict(block_pattern="parallel", sync_layers=[0, 3]), 3),
    "mixed, no bias": (dict(block_types=["parallel", "tp", "parallel", "spd", "parallel", "parallel"],
                            bias=False), 6),
}


def rs_config(tp_size, **kwargs):
    return ReducedSyncConfig(**{**TINY, **kwargs}, tp_size=tp_size)


def make(config, seed=0, tp_group=None):
    torch.manual_seed(seed)
    return ReducedSyncGPT(config, tp_group=tp_group).double()


def batch(seed=1, B=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (B, TINY["block_size"]), generator=g)


# ----------------------------------------------------------------------------- one process

@pytest.mark.parametrize("name", PATTERNS)
def test_schedule_and_simulated_counts(name):
    kwargs, syncs = PATTERNS[name]
    config = rs_config(2, **kwargs)
    assert expected_syncs(config) == syncs
    model = make(config)
    _, loss = model(batch(), batch(2))
    loss.backward()
    assert model.metrics()["syncs_forward"] == model.metrics()["syncs_backward"] == syncs


def test_attention_recompute_repeats_no_sync_and_changes_no_gradient():
    """Unlike activation_checkpointing (refused: it would run the blocks' all-reduces again), the
    recomputed attention core sits between f and g and holds no collective."""
    plain = make(rs_config(2, block_pattern="tp,spd,parallel"))
    recompute = make(rs_config(2, block_pattern="tp,spd,parallel", attn_recompute=True))
    for model in (plain, recompute):
        _, loss = model(batch(), batch(2))
        loss.backward()
    counts = recompute.metrics()
    assert counts["syncs_forward"] == counts["syncs_backward"] == expected_syncs(recompute.config)
    for (name, p), q in zip(plain.named_parameters(), recompute.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_activation_norms_watch_the_whole_residual_stream_at_sync_points():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**TINY)).double()
    tp = make(rs_config(2, block_pattern="tp"))
    tp.load_state_dict(gpt.state_dict())
    norms = {name: evaluation.ActivationNorms(model, range(TINY["n_layer"])) for name, model in (("gpt", gpt), ("tp", tp))}
    gpt(batch()), tp(batch())
    assert norms["tp"].layers == list(range(TINY["n_layer"]))
    assert norms["tp"].read() == pytest.approx(norms["gpt"].read(), rel=1e-12)  # TP blocks are GPT-2
    runs = make(rs_config(2, block_types=["parallel", "parallel", "tp", "parallel", "spd", "parallel"]))
    assert evaluation.ActivationNorms(runs, [0, 1, 2, 3, 4, -1]).layers == [1, 2, 3, 4, 5]
    assert len(runs.state_dict()) == len(gpt.state_dict())  # the sync points hold no weights


def test_lone_parallel_block_costs_one_sync_and_runs_break_where_asked():
    assert schedule(rs_config(2, block_pattern="spd,parallel")) == [("run", [i]) for i in range(6)]
    assert schedule(rs_config(2, block_pattern="parallel", sync_every=3)) == [("run", [0, 1, 2]), ("run", [3, 4, 5])]
    assert schedule(rs_config(2, block_types=["parallel", "parallel", "tp", "parallel", "spd", "parallel"])) == [
        ("run", [0, 1]), ("tp", [2]), ("run", [3]), ("run", [4]), ("run", [5])]


def test_the_communication_study_alternating_parallel_patterns_cost_what_they_really_merge():
    # The communication study counted parallel blocks as free: [SPD, P] x 6 as 8 syncs, [SPD, P, P] x 4 as 6. Each
    # parallel run still needs its merge, so they cost 12 and 8 (train_gpt2_8comm/6comm use others).
    twelve = dict(TINY, n_layer=12)
    assert expected_syncs(ReducedSyncConfig(**twelve, block_pattern="spd,parallel")) == 12
    assert expected_syncs(ReducedSyncConfig(**twelve, block_pattern="spd,parallel,parallel")) == 8
    assert expected_syncs(ReducedSyncConfig(**twelve, block_pattern="spd,parallel,parallel,parallel")) == 6


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_tp_blocks_equal_gpt_with_the_same_weights(tp_size):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**TINY)).double()
    model = make(rs_config(tp_size, block_pattern="tp"))
    model.load_state_dict(gpt.state_dict())
    idx, targets = batch(), batch(2)
    (a, loss_a), (b, loss_b) = gpt(idx, targets), model(idx, targets)
    assert torch.allclose(a, b, atol=1e-12, rtol=0)
    loss_a.backward()
    loss_b.backward()
    for (name, p), q in zip(gpt.named_parameters(), model.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-12, rtol=0), name


def test_same_seed_gives_gpt_weights_and_spd_differs_from_gpt():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**TINY)).double()
    spd = make(rs_config(2, block_pattern="spd"))
    assert all(torch.equal(a, b) for a, b in zip(gpt.state_dict().values(), spd.state_dict().values()))
    assert not torch.allclose(gpt(batch())[0], spd(batch())[0], atol=1e-6)  # an approximation, not TP
    # With one shard there is nothing to approximate: every block type is GPT-2.
    one = make(rs_config(1, block_pattern="spd,parallel,parallel"))
    assert torch.allclose(gpt(batch())[0], one(batch())[0], atol=1e-12, rtol=0)


def test_spd_block_is_a_one_block_parallel_run_and_follows_the_formula():
    spd = make(rs_config(2, block_pattern="spd"))
    grouped = make(rs_config(2, block_pattern="parallel", sync_every=1))
    assert torch.equal(spd(batch())[0], grouped(batch())[0])
    # The formula of docs/experiments.md by hand for block 0 (two shards: heads 0-1 | 2-3, MLP columns halves).
    b, x = spd.transformer.h[0], torch.randn(2, 8, 16, dtype=torch.float64)
    spd.record = new_record()
    a = [spd.attn_partial(b, i, b.ln_1(x)) for i in range(2)]
    z = [spd.mlp_partial(b, i, b.ln_2(x + a[i] + b.attn.c_proj.bias)) + a[i] for i in range(2)]
    expected = x + z[0] + z[1] + b.attn.c_proj.bias + b.mlp.c_proj.bias
    assert torch.allclose(spd.local_run([0], x), expected, atol=1e-12, rtol=0)


def test_clip_grad_norm_matches_torch_in_simulation():
    model = make(rs_config(2, block_pattern="tp,spd"))
    model(batch(), batch(2))[1].backward()
    grads = [p.grad.clone() for p in model.parameters()]
    norm = sharding.clip_grad_norm(model, 0.01)
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    assert norm.item() == pytest.approx(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01).item(), rel=1e-6)


# ----------------------------------------------------------------------------- real ranks

def _real_equals_simulated(rank, world):
    group = dist.group.WORLD
    for name, (kwargs, syncs) in PATTERNS.items():
        config = rs_config(world, **kwargs)
        sim, real = make(config), make(config, tp_group=group)
        assert sum(p.numel() for p in real.parameters()) < sum(p.numel() for p in sim.parameters())
        assert real.get_num_params() == sim.get_num_params()
        idx, targets = batch(), batch(2)
        (ls, loss_s), (lr, loss_r) = sim(idx, targets), real(idx, targets)
        assert torch.allclose(ls, lr, atol=1e-10, rtol=0), name
        loss_s.backward()
        loss_r.backward()
        assert_grads_are_shards(sim, real, rank, world, name)
        m = real.metrics()
        assert (m["syncs_forward"], m["syncs_backward"]) == (syncs, syncs), (name, m)
        assert m["allreduce_mib_forward"] == sim.metrics()["allreduce_mib_forward"]
        # Gathered shards are the simulated (GPT-layout) weights; the gradient norm is the whole model's.
        full = real.full_state_dict()
        assert all(torch.equal(full[k], v) for k, v in sim.state_dict().items()), name
        assert torch.allclose(sharding.clip_grad_norm(real, 1e9), sharding.clip_grad_norm(sim, 1e9), rtol=1e-6), name


def assert_grads_are_shards(sim, real, rank, world, name):
    """Each real rank's gradient is its shard of the simulated model's gradient."""
    sim_grads = dict(sim.named_parameters())
    for pname, p in real.named_parameters():
        expected = shard_tensor(pname, sim_grads[pname].grad, rank, world)
        assert torch.allclose(p.grad, expected, atol=1e-10, rtol=0), (name, pname)


def test_real_tp_on_two_ranks_equals_simulation_for_every_pattern(tmp_path):
    run_ranks(_real_equals_simulated, 2, tmp_path)


def _real_equals_simulated_with_dropout(rank, world):
    """Dropout on: the same masks in both executions, over two training steps' worth of forward
    passes, and with attention recomputed in backward (the masks must be replayed exactly)."""
    group = dist.group.WORLD
    for name in ("tp", "spd", "parallel", "tp,spd", "mixed, no bias"):
        for recompute in (False, True):
            config = rs_config(world, **PATTERNS[name][0], dropout=0.3, attn_recompute=recompute)
            sim, real = make(config), make(config, tp_group=group)
            for step in range(2):
                torch.manual_seed(100 + step)  # the replica's stream, equal on its ranks
                (ls, loss_s) = sim(batch(), batch(2))
                after_sim = torch.rand(())  # the default stream moved on alike in both
                torch.manual_seed(100 + step)
                (lr, loss_r) = real(batch(), batch(2))
                assert torch.equal(after_sim, torch.rand(())), name
                assert torch.allclose(ls, lr, atol=1e-10, rtol=0), (name, recompute, (ls - lr).abs().max())
                loss_s.backward()
                loss_r.backward()
            assert_grads_are_shards(sim, real, rank, world, name)
    # The masks are random: another seed, or evaluation mode, gives other logits.
    torch.manual_seed(100)
    a = sim(batch())[0]
    torch.manual_seed(101)
    assert not torch.allclose(a, sim(batch())[0])


def test_real_tp_equals_simulation_with_dropout_on_two_ranks(tmp_path):
    run_ranks(_real_equals_simulated_with_dropout, 2, tmp_path)


def test_shards_draw_different_dropout_masks():
    """The two shards of one sublayer draw different masks (the bug: one stream per replica gave
    every rank the same), and a shard's stream replays its mask from the forward pass's seed."""
    model = make(rs_config(2, block_pattern="spd", dropout=0.5))
    model.shard_seed = 7
    h = torch.ones(1, 8, 16, dtype=torch.float64)
    masks = []
    for r in range(2):
        with model.shard_stream(0, 1, r, h):
            masks.append(torch.nn.functional.dropout(h, 0.5) != 0)
    assert not torch.equal(masks[0], masks[1])
    with model.shard_stream(0, 1, 1, h):
        assert torch.equal(torch.nn.functional.dropout(h, 0.5) != 0, masks[1])  # one seed, one stream


def _real_tp_equals_gpt(rank, world):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**TINY)).double()
    real = make(rs_config(world, block_pattern="tp"), tp_group=dist.group.WORLD)
    real.load_full_state_dict(gpt.state_dict())
    idx, targets = batch(), batch(2)
    (a, loss_a), (b, loss_b) = gpt(idx, targets), real(idx, targets)
    assert torch.allclose(a, b, atol=1e-10, rtol=0)
    loss_a.backward()
    loss_b.backward()
    grads = dict(gpt.named_parameters())
    for name, p in real.named_parameters():
        assert torch.allclose(p.grad, shard_tensor(name, grads[name].grad, rank, world), atol=1e-10, rtol=0), name


def test_real_tp_blocks_equal_unsharded_gpt(tmp_path):
    run_ranks(_real_tp_equals_gpt, 2, tmp_path)


def _f_and_g_backward_rules(rank, world):
    group, record = dist.group.WORLD, new_record()
    # g: y = sum_r x_r. dL/dx_r = dL/dy, not world * dL/dy (the functional collectives' trap).
    x = torch.full((3,), float(rank + 1), dtype=torch.float64, requires_grad=True)
    y = _SumForward.apply(x, group, record)
    assert torch.equal(y, torch.full((3,), 3.0, dtype=torch.float64))
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    (y * w).sum().backward()
    assert torch.equal(x.grad, w)
    # f: x replicated, each rank's loss uses its copy; dL/dx is the sum of the ranks' terms, once.
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    (h,) = _SumBackward.apply(group, record, x)
    (h * (rank + 1)).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0, dtype=torch.float64))
    assert (record["forward"], record["backward"]) == (1, 1)


def test_f_and_g_do_not_scale_gradients_by_world_size(tmp_path):
    run_ranks(_f_and_g_backward_rules, 2, tmp_path)


# ----------------------------------------------------------------------------- train.py, TP x DP

def events(out_dir, kind):
    return [r for r in rundir.read_events(out_dir) if r["event"] == kind]


def torchrun(nproc, args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_tp2_with_dropout_trains_like_the_simulation_resumes_and_samples(data_dir, tmp_path):
    """train.py on 2 tensor-parallel ranks with dropout 0.2 against one simulating process: the same
    masks, so the same losses; a resumed run restores every shard's stream with the default one. Its
    end-of-run sample (sample_tokens): the generation's all-reduces need both ranks, so both generate
    (the master alone waited for a peer already in the exit barrier), and draw the simulation's tokens."""
    gpt2_ids = "--vocab_size=50304"  # the toy ids are read as GPT-2 tokens: the sample's prompt "\\n" is 198
    args = lambda out, *extra: tp_args(data_dir, out, "--optimizer=sgd", "--dropout=0.2", "--max_iters=3",
                                       "--lr_decay_iters=3", gpt2_ids, *extra)
    single, real = str(tmp_path / "single"), str(tmp_path / "tp2")
    train.main(args(single, "--sample_tokens=6"))
    torchrun(2, args(real, "--max_iters=2"))
    resumed = torchrun(2, args(real, "--init_from=resume", "--sample_tokens=6", "--dist_timeout=60"))  # a hang: 60 s
    assert events(real, "checklist")[0]["tp_execution"].startswith("real")
    losses = lambda out: {r["iter"]: r["loss"] for r in events(out, "train")}
    a, b = losses(single), losses(real)
    assert list(a) == list(b) == [1, 2, 3]
    assert all(b[i] == pytest.approx(a[i], rel=1e-5) for i in a), (a, b)
    assert resumed.stdout.count("sample:") == 1
    sample = lambda path: open(os.path.join(path, "log.txt")).read().split("sample:\n")[1]
    assert sample(real) == sample(single)  # the same seed draws the same tokens from the same logits
    train.main(args(str(tmp_path / "off"), "--dropout=0.0"))
    assert abs(losses(str(tmp_path / "off"))[1] - a[1]) > 1e-4  # the masks did something (40x the tolerance)


def test_tp2_x_dp2_trains_like_one_simulated_replica_and_resumes(data_dir, tmp_path):
    # SGD with momentum: its update is linear in the gradient, so weights compared after a step
    # compare gradients (Adam's ~lr * sign(g) turns reduction-order rounding into 2 * lr jumps), and
    # the momentum buffers are sharded optimizer state that the resume must restore per tp rank.
    sgd = "--optimizer=sgd"
    single, split = str(tmp_path / "single"), str(tmp_path / "tpdp")
    train.main(tp_args(data_dir, single, sgd))  # one process: the 2 shards simulated, 4 micro-steps
    torchrun(4, tp_args(data_dir, split, sgd, "--max_iters=2"))  # 2 replicas x 2 tp ranks, then resume
    torchrun(4, tp_args(data_dir, split, sgd, "--init_from=resume"))
    checklist = events(split, "checklist")[0]
    assert checklist["world_size"] == 4 and checklist["data_parallel_replicas"] == 2
    assert checklist["grad_accum_per_rank"] == 2 and checklist["tp_execution"].startswith("real")
    assert checklist["syncs_per_forward"].startswith("4 measured / 4 expected")
    assert checklist["act_rms_after_layers"] == "0, 3"
    # the latest micro-step's RMS: a different micro-batch here than in the single process
    assert all(r["act_rms_layer0"] > 0 and r["act_rms_layer3"] > 0 for r in events(split, "train"))
    losses = lambda out: {r["iter"]: r["loss"] for r in events(out, "train")}
    a, b = losses(single), losses(split)
    assert list(a) == list(b) == [1, 2, 3, 4]
    assert all(b[i] == pytest.approx(a[i], rel=1e-5) for i in a), (a, b)
    evals = lambda out: {e["iter"]: e["val_loss"] for e in events(out, "eval")}
    assert list(evals(split)) == list(evals(single)) == [0, 2, 4]  # the resumed run re-evaluates step 2
    assert all(evals(split)[i] == pytest.approx(evals(single)[i], rel=1e-5) for i in (0, 2, 4))
    assert all(e["syncs_forward"] == e["syncs_backward"] == 4 for e in events(split, "eval"))
    ckpt_a = torch.load(os.path.join(single, "ckpt.pt"), weights_only=True)
    ckpt_b = torch.load(os.path.join(split, "ckpt.pt"), weights_only=True)
    assert len(ckpt_b["optimizer"]) == 2  # one optimizer state per tp rank
    for key, value in ckpt_a["model"].items():
        assert torch.allclose(value, ckpt_b["model"][key], atol=1e-5, rtol=0), key


def hellaswag_model(tp_group=None):
    """A reduced-sync model over GPT-2's vocabulary (the fixture's ids), the same weights whether
    its shards are simulated or real; embeddings spread so that no two endings nearly tie."""
    config = ReducedSyncConfig(**{**TINY, "vocab_size": 50304, "block_size": 32}, tp_size=2,
                               block_pattern="tp,spd,parallel")
    torch.manual_seed(0)
    full = ReducedSyncGPT(config)
    with torch.no_grad():
        full.transformer.wte.weight.mul_(25)
    if tp_group is None:
        return full
    model = ReducedSyncGPT(config, tp_group=tp_group)
    model.load_full_state_dict(full.state_dict())
    return model


def _hellaswag_tp_x_dp(rank, world, fixture, out):
    import hellaswag
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = hellaswag_model(mesh.get_group("tp"))
    result = hellaswag.evaluate_hellaswag(model, hellaswag.load_examples(fixture), "cpu", batch_size=1,
                                          replica=(mesh.get_local_rank("dp"), 2, mesh.get_group("dp")))
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)


def test_hellaswag_on_tp2_x_dp2_ranks_equals_the_simulated_model(tmp_path):
    """The two ranks of a replica score the same examples (a TP forward needs both); replicas share
    the examples out and their counts are summed once, not once per TP rank."""
    import hellaswag
    from helpers import FIXTURE, write_jsonl
    fixture = write_jsonl(tmp_path / "hellaswag_val.jsonl", FIXTURE)
    expected = hellaswag.evaluate_hellaswag(hellaswag_model(), hellaswag.load_examples(fixture), "cpu")
    assert expected["n"] == len(FIXTURE) and 0 < expected["acc"] < 1  # not a degenerate model
    run_ranks(_hellaswag_tp_x_dp, 4, tmp_path, fixture, str(tmp_path))
    for rank in range(4):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == expected


# ----------------------------------------------------------------------------- the experiment configs

COMM_CONFIGS = {  # config file -> syncs per forward pass that its name promises
    "train_gpt2_24comm": 24, "train_gpt2_18comm": 18, "train_gpt2_16comm": 16, "train_gpt2_12comm": 12,
    "train_gpt2_8comm": 8, "train_gpt2_6comm": 6, "train_spd_12sync": 12, "train_grouped_6sync": 6,
    "train_grouped_4sync": 4, "train_grouped_3sync": 3, "train_grouped_2sync": 2, "train_selective_9sync": 9,
}


@pytest.mark.parametrize("name", COMM_CONFIGS)
def test_comm_configs_promise_what_they_count(name):
    for variant in ("", "reduced_sync_shakespeare"):  # the GPU recipe, and its CPU twin through the overlay
        files = [name] + ([variant] if variant else [])
        cfg = configurator.apply_config(runtime.DEFAULTS, [os.path.join(REPO, "config", f"{f}.py") for f in files])
        config = runtime.model_config(cfg)
        assert cfg["model_type"] == "reduced_sync" and expected_syncs(config) == COMM_CONFIGS[name]
        if not variant:
            assert (cfg["n_layer"], cfg["n_embd"], cfg["max_iters"], cfg["dataset"]) == (12, 768, 20000, "openwebtext")
            assert cfg["wandb_run_name"].startswith("gpt2-124M-") and cfg["tp_size"] == 2
        else:
            assert cfg["tp_size"] == 2 and cfg["dataset"] == "shakespeare"


def test_architecture_script_counts_syncs_on_two_real_ranks(capsys):
    import test_all_architectures as script
    assert script.main(["--only=rs-", "--ranks=2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("PASS ")]
    assert len(lines) == len(COMM_CONFIGS)
    for name, syncs in COMM_CONFIGS.items():
        line = next(l for l in lines if l.split()[1] == "rs-" + name.removeprefix("train_"))
        assert f"real on 2 ranks, {syncs} all-reduces forward and backward" in line


@pytest.mark.parametrize("extra, message", [
    (["--model_type=gpt", "--tp_size=2"], "needs model_type='reduced_sync'"),
    (["--block_pattern=tp,spd,spd"], "does not divide n_layer"),
    (["--block_pattern=tp,ring"], "unknown block types"),
    (["--tp_size=4"], "must divide n_head"),
    (["--sync_layers=[7]"], "sync_layers contains 7"),
])
def test_impossible_reduced_sync_configs_fail_at_startup(data_dir, tmp_path, extra, message):
    with pytest.raises(configurator.ConfigError, match=message):
        train.main(tp_args(data_dir, str(tmp_path / "run"), *extra))


def _overflow_on_one_rank(rank, world):
    layout = ParallelLayout(world_size=world)
    layout.distributed, layout.rank = True, rank
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0)
    scaler.scale(weight.sum()).backward()
    weight.grad[0] = float("inf") if rank == 1 else 1.0  # rank 1's shard overflowed
    scaler.unscale_(optimizer)
    layout.agree_on_skipping(scaler, optimizer)
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(weight.detach(), torch.ones(3)), f"rank {rank} stepped"  # every rank skipped
    assert scaler.get_scale() == 8.0  # and every rank lowered its scale


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    """fp16 with tensor-parallel (or FSDP) shards: GradScaler's found_inf is each rank's own; reduced
    over the ranks, one overflow skips the step everywhere, so replicated weights cannot drift."""
    run_ranks(_overflow_on_one_rank, 2, tmp_path)


def _mesh_groups_timeout(rank, world):
    for layout in (ParallelLayout("ddp", world, tp=2), ParallelLayout("fsdp", world, tp=1, shard=world)):
        layout.distributed, layout.rank = True, rank
        layout.timeout = datetime.timedelta(seconds=7)
        layout.build_mesh()
        for name in layout.mesh_dims():
            backend = layout.mesh.get_group(name)._get_backend(torch.device("cpu"))
            assert backend.options._timeout == layout.timeout, (name, backend.options._timeout)


def test_every_mesh_group_waits_dist_timeout(tmp_path):
    """A mesh's subgroups got the backend's default timeout (NCCL 10 min, gloo 30), not dist_timeout."""
    run_ranks(_mesh_groups_timeout, 2, tmp_path)


def _compiled_steps_without_graph_breaks(rank, world, pattern):
    import torch._dynamo
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    config = rs_config(world, block_pattern=pattern)
    model = make(config, tp_group=dist.group.WORLD if world > 1 else None)
    _, loss = model(batch(), batch())  # eager: the counts startup_report checks
    loss.backward()
    eager = model.metrics()
    compiled = torch.compile(model, backend="eager")
    for _ in range(2):
        _, loss = compiled(batch(), batch())
        loss.backward()
    assert dict(torch._dynamo.utils.counters["graph_break"]) == {}, dict(torch._dynamo.utils.counters["graph_break"])
    assert model.metrics() == eager and eager["syncs_forward"] == eager["syncs_backward"] == expected_syncs(config)


@pytest.mark.parametrize("pattern", ["tp,spd,parallel"])
def test_sync_points_compile_without_graph_breaks(tmp_path, pattern):
    """The sync autograd Functions counted their all-reduces in a Python dict, inside forward and
    backward: a graph break at every sync point (TORCH_LOGS=graph_breaks). Simulated and on 2 real ranks."""
    _compiled_steps_without_graph_breaks(0, 1, pattern)
    run_ranks(_compiled_steps_without_graph_breaks, 2, tmp_path, pattern)


def test_a_stalled_rank_is_named_where_nccl_would_abort_first(monkeypatch):
    """NCCL's watchdog ends the job before Python sees a timeout: the stall watch names the silent rank
    from the heartbeats itself, said once, by the lowest live rank."""
    import time

    import parallel
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=5))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    now = time.time()
    for rank, age in ((0, 0.5), (1, 40.0), (2, 1.0)):
        store.set(f"heartbeat/{rank}", repr(now - age))
    stalled, message = parallel.stall_message(0, 3, timeout=60.0)
    assert stalled == {1} and message.startswith("rank 1 (silent for 40 s) stopped responding")
    assert "dist_timeout=60 s" in message
    assert parallel.stall_message(2, 3, timeout=60.0) == ({1}, None)  # rank 0 says it
    store.set("heartbeat/1", repr(time.time()))
    assert parallel.stall_message(0, 3, timeout=60.0) == (frozenset(), None)
