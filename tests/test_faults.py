"""Faults an operator meets, injected for real (signals, write errors, hostile files, a frozen
rank, a second process, bad data): nothing is lost and the user sees one clear line."""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import configurator
import eval as eval_script
import evaluation
import hellaswag
import rundir
import runtime
import sample
import tokendata
import train
from ablation import suites
from helpers import ENV, LONG, VOCAB, events, load_ckpt, run_script, tiny_args, wait_for_training

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_signals():
    """In a child before it runs: the default handlers a terminal gives, whatever this test run
    inherited (a background job ignores SIGINT, nohup ignores SIGHUP)."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def start(args, **kwargs):
    return subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals, **kwargs)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.strip()]



# ----------------------------------------------------------------------------- checkpoints that cannot run code

class Payload:
    """Unpickling this runs `touch <marker>`: what a crafted ckpt.pt could do with weights_only=False."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_hostile_checkpoint_is_refused_and_its_payload_never_runs(data_dir, tmp_path, capsys):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=4"))
    marker = tmp_path / "payload-ran"
    ckpt = load_ckpt(out)
    ckpt["config"]["note"] = Payload(marker)
    torch.save(ckpt, os.path.join(out, "ckpt.pt"))
    code, stderr = run_script(capsys, "train.py", *tiny_args(data_dir, out, "--init_from=resume"))
    assert code == 1, stderr[-2000:]
    assert error_lines(stderr) == [
        f"error: {out}/ckpt.pt holds objects other than tensors and plain values (posix.system): refused, "
        f"because loading them could run arbitrary code; only load checkpoints written by train.py"]
    # sample.py, eval.py and hellaswag.py load through the same runtime.load_model (scripts' one-line
    # exits for RunDirError: see run_script's error list in each)
    for main, argv in ((sample.main, ["--num_samples=1"]), (eval_script.main, [f"--data_dir={data_dir}"]),
                       (hellaswag.main, ["--input=unused.jsonl"])):
        with pytest.raises(rundir.RunDirError, match="posix.system"):
            main([f"--out_dir={out}", *argv])
    assert not marker.exists()


def test_checkpoints_hold_only_tensors_and_plain_values(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=4", "--optimizer=adamw_spam", "--pruning=state",
                         "--prune_start=1", "--prune_interval=1", "--dropout=0.1"))
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)  # would raise on anything else
    assert ckpt["iter_num"] == 4 and isinstance(ckpt["rng"][0]["torch"], torch.Tensor)
    json.dumps(ckpt["config"], allow_nan=False)  # the config is plain values


# ----------------------------------------------------------------------------- evaluation divergence

def test_a_nan_evaluation_never_replaces_the_last_good_checkpoint(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    real_evaluate = train.evaluate
    calls = []

    def evaluate_nan_the_third_time(*args, **kwargs):  # evaluations at iterations 0, 4, 8
        calls.append(1)
        losses = real_evaluate(*args, **kwargs)
        return {k: float("nan") for k in losses} if len(calls) == 3 else losses

    monkeypatch.setattr(train, "evaluate", evaluate_nan_the_third_time)
    with pytest.raises(train.TrainingDiverged, match="evaluation loss became train nan, val nan at iteration 8"):
        train.main(tiny_args(data_dir, out, "--eval_interval=4", "--max_iters=12", "--lr_decay_iters=12"))
    assert load_ckpt(out)["iter_num"] == 4
    text = open(os.path.join(out, "log.jsonl")).read()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    assert events(out, "diverged")[0] | {"time": 0} == dict(event="diverged", time=0, iter=8, train_loss=None,
                                                            val_loss=None)


# ----------------------------------------------------------------------------- preemption, Ctrl-C, one run per out_dir

def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resume_matches(data_dir, tmp_path):
    """One process stops after the step the signal came in, whether or not it is a log step (log_interval=2:
    the host reads the device every other step) and resumes exactly where it stopped."""
    out = str(tmp_path / "run")
    args = tiny_args(data_dir, out, "--dropout=0.1", *LONG, "--log_interval=2")
    proc = start(args)
    wait_for_training(out, proc, min_iter=3)
    second = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 1
    assert error_lines(second.stderr) == [f"error: {out} is in use by another run (pid {proc.pid}): wait for it to "
                                          f"end, stop it, or choose another out_dir"]
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == train.EXIT_STOPPED_BY_SIGNAL, stderr[-2000:]
    assert error_lines(stderr) == ["SIGTERM received: finishing this step, then writing a checkpoint and stopping "
                                   "(send it again to stop at once)"]
    end = events(out, "end")[-1]
    assert (end["stop_reason"], end["signal"]) == ("signal", "SIGTERM")
    stopped_at = end["iter"]
    assert load_ckpt(out)["iter_num"] == stopped_at
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    # Resuming reproduces the uninterrupted run exactly, dropout's RNG included.
    resumed_end = stopped_at + 3
    train.main(tiny_args(data_dir, out, "--dropout=0.1", *LONG, "--init_from=resume", f"--max_iters={resumed_end}"))
    straight = str(tmp_path / "straight")
    train.main(tiny_args(data_dir, straight, "--dropout=0.1", *LONG, f"--max_iters={resumed_end}"))
    assert [r["iter"] for r in events(straight, "train")] == list(range(1, resumed_end + 1))
    losses = lambda d: {r["iter"]: r["loss"] for r in events(d, "train")}
    assert losses(out).items() <= losses(straight).items() and max(losses(out)) == resumed_end
    assert rundir.finished(rundir.read_events(out))[-1]["stop_reason"] == "max_iters"


def test_sighup_stops_like_sigterm_with_a_checkpoint(data_dir, tmp_path):
    """A closed terminal or a lost ssh session sends SIGHUP: the run saves and ends as on SIGTERM."""
    out = str(tmp_path / "run")
    proc = start(tiny_args(data_dir, out, *LONG))
    wait_for_training(out, proc, min_iter=2)
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == train.EXIT_STOPPED_BY_SIGNAL, stderr[-2000:]
    end = events(out, "end")[-1]
    assert (end["stop_reason"], end["signal"]) == ("signal", "SIGHUP")
    assert load_ckpt(out)["iter_num"] == end["iter"]


def test_a_signal_before_the_first_step_stops_start_up_at_once_and_says_nothing_was_saved(data_dir, tmp_path,
                                                                                          monkeypatch):
    """Start-up (model building, data checks, memory estimate) can take minutes at large sizes; a
    signal then stops it at once with the truth instead of waiting for a step that has not begun."""
    out = str(tmp_path / "run")
    real_check_data = train.tokendata.check_data

    def slow_start(cfg, scan=None):
        os.kill(os.getpid(), signal.SIGTERM)  # as the scheduler would, while the run is still setting up
        return real_check_data(cfg, scan)

    monkeypatch.setattr(train.tokendata, "check_data", slow_start)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(train.Interrupted, match="SIGTERM before the first step: stopped at once; no checkpoint "
                                                "was written") as stopped:
        train.main(tiny_args(data_dir, out))
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    assert not os.path.exists(os.path.join(out, "ckpt.pt")) and signal.getsignal(signal.SIGTERM) == previous


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_under_torchrun_stops_every_rank_after_the_same_step(data_dir, tmp_path, signum):
    """The ranks share the stop flag where they read their steps, at log steps (no all-reduce per step):
    every rank stops after the same one and the checkpoint is that step's."""
    out, name = str(tmp_path / "run"), signal.Signals(signum).name
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", *tiny_args(data_dir, out, *LONG, "--log_interval=3")], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    wait_for_training(out, proc, min_iter=3)
    proc.send_signal(signum)  # torchrun passes it on to both ranks
    _, stderr = proc.communicate(timeout=120)
    assert stderr.count(f"{name} received: finishing this step") == 2, stderr[-3000:]
    assert stderr.count("and those up to the next log step (every rank stops after the same one)") == 2
    end = events(out, "end")[-1]
    assert (end["stop_reason"], end["signal"]) == ("signal", name) and end["iter"] % 3 == 0
    assert load_ckpt(out)["iter_num"] == end["iter"] and len(load_ckpt(out)["rng"]) == 2


def test_second_sigint_stops_at_once_and_keeps_the_checkpoint(data_dir, tmp_path):
    out = str(tmp_path / "run")
    # A long sample at the end gives the second Ctrl-C something to cut short (signals that arrive
    # together coalesce into one, so the second must come after the first was handled); the toy ids
    # have no text of their own, so the sample reads them as GPT-2's.
    proc = start(tiny_args(data_dir, out, *LONG, "--sample_tokens=1000000", "--vocab_size=50304"))
    wait_for_training(out, proc, min_iter=2)
    proc.send_signal(signal.SIGINT)
    while not events(out, "end"):
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-4000:]  # the whole story if it ever fails
    assert error_lines(stderr)[-1] == (f"error: second signal (SIGINT after SIGINT): stopped at once; {out}/ckpt.pt "
                                       f"holds the last checkpoint written")
    assert load_ckpt(out)["iter_num"] == events(out, "end")[0]["iter"]


def test_a_second_signal_during_a_save_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    real_save = torch.save
    saves = []

    class SignalledFile:
        """A checkpoint file whose third write is interrupted by Ctrl-C pressed twice."""

        def __init__(self, f):
            self.f, self.writes = f, 0

        def write(self, data):
            self.writes += 1
            if self.writes == 3:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
            return self.f.write(data)

        def flush(self):
            self.f.flush()

    def save(obj, f, *args, **kwargs):
        saves.append(1)
        return real_save(obj, SignalledFile(f) if len(saves) == 2 else f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even in a background job
    try:
        with pytest.raises(train.Interrupted, match="second signal .SIGINT after SIGINT.: stopped at once"):
            train.main(tiny_args(data_dir, out))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler that was there before
    finally:
        signal.signal(signal.SIGINT, previous)
    assert load_ckpt(out)["iter_num"] == 4 and len(saves) == 2
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


# ----------------------------------------------------------------------------- write errors and torn logs

def limited_file_size(limit):
    """For a subprocess: files may grow to `limit` bytes; a write beyond fails with EFBIG ('file too
    large'), as a full disk fails with ENOSPC (SIGXFSZ would kill the process instead: ignored)."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_write_errors_name_their_cause_and_lose_nothing(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=4"))
    ckpt_size = os.path.getsize(os.path.join(out, "ckpt.pt"))
    # A checkpoint that cannot be written: the previous one stays.
    proc = subprocess.run([sys.executable, "train.py", *tiny_args(data_dir, out, "--init_from=resume")], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=120,
                          preexec_fn=limited_file_size(ckpt_size // 2))
    assert proc.returncode == 1
    assert error_lines(proc.stderr) == [f"error: file too large while writing {out}/ckpt.pt; the previous "
                                        f"checkpoint is intact"]
    assert load_ckpt(out)["iter_num"] == 4
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    # The first save of a run on a full disk: nothing was there before, and the message says so.
    first = str(tmp_path / "first")
    proc = subprocess.run([sys.executable, "train.py", *tiny_args(data_dir, first)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=120, preexec_fn=limited_file_size(ckpt_size // 2))
    assert proc.returncode == 1 and error_lines(proc.stderr)[-1] == (
        f"error: file too large while writing {first}/ckpt.pt; no checkpoint was written yet")
    # A log line that cannot be written whole: the run stops, leaving a torn last line ...
    log_size = os.path.getsize(os.path.join(out, "log.jsonl"))
    limit = max(log_size, os.path.getsize(os.path.join(out, "run_info.json")) + 1500) + 300  # run_info.json fits
    proc = subprocess.run([sys.executable, "train.py", *tiny_args(data_dir, out, "--init_from=resume", *LONG,
                                                                  "--max_iters=40")],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120,
                          preexec_fn=limited_file_size(limit))
    assert proc.returncode == 1
    assert error_lines(proc.stderr)[-1] == (
        f"error: file too large while writing {out}/log.jsonl; the run stopped there; ckpt.pt holds the last "
        f"checkpoint (resume with --init_from=resume once there is room)")
    raw = open(os.path.join(out, "log.jsonl"), "rb").read()
    assert not raw.endswith(b"\n") and len(raw) == limit
    whole = rundir.read_events(out)  # ... which readers skip
    assert len(whole) == raw.count(b"\n")
    # ... and a resume cuts off before appending: every line is a record, none glued to the fragment.
    train.main(tiny_args(data_dir, out, "--init_from=resume"))
    lines = open(os.path.join(out, "log.jsonl")).read().splitlines()
    records = [json.loads(line) for line in lines]
    repaired = [r for r in records if r["event"] == "log_repaired"]
    assert len(repaired) == 1 and raw.decode().rsplit("\n", 1)[-1].startswith(repaired[0]["torn"])
    assert records[:len(whole)] == whole and records[-1]["event"] == "end" and records[-1]["iter"] == 8


def test_readers_skip_a_torn_or_garbled_line(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"event": "eval", "iter": 0}\n{"event": "tr\n'
                                        '{"event": "end", "iter": 4, "stop_reason": "max_iters"}\n{"event": "tra')
    assert [e["event"] for e in rundir.read_events(str(tmp_path))] == ["eval", "end"]
    assert rundir.repair_torn_line(str(tmp_path / "log.jsonl")) == '{"event": "tra'
    assert open(tmp_path / "log.jsonl").read().endswith('"max_iters"}\n')


# ----------------------------------------------------------------------------- no hung ranks

def test_a_frozen_rank_ends_the_job_within_the_timeout_and_is_named(data_dir, tmp_path):
    out = str(tmp_path / "run")
    log = open(tmp_path / "torchrun.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", *tiny_args(data_dir, out, *LONG, "--dist_timeout=5")],
                            cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    ranks = {}
    try:
        wait_for_training(out, proc, min_iter=2)
        for pid in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split():
            environ = dict(v.split("=", 1) for v in open(f"/proc/{pid}/environ").read().split("\0") if "=" in v)
            ranks[int(environ["RANK"])] = int(pid)
        os.kill(ranks[1], signal.SIGSTOP)
        frozen_at = time.time()
        while os.path.exists(f"/proc/{ranks[0]}") and open(f"/proc/{ranks[0]}/stat").read().split()[2] != "Z":
            assert time.time() - frozen_at < 60, "rank 0 still waits on the frozen rank"
            time.sleep(0.2)
        waited = time.time() - frozen_at
    finally:  # torchrun would SIGKILL the frozen rank itself, after a 30 s grace
        for pid in [proc.pid, *ranks.values()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    text = open(tmp_path / "torchrun.txt").read()
    assert 4 <= waited < 30, waited  # rank 0 may have been waiting a moment before the SIGSTOP
    named = [line for line in text.splitlines() if line.startswith("error: rank 1 (silent for")]
    assert len(named) == 1 and "stopped responding, frozen or stuck outside Python; rank 0 waited " \
                               "dist_timeout=5 s in a collective and ended the job" in named[0], text[-3000:]


# ----------------------------------------------------------------------------- sweeps take their runs with them

def test_a_killed_sweep_stops_its_training_runs(data_dir, tmp_path):
    sweep_dir = tmp_path / "out-sweep"
    args = [a for a in tiny_args(data_dir, "unused", *LONG) if not a.startswith("--out_dir=")]
    proc = subprocess.Popen([sys.executable, "sweep.py", "--grid=seed=[1]", f"--sweep_dir={sweep_dir}", "--gpus=0",
                             *args], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_training(str(sweep_dir / "seed-1"), proc, min_iter=2)
    finally:
        proc.kill()  # kill -9: no chance to clean up
    proc.wait()
    deadline = time.time() + 60
    while not events(str(sweep_dir / "seed-1"), "end"):
        assert time.time() < deadline, "the run outlived its sweep"
        time.sleep(0.2)
    end = events(str(sweep_dir / "seed-1"), "end")[0]
    assert end["signal"] == "SIGTERM" and load_ckpt(str(sweep_dir / "seed-1"))["iter_num"] == end["iter"]


# ----------------------------------------------------------------------------- bad input, refused before work starts

def write_data(path, train_tokens, val_tokens):
    os.makedirs(path, exist_ok=True)
    tokendata.write_split(os.path.join(path, "train.bin"), [np.asarray(train_tokens)])
    tokendata.write_split(os.path.join(path, "val.bin"), [np.asarray(val_tokens)])
    return str(path)


def test_odd_sized_data_file_is_named_in_one_line(tmp_path, capsys):
    data = write_data(tmp_path / "data", np.arange(2000) % VOCAB, np.arange(500) % VOCAB)
    with open(os.path.join(data, "train.bin"), "ab") as f:
        f.write(b"\x01")  # a torn copy: half a token
    code, stderr = run_script(capsys, "train.py", *tiny_args(data, str(tmp_path / "run")))
    assert code == 1
    assert error_lines(stderr) == [
        f"error: {data}/train.bin has 4001 bytes, not a whole number of 2-byte tokens: the file is truncated or not "
        f"a token file; prepare it again with `python data/toy/prepare.py`"]


def test_out_of_vocabulary_ids_are_found_once_and_kept_in_meta(tmp_path, capsys):
    tokens = np.arange(2000) % VOCAB
    tokens[1234] = VOCAB + 5
    data = write_data(tmp_path / "data", tokens, np.arange(500) % VOCAB)
    code, stderr = run_script(capsys, "train.py", *tiny_args(data, str(tmp_path / "run")))
    assert code == 1
    assert error_lines(stderr) == [f"error: {data}/train.bin holds token id {VOCAB + 5} but vocab_size={VOCAB}: "
                                        f"set vocab_size above {VOCAB + 5} or prepare it again with "
                                        f"`python data/toy/prepare.py`"]
    cached = tokendata.read_meta(data)["max_token_id"]
    assert (cached["train"]["max"], cached["val"]["max"]) == (VOCAB + 5, VOCAB - 1)
    write_data(tmp_path / "data", np.arange(2000) % VOCAB, np.arange(500) % VOCAB)  # rewritten: scanned again
    assert tokendata.max_token_id(data) == {"train": VOCAB - 1, "val": VOCAB - 1}


def test_syntax_error_in_a_config_file_is_one_line(tmp_path, capsys):
    (tmp_path / "bad.py").write_text("batch_size = 4\nlearning_rate = (3e-4\nn_layer = 2\n")
    code, stderr = run_script(capsys, "train.py", str(tmp_path / "bad.py"))
    assert code == 1 and "Traceback" not in stderr
    assert error_lines(stderr) == [f"error: {tmp_path}/bad.py:2: syntax error ('(' was never closed): fix "
                                        f"the config file"]
    (tmp_path / "fails.py").write_text("batch_size = 4\nn_layer = undefined_name\n")
    with pytest.raises(configurator.ConfigError, match=r"fails.py:2: NameError: name 'undefined_name'"):
        configurator.apply_config(runtime.DEFAULTS, [str(tmp_path / "fails.py")])


@pytest.mark.parametrize("extra, message", [
    (["--device=cuda"], "no CUDA GPU is visible"),
    (["--n_layer=64", "--n_embd=16384", "--n_head=128"], r"this run needs at least [\d,.]+ GiB per rank"),
    # a step that fits but an evaluation's whole logits (800,000 tokens x 50,304) do not
    (["--batch_size=100000", "--block_size=8", "--vocab_size=50304"],
     r"this run needs at least [\d,.]+ GiB per rank \(params .* evaluation [\d,.]+ GiB\) but .*: lower batch_size or block_size"),
    (["--hellaswag_limit=-1"], "hellaswag_limit must be >= 0"),
    (["--dist_timeout=0"], "dist_timeout must be >= 1"),
    (["--out_dir="], "out_dir is empty: name the run directory"),
    (["--device=tpu"], "device='tpu': use cpu, cuda, cuda:N or mps"),
    (["--eval_iters=1000000000"], "eval_iters=1000000000 x batch_size=.* evaluation windows exceed the .* tokens of the "
                                  "smaller split: lower eval_iters"),
])
def test_impossible_runs_fail_before_work_starts(data_dir, tmp_path, extra, message):
    if extra[0] == "--device=cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(configurator.ConfigError, match=message):
        train.main(tiny_args(data_dir, str(tmp_path / "run"), *extra))
    assert not os.path.exists(tmp_path / "run" / "log.jsonl")


def test_empty_val_split_is_refused(tmp_path):
    data = write_data(tmp_path / "data", np.arange(2000) % VOCAB, np.zeros(0, dtype=np.int64))
    with pytest.raises(configurator.ConfigError, match=r"val.bin is empty: prepare it again"):
        train.main(tiny_args(data, str(tmp_path / "run")))


def test_eval_names_a_damaged_val_split_before_loading_any_model(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for content, message in ((b"", "val.bin is empty: prepare it again"),
                             (b"abc", "val.bin has 3 bytes, not a whole number of 2-byte tokens")):
        (data / "val.bin").write_bytes(content)
        code, stderr = run_script(capsys, "eval.py", f"--data_dir={data}", f"--out_dir={tmp_path / 'none'}")
        assert code == 1 and "Traceback" not in stderr
        assert error_lines(stderr)[-1].startswith(f"error: {data}/{message}"), stderr


@pytest.mark.parametrize("row, message", [
    (dict(ctx="a", endings=["b", "c", "d", "e"], label=4), "label in 0..3, got label 4"),
    (dict(ctx="a", endings=["b", "c", "d"], label=0), "'endings' must be 4 non-empty strings"),
    (dict(ctx="a", endings=["b", "", "d", "e"], label=0), "'endings' must be 4 non-empty strings"),
])
def test_malformed_hellaswag_rows_are_named_by_line(tmp_path, row, message):
    good = dict(ctx="a", endings=["b", "c", "d", "e"], label=1)
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: .*{message}"):
        evaluation.load_examples(str(path))


@pytest.mark.parametrize("main, argv, message", [
    (eval_script.main, ["--data_dir=unused", "--batch_size=0"], "batch_size must be >= 1"),
    (hellaswag.main, ["--batch_size=0"], "batch_size must be >= 1"),
    (hellaswag.main, ["--limit=-3"], "limit must be >= 0"),
    (sample.main, ["--num_samples=0"], "num_samples must be >= 1"),
    (sample.main, ["--top_k=0"], "top_k must be >= 1"),
    (sample.main, ["--temperature=-1.0"], "temperature must be >= 0"),
    (sample.main, ["--start="], "start is empty"),
    (sample.main, ["--out_dir="], "out_dir is empty"),
    (hellaswag.main, ["--out_dir="], "out_dir is empty"),
])
def test_evaluation_and_sampling_keys_out_of_range(tmp_path, main, argv, message):
    with pytest.raises(configurator.ConfigError, match=message):
        main([f"--out_dir={tmp_path}", *argv])


# ----------------------------------------------------------------------------- sweeps: lock, Ctrl-C, damaged suite.json

def sweep_command(sweep_dir, data_dir, *extra):
    args = [a for a in tiny_args(data_dir, "unused", *extra) if not a.startswith("--out_dir=")]
    return [sys.executable, "sweep.py", "--grid=seed=[1,2]", f"--sweep_dir={sweep_dir}", "--gpus=0", *args]


def test_a_second_sweep_on_the_same_directory_is_refused_naming_the_first(data_dir, tmp_path, capsys):
    sweep_dir = tmp_path / "out-sweep"
    first = subprocess.Popen(sweep_command(sweep_dir, data_dir, *LONG), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=default_signals)
    try:
        wait_for_training(str(sweep_dir / "seed-1"), first, min_iter=1)
        # the second sweep is this process (the first runs in its own): refused at once, while the first trains on
        code, stderr = run_script(capsys, *sweep_command(sweep_dir, data_dir, *LONG)[1:])
        assert code == 1
        assert error_lines(stderr)[-1] == (f"error: {sweep_dir} is in use by another sweep (pid {first.pid}): "
                                           f"wait for it to end, stop it, or choose another sweep_dir")
    finally:
        first.kill()
        first.wait()


def test_ctrl_c_to_a_sweep_pauses_its_run_with_a_checkpoint_and_one_line(data_dir, tmp_path):
    """Ctrl-C in a terminal reaches the whole foreground group: the sweep and its running train.py."""
    sweep_dir = tmp_path / "out-sweep"
    proc = subprocess.Popen(sweep_command(sweep_dir, data_dir, *LONG), cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_signals)
    wait_for_training(str(sweep_dir / "seed-1"), proc, min_iter=2)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert error_lines(stderr)[-1] == ("error: interrupted: 1 running run(s) saved a checkpoint and stopped; run the "
                                       "same command again to resume them")
    end = events(str(sweep_dir / "seed-1"), "end")[-1]
    assert end["signal"] == "SIGINT" and load_ckpt(str(sweep_dir / "seed-1"))["iter_num"] == end["iter"]


def test_a_truncated_suite_json_is_named_in_one_line(tmp_path):
    suite_dir = tmp_path / "out-suite"
    suite_dir.mkdir()
    (suite_dir / "suite.json").write_text('{"metric": "val_loss", "baseline": "ba')
    suite = dict(name="s", metric="val_loss", baseline="base", alpha=0.05, min_effect=None)
    with pytest.raises(configurator.ConfigError, match=f"{suite_dir}/suite.json is damaged"):
        suites.freeze_suite(suite, [], str(suite_dir))
    with pytest.raises(configurator.ConfigError, match="suite.json is damaged"):
        import report
        report.main([str(suite_dir)])


def test_a_read_only_out_dir_is_one_line(data_dir, tmp_path, capsys):
    if os.geteuid() == 0:  # root writes anywhere: make the path impossible instead (a file in the way)
        (tmp_path / "taken").write_text("a file, not a directory")
        out = str(tmp_path / "taken" / "run")
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        out = str(tmp_path / "ro" / "run")
    code, stderr = run_script(capsys, "train.py", *tiny_args(data_dir, out))
    assert code == 1 and "Traceback" not in stderr
    assert error_lines(stderr)[-1].startswith(f"error: cannot write in {out} (")
    assert error_lines(stderr)[-1].endswith("): choose a writable out_dir")


# ----------------------------------------------------------------------------- resuming on other data

def test_resume_on_a_re_prepared_dataset_is_refused_unless_allowed_and_then_recorded(data_dir, tmp_path, capsys):
    data, out = tmp_path / "data", str(tmp_path / "run")
    shutil.copytree(data_dir, data)
    train.main(tiny_args(str(data), out, "--max_iters=4"))
    tokens = np.fromfile(data / "val.bin", dtype=np.uint16)
    np.roll(tokens, 7).tofile(data / "val.bin")  # prepared again: same name, other content
    resume = tiny_args(str(data), out, "--init_from=resume")
    code, stderr = run_script(capsys, "train.py", *resume)
    assert code == 1 and error_lines(stderr) == [
        f"error: {data} is not the data this run started on (dataset fingerprint and eval windows changed since "
        f"{out}/run_info.json was written): resume on the original data, start a new out_dir, or pass "
        f"--allow_data_change=True (the run record then says so)"]
    assert load_ckpt(out)["iter_num"] == 4  # nothing lost
    train.main([*resume, "--allow_data_change=True"])
    info = json.load(open(os.path.join(out, "run_info.json")))
    assert set(info["resumes"][-1]["data_changed"]) == {"dataset_fingerprint", "eval_windows"}
    assert info["facts"]["dataset_fingerprint"] == info["resumes"][-1]["data_changed"]["dataset_fingerprint"][0]


def test_resume_on_another_data_order_is_refused_unless_allowed_and_then_recorded(data_dir, tmp_path, capsys):
    """Issue 50: a resume with another data_order was accepted in silence: the steps after it drew
    another batch order while config.json claimed the new order for the whole run."""
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--max_iters=4"))
    resume = tiny_args(data_dir, out, "--init_from=resume", "--data_order=1")
    code, stderr = run_script(capsys, "train.py", *resume)
    assert code == 1 and error_lines(stderr) == [
        f"error: {out} started on another batch order than this resume would draw (the data order recorded in "
        f"{out}/run_info.json differs: data_order=0 there, 1 now): resume with the keys it started with, start a new "
        f"out_dir, or pass --allow_data_change=True (the run record then says so)"]
    assert load_ckpt(out)["iter_num"] == 4 and json.load(open(os.path.join(out, "config.json")))["data_order"] == 0
    train.main([*resume, "--allow_data_change=True"])
    info = json.load(open(os.path.join(out, "run_info.json")))
    assert set(info["resumes"][-1]["data_changed"]) == {"data_order"}


def test_a_run_whose_latest_attempt_died_after_a_preemption_is_failed_not_preempted():
    """kill -9 of a requeued run's train.py (or an OOM kill) leaves the earlier attempt's `end`
    record as the log's last `end`: the run was shown as "preempted", forever."""
    first = [{"event": "checklist"}, {"event": "train"}, {"event": "end", "stop_reason": "signal"}]
    assert rundir.run_status(first) == "preempted"
    assert rundir.run_status(first + [{"event": "checklist"}, {"event": "train"}]) == "failed"
    assert rundir.run_status(first + [{"event": "checklist"}, {"event": "end", "stop_reason": "signal"}]) == "preempted"
    assert rundir.run_status(first + [{"event": "checklist"}, {"event": "end", "stop_reason": "max_iters"}]) == "finished"
    assert rundir.run_status([{"event": "checklist"}]) == "failed" and rundir.run_status([]) == "not run"


def test_the_dataset_is_scanned_once_per_run_even_read_only(data_dir, tmp_path, monkeypatch):
    """A read-only dataset keeps no scan in meta.json: the start-up read every token of it once in the
    first rank's scan and again in every rank's data check. Rank 0 scans; the others get its answer."""
    scans = []
    real = tokendata.max_token_id
    monkeypatch.setattr(tokendata, "max_token_id", lambda d, *a: scans.append(d) or real(d, *a))
    monkeypatch.setattr(tokendata, "atomic_write", lambda *a, **k: (_ for _ in ()).throw(OSError(30, "read-only")))
    train.main(tiny_args(data_dir, str(tmp_path / "run"), "--max_iters=1"))
    assert scans == [data_dir]


# ----------------------------------------------------------------------------- round four: forks, ladders, plans

def flip_bytes_inside(path, tensor, n=16):
    """Flip n bytes in the middle of `tensor`'s stored bytes in a checkpoint file (the zip stores them raw)."""
    raw = open(path, "rb").read()
    needle = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()[:64]
    at = raw.index(needle) + 16
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in raw[at:at + n]))


def test_a_checkpoint_with_flipped_bytes_is_named_on_resume_and_on_fork(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out))
    path = os.path.join(out, "ckpt.pt")
    flip_bytes_inside(path, load_ckpt(out)["model"]["transformer.h.0.mlp.c_fc.weight"])
    assert torch.load(path, map_location="cpu", weights_only=True)["iter_num"] == 8  # torch itself loads it silently
    with pytest.raises(rundir.RunDirError, match=f"{path} is damaged: its contents do not match the sha256") as e:
        train.main(tiny_args(data_dir, out, "--init_from=resume", "--max_iters=12", "--lr_decay_iters=12"))
    assert "\n" not in str(e.value)
    with pytest.raises(rundir.RunDirError, match="the trunk checkpoint is damaged: .* do not match the sha256"):
        train.main(tiny_args(data_dir, str(tmp_path / "branch"), "--max_iters=12", "--lr_decay_iters=12",
                             f"--fork_from={out}"))


def test_a_fork_from_a_branch_or_at_the_budget_is_refused(data_dir, tmp_path):
    trunk, branch = str(tmp_path / "trunk"), str(tmp_path / "branch")
    train.main(tiny_args(data_dir, trunk, "--max_iters=4", "--lr_decay_iters=8"))
    with pytest.raises(configurator.ConfigError, match="the trunk ended at iteration 4, at or after this run's last"):
        train.main(tiny_args(data_dir, branch, "--max_iters=4", "--lr_decay_iters=8", f"--fork_from={trunk}"))
    train.main(tiny_args(data_dir, branch, f"--fork_from={trunk}"))
    with pytest.raises(configurator.ConfigError, match=f"is itself a branch \\(forked from {trunk}\\)"):
        train.main(tiny_args(data_dir, str(tmp_path / "again"), f"--fork_from={branch}"))
    assert not os.path.exists(tmp_path / "again" / "ckpt.pt")


def test_a_nan_before_the_first_checkpoint_does_not_claim_one_exists(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    monkeypatch.setattr(train, "evaluate", lambda *a, **k: dict(train=float("nan"), val=float("nan")))
    with pytest.raises(train.TrainingDiverged):
        train.main(tiny_args(data_dir, out))
    line = open(os.path.join(out, "log.txt")).read()
    assert "no checkpoint was written" in line and "untouched" not in line
