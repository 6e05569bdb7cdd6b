"""train.py end to end on tiny models: logs, budgets, resume, atomic saves, divergence, DDP."""
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import configurator
import devices
import runrecord
import runtime
import sample
import tokendata
import train
from helpers import REPO, VOCAB, events, load_ckpt, run_script, tiny_args
from model import GPT

def test_logs_every_metric_and_learns(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=16", "--lr_decay_iters=16", "--log_act_norm_layers=[0, -1]"))
    checklist = events(out, "checklist")[0]
    for key in ("dataset", "train_tokens", "val_tokens", "model_class", "parameters", "block_size", "micro_batch",
                "grad_accum_steps", "world_size", "effective_batch_sequences", "tokens_per_iter", "token_budget",
                "dtype", "compile", "attn_impl", "device"):
        assert key in checklist, key
    assert checklist["tokens_per_iter"] == 4 * 16 * 2 and checklist["token_budget"] == 16 * 128
    assert checklist["mfu_against"].startswith("measured float32 matmul peak")
    assert checklist["head_loss"].startswith("chunked (auto: on a CPU")  # head_loss='auto' settled, and why
    assert checklist["train_tokens"] == 20000 and checklist["val_tokens"] == 4000
    records = events(out, "train")
    assert [r["iter"] for r in records] == list(range(1, 17))
    for r in records:
        for key in ("tokens", "loss", "lr", "grad_norm", "act_rms_layer0", "act_rms_layer1", "step_time_ms",
                    "tokens_per_sec", "peak_memory_mib", "tokens_per_iter"):
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), key
        assert 0 < r["mfu"] < 1  # against the matmul peak measured at start-up
        assert r["tokens"] == r["iter"] * 128
    evals = events(out, "eval")
    assert [e["iter"] for e in evals] == [0, 4, 8, 12, 16]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5
    assert all(e["val_ppl"] == pytest.approx(math.exp(e["val_loss"])) for e in evals)
    assert events(out, "end")[0]["stop_reason"] == "max_iters"
    text = open(os.path.join(out, "log.txt")).read()
    assert f"step 16: train loss {evals[-1]['train_loss']:.4f}, val loss {evals[-1]['val_loss']:.4f}" in text
    config = json.load(open(os.path.join(out, "config.json")))
    assert set(config) == set(runtime.DEFAULTS) and config["n_embd"] == 32


def test_chunked_head_trains_like_the_full_head(data_dir, tmp_path):
    """The same run with and without logits: equal losses at every step and equal final weights
    (fp32, SGD, two micro-steps per iteration)."""
    runs = {}
    for head_loss in ("full", "chunked"):
        out = str(tmp_path / head_loss)
        train.main(tiny_args(data_dir, out, "--optimizer=sgd", f"--head_loss={head_loss}"))
        runs[head_loss] = ([r["loss"] for r in events(out, "train")], load_ckpt(out)["model"])
    assert runs["chunked"][0] == pytest.approx(runs["full"][0], rel=1e-5)
    for name, weight in runs["full"][1].items():
        torch.testing.assert_close(runs["chunked"][1][name], weight, rtol=1e-5, atol=1e-6, msg=name)


def test_resume_reproduces_uninterrupted_run(data_dir, tmp_path):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    common = ("--dropout=0.1",)  # dropout makes the RNG state part of what must be restored
    train.main(tiny_args(data_dir, straight, *common))
    train.main(tiny_args(data_dir, split, *common, "--max_iters=4"))
    assert load_ckpt(split)["iter_num"] == 4
    # Recomputation may be switched on when resuming (what changes is memory, not the numbers)
    train.main(tiny_args(data_dir, split, *common, "--init_from=resume", "--attn_recompute=True"))
    losses = lambda out: {r["iter"]: r["loss"] for r in events(out, "train")}
    assert losses(split) == losses(straight)  # exact equality, every iteration
    a, b = load_ckpt(straight), load_ckpt(split)
    assert b["config"]["attn_recompute"] and not a["config"]["attn_recompute"]
    assert [c["recompute_in_backward"] for c in events(split, "checklist")] == ["nothing", "attention core"]
    assert a["iter_num"] == b["iter_num"] == 8 and a["tokens_seen"] == b["tokens_seen"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_resume_refuses_a_different_model_shape(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=4"))
    with pytest.raises(configurator.ConfigError, match="n_layer"):
        train.main(tiny_args(data_dir, out, "--init_from=resume", "--n_layer=3"))


def test_interrupted_save_keeps_previous_checkpoint(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    real_save = torch.save
    calls = []

    def crash_on_second_save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            f.write(b"half a checkpoint")
            raise KeyboardInterrupt("simulated crash during save")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", crash_on_second_save)
    with pytest.raises(KeyboardInterrupt):
        train.main(tiny_args(data_dir, out))
    ckpt = load_ckpt(out)
    assert ckpt["iter_num"] == 4
    model = GPT(runtime.model_config(ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    assert not os.path.exists(os.path.join(out, "ckpt.pt.tmp"))


def test_nan_loss_stops_and_keeps_last_good_checkpoint(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    real_forward = GPT.forward
    calls = []

    def forward_that_diverges(self, idx, targets=None, **kwargs):
        logits, loss = real_forward(self, idx, targets, **kwargs)
        if self.training:
            calls.append(1)
            if len(calls) > 10:  # micro-steps 11+ are in iteration 6
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward_that_diverges)
    with pytest.raises(train.TrainingDiverged, match="nan"):
        train.main(tiny_args(data_dir, out))
    assert events(out, "diverged")[0]["iter"] == 6
    assert load_ckpt(out)["iter_num"] == 4


TIMING = ("time", "step_time_ms", "tokens_per_sec", "mfu", "mfu_peak_gflops", "peak_memory_mib", "load_average",
          "train_time")


def test_the_host_reads_the_device_only_at_log_steps_and_logs_the_same_values(data_dir, tmp_path, monkeypatch):
    """The loop lets the device run ahead: the steps' losses, gradient norms and times stay on the device
    until a log line, an evaluation (eval_interval, eval_at) or the end of the budget needs them, and are
    then read in one go. Every logged value is the one a read after every step gives, bit for bit."""
    args = ("--max_iters=12", "--lr_decay_iters=12", "--dropout=0.1", "--log_act_norm_layers=[0, -1]",
            "--eval_interval=5", "--eval_at=[7]")
    every = str(tmp_path / "every_step")
    train.main(tiny_args(data_dir, every, *args))
    reads = []
    read_steps = train.read_steps
    monkeypatch.setattr(train, "read_steps", lambda unread, *a: (reads.append(len(unread)), read_steps(unread, *a))[1])
    sparse = str(tmp_path / "every_third")
    train.main(tiny_args(data_dir, sparse, *args, "--log_interval=3"))
    assert reads == [3, 2, 1, 1, 2, 1, 2]  # read at iterations 3, 5, 6, 7, 9, 10, 12: never per step in between
    logged = lambda out, kind: {r["iter"]: {k: v for k, v in r.items() if k not in TIMING} for r in events(out, kind)}
    dense = logged(every, "train")
    assert logged(sparse, "train") == {i: dense[i] for i in (3, 6, 9, 12)}
    assert set(dense[12]) >= {"loss", "grad_norm", "lr", "act_rms_layer0", "act_rms_layer1"}
    assert logged(sparse, "eval") == logged(every, "eval") and list(logged(every, "eval")) == [0, 5, 7, 10, 12]
    assert events(sparse, "end")[0]["train_time"] > 0


def test_budgets_end_the_run_and_say_which(data_dir, tmp_path):
    out = str(tmp_path / "tokens")
    train.main(tiny_args(data_dir, out, "--max_iters=100", "--lr_decay_iters=100", "--max_tokens=640"))
    end = events(out, "end")[0]
    assert (end["stop_reason"], end["iter"], end["tokens"]) == ("max_tokens", 5, 640)
    out = str(tmp_path / "time")
    train.main(tiny_args(data_dir, out, "--max_iters=100", "--lr_decay_iters=100", "--max_time=1e-9"))
    end = events(out, "end")[0]
    assert (end["stop_reason"], end["iter"]) == ("max_time", 1)


def test_tokens_per_iter_derives_accumulation_and_budget_sets_the_decay(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--gradient_accumulation_steps=0", "--tokens_per_iter=256",
                         "--max_iters=1000", "--lr_decay_iters=0", "--max_tokens=1024"))
    checklist = events(out, "checklist")[0]
    assert (checklist["grad_accum_steps"], checklist["tokens_per_iter"], checklist["token_budget"]) == (4, 256, 1024)
    assert "batch_size 4 x block_size 16 x gradient_accumulation_steps 4" in open(os.path.join(out, "log.txt")).read()
    records = events(out, "train")
    assert [r["iter"] for r in records] == [1, 2, 3, 4] and records[-1]["tokens"] == 1024
    # The cosine ends with the token budget (4 iterations), not at max_iters=1000.
    assert train.learning_rate_at(json.load(open(os.path.join(out, "config.json"))), 4) == pytest.approx(1e-3)


def test_learning_rate_schedules():
    cfg = dict(runtime.DEFAULTS, learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110, max_iters=200)
    cosine = [train.learning_rate_at(dict(cfg, lr_schedule="cosine"), it) for it in range(200)]
    assert cosine[0] == pytest.approx(0.1) and cosine[9] == pytest.approx(1.0)
    assert cosine[60] == pytest.approx(0.55) and cosine[110] == cosine[199] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(cosine[9:], cosine[10:]))
    constant = [train.learning_rate_at(dict(cfg, lr_schedule="constant", warmup_iters=0), it) for it in range(200)]
    assert set(constant) == {1.0}
    wsd = [train.learning_rate_at(dict(cfg, lr_schedule="wsd", wsd_decay_frac=0.2), it) for it in range(200)]
    assert set(wsd[9:88]) == {1.0} and wsd[99] == pytest.approx(0.55) and wsd[110] == pytest.approx(0.1)


def test_data_windows_are_fixed_and_shared_out_across_ranks():
    cfg = dict(runtime.DEFAULTS, batch_size=4, block_size=16, eval_iters=3)
    a = tokendata.eval_offsets(dict(cfg, seed=1), 1000)
    assert np.array_equal(a, tokendata.eval_offsets(dict(cfg, seed=2), 1000)) and a.shape == (3, 4)
    # One process's micro-step m*W + r is rank r's micro-step m: the same windows either way.
    assert np.array_equal(tokendata.train_offsets(cfg, 1000, 7, 3), tokendata.train_offsets(cfg, 1000, 7, 3))
    assert not np.array_equal(tokendata.train_offsets(cfg, 1000, 7, 3), tokendata.train_offsets(cfg, 1000, 7, 2))


@pytest.mark.parametrize("extra, message", [
    (["--n_head=3"], "divisible by n_head"),
    (["--block_size=5000"], "lower block_size"),
    (["--batch_size=2000"], "lower batch_size"),
    (["--warmup_iters=50"], "warmup_iters"),
    (["--log_act_norm_layers=[5]"], "log_act_norm_layers"),
    (["--init_from=resume"], "ckpt.pt does not exist"),
    (["--lr_schedule=linear"], "lr_schedule"),
    (["--hellaswag_interval=10"], "vocab_size >= 50257"),
    (["--dtype=float16"], "needs a GPU"),
    (["--gradient_accumulation_steps=0"], "set one"),
    (["--gradient_accumulation_steps=0", "--tokens_per_iter=100"], "not a multiple of batch_size"),
    (["--tokens_per_iter=256"], "disagree"),
    (["--max_tokens=1000"], "use 896 or 1024"),
])
def test_impossible_configs_fail_at_startup(data_dir, tmp_path, extra, message):
    with pytest.raises((configurator.ConfigError, ValueError), match=message):
        train.main(tiny_args(data_dir, str(tmp_path / "run"), *extra))
    assert not os.path.exists(tmp_path / "run" / "log.jsonl")


@pytest.mark.parametrize("dataset, command", [("openwebtext", "python data/openwebtext/prepare.py"),
                                              ("shakespeare_char", "python data/shakespeare/prepare.py --tokenizer=char")])
def test_missing_dataset_names_the_prepare_script(tmp_path, capsys, dataset, command):
    code, stderr = run_script(capsys, "train.py", f"--dataset={dataset}", f"--data_dir={tmp_path}/none",
                              f"--out_dir={tmp_path}/run")
    assert code == 1
    assert f"`{command}`" in stderr and os.path.exists(os.path.join(REPO, command.split()[1]))


def test_ddp_two_ranks_match_one_process_with_same_accumulation(data_dir, tmp_path):
    # SGD, not Adam: Adam's first update is ~lr * sign(g), so a near-zero gradient entry whose sign
    # depends on the reduction order (local accumulation vs all-reduce, the CPU's SIMD kernels) moves
    # its weight by up to 2 * lr. SGD's update is linear in the gradient: equal weights mean equal gradients.
    args = lambda out: tiny_args(data_dir, out, "--gradient_accumulation_steps=4", "--max_iters=1",
                                 "--eval_interval=100", "--warmup_iters=0", "--optimizer=sgd")
    single, ddp = str(tmp_path / "single"), str(tmp_path / "ddp")
    train.main(args(single))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "train.py", *args(ddp)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    checklist = events(ddp, "checklist")[0]
    assert checklist["world_size"] == 2 and checklist["grad_accum_per_rank"] == 2
    a, b = load_ckpt(single), load_ckpt(ddp)
    torch.manual_seed(1337)
    init = GPT(runtime.model_config(a["config"])).state_dict()
    for key in a["model"]:
        assert torch.allclose(a["model"][key], b["model"][key], atol=1e-6, rtol=0), key
    assert any(not torch.equal(a["model"][k], init[k]) for k in init)  # the step did change the weights
    assert events(single, "train")[0]["loss"] == pytest.approx(events(ddp, "train")[0]["loss"], rel=1e-6)


def test_compiled_run_saves_plain_keys(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--compile=True", "--max_iters=2", "--lr_decay_iters=2", "--eval_interval=2"))
    assert not any(k.startswith("_orig_mod.") for k in load_ckpt(out)["model"])
    assert all(math.isfinite(r["act_rms_layer0"]) for r in events(out, "train"))


def shakespeare_prepare():
    """data/shakespeare/prepare.py as a module (a script in a directory without __init__.py)."""
    spec = importlib.util.spec_from_file_location("shakespeare_prepare",
                                                  os.path.join(REPO, "data", "shakespeare", "prepare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("tokenizer, extra", [("gpt2", ()), ("char", ("--dataset=shakespeare_char", "--vocab_size=80"))])
def test_shakespeare_demo_config_runs(tmp_path, capsys, tokenizer, extra):
    """The demo, and the same on characters: its sample and sample.py's read the run's own tokens. The three
    scripts' main() in this process: what is tested is the demo's config and data, not an interpreter."""
    data = tmp_path / "shakespeare"
    shakespeare_prepare().main([f"--out_dir={data}", f"--tokenizer={tokenizer}"])
    out = tmp_path / "run"
    train.main([os.path.join(REPO, "config", "train_shakespeare.py"), f"--data_dir={data}", f"--out_dir={out}",
                "--max_iters=3", "--eval_interval=3", "--eval_iters=1", "--log_interval=1", "--warmup_iters=1",
                "--sample_tokens=8", *extra])
    stdout = capsys.readouterr().out
    assert "step 3: train loss" in stdout and "sample:" in stdout
    assert [r["iter"] for r in events(out, "train")] == [1, 2, 3]
    assert events(out, "checklist")[0]["train_tokens"] > 1_000_000
    sample.main([f"--out_dir={out}", "--num_samples=1", "--max_new_tokens=5", "--start=ROMEO:"])
    stdout = capsys.readouterr().out
    assert stdout.startswith("ROMEO:"), stdout
    if tokenizer == "char":
        sampled = stdout.split("\n---------------")[0]
        assert len(sampled) == len("ROMEO:") + 5 and set(sampled) <= set(json.load(open(data / "meta.json"))["chars"])


def test_text_in_another_tokenization_is_refused_before_training(data_dir, tmp_path):
    """A sample whose prompt is a GPT-2 token the model lacks, or HellaSwag (GPT-2 BPE) on char-level data."""
    out = str(tmp_path / "run")
    with pytest.raises(configurator.ConfigError, match=r"'\\n' is GPT-2 token 198, beyond the model's 64 ids"):
        train.main(tiny_args(data_dir, out, "--sample_tokens=8"))
    chars = tmp_path / "chars"
    shutil.copytree(data_dir, chars)
    tokendata.write_meta(str(chars), tokenizer="char", vocab_size=VOCAB, chars="".join(map(chr, range(32, 32 + VOCAB))))
    with pytest.raises(configurator.ConfigError, match="holds 'char' tokens: set hellaswag_interval=0"):
        train.main(tiny_args(str(chars), out, "--vocab_size=50304", "--hellaswag_interval=4"))
    assert not events(out, "train")


def test_wandb_offline_run_is_written_without_an_api_key(data_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "run"
    train.main(tiny_args(data_dir, str(out), "--max_iters=2", "--lr_decay_iters=2", "--wandb_log=True"))
    runs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert events(str(out), "end")[0]["stop_reason"] == "max_iters"


def test_hellaswag_runs_at_its_interval_and_at_the_end(data_dir, tmp_path):
    from helpers import FIXTURE, write_jsonl
    fixture = write_jsonl(tmp_path / "hellaswag_val.jsonl", FIXTURE)
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--vocab_size=50304", "--max_iters=6", "--lr_decay_iters=6",
                         "--hellaswag_interval=4", f"--hellaswag_input={fixture}", "--hellaswag_limit=4"))
    results = events(out, "hellaswag")
    assert [r["iter"] for r in results] == [0, 4, 6]
    assert all(r["n"] == 4 and 0 <= r["acc"] <= 1 and 0 <= r["acc_norm"] <= 1 for r in results)
    assert "step 6: hellaswag acc" in open(os.path.join(out, "log.txt")).read()


class QueuedDevice:
    """A stand-in for a GPU's queue on CPU: every batch read queues `seconds` of 'kernels' that finish
    only when devices.synchronize waits for them; `peak` is the allocator's peak, which evaluation
    raises to 1000 MiB and a training batch to 10 MiB."""

    def __init__(self, monkeypatch, seconds):
        self.pending, self.peak, self.seconds = 0.0, 0.0, seconds
        get_batch, evaluate = train.get_batch, train.evaluate
        monkeypatch.setattr(train, "get_batch", lambda *a: (self.queue(10.0), get_batch(*a))[1])
        monkeypatch.setattr(train, "evaluate", lambda *a, **k: (self.queue(1000.0), evaluate(*a, **k))[1])
        monkeypatch.setattr(devices, "synchronize", self.synchronize)
        monkeypatch.setattr(devices, "reset_peak_memory", lambda device: setattr(self, "peak", 0.0))
        monkeypatch.setattr(devices, "peak_memory_mib", lambda device: self.peak)

    def queue(self, mib):
        self.pending += self.seconds
        self.peak = max(self.peak, mib)

    def synchronize(self, device):
        time.sleep(self.pending)
        self.pending = 0.0


def test_step_time_waits_for_the_device(data_dir, tmp_path, monkeypatch):
    """A step is timed to its last kernel: work the device finishes only at a synchronize is in the
    step time, the tokens/s and train_time (and max_time), and evaluation's queued work is not."""
    QueuedDevice(monkeypatch, seconds=0.05)
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=4", "--lr_decay_iters=4"))
    steps = events(out, "train")
    assert len(steps) == 4 and all(100 <= r["step_time_ms"] < 1000 for r in steps)  # 2 micro-steps x 50 ms
    assert all(r["tokens_per_sec"] <= 128 / 0.1 for r in steps)
    assert events(out, "end")[0]["train_time"] >= 0.4


def test_the_gpu_timer_queues_events_and_waits_only_when_a_lap_is_read(monkeypatch):
    """On a GPU each mark is a CUDA event the host queues and goes on from (no synchronize); reading a
    lap, which train.py does at log steps, waits for its end event and gives elapsed_time in seconds."""
    calls = []

    class Event:  # torch.cuda.Event's calls, on a CPU: each records the order it was queued in
        def __init__(self, enable_timing):
            assert enable_timing
            self.order = sum(kind == "record" for kind, _ in calls)

        def record(self):
            calls.append(("record", self))

        def synchronize(self):
            calls.append(("synchronize", self))

        def elapsed_time(self, end):
            return 250.0 * (end.order - self.order)  # milliseconds

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(devices, "synchronize", lambda device: calls.append(("device", device)))
    timer, laps = devices.DeviceTimer("cuda:0"), []
    for _ in range(3):
        timer.start()
        laps.append(timer.stop())
    assert [kind for kind, _ in calls] == ["record"] * 6
    assert [timer.seconds(lap) for lap in laps] == [0.25] * 3
    assert calls[6:] == [("synchronize", end) for _, end in laps]


def test_peak_memory_is_reset_per_step_and_evaluation_logged_apart(data_dir, tmp_path, monkeypatch):
    QueuedDevice(monkeypatch, seconds=0.0)
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=4", "--lr_decay_iters=4"))
    assert [r["peak_memory_mib"] for r in events(out, "train")] == [10.0] * 4  # never evaluation's
    assert [r["peak_memory_mib"] for r in events(out, "eval")] == [1000.0] * 2


@pytest.mark.parametrize("probes,expected", [([1e3], None), ([1e3, 1e15], "against the second probe")])
def test_mfu_is_never_above_one(data_dir, tmp_path, monkeypatch, probes, expected):
    """A matmul peak probed while other work had the cores reads low: it is probed again when the model
    outruns it; an MFU still above 1 is logged as n/a, never as 135%."""
    answers = iter(probes + [probes[-1]] * 100)
    monkeypatch.setattr(devices, "matmul_peak_flops", lambda device, dtype: next(answers))
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=2", "--lr_decay_iters=2"))
    steps = events(out, "train")
    if expected is None:
        assert all(r["mfu"] is None and r["mfu_peak_gflops"] == 1e-6 for r in steps)
        assert "mfu n/a" in open(os.path.join(out, "log.txt")).read()
    else:
        assert all(0 < r["mfu"] < 1 and r["mfu_peak_gflops"] == 1e6 for r in steps)


def test_checklist_names_the_attention_kernel_and_the_float32_matmuls(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=1", "--lr_decay_iters=1", "--warmup_iters=0"))
    checklist = events(out, "checklist")[0]
    assert checklist["sdpa_backend"] == "FLASH_ATTENTION"  # the CPU build's fused kernel at float32
    assert checklist["float32_matmuls"] == "IEEE float32"
    assert devices.sdpa_backend("cpu", "float32", 2, 16, 16) == "FLASH_ATTENTION"
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):  # as where a build gates the fused kernels (ROCm on RDNA3)
        assert devices.sdpa_backend("cpu", "float32", 2, 16, 16) == "MATH"


@pytest.mark.parametrize("options, calls", [
    (dict(), ("attention",)), (dict(model_type="ra", ra_pattern="all", ra_mode="mix"), ("mix",)),
    (dict(model_type="ra", ra_pattern="late", ra_mode="swap", ra_window=8), ("attention", "swap")),
    (dict(model_type="ra", ra_pattern="all", ra_mode="mix", ra_window=8), ("mix",)),
    (dict(model_type="ra", ra_pattern="learned"), ("attention", "swap")), (dict(attn_impl="manual"), ()),
    (dict(model_type="ra", ra_pattern="all", ra_mode="mix", attn_impl="auto"), ("mix",))])
def test_sdpa_probe_covers_ra_calls_and_warns_in_one_line_on_the_math_kernel(options, calls):
    """RA's doubled (mix) and masked (windowed) calls are probed as reciprocal_sdpa makes them; where the
    dispatcher answers MATH (as ROCm builds do on some GPUs) the checklist carries one warning line."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    cfg = dict(runtime.DEFAULTS, n_head=2, n_embd=32, block_size=32, **options)
    assert tuple(devices.sdpa_probe(cfg, "cpu", "float32")) == calls
    assert "sdpa_warning" not in devices.device_facts(cfg, "cpu", "float32", 1e9)
    with sdpa_kernel([SDPBackend.MATH]):
        facts = devices.device_facts(cfg, "cpu", "float32", 1e9)
    if calls:
        assert facts["sdpa_warning"].startswith(f"WARNING: SDPA runs the math kernel for {', '.join(calls)}")
        assert "\n" not in facts["sdpa_warning"]
    else:
        assert "sdpa_warning" not in facts and facts["sdpa_backend"] == "not used (attn_impl='manual')"


def test_precision_uses_native_bf16_only_and_tf32_for_float32_on_gpus(monkeypatch):
    """is_bf16_supported() counts emulation (V100, T4): those get fp16. A float32 GPU run uses TF32."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert devices.precision("", "cuda:0")[0] == "float16"
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    devices.precision("float32", "cpu")
    assert not torch.backends.cuda.matmul.allow_tf32
    devices.precision("float32", "cuda:0")
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


def test_only_the_master_hashes_the_run_facts(data_dir, monkeypatch):
    """Every rank takes part in gathering a sharded model's weights; only the master, which writes
    run_info.json, hashes them and the dataset (each rank hashed all of it)."""
    from parallel import ParallelLayout
    cfg = runtime.resolve(configurator.apply_config(runtime.DEFAULTS, tiny_args(data_dir, "unused")), 1)
    model = GPT(runtime.model_config(cfg))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    counts = {"train": 20000, "val": 4000}
    follower = ParallelLayout(world_size=2)
    follower.rank = 1
    hashed = []
    fingerprint = runrecord.dataset_fingerprint
    monkeypatch.setattr(runrecord, "dataset_fingerprint", lambda d: hashed.append(d) or fingerprint(d))
    assert runrecord.run_facts(cfg, follower, model, optimizer, data_dir, counts, "float32") is None and hashed == []
    facts = runrecord.run_facts(cfg, ParallelLayout(), model, optimizer, data_dir, counts, "float32")
    assert hashed == [data_dir] and len(facts["init_weights"]) > 0


def test_deterministic_runs_on_deterministic_algorithms_and_says_so(data_dir, tmp_path):
    """deterministic=True switches on PyTorch's deterministic algorithms (a process-wide switch: the run
    is its own process here) and run_info.json and the checklist record it; by default it is off."""
    for on in (True, False):
        out = str(tmp_path / f"run-{on}")
        subprocess.run([sys.executable, "train.py", *tiny_args(data_dir, out, "--max_iters=2", f"--deterministic={on}")],
                       cwd=REPO, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        info = json.load(open(os.path.join(out, "run_info.json")))
        assert info["start"]["deterministic_algorithms"] is on
        assert events(out, "checklist")[0]["deterministic_algorithms"] is on
