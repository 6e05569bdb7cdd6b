"""FSDP2 and HSDP (data_parallel='fsdp'/'hsdp') against DDP, sharded checkpoints (exact resume,
resume on another world size, a crash mid-save, export to one file), the memory estimate against a
measured peak, and the GPT-2 Medium/Large/XL configs."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

import configurator
import eval as eval_script
import export_checkpoint
import runtime
import sample
import rundir
import sharding
import train
from helpers import REPO, events, load_ckpt, measured_peak_bytes, tiny_args

# SGD (see test_ddp_two_ranks_match_one_process_with_same_accumulation), clipping active (grad norms
# ~1 here), 8 micro-steps per step (accumulation on every layout), a vocabulary GPT-2's BPE prompt fits.
COMMON = ("--optimizer=sgd", "--optimizer_impl=foreach", "--gradient_accumulation_steps=8", "--warmup_iters=0", "--max_iters=4",
          "--lr_decay_iters=4", "--eval_interval=2", "--eval_iters=3", "--grad_clip=0.5", "--vocab_size=256")


def torchrun(nproc, args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def losses(out, kind="train"):
    return {r["iter"]: r["loss" if kind == "train" else "val_loss"] for r in events(out, kind)}


# Its readers run on one xdist worker: a module fixture runs once per worker that needs it (4 launches).
reads_two_rank_runs = pytest.mark.xdist_group("two_rank_runs")


@pytest.fixture(scope="module")
def two_rank_runs(data_dir, tmp_path_factory):
    """DDP and FSDP on 2 ranks with dropout (the RNG matters on resume), and FSDP stopped at
    iteration 2 (its checkpoint is copied aside before anything resumes from it)."""
    root = tmp_path_factory.mktemp("sharded")
    runs = {name: str(root / name) for name in ("ddp", "fsdp", "split", "at2")}
    args = lambda out, *extra: tiny_args(data_dir, out, *COMMON, "--dropout=0.1", *extra)
    torchrun(2, args(runs["ddp"]))
    torchrun(2, args(runs["fsdp"], "--data_parallel=fsdp"))
    torchrun(2, args(runs["split"], "--data_parallel=fsdp", "--max_iters=2"))
    shutil.copytree(runs["split"], runs["at2"])
    torchrun(2, args(runs["split"], "--data_parallel=fsdp", "--init_from=resume"))
    return runs


@reads_two_rank_runs
def test_fsdp_on_two_ranks_equals_ddp_and_exports_one_file(two_rank_runs, tmp_path, capsys):
    """eval_iters=3 on 2 ranks: one rank runs an uncounted forward in the last round (FSDP all-gathers)."""
    ddp, fsdp = two_rank_runs["ddp"], two_rank_runs["fsdp"]
    assert events(fsdp, "checklist")[0]["data_parallel"] == "fsdp"
    assert events(fsdp, "checklist")[0]["grad_accum_per_rank"] == 4
    facts = lambda out: json.load(open(os.path.join(out, "run_info.json")))["facts"]
    assert facts(fsdp)["init_weights"] == facts(ddp)["init_weights"]  # gathered whole, not one rank's shards
    assert sorted(os.listdir(os.path.join(fsdp, "dcp"))) == ["iter_0000004", "latest"]  # iteration 2's removed
    assert_trained_alike(ddp, fsdp, 1e-6)
    exported, reference = load_ckpt(fsdp), load_ckpt(ddp)
    assert exported["iter_num"] == 4
    for k, state in reference["optimizer"]["state"].items():  # the momentum buffers, in DDP's own layout
        assert torch.allclose(exported["optimizer"]["state"][k]["momentum_buffer"], state["momentum_buffer"],
                              atol=1e-6, rtol=0), k
    sample.main([f"--out_dir={fsdp}", "--num_samples=1", "--max_new_tokens=4", "--dtype=float32", "--device=cpu"])
    assert capsys.readouterr().out.count("---------------") == 1


@reads_two_rank_runs
def test_fsdp_resume_equals_the_uninterrupted_run_exactly(two_rank_runs):
    split, straight = two_rank_runs["split"], two_rank_runs["fsdp"]
    assert min(losses(split)) == 1 and losses(split) == losses(straight)  # every iteration, bit for bit
    assert losses(split, "eval") == losses(straight, "eval")


@reads_two_rank_runs
def test_fsdp_checkpoint_resumes_on_another_world_size(two_rank_runs, data_dir):
    """Written by 2 ranks, read by 1 process (DCP reshards): the weights arrive intact (the resumed
    run's first evaluation equals the writer's at that iteration) and training goes on."""
    out = two_rank_runs["at2"]
    train.main(tiny_args(data_dir, out, *COMMON, "--dropout=0.1", "--data_parallel=fsdp", "--init_from=resume"))
    resumed = [e for e in events(out, "eval") if e["iter"] == 2]
    assert len(resumed) == 2 and resumed[1]["val_loss"] == pytest.approx(resumed[0]["val_loss"], rel=1e-6)
    assert events(out, "checklist")[-1]["world_size"] == 1 and events(out, "end")[-1]["iter"] == 4
    assert rundir.latest_checkpoint(out).endswith("iter_0000004")


def assert_trained_alike(reference, sharded, tolerance):
    """The same train and eval losses at every logged iteration (relative tolerance), and the sharded
    run's exported weights those of the reference's ckpt.pt (absolute)."""
    for kind in ("train", "eval"):
        a, b = losses(reference, kind), losses(sharded, kind)
        assert a.keys() == b.keys() and all(b[i] == pytest.approx(a[i], rel=tolerance) for i in a), kind
    export_checkpoint.main([f"--out_dir={sharded}"])
    exported = load_ckpt(sharded)["model"]
    for key, value in load_ckpt(reference)["model"].items():
        assert torch.allclose(exported[key], value, atol=tolerance, rtol=0), key


def test_hsdp_on_four_ranks_equals_ddp(data_dir, tmp_path):
    """2 replicas x shard groups of 2 against DDP on 4 ranks, 2 micro-steps per rank, with dropout (each
    data-parallel rank draws its own masks on both layouts) and activation checkpointing inside FSDP's
    units (recomputation replays the masks)."""
    ddp, hsdp = str(tmp_path / "ddp"), str(tmp_path / "hsdp")
    args = lambda out, *extra: tiny_args(data_dir, out, *COMMON, "--dropout=0.1", *extra)
    torchrun(4, args(ddp))
    torchrun(4, args(hsdp, "--data_parallel=hsdp", "--hsdp_shard_size=2", "--activation_checkpointing=True"))
    assert events(hsdp, "checklist")[0]["grad_accum_per_rank"] == 2
    assert_trained_alike(ddp, hsdp, 1e-6)


def test_fsdp_with_blocks_compiled_one_by_one_trains_like_one_eager_process(data_dir, tmp_path):
    """compile=True under FSDP compiles each block (FSDP's hooks sit between them); the losses and the
    exported weights are those of one eager process (no dropout: inductor draws its own masks)."""
    single, compiled = str(tmp_path / "single"), str(tmp_path / "compiled")
    train.main(tiny_args(data_dir, single, *COMMON, "--max_iters=2"))
    torchrun(2, tiny_args(data_dir, compiled, *COMMON, "--max_iters=2", "--data_parallel=fsdp", "--compile=True"))
    assert events(compiled, "checklist")[0]["compile"] is True
    assert_trained_alike(single, compiled, 1e-5)


def test_a_crash_during_a_save_leaves_the_previous_checkpoint_in_charge(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    args = lambda *extra: tiny_args(data_dir, out, *COMMON, "--data_parallel=fsdp", "--model_type=ra",
                                    "--ra_pattern=learned", *extra)
    train.main(args("--max_iters=2"))
    real_save = dcp.save

    def crash_after_writing_shards(state, **kwargs):
        real_save(state, **kwargs)
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(dcp, "save", crash_after_writing_shards)
    with pytest.raises(KeyboardInterrupt):
        train.main(args("--init_from=resume"))
    assert rundir.latest_checkpoint(out).endswith("iter_0000002")
    assert os.path.isdir(os.path.join(out, "dcp", "iter_0000004"))  # the torn one, never pointed at
    monkeypatch.setattr(dcp, "save", real_save)
    train.main(args("--init_from=resume"))
    at2 = [e["val_loss"] for e in events(out, "eval") if e["iter"] == 2]
    assert len(at2) == 3 and at2[0] == at2[1] == at2[2]  # each resume read iteration 2's weights
    assert sorted(os.listdir(os.path.join(out, "dcp"))) == ["iter_0000004", "latest"]
    assert os.path.exists(os.path.join(out, "dcp", "iter_0000004", "meta.pt"))
    with pytest.raises(FileNotFoundError, match="python export_checkpoint.py"):  # the evaluators say what to do
        eval_script.main([f"--out_dir={out}", f"--data_dir={data_dir}"])
    export_checkpoint.main([f"--out_dir={out}"])
    result = str(tmp_path / "eval.json")
    eval_script.main([f"--out_dir={out}", f"--data_dir={data_dir}", "--eval_tokens=320", "--dtype=float32",
                      f"--out_json={result}"])
    assert 0 < json.load(open(result))["loss"] < 6


def test_sigterm_under_torchrun_writes_a_sharded_checkpoint_that_resumes(data_dir, tmp_path):
    """What slurm/train_multinode.sbatch relies on: SIGTERM to torchrun, every rank's shards saved at
    the step where they stopped, 'signal' in the log, and a resume (here on 1 process) that goes on."""
    from helpers import ENV, LONG, wait_for_training
    out = str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", *tiny_args(data_dir, out, *LONG, "--data_parallel=fsdp")], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_training(out, proc, min_iter=3)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert stderr.count("SIGTERM received: finishing this step") == 2, stderr[-3000:]
    end = events(out, "end")[-1]
    assert end["stop_reason"] == "signal"
    assert sharding.read_meta(rundir.latest_checkpoint(out))["iter_num"] == end["iter"]
    train.main(tiny_args(data_dir, out, *LONG, "--data_parallel=fsdp", "--init_from=resume",
                         f"--max_iters={end['iter'] + 2}"))
    assert events(out, "end")[-1]["stop_reason"] == "max_iters" and events(out, "train")[-1]["iter"] == end["iter"] + 2


def test_fsdp_across_tensor_parallel_replicas_equals_one_simulated_replica(data_dir, tmp_path, capsys):
    """The 3-D layout: 2 tensor-parallel ranks per replica x 2 replicas, FSDP sharding each tp
    position's heads and columns over the 2 data-parallel ranks that hold it, against one process
    simulating both shards (SGD with momentum: equal weights mean equal gradients, and the momentum
    buffers are the optimizer state the checkpoint must carry). Stopped at iteration 2, its sharded
    checkpoint resumes on the same 4 ranks, under HSDP (2 replicas x shard groups of 1 x tp 2), and on
    2 ranks (1 replica: resharded), and exports to one GPT-layout file that sample.py reads."""
    from helpers import tp_args
    args = lambda out, *extra: tp_args(data_dir, out, "--optimizer=sgd", "--optimizer_impl=foreach", "--vocab_size=256",
                                       *extra)  # a vocabulary GPT-2's BPE prompt fits
    runs = {name: str(tmp_path / name) for name in ("single", "fsdp", "hsdp", "two_ranks")}
    train.main(args(runs["single"]))
    torchrun(4, args(runs["fsdp"], "--data_parallel=fsdp", "--max_iters=2"))
    shutil.copytree(runs["fsdp"], runs["hsdp"])
    shutil.copytree(runs["fsdp"], runs["two_ranks"])
    assert sorted(os.listdir(os.path.join(runs["fsdp"], "dcp", "iter_0000002"))) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp", "meta.pt"]  # every rank wrote
    torchrun(4, args(runs["fsdp"], "--data_parallel=fsdp", "--init_from=resume"))
    torchrun(4, args(runs["hsdp"], "--data_parallel=hsdp", "--hsdp_shard_size=1", "--init_from=resume"))
    torchrun(2, args(runs["two_ranks"], "--data_parallel=fsdp", "--init_from=resume"))
    checklist = events(runs["fsdp"], "checklist")[0]
    assert checklist["tp_execution"].startswith("real") and checklist["data_parallel_replicas"] == 2
    facts = lambda out: json.load(open(os.path.join(out, "run_info.json")))["facts"]
    assert facts(runs["fsdp"])["init_weights"] == facts(runs["single"])["init_weights"]  # gathered over dp, then tp
    reference = losses(runs["single"])
    for name in ("fsdp", "hsdp", "two_ranks"):
        got = losses(runs[name])
        assert got.keys() == reference.keys() == {1, 2, 3, 4}, name
        assert all(got[i] == pytest.approx(reference[i], rel=1e-5) for i in got), (name, got, reference)
        assert events(runs[name], "end")[-1]["iter"] == 4
    assert events(runs["two_ranks"], "checklist")[-1]["world_size"] == 2
    single = load_ckpt(runs["single"])
    for name in ("fsdp", "two_ranks"):
        export_checkpoint.main([f"--out_dir={runs[name]}"])
        exported = load_ckpt(runs[name])
        for key, value in single["model"].items():
            assert torch.allclose(exported["model"][key], value, atol=1e-5, rtol=0), (name, key)
        for k, state in single["optimizer"]["state"].items():
            assert torch.allclose(exported["optimizer"]["state"][k]["momentum_buffer"], state["momentum_buffer"],
                                  atol=1e-5, rtol=0), (name, k)
    sample.main([f"--out_dir={runs['fsdp']}", "--num_samples=1", "--max_new_tokens=4", "--dtype=float32",
                 "--device=cpu"])
    assert capsys.readouterr().out.count("---------------") == 1


@pytest.mark.parametrize("extra, message", [
    (dict(data_parallel="zero"), "data_parallel='zero'"),
    (dict(data_parallel="hsdp", model_type="reduced_sync", tp_size=2, hsdp_shard_size=4),
     "hsdp_shard_size=4 does not divide the 2 data-parallel ranks"),
    (dict(data_parallel="fsdp", optimizer="adamw_spam"), "AdamW-SPAM"),
    (dict(data_parallel="fsdp", optimizer="sgd", optimizer_impl="fused"), "no fused SGD"),
    (dict(data_parallel="hsdp", hsdp_shard_size=3), "hsdp_shard_size=3 does not divide the 4 data-parallel ranks"),
    (dict(data_parallel="fsdp", sample_tokens=10), "export_checkpoint.py"),
    (dict(data_parallel="fsdp", init_from="resume", out_dir="/nonexistent"), "dcp/latest does not exist"),
])
def test_impossible_layouts_fail_before_any_work(extra, message):
    cfg = dict(runtime.DEFAULTS, **extra)
    with pytest.raises(configurator.ConfigError, match=message.replace("(", r"\(")):
        runtime.resolve(cfg, 4)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("head_loss", ["full", "chunked"])
def test_memory_estimate_is_within_25_percent_of_the_measured_peak(checkpointing, head_loss):
    cfg = dict(runtime.DEFAULTS, n_layer=4, n_head=4, n_embd=128, vocab_size=512, block_size=128, batch_size=8,
               gradient_accumulation_steps=1, activation_checkpointing=checkpointing, dtype="float32",
               head_loss=head_loss)
    n_params = runtime.build_model(cfg).get_num_params(non_embedding=False)
    estimate = sharding.memory_estimate(cfg, n_params, 1, "float32", "cpu")["step"]
    assert estimate == pytest.approx(measured_peak_bytes(cfg), rel=0.25)


@pytest.mark.parametrize("keys", [dict(attn_impl="manual"), dict(attn_impl="manual", dropout=0.1),
                                  dict(attn_impl="manual", attn_recompute=True),
                                  dict(attn_impl="manual", activation_checkpointing=True),
                                  dict(attn_impl="manual", model_type="ra", ra_pattern="all", ra_mode="gate"),
                                  dict(dropout=0.1)])  # a CPU's SDPA meets dropout in PyTorch's math kernel
def test_memory_estimate_counts_materialized_attention_weights(keys):
    """At T = 1024 the T x T weights are most of the peak (2-5x the rest when left out)."""
    cfg = dict(runtime.DEFAULTS, n_layer=4, n_head=4, n_embd=128, vocab_size=512, block_size=1024, batch_size=2,
               gradient_accumulation_steps=1, dtype="float32", **keys)
    estimate = sharding.memory_estimate(cfg, runtime.count_params(cfg), 1, "float32", "cpu")["step"]
    assert estimate == pytest.approx(measured_peak_bytes(cfg), rel=0.25)
    on_gpu = sharding.memory_estimate(cfg, runtime.count_params(cfg), 1, "float32", "cuda")["step"]
    assert on_gpu - sharding.RESERVE_BYTES < estimate \
        or keys.get("attn_impl") == "manual"  # a GPU's flash attention keeps no weights, dropout or not


def test_memory_estimate_shards_the_states_under_fsdp():
    cfg = dict(runtime.DEFAULTS, data_parallel="ddp", gradient_accumulation_steps=8)
    ddp = sharding.memory_estimate(cfg, 10**9, 8, "bfloat16")
    fsdp = sharding.memory_estimate(dict(cfg, data_parallel="fsdp"), 10**9, 8, "bfloat16")
    assert fsdp["optimizer"] == ddp["optimizer"] // 8 and fsdp["activations"] == ddp["activations"]
    assert fsdp["total"] < ddp["total"] / 2


@pytest.mark.parametrize("name", ["350m", "774m", "1558m"])
def test_gpt2_size_configs_start_on_one_or_several_nodes(name):
    """Their parameter counts are test_all_architectures.py's (GPT2_SIZE_CONFIGS)."""
    path = os.path.join(REPO, "config", f"train_gpt2_{name}.py")
    two_nodes = ["--data_parallel=hsdp", "--batch_size=8", "--gradient_accumulation_steps=16"]  # README's example
    for world, layout in ((8, []), (16, two_nodes)):
        cfg = runtime.resolve(configurator.apply_config(runtime.DEFAULTS, [path, *layout]), world)
        assert cfg["tokens_per_iter"] == 128 * 1024


@reads_two_rank_runs
def test_a_damaged_sharded_checkpoint_is_named_in_one_line_on_export_and_resume(two_rank_runs, data_dir, tmp_path):
    """A half-written shard (a node died mid-copy, a full disk) and a hostile meta.pt: export and a
    2-rank resume each end in one line naming the checkpoint; the payload never runs."""
    run = str(tmp_path / "damaged")
    shutil.copytree(two_rank_runs["at2"], run)
    ckpt = rundir.latest_checkpoint(run)  # another test may have resumed the original past iteration 2
    shard = next(os.path.join(ckpt, f) for f in sorted(os.listdir(ckpt)) if f.endswith(".distcp"))
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    export = subprocess.run([sys.executable, "export_checkpoint.py", f"--out_dir={run}"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    lines = [l for l in export.stderr.splitlines() if l.strip()]
    assert export.returncode == 1 and "Traceback" not in export.stderr, export.stderr[-2000:]
    assert lines[-1].startswith(f"error: the sharded checkpoint {ckpt} cannot be read (") and "damaged" in lines[-1]
    resume = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", *tiny_args(data_dir, run, *COMMON, "--dropout=0.1", "--data_parallel=fsdp",
                                                    "--init_from=resume")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert resume.returncode != 0
    assert resume.stderr.count(f"error: the sharded checkpoint {ckpt} cannot be read (") == 2, resume.stderr[-3000:]

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path}/pwned",))
    torch.save({"config": Payload()}, os.path.join(ckpt, "meta.pt"))
    export = subprocess.run([sys.executable, "export_checkpoint.py", f"--out_dir={run}"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert export.returncode == 1 and "Traceback" not in export.stderr and not os.path.exists(tmp_path / "pwned")
    assert [l for l in export.stderr.splitlines() if l.strip()][-1].startswith("error: ")


def test_memory_estimate_counts_buckets_autocast_copies_and_a_gpu_reserve():
    """What the allocator holds besides weights, states and activations: DDP's float32 gradient buckets
    on several ranks, autocast's 16-bit weight copies (FSDP gathers 16-bit weights instead), and on a
    GPU a stated reserve for workspaces and NCCL."""
    cfg = dict(runtime.DEFAULTS, gradient_accumulation_steps=8)
    n = 10**9
    overhead = lambda c, world, dtype, device="cuda": sharding.memory_estimate(c, n, world, dtype, device)["overhead"]
    assert overhead(cfg, 8, "bfloat16") == 4 * n + 2 * n + sharding.RESERVE_BYTES
    assert overhead(cfg, 1, "bfloat16") == 2 * n + sharding.RESERVE_BYTES  # no buckets on one process
    assert overhead(cfg, 8, "float32", "cpu") == 4 * n  # no autocast copies, no GPU reserve
    assert overhead(dict(cfg, data_parallel="fsdp"), 8, "bfloat16") == sharding.RESERVE_BYTES
    e = sharding.memory_estimate(cfg, n, 8, "bfloat16")
    assert e["step"] == e["params"] + e["grads"] + e["optimizer"] + e["overhead"] + e["activations"] + e["head"]


def test_memory_check_compares_against_the_free_gpu_memory(monkeypatch):
    """The CUDA context and other processes take their share: a run that fits the card's total but not
    its free memory is refused."""
    from sharding import check_memory
    from parallel import ParallelLayout
    layout = ParallelLayout()
    layout.device = "cuda:0"
    cfg = dict(runtime.DEFAULTS, n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=2, vocab_size=256)
    need = sharding.memory_estimate(cfg, runtime.count_params(cfg), 1, "bfloat16")["total"]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (need - 1, 80 * 2**30))
    with pytest.raises(configurator.ConfigError, match="but the free memory of cuda:0 is"):
        check_memory(cfg, layout, runtime.count_params(cfg), "bfloat16")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (need, 80 * 2**30))
    check_memory(cfg, layout, runtime.count_params(cfg), "bfloat16")


def _local_weights(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    full = sharding.local_weights_bytes(model)
    sharding.shard_model(model, init_device_mesh("cpu", (world,)), "float32", "float32")
    local = sharding.local_weights_bytes(model)
    assert full / world <= local < full / world + 4 * 64, (local, full)  # its shard (rows padded to divide)


def test_memory_ratio_divides_by_the_weights_this_rank_holds(tmp_path):
    """memory_ratio is a rank's peak over its weights: under FSDP its shard, not the full model."""
    from helpers import run_ranks
    run_ranks(_local_weights, 2, tmp_path)
