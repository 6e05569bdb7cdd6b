"""Issue 61, round six: the operator's drills of the training loop and the ideas registry, each the
fault or input as the operator met it, on the tiny RA recipe (2 layers x 32 wide) over the toy corpus.
Each ends in one line (an event or an error), with nothing lost and no hang (docs/faults.md)."""
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import messages
import train
from helpers import ENV, LONG, events, load_ckpt, run_script, tiny_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RA = ("--model_type=ra", "--ra_pattern=alternate", "--ra_mode=gate")  # tiny_args's 2 layers x 32 wide


# ----------------------------------------------------------------------------- 1. a huge but finite eval loss

def test_a_huge_finite_eval_loss_ends_as_diverged_and_keeps_the_last_good_checkpoint(data_dir, tmp_path, capsys):
    """--learning_rate=100.0 --lr_schedule=constant --eval_interval=5 --log_interval=25 on Shakespeare: the
    val loss grows beyond exp's range while finite; it used to die in math.exp with an OverflowError and
    no event. On the toy corpus a warmup lets the evaluation at iteration 5 pass and write a checkpoint."""
    out = str(tmp_path / "run")
    args = tiny_args(data_dir, out, *RA, "--max_iters=40", "--lr_decay_iters=40", "--learning_rate=100.0",
                     "--lr_schedule=constant", "--eval_interval=5", "--log_interval=25", "--warmup_iters=100")
    code, stderr = run_script(capsys, "train.py", *args)
    assert code == 1, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr[-2000:]
    diverged = events(out, "diverged")
    assert len(diverged) == 1 and not events(out, "end")
    evals = events(out, "eval")
    assert diverged[0]["iter"] > evals[-1]["iter"] and all(math.isfinite(e["val_ppl"]) for e in evals)
    assert load_ckpt(out)["iter_num"] == evals[-1]["iter"] > 0  # the last good checkpoint, untouched
    assert "too large for a perplexity (exp overflows)" in lines[0], lines
    assert f"the last good checkpoint is untouched in {out}/ckpt.pt" in open(os.path.join(out, "log.txt")).read()


def test_a_finite_eval_loss_beyond_exp_is_named_as_such():
    fields = dict(train_loss=812.5, val_loss=790.25)
    assert messages.what_diverged(fields) == ("evaluation loss became train 812.5, val 790.25, too large for a "
                                              "perplexity (exp overflows)")
    assert messages.what_diverged(dict(train_loss=math.nan, val_loss=math.nan)) == \
        "evaluation loss became train nan, val nan"


# ----------------------------------------------------------------------------- 3. the divergence's trigger

def test_the_nan_message_names_the_infinite_grad_norm_as_the_trigger():
    assert messages.what_diverged(dict(loss=557483968.0, grad_norm=math.inf)) == \
        "grad norm became inf (loss 557483968.0)"
    assert messages.what_diverged(dict(loss=math.nan, grad_norm=math.inf)) == "loss became nan (grad norm inf)"


# ----------------------------------------------------------------------------- 2. max_time on the host's clock

def test_max_time_stops_the_run_between_log_steps(data_dir, tmp_path):
    """--max_time=3.0 --log_interval=1000 --eval_interval=1000: the run used to train on past its budget
    (iter 381 after 143.6 s) because the budget was checked only where the loop read the device."""
    out = str(tmp_path / "run")
    started = time.perf_counter()
    train.main(tiny_args(data_dir, out, *RA, *LONG, "--max_time=3.0", "--log_interval=1000", "--eval_interval=1000"))
    end = events(out, "end")[-1]
    assert end["stop_reason"] == "max_time" and end["signal"] is None
    assert 3.0 <= end["train_time"] < 3.5 and end["iter"] < 1000  # stopped at the step that spent it
    assert time.perf_counter() - started < 60
    assert load_ckpt(out)["iter_num"] == end["iter"]
    assert events(out, "eval")[-1]["iter"] == end["iter"]  # the budget's final evaluation


def test_max_time_is_watched_without_reading_the_device_every_step(data_dir, tmp_path, monkeypatch):
    """The watch is on the host's clock: the device is read at the start of the budget's end only."""
    reads = []
    real = train.read_steps
    monkeypatch.setattr(train, "read_steps", lambda unread, *a: reads.append(len(unread)) or real(unread, *a))
    train.main(tiny_args(data_dir, str(tmp_path / "run"), *RA, *LONG, "--max_time=1.0", "--log_interval=1000",
                         "--eval_interval=1000"))
    assert reads[0] > 1  # many steps queued before the first read
    assert sum(reads) == events(str(tmp_path / "run"), "end")[-1]["iter"]


def test_a_signal_in_the_step_that_spends_the_budget_is_recorded_as_a_signal(data_dir, tmp_path, monkeypatch):
    """A SIGTERM to a run is a pause (exit 3, resume to go on), never 'finished by its budget', even in
    the budget's last step; the resumed run then ends with its final evaluation."""
    out = str(tmp_path / "run")
    real_step = train.train_step

    def sigterm_in_the_last_step(cfg, layout, run, batches, iter_num, lr, autocast):
        if iter_num == cfg["max_iters"] - 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(cfg, layout, run, batches, iter_num, lr, autocast)

    monkeypatch.setattr(train, "train_step", sigterm_in_the_last_step)
    with pytest.raises(SystemExit) as stopped:
        train.main(tiny_args(data_dir, out, *RA, "--log_interval=1000"))
    assert stopped.value.code == train.EXIT_STOPPED_BY_SIGNAL
    end = events(out, "end")[-1]
    assert (end["stop_reason"], end["signal"], end["iter"]) == ("signal", "SIGTERM", 8)
    assert load_ckpt(out)["iter_num"] == 8
    monkeypatch.setattr(train, "train_step", real_step)
    train.main(tiny_args(data_dir, out, *RA, "--log_interval=1000", "--init_from=resume"))
    end = events(out, "end")[-1]
    assert (end["stop_reason"], end["iter"]) == ("max_iters", 8) and events(out, "eval")[-1]["iter"] == 8


# ----------------------------------------------------------------------------- 4-6. the ideas registry, edited

QK_ENTRY = '''    "QK-norm": Idea(
        keys=("qk_norm",), layers=all_layers_if("qk_norm"), attention=QKNorm, layer_params=lambda config, i: 0,
        new_parameters=(), gpt2_function=False, example=dict(qk_norm=True), extra_flops=no_flops,
        kept_scores=no_scores),
'''
EDITS = {  # the operator's edit: file, text, replacement
    "entry removed": ("ra_model.py", QK_ENTRY, ""),
    "layers always empty": ("ra_model.py", 'layers=all_layers_if("qk_norm")', "layers=lambda config: range(0)"),
    "field missing": ("ra_model.py", ", example=dict(qk_norm=True), extra_flops=no_flops,", ", extra_flops=no_flops,"),
    "default removed": ("runtime.py", "    qk_norm=False,", "    # qk_norm=False,"),
}


def edited_repository(tmp_path, edit):
    """A copy of the scripts with one registration edited as the operator did, in the file itself."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", "tests", "reports", "docs", "__pycache__"))
    name, old, new = EDITS[edit]
    text = (copy / name).read_text()
    assert text.count(old) == 1, (edit, name)
    (copy / name).write_text(text.replace(old, new))
    return copy


@pytest.mark.parametrize("edit, keys, message", [
    ("entry removed", ("--model_type=gpt", "--qk_norm=True"),
     "RAConfig.qk_norm is owned by 0 ideas in ra_model.IDEAS (none): register the idea that reads it, once"),
    ("layers always empty", ("--model_type=ra", "--qk_norm=True"),
     "qk_norm=True switches on the idea 'QK-norm', which runs in none of the 2 layers (ra_model.IDEAS['QK-norm']"
     ".layers is empty): make layers() return the layers that run it, or leave qk_norm at False"),
    ("field missing", ("--model_type=gpt",),
     "idea 'QK-norm' in ra_model.IDEAS lacks example: give its entry every field of Idea (docs/new-idea.md's "
     "table says what each is for)"),
    ("default removed", ("--model_type=gpt",),
     "RAConfig has the fields ['qk_norm'], which are no keys of runtime.DEFAULTS: add each with its default and "
     "meaning"),
])
def test_a_broken_idea_registration_is_refused_in_one_line_before_any_work(data_dir, tmp_path, edit, keys, message):
    """4: QK-norm's IDEAS entry removed, --model_type=gpt --qk_norm=True trained plain GPT; 5: an entry whose
    layers() is always empty trained the baseline; 6: a key removed from runtime.DEFAULTS ended every gpt run
    in KeyError: 'qk_norm', an Idea missing a field every script in a TypeError traceback at import."""
    copy = edited_repository(tmp_path, edit)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train.py", *tiny_args(data_dir, str(out), *keys)], cwd=copy, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stderr.strip()) == (1, f"error: {message}")
    assert not out.exists()  # refused before the run directory
    if edit == "field missing":  # the scripts import again: --help answers
        helped = subprocess.run([sys.executable, "sample.py", "--help"], cwd=copy, env=ENV, capture_output=True,
                                text=True, timeout=300)
        assert helped.returncode == 0, helped.stderr[-2000:]
