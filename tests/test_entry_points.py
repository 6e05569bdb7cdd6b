"""Every documented entry point run the way a user runs it: `--help`, and the evaluators on one
process and under torchrun on 2 gloo ranks (the documented commands that once crashed)."""
import importlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import configurator
import tokendata
from model import GPT, GPTConfig, model_config_fields
from helpers import FIXTURE, SHARED_KEYS, documented, write_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Scripts whose keys are read by configurator.py (DEFAULTS, or a tool's OPTIONS and the keys it shares),
# each with a meaning its --help must show; the data preparation scripts use argparse.
CONFIG_SCRIPTS = {
    "train": "micro-steps per optimizer step, summed over all processes",
    "sample": "'bfloat16', 'float16', 'float32'",
    "eval": "'bfloat16', 'float16', 'float32'",
    "hellaswag": "'bfloat16', 'float16', 'float32'",
    "sweep": "print the runs (and check them) without starting any",
    "report": "a variant name or a directory",
    "export_checkpoint": "a Hugging Face GPT2LMHeadModel directory",
    "gpu_check": "where the rows are written",
    "test_all_architectures": "run the reduced-sync entries sharded on this many gloo ranks",
    "tools.bench_ra_variants": "window of the *_window and ra_mla variants",
    "tools.bench_train_step": "peak memory of one step on fake tensors, no timing",
    "tools.bench_comm": "InfiniBand: TP across this many nodes, one rank each",
    "tools.bench_ra_kernels": "sequence lengths, comma-separated",
    "tools.bench_ra_layout": "timed passes of each path, alternating",
    "tools.bench_suite_designs": "the seeds each design runs",
    "tools.noise_budget": "runs at a time the seed-hour assumes",
    "tools.calibration": "the seeds of each sub-suite (a pilot; for a family",
    "tools.tune_lr": "the tuning seeds: at least 3, none of them a seed a comparison uses",
    "tools.calibrate_analysis": "simulated tables per null",
    "tools.portable_runs": "leave them out of what you commit",
}
ARGPARSE_SCRIPTS = ("data.shakespeare.prepare", "data.openwebtext.prepare", "data.finewebedu.prepare",
                    "data.wikitext2.prepare")


@pytest.mark.parametrize("name", CONFIG_SCRIPTS)
def test_config_scripts_answer_help_with_keys_defaults_and_meanings(name, monkeypatch, capsys):
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as done:
        configurator.run_script(module.main)
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(module.__doc__.strip().split("\n")[0])
    for defaults in documented(name, module):
        for key, value in defaults.items():
            assert f"--{key}={value!r}" in out, key
    assert CONFIG_SCRIPTS[name] in out
    if name == "train":
        assert "\n  # reciprocal attention and MLA" in out  # comment lines become headings
    if name in SHARED_KEYS:  # the shared keys' meanings and headings, after the tool's own
        assert out.index("--preset=") < out.index("\n  # the model's shape: each key left at 0 takes the preset's value")
        assert "untimed steps first (compile happens here)" in out


def test_every_tool_reads_its_keys_with_the_configurator():
    tools = sorted(f"tools.{f[:-3]}" for f in os.listdir(os.path.join(REPO, "tools"))
                   if f.endswith(".py") and 'if __name__ == "__main__":' in open(os.path.join(REPO, "tools", f)).read())
    assert tools and set(tools) <= set(CONFIG_SCRIPTS)
    for name in [*tools, "gpu_check", "test_all_architectures"]:
        assert "argparse" not in open(os.path.join(REPO, *name.split(".")) + ".py").read(), name


@pytest.mark.parametrize("name, args, message", [
    ("tools.bench_train_step", ["--options=plain,fast"], "error: unknown options ['fast']: use a comma list of plain,"),
    ("tools.bench_train_step", ["--memory_only=True", "--options=all_compiled"], "error: --memory_only=True runs eager on fake tensors"),
    ("tools.bench_ra_variants", ["--preset=huge"], "error: --preset='huge': use one of small, gpt2"),
    ("tools.bench_ra_variants", ["--n_head=3"], "error: --n_head=3 must divide --n_embd=128"),
    ("tools.bench_ra_variants", ["--steps=0"], "error: --steps=0: use a whole number >= 1"),
    ("tools.bench_ra_kernels", ["--T", "1024", "4096"], "error: override '--T' needs a value: write --T=VALUE"),
    ("tools.bench_ra_kernels", ["--T=1024,4k"], "error: --T=1024,4k: comma-separated whole numbers"),
    ("tools.bench_ra_layout", ["--dtype=fp8"], "error: --dtype='fp8': use float32, bfloat16 or float16"),
    ("tools.bench_comm", [], "error: run under torchrun: torchrun --standalone --nproc_per_node=2"),
    ("tools.bench_comm", ["--nvlink_beta_gbps=0"], "error: --nvlink_beta_gbps=0.0: use a number > 0"),
    ("test_all_architectures", ["--only", "post"], "error: override '--only' needs a value: write --only=VALUE"),
    ("test_all_architectures", ["--ranks=two"], "error: config key 'ranks' (from --ranks=two) expects int"),
    ("gpu_check", ["out.json"], "error: 'out.json': gpu_check.py takes only --json=PATH and --only=SECTIONS"),
    ("gpu_check", ["--only=kernels,speed"], "error: --only=kernels,speed: unknown sections ['speed']"),
])
def test_tools_refuse_bad_input_in_one_line_before_any_work(name, args, message, monkeypatch, capsys):
    module = importlib.import_module(name)
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(sys, "argv", [name, *args])
    with pytest.raises(SystemExit) as done:
        configurator.run_script(module.main)
    out, err = capsys.readouterr()
    assert done.value.code == 1 and out == "", out
    assert err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.parametrize("name", ARGPARSE_SCRIPTS)
def test_argparse_scripts_answer_help(name, monkeypatch, capsys):
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_train_help_as_a_command():
    proc = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--tokens_per_iter=0" in proc.stdout and proc.stderr == ""


def test_help_into_a_pipe_whose_reader_is_gone_ends_without_a_traceback():
    """`python report.py --help | head -1`: the reader stops early, and the script still exits 0 with
    nothing on stderr (the reader here is gone before the text is written, so every write fails)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "report.py", "--help"], cwd=REPO, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


# ----------------------------------------------------------------------------- evaluators on 2 ranks

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny GPT-2-vocabulary checkpoint as train.py writes it, a val.bin and a HellaSwag file."""
    d = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=50304, n_layer=2, n_head=2, n_embd=16))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(25)  # spread the logits: no near ties between endings
    config = {k: getattr(model.config, k) for k in model_config_fields()}
    config.update(model_type="gpt", dataset="fixture")
    torch.save(dict(model=model.state_dict(), config=config), d / "ckpt.pt")
    tokendata.write_split(str(d / "val.bin"), [np.random.default_rng(0).integers(0, 50257, size=300)])
    write_jsonl(d / "hellaswag_val.jsonl", FIXTURE)
    return d


def torchrun(script, args, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           script, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_hellaswag_under_torchrun_equals_one_process(run_dir, tmp_path):
    import hellaswag
    args = [f"--out_dir={run_dir}", f"--input={run_dir}/hellaswag_val.jsonl", "--device=cpu", "--dtype=float32",
            "--batch_size=1"]
    alone = hellaswag.main([*args, f"--out_items={tmp_path}/alone.jsonl"])
    proc = torchrun(os.path.join(REPO, "hellaswag.py"), [*args, f"--out_json={tmp_path}/h.json",
                                                         f"--out_items={tmp_path}/ranks.jsonl"], tmp_path)
    result = json.loads((tmp_path / "h.json").read_text())
    assert {k: result[k] for k in alone} == alone and alone["n"] == len(FIXTURE)
    # every example's scores, gathered from the rank that scored it, as one process wrote them
    assert (tmp_path / "ranks.jsonl").read_text() == (tmp_path / "alone.jsonl").read_text()
    assert proc.stdout.count("HellaSwag acc") == 1  # the master reports, once


def test_eval_under_torchrun_equals_one_process(run_dir, tmp_path):
    eval_script = importlib.import_module("eval")
    args = [f"--out_dir={run_dir}", f"--data_dir={run_dir}", "--device=cpu", "--dtype=float32", "--batch_size=2"]
    alone = eval_script.main(args)
    proc = torchrun(os.path.join(REPO, "eval.py"), [*args, f"--out_json={tmp_path}/e.json"], tmp_path)
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["windows"] == alone["windows"] == 9 and result["tokens"] == alone["tokens"]
    assert result["loss"] == pytest.approx(alone["loss"], rel=1e-6, abs=0)  # per-row rounding only
    assert proc.stdout.count("perplexity") == 1


def test_config_error_under_torchrun_is_printed_once(tmp_path):
    """Every rank checks the same config: the refusal is one line, not one per rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           os.path.join(REPO, "train.py"), os.path.join(REPO, "config", "train_shakespeare.py"),
                           "--gradient_accumulation_steps=3", "--device=cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.count("error: gradient_accumulation_steps=3 is the total over all processes") == 1, proc.stderr


@pytest.mark.parametrize("head_loss,package", [("liger", "liger_kernel"), ("cce", "cut_cross_entropy")])
def test_checkpoint_of_a_package_head_is_evaluated_without_the_package(run_dir, tmp_path, monkeypatch, capsys,
                                                                       head_loss, package):
    """Evaluation, sampling, HellaSwag and export never call the training head: a run trained with
    liger or cce is read where that package is missing."""
    import export_checkpoint
    import hellaswag
    import sample
    eval_script = importlib.import_module("eval")
    ckpt = torch.load(os.path.join(run_dir, "ckpt.pt"), weights_only=True)
    ckpt["config"]["head_loss"] = head_loss
    run = tmp_path / "run"
    run.mkdir()
    torch.save(ckpt, run / "ckpt.pt")
    monkeypatch.setitem(sys.modules, package, None)  # `import liger_kernel` raises ImportError
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find_spec(name, *a))
    common = [f"--out_dir={run}", "--device=cpu", "--dtype=float32"]
    assert eval_script.main([*common, f"--data_dir={run_dir}", "--batch_size=2"])["windows"] == 9
    sample.main([*common, "--num_samples=1", "--max_new_tokens=4", "--start=Hello"])
    assert hellaswag.main([*common, f"--input={run_dir}/hellaswag_val.jsonl", "--batch_size=1"])["n"] == len(FIXTURE)
    export_checkpoint.main([f"--out_dir={run}", "--format=hf", f"--out={tmp_path / 'hf'}"])
    assert (tmp_path / "hf" / "config.json").exists()


def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    """The self-check needs a GPU (it is no part of this suite); here it answers in one line."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "gpu_check.py"), f"--json={tmp_path}/g.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == "" and not (tmp_path / "g.json").exists()
    assert proc.stderr.count("\n") == 1 and "no GPU is visible" in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- gpu_check's logic on CPU

def tiny_small(monkeypatch, gpu_check):
    """gpu_check's small training runs at test size, on the CPU."""
    monkeypatch.setattr(gpu_check, "SMALL", dict(
        dataset="toy", vocab_size=256, n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4,
        gradient_accumulation_steps=1, max_iters=4, lr_decay_iters=4, warmup_iters=1, learning_rate=3e-3,
        eval_interval=1000, eval_iters=1, log_interval=1, dtype="float32", save_checkpoint=False, device="cpu"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_gpu_check_speed_rows_warn_and_only_correctness_rows_fail():
    import gpu_check as g
    ms = {"sdpa": 1.0, "mix": 3.0, "swap": 1.2, "sdpa mix": 2.5, "sdpa swap": 1.1}
    rows = g.speed_rows(ms, 1024)
    status = {r["check"]: r["status"] for r in rows}
    assert status == {"fused mix / SDPA, T=1024": "WARN", "fused swap / SDPA, T=1024": "pass",
                      "fused mix / RA through SDPA, T=1024": "WARN", "RA through SDPA mix / SDPA, T=1024": "info",
                      "RA through SDPA swap / SDPA, T=1024": "info"}
    assert g.speed_rows(dict(ms, mix=2.0), 4096)[2]["status"] == "pass"  # beats the SDPA route only up to 2048
    assert g.exit_status(rows) == 0  # a slow kernel is a warning, never the exit status
    assert g.exit_status(rows + [g.correctness("kernels", "x", False, "1")]) == 1
    assert g.exit_status([g.row("training", "liger", "skip", "not installed")]) == 0


def test_gpu_check_mfu_is_6n_plus_attention_over_the_data_sheet_peak():
    import gpu_check as g
    flops = g.flops_per_token(dict(g.GPT2, device="cpu"))
    n = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304)).get_num_params()
    assert flops == 6 * n + 12 * 12 * 768 * 1024
    steps = [dict(tokens_per_sec=1e9)] * 10 + [dict(tokens_per_sec=r) for r in (4e5, 5e5, 6e5)]
    rate, mfu = g.throughput_rows(steps, flops, 989e12, "gpt2")
    assert rate["measured"] == "500,000" and rate["status"] == "info"  # median after the compile steps
    assert mfu["measured"] == f"{100 * 5e5 * flops / 989e12:.1f}%" and mfu["status"] == "WARN"  # < 45%
    assert g.throughput_rows(steps, flops, 0.4 * 5e5 * flops, "gpt2")[1]["status"] == "pass"
    assert g.throughput_rows(steps, flops, None, "gpt2")[1]["status"] == "skip"


def test_gpu_check_memory_row_fails_both_ways_past_its_margin():
    """Under the allocator's peak: a run that does not fit passes the pre-flight check; over what it
    reserved: the refusal turns away a run that fits. Both FAIL past the margin."""
    import gpu_check as g
    G, reserve = 2**30, 2**30
    estimate = lambda step, total: dict(step=int((step + 1) * G), total=int((total + 1) * G))
    row = lambda e, step, ev, reserved: g.memory_row("baseline", e, step * G, ev * G, reserved * G, reserve)["status"]
    assert row(estimate(10, 12), 10, 11, 11) == "pass"
    assert row(estimate(7, 12), 10, 11, 11) == "FAIL"  # step under by 30%
    assert row(estimate(10, 10), 10, 14, 14) == "FAIL"  # evaluation's peak under by 29%
    assert row(estimate(10, 15), 10, 11, 11) == "FAIL"  # 36% over the reserved peak: would refuse a run that fits
    assert row(estimate(8, 9), 10, 11, 11) == "pass"  # within 25%


def test_gpu_check_loss_comparisons():
    import gpu_check as g
    run = {i: 3.0 - i / 100 for i in range(1, 301)}
    assert g.parity_row(run, {i: v + 0.02 for i, v in run.items()})["status"] == "pass"
    assert g.parity_row(run, {i: v + 0.05 for i, v in run.items()})["status"] == "FAIL"
    assert g.parity_row(run, run | {300: float("nan")})["status"] == "FAIL"
    noisy = run | {7: run[7] + 1e-7}
    assert g.bitwise_row(run, noisy, "plain", required=False)["status"] == "info"
    assert g.bitwise_row(run, noisy, "plain", required=False)["measured"] == "differ from iter 7"
    assert g.bitwise_row(run, noisy, "det", required=True)["status"] == "FAIL"
    assert g.bitwise_row(run, dict(run), "det", required=True)["status"] == "pass"
    assert g.resume_row(run, dict(run), "dcp")["status"] == "pass"
    assert g.resume_row(run, {i: run[i] for i in range(1, 200)}, "dcp")["status"] == "FAIL"  # stopped early
    assert g.match_row(run, {i: v + 5e-4 for i, v in run.items()}, "ddp")["status"] == "pass"
    assert g.match_row(run, {i: v + 5e-3 for i, v in run.items()}, "ddp")["status"] == "FAIL"


def test_gpu_check_kernel_accuracy_logic_catches_a_wrong_kernel():
    """The RA accuracy rows run on the GPU; their logic here, on RA through SDPA as the kernel under test
    (it passes), a kernel that ignores the window, and one that gives alpha no gradient (both fail)."""
    import gpu_check as g
    from ra_model import reciprocal_sdpa

    def through_sdpa(q, k, v, mode, alpha=None, gate_logit=None, window=0):
        assert q.stride(-1) == 1 and not q.is_contiguous()  # the model's strided views
        return reciprocal_sdpa(q, k, v, mode, alpha, None if gate_logit is None else torch.sigmoid(gate_logit),
                               window, 0.0)

    def no_window(q, k, v, mode, alpha=None, gate_logit=None, window=0):
        return through_sdpa(q, k, v, mode, alpha, gate_logit, 0)

    def alpha_detached(q, k, v, mode, alpha=None, gate_logit=None, window=0):
        return through_sdpa(q, k, v, mode, None if alpha is None else alpha.detach(), gate_logit, window)

    def nan_in_gate(q, k, v, mode, alpha=None, gate_logit=None, window=0):
        out = through_sdpa(q, k, v, mode, alpha, gate_logit, window)
        return out * float("nan") if mode == "gate" else out

    case = [("float32", 8, (0, 5))]
    assert g.accuracy_rows(nan_in_gate, "cpu", case)[0]["status"] == "FAIL"  # a NaN is the worst error
    good = g.accuracy_rows(through_sdpa, "cpu", case)
    assert good[0]["status"] == "pass" and good[0]["check"] == "RA kernel float32 D=8", good
    assert g.accuracy_rows(no_window, "cpu", case)[0]["status"] == "FAIL"
    bad = g.accuracy_rows(alpha_detached, "cpu", case)[0]
    assert bad["status"] == "FAIL" and "dalpha (mix" in bad["detail"]
    assert g.bucket_rows(through_sdpa, "cpu", lengths=(20, 40))[0]["status"] == "pass"
    # dalpha and dgate sum terms that cancel: they may reach twice PyTorch's own error in the dtype
    assert g.allowances({"out": 1e-3, "dgate": 0.07}, {"out": 1e-3, "dgate": 0.04}, "bfloat16") == {"out": 0.03,
                                                                                                 "dgate": 0.08}
    assert g.allowances({"dalpha": 0.01}, {"dalpha": 0.001}, "bfloat16") == {"dalpha": 0.03}  # never below tolerance
    assert g.allowances({"dgate": 0.07}, {"dgate": float("nan")}, "bfloat16") == {"dgate": 0.03}  # no yardstick
    assert g.accuracy_row("c", [("gate", {"dgate": (0.07, 0.08)})], "w")["status"] == "pass"
    failed = g.accuracy_row("c", [("gate", {"dgate": (0.09, 0.08)}), ("swap", {"dx": (0.02, 0.03)})], "w")
    assert failed["status"] == "FAIL" and "dgate (gate)" in failed["detail"] and failed["measured"] == "9.0e-02"
    assert g.deterministic_kernel_rows(through_sdpa, "cpu")[0]["status"] == "skip"  # no deterministic= option

    def with_option(q, k, v, mode, alpha=None, gate_logit=None, window=0, deterministic=False):
        return through_sdpa(q, k, v, mode, alpha, gate_logit, window)

    assert g.repeat_bitwise(with_option, "cpu", T=16)
    assert [r["status"] for r in g.deterministic_kernel_rows(with_option, "cpu")] == ["pass", "pass"]


def test_gpu_check_heads_against_the_float64_full_head_on_cpu():
    import gpu_check as g
    rows = {r["check"].split()[0]: r for r in g.head_rows("cpu", N=64, C=16, V=300)}
    assert rows["head_loss=full"]["status"] == rows["head_loss=chunked"]["status"] == "pass"
    assert rows["head_loss=liger"]["status"] == rows["head_loss=cce"]["status"] == "skip"  # CUDA packages


class FakeEvent:
    """torch.cuda.Event on the host clock, so the GPU-timed code runs on a CPU."""

    def __init__(self, enable_timing=False):
        self.time = None

    def record(self):
        self.time = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return 1000 * (end.time - self.time)


def test_gpu_check_gpu_sections_run_with_events_and_allocator_faked(monkeypatch):
    """The timed and measured parts as they run on a GPU, on the CPU: CUDA events on the host clock,
    the allocator's counters fixed (its verdicts are test_gpu_check_memory_row_...'s)."""
    import gpu_check as g
    import kernels.ra_attention
    from ra_model import reciprocal_sdpa
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    for name, value in (("memory_allocated", 0), ("max_memory_allocated", 2**26), ("max_memory_reserved", 2**27)):
        monkeypatch.setattr(torch.cuda, name, lambda device=None, value=value: value)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(g, "GPT2", dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=256))
    monkeypatch.setattr(kernels.ra_attention, "reciprocal_attention", lambda q, k, v, mode, alpha=None, **_:
                        reciprocal_sdpa(q, k, v, mode, alpha, None, 0, 0.0))
    memory = g.memory_rows("cpu")
    assert [r["check"] for r in memory] == [f"memory estimate: {name}" for name in g.MEMORY_CASES]
    assert all(r["status"] in ("pass", "FAIL") and r["measured"] != "crashed" for r in memory)
    timer, peak = g.step_timer_row("cpu")
    assert timer["status"] == "pass" and peak["status"] == "WARN"  # a CPU has no data-sheet peak
    speed = g.kernel_speed_rows("cpu", lengths=(32,), B=1, H=2, D=8)
    assert [r["status"] for r in speed][3:] == ["info", "info"] and len(speed) == 5


def test_gpu_check_a_crashed_section_is_one_failed_row_and_json_layout(tmp_path):
    import gpu_check as g

    def kernel_rows(device):
        raise RuntimeError("CUDA error: an illegal memory access\nmore")

    rows = g.guarded("kernels", kernel_rows, "cuda:0")
    assert rows == [g.row("kernels", "kernels: kernel_rows", "FAIL", "crashed",
                          "RuntimeError: CUDA error: an illegal memory access")]
    rows.append(g.speed("kernels", "fused mix / SDPA, T=1024", False, "3.00x"))
    layout = json.loads(json.dumps(g.summary(rows, "NVIDIA H100 80GB HBM3", 12.0, dict(kernels=12.0))))
    assert layout["exit_status"] == 1 and layout["counts"] == {"pass": 0, "FAIL": 1, "WARN": 1, "skip": 0, "info": 0}
    assert {"device", "torch", "cuda", "hip", "gpus", "seconds", "rows"} <= set(layout)
    assert layout["section_seconds"] == {"kernels": 12.0}
    assert g.table(rows).splitlines()[2].split()[:2] == ["kernels", "fused"]
    assert g.sections_to_run("") == list(g.SECTIONS) and g.sections_to_run("memory,kernels") == ["memory", "kernels"]


def test_gpu_check_determinism_rows_run_train_twice_each_way(tmp_path, monkeypatch):
    """The determinism section as on a GPU, here on the CPU: 4 short train.py runs."""
    import gpu_check as g
    tiny_small(monkeypatch, g)
    g.toy_data(str(tmp_path / "data"))
    rows = {r["check"]: r for r in g.determinism_rows(str(tmp_path), "cpu")}
    assert rows["two identical runs"]["status"] == "info"
    assert rows["two runs with deterministic=True"]["status"] == "pass"
    assert rows["deterministic=True recorded"]["status"] == "pass"
    cost = rows["deterministic=True: step time cost"]["measured"]
    assert cost.endswith("x") and 0 < float(cost[:-1]) < 100


def test_gpu_check_distributed_rows_under_torchrun_on_gloo(tmp_path, monkeypatch):
    """The distributed section as on a GPU (torchrun, DDP, FSDP2, DCP save and resume, 2 ranks against
    one), here on gloo: the launcher's arguments and the comparisons hold."""
    import gpu_check as g
    tiny_small(monkeypatch, g)
    g.toy_data(str(tmp_path / "data"))
    rows = g.distributed_rows(str(tmp_path), 2, "cpu")
    assert [r["status"] for r in rows] == ["pass"] * 4, rows
    assert rows[2]["measured"] == "bitwise equal" and rows[3]["check"] == "DDP on 2 GPUs vs 1, same global batch"
